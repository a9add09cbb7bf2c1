/* frames_test: reading Forward frames in place (shim/frames.c): data-only
 * frames split across slices at every place, including inside the key and
 * the length, read back byte for byte; other frames decoded; bytes given
 * back; what is not a frame refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shim/frames.h"

/* A message's bytes as gRPC could hold them: in slices cut at `cuts`
 * (ascending offsets inside it), each of its own (small copied slices
 * would be merged). */
static grpc_byte_buffer *
buffer_of (const uint8_t *bytes, size_t len, const size_t *cuts, size_t n_cuts)
{
  grpc_slice slices[8];
  size_t n = 0, at = 0;
  for (size_t i = 0; i <= n_cuts; i++)
    {
      size_t end = i < n_cuts ? cuts[i] : len;
      uint8_t *copy = malloc (end - at + 1);
      memcpy (copy, bytes + at, end - at);
      slices[n++] = grpc_slice_new (copy, end - at, free);
      at = end;
    }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create (slices, n);
  for (size_t i = 0; i < n; i++)
    grpc_slice_unref (slices[i]);
  return bb;
}

static uint8_t *
packed (const Sandbox__V1__ForwardFrame *f, size_t *len)
{
  *len = protobuf_c_message_get_packed_size (&f->base);
  uint8_t *out = malloc (*len + 1);
  protobuf_c_message_pack (&f->base, out);
  return out;
}

/* Every byte of the current frame's data, in pieces of at most `step`. */
static size_t
read_all (frames_t *fr, uint8_t *out, size_t step)
{
  size_t n = 0;
  const uint8_t *p;
  for (size_t k; (k = frames_next (fr, &p, step)) > 0;)
    {
      memcpy (out + n, p, k);
      n += k;
    }
  assert_false (frames_buffered (fr));
  return n;
}

static void
test_data_only_frames_split_anywhere_read_back_whole_in_place (void **state)
{
  /* Lengths whose varint takes one, two and three bytes. */
  static const size_t sizes[] = {0, 1, 127, 128, 300, 16384, 262144};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    {
      size_t size = sizes[s];
      uint8_t *data = malloc (size + 1);
      for (size_t i = 0; i < size; i++)
        data[i] = (uint8_t) (i * 7 + size);
      Sandbox__V1__ForwardFrame f = SANDBOX__V1__FORWARD_FRAME__INIT;
      f.data.data = data;
      f.data.len = size;
      size_t len = 0;
      uint8_t *bytes = packed (&f, &len);
      uint8_t *out = malloc (size + 1);
      /* One cut anywhere (near the start: every place), then two. */
      for (size_t a = 1; a < len && a < 16; a++)
        for (size_t b = a + 1; b <= len; b += (b < 20 ? 1 : len / 3 + 1))
          {
            size_t cuts[2] = {a, b};
            grpc_byte_buffer *bb = buffer_of (bytes, len, cuts, b < len ? 2 : 1);
            size_t off = 0, dlen = 0;
            assert_true (frames_data_only (bb, &off, &dlen));
            assert_int_equal (dlen, size);
            assert_int_equal (off, len - size);
            frames_t fr = {0};
            bool cw = true, conn = true;
            assert_int_equal (frames_take (&fr, bb, &cw, &conn, NULL), 0);
            assert_true (fr.raw != NULL); /* read in place, not decoded */
            assert_false (cw);
            assert_false (conn);
            assert_int_equal (frames_buffered (&fr), size > 0);
            assert_int_equal (read_all (&fr, out, a + 5), size);
            assert_memory_equal (out, data, size);
            frames_drop (&fr);
          }
      free (out);
      free (bytes);
      free (data);
    }
}

static void
test_other_frames_are_decoded (void **state)
{
  frames_t fr = {0};
  err_t err = ERR_INIT;
  bool cw = false, conn = false;
  size_t len = 0, off, dlen;

  Sandbox__V1__ForwardFrame ok = SANDBOX__V1__FORWARD_FRAME__INIT;
  ok.connected = true;
  uint8_t *bytes = packed (&ok, &len);
  grpc_byte_buffer *bb = buffer_of (bytes, len, NULL, 0);
  assert_false (frames_data_only (bb, &off, &dlen));
  assert_int_equal (frames_take (&fr, bb, &cw, &conn, &err), 0);
  assert_true (conn);
  assert_false (cw);
  assert_false (frames_buffered (&fr));
  free (bytes);

  /* Data and close_write in one frame: the data first, then the end. */
  Sandbox__V1__ForwardFrame last = SANDBOX__V1__FORWARD_FRAME__INIT;
  last.data.data = (uint8_t *) "bye";
  last.data.len = 3;
  last.close_write = true;
  bytes = packed (&last, &len);
  size_t cut = 2;
  bb = buffer_of (bytes, len, &cut, 1);
  assert_false (frames_data_only (bb, &off, &dlen));
  assert_int_equal (frames_take (&fr, bb, &cw, &conn, &err), 0);
  assert_true (cw);
  assert_false (conn);
  uint8_t out[8];
  assert_int_equal (read_all (&fr, out, 2), 3);
  assert_memory_equal (out, "bye", 3);
  free (bytes);
  frames_drop (&fr);
}

static void
test_bytes_given_back_are_read_again (void **state)
{
  Sandbox__V1__ForwardFrame f = SANDBOX__V1__FORWARD_FRAME__INIT;
  f.data.data = (uint8_t *) "HTTP/1.1 200 OK\r\n\r\nbody";
  f.data.len = strlen ((char *) f.data.data);
  size_t len = 0;
  uint8_t *bytes = packed (&f, &len);
  size_t cut = 10;
  frames_t fr = {0};
  assert_int_equal (frames_take (&fr, buffer_of (bytes, len, &cut, 1), NULL, NULL, NULL), 0);
  const uint8_t *p;
  size_t k = frames_next (&fr, &p, 100); /* the first slice's share: 8 bytes */
  assert_int_equal (k, 8);
  frames_unread (&fr, 3);
  assert_int_equal (frames_next (&fr, &p, 3), 3);
  assert_memory_equal (p, "1.1", 3);
  uint8_t out[64];
  size_t n = read_all (&fr, out, 64);
  assert_int_equal (n, f.data.len - 8);
  assert_memory_equal (out, f.data.data + 8, n);
  free (bytes);
  frames_drop (&fr);
}

static void
test_what_is_not_a_frame_is_refused (void **state)
{
  /* A data key whose length runs past the end, then a field of the wrong
   * type: not data-only, and not a ForwardFrame. */
  static const uint8_t bad[] = {0x1a, 0x05, 'a', 'b', 0x0a, 0xff};
  grpc_byte_buffer *bb = buffer_of (bad, sizeof bad, NULL, 0);
  size_t off, dlen;
  assert_false (frames_data_only (bb, &off, &dlen));
  frames_t fr = {0};
  err_t err = ERR_INIT;
  assert_int_equal (frames_take (&fr, bb, NULL, NULL, &err), -1);
  assert_int_equal (err.status, EINVAL);
  err_release (&err);
  assert_false (frames_buffered (&fr));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_data_only_frames_split_anywhere_read_back_whole_in_place),
      cmocka_unit_test (test_other_frames_are_decoded),
      cmocka_unit_test (test_bytes_given_back_are_read_again),
      cmocka_unit_test (test_what_is_not_a_frame_is_refused),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
