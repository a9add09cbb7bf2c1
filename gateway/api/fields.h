/* api/fields: the protobuf field numbers that api writes by hand, where a
 * message is framed around bytes it does not copy (an exec's output
 * buffer, a file chunk, a Forward read) or packed page by page (ListDir),
 * and the header of such a field.
 *
 * A field of a oneof is protobuf-c's own case constant (its value is the
 * field number); the others are named here, and
 * tests/unit/gateway/api/fields_test.c checks every one against the
 * message's descriptor and the bytes against protobuf-c's own packing.
 * Every one is below 16, so its tag is one byte (asserted at build time
 * in fields.c). No state; any thread.
 */
#ifndef SBX_GATEWAY_API_FIELDS_H
#define SBX_GATEWAY_API_FIELDS_H

#include <stddef.h>
#include <stdint.h>

#include "sandbox/v1/sandbox.pb-c.h"

#define API_FIELD_EXEC_EVENT_STDOUT SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT
#define API_FIELD_EXEC_EVENT_STDERR SANDBOX__V1__EXEC_EVENT__EVENT_STDERR
#define API_FIELD_SNAPSHOT_CHUNK_DATA 1      /* SnapshotChunk.data */
#define API_FIELD_FILE_CHUNK_DATA 1          /* FileChunk.data */
#define API_FIELD_LIST_DIR_ENTRIES 1         /* ListDirResponse.entries */
#define API_FIELD_LIST_DIR_NEXT_PAGE_TOKEN 2 /* ListDirResponse.next_page_token */
#define API_FIELD_FORWARD_FRAME_DATA 3       /* ForwardFrame.data */
#define API_FIELD_FORWARD_FRAME_CONNECTED 5  /* ForwardFrame.connected */

/* Protobuf's wire types that api writes. */
#define API_WIRE_VARINT 0
#define API_WIRE_LEN 2
/* The one-byte tag of `field` (below 16) with wire type `wire`. */
#define API_TAG(field, wire) ((uint8_t) (((unsigned) (field) << 3) | (wire)))

/* The longest header api_field_header writes: a tag and a 64-bit varint. */
#define API_FIELD_HEADER_MAX 11

/* Writes the header (one-byte tag, varint length) of the length-delimited
 * field `field` (an API_FIELD_* constant) holding `len` bytes into `head`
 * (API_FIELD_HEADER_MAX bytes); returns its size. */
size_t api_field_header (uint8_t *head, uint32_t field, size_t len);

#endif
