/* fields_test: the protobuf fields that gateway/api frames by hand
 * (api/fields.h). Every API_FIELD_* constant is the number the message's
 * descriptor gives that field, and the bytes api writes (api_field_header
 * and the data after it; ForwardFrame's `connected`) are exactly the bytes
 * protobuf-c packs for the same message, for lengths across every varint
 * size of the length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/api/fields.h"

static uint32_t
field_number (const ProtobufCMessageDescriptor *d, const char *name)
{
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name (d, name);
  assert_non_null (f);
  return f->id;
}

static void
test_every_constant_is_the_descriptors_field_number (void **state)
{
  (void) state;
  assert_int_equal (API_FIELD_EXEC_EVENT_STDOUT, field_number (&sandbox__v1__exec_event__descriptor, "stdout"));
  assert_int_equal (API_FIELD_EXEC_EVENT_STDERR, field_number (&sandbox__v1__exec_event__descriptor, "stderr"));
  assert_int_equal (API_FIELD_SNAPSHOT_CHUNK_DATA, field_number (&sandbox__v1__snapshot_chunk__descriptor, "data"));
  assert_int_equal (API_FIELD_FILE_CHUNK_DATA, field_number (&sandbox__v1__file_chunk__descriptor, "data"));
  assert_int_equal (API_FIELD_LIST_DIR_ENTRIES,
                    field_number (&sandbox__v1__list_dir_response__descriptor, "entries"));
  assert_int_equal (API_FIELD_LIST_DIR_NEXT_PAGE_TOKEN,
                    field_number (&sandbox__v1__list_dir_response__descriptor, "next_page_token"));
  assert_int_equal (API_FIELD_FORWARD_FRAME_DATA, field_number (&sandbox__v1__forward_frame__descriptor, "data"));
  assert_int_equal (API_FIELD_FORWARD_FRAME_CONNECTED,
                    field_number (&sandbox__v1__forward_frame__descriptor, "connected"));
}

/* Lengths whose varint takes 1, 2, 3 and 4 bytes, at each boundary. */
static const size_t lengths[] = {0, 1, 127, 128, 300, 16383, 16384, (1u << 21) - 1, 1u << 21, 3u << 20};

/* api's framing of `len` bytes as field `field`: header, then the data. */
static uint8_t *
hand_packed (uint32_t field, const uint8_t *data, size_t len, size_t *n)
{
  uint8_t *out = malloc (API_FIELD_HEADER_MAX + len + 1);
  assert_non_null (out);
  size_t hn = api_field_header (out, field, len);
  assert_true (hn <= API_FIELD_HEADER_MAX);
  memcpy (out + hn, data, len);
  *n = hn + len;
  return out;
}

/* protobuf-c's packing of `m`. */
static uint8_t *
library_packed (const ProtobufCMessage *m, size_t *n)
{
  *n = protobuf_c_message_get_packed_size (m);
  uint8_t *out = malloc (*n + 1);
  assert_non_null (out);
  assert_int_equal (protobuf_c_message_pack (m, out), *n);
  return out;
}

static void
assert_same_bytes (uint8_t *a, size_t an, uint8_t *b, size_t bn)
{
  assert_int_equal (an, bn);
  assert_memory_equal (a, b, an);
  free (a);
  free (b);
}

static uint8_t *
pattern (size_t len)
{
  uint8_t *p = malloc (len + 1);
  assert_non_null (p);
  for (size_t i = 0; i < len; i++)
    p[i] = (uint8_t) (i * 7 + 1);
  return p;
}

static void
test_bytes_fields_are_packed_as_protobuf_c_packs_them (void **state)
{
  (void) state;
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++)
    {
      size_t len = lengths[i], an, bn;
      uint8_t *data = pattern (len);
      ProtobufCBinaryData bytes = {len, data};

      Sandbox__V1__ExecEvent ev = SANDBOX__V1__EXEC_EVENT__INIT;
      ev.event_case = SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT;
      ev.stdout = bytes;
      uint8_t *a = hand_packed (API_FIELD_EXEC_EVENT_STDOUT, data, len, &an);
      uint8_t *b = library_packed (&ev.base, &bn);
      assert_same_bytes (a, an, b, bn);
      ev.event_case = SANDBOX__V1__EXEC_EVENT__EVENT_STDERR;
      ev.stderr = bytes;
      a = hand_packed (API_FIELD_EXEC_EVENT_STDERR, data, len, &an);
      b = library_packed (&ev.base, &bn);
      assert_same_bytes (a, an, b, bn);

      if (len > 0) /* proto3: an empty bytes field is not written at all */
        {
          Sandbox__V1__SnapshotChunk chunk = SANDBOX__V1__SNAPSHOT_CHUNK__INIT;
          chunk.data = bytes;
          a = hand_packed (API_FIELD_SNAPSHOT_CHUNK_DATA, data, len, &an);
          b = library_packed (&chunk.base, &bn);
          assert_same_bytes (a, an, b, bn);

          Sandbox__V1__FileChunk fc = SANDBOX__V1__FILE_CHUNK__INIT;
          fc.data = bytes;
          a = hand_packed (API_FIELD_FILE_CHUNK_DATA, data, len, &an);
          b = library_packed (&fc.base, &bn);
          assert_same_bytes (a, an, b, bn);

          Sandbox__V1__ForwardFrame fr = SANDBOX__V1__FORWARD_FRAME__INIT;
          fr.data = bytes;
          a = hand_packed (API_FIELD_FORWARD_FRAME_DATA, data, len, &an);
          b = library_packed (&fr.base, &bn);
          assert_same_bytes (a, an, b, bn);
        }
      free (data);
    }
}

static void
test_a_list_dir_page_is_packed_as_protobuf_c_packs_it (void **state)
{
  (void) state;
  /* Two entries, then the token, as files_list.c appends them. */
  Sandbox__V1__FileInfo e1 = SANDBOX__V1__FILE_INFO__INIT, e2 = SANDBOX__V1__FILE_INFO__INIT;
  e1.path = "a";
  e1.size = 5;
  char longname[300];
  memset (longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  e2.path = longname; /* an entry longer than 127 bytes: a two-byte length */
  e2.size = 1u << 30;
  Sandbox__V1__FileInfo *entries[] = {&e1, &e2};
  Sandbox__V1__ListDirResponse resp = SANDBOX__V1__LIST_DIR_RESPONSE__INIT;
  resp.n_entries = 2;
  resp.entries = entries;
  resp.next_page_token = "42";
  size_t bn;
  uint8_t *b = library_packed (&resp.base, &bn);

  uint8_t *a = malloc (bn + 64);
  assert_non_null (a);
  size_t an = 0;
  for (size_t i = 0; i < 2; i++)
    {
      size_t len = protobuf_c_message_get_packed_size (&entries[i]->base);
      an += api_field_header (a + an, API_FIELD_LIST_DIR_ENTRIES, len);
      an += protobuf_c_message_pack (&entries[i]->base, a + an);
    }
  an += api_field_header (a + an, API_FIELD_LIST_DIR_NEXT_PAGE_TOKEN, 2);
  memcpy (a + an, "42", 2);
  an += 2;
  assert_same_bytes (a, an, b, bn);
}

static void
test_forward_connected_is_the_varint_protobuf_c_packs (void **state)
{
  (void) state;
  const uint8_t connected[] = {API_TAG (API_FIELD_FORWARD_FRAME_CONNECTED, API_WIRE_VARINT), 1};
  Sandbox__V1__ForwardFrame fr = SANDBOX__V1__FORWARD_FRAME__INIT;
  fr.connected = true;
  size_t bn;
  uint8_t *b = library_packed (&fr.base, &bn);
  assert_int_equal (bn, sizeof connected);
  assert_memory_equal (connected, b, bn);
  free (b);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_every_constant_is_the_descriptors_field_number),
      cmocka_unit_test (test_bytes_fields_are_packed_as_protobuf_c_packs_them),
      cmocka_unit_test (test_a_list_dir_page_is_packed_as_protobuf_c_packs_it),
      cmocka_unit_test (test_forward_connected_is_the_varint_protobuf_c_packs),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
