/* api/fields: the header of a hand-framed protobuf field (see fields.h). */
#include "gateway/api/fields.h"

/* A one-byte tag holds field numbers 1 to 15. */
#define ONE_BYTE_TAG(field) _Static_assert((field) >= 1 && (field) <= 15, #field " needs a one-byte tag")
ONE_BYTE_TAG (API_FIELD_EXEC_EVENT_STDOUT);
ONE_BYTE_TAG (API_FIELD_EXEC_EVENT_STDERR);
ONE_BYTE_TAG (API_FIELD_SNAPSHOT_CHUNK_DATA);
ONE_BYTE_TAG (API_FIELD_FILE_CHUNK_DATA);
ONE_BYTE_TAG (API_FIELD_LIST_DIR_ENTRIES);
ONE_BYTE_TAG (API_FIELD_LIST_DIR_NEXT_PAGE_TOKEN);
ONE_BYTE_TAG (API_FIELD_FORWARD_FRAME_DATA);
ONE_BYTE_TAG (API_FIELD_FORWARD_FRAME_CONNECTED);

size_t
api_field_header (uint8_t *head, uint32_t field, size_t len)
{
  size_t n = 0;
  head[n++] = API_TAG (field, API_WIRE_LEN);
  for (; len >= 0x80; len >>= 7)
    head[n++] = (uint8_t) (len | 0x80);
  head[n++] = (uint8_t) len;
  return n;
}
