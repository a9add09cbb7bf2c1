/* gcs parse: the pieces of the GCS client that read bytes a server sent —
 * HTTP status lines and the headers the client uses (Location, Range,
 * x-goog-hash) — plus the CRC32C and base64 codecs they need.
 *
 * Every function takes a pointer and a length (curl hands header lines
 * without a terminating NUL), never reads past the length, and refuses
 * anything malformed rather than guessing: these are the entry points to fuzz.
 * Header names are matched case-insensitively.
 *
 * Thread safety: no state except the CRC32C table, built once under
 * pthread_once; every function may be called from any thread.
 */
#ifndef SBX_GATEWAY_GCS_PARSE_H
#define SBX_GATEWAY_GCS_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* Longest header value the client keeps (a Location URI); longer is refused. */
#define GCS_HEADER_VALUE_MAX 8192

/* Parses an HTTP status line ("HTTP/1.1 308 Resume Incomplete\r\n", also
 * "HTTP/2 200"). 1 with *code (100..599) when `line` is one, 0 when it is
 * not a status line, -1 when it starts with "HTTP/" but is malformed. */
int gcs_parse_status_line (const char *line, size_t len, long *code);

/* When the header line `line` ("Name: value\r\n") has the name `name` (any
 * case), returns 1 and points *value at the value inside `line` with
 * surrounding blanks and the line end trimmed (*vlen its length); 0 when the
 * line is another header or not a header. *value is not NUL-terminated. */
int gcs_header_value (const char *line, size_t len, const char *name, const char **value, size_t *vlen);

/* Parses a resumable upload's Range header value "bytes=0-N" into the number
 * of bytes the server has committed (N + 1). 0 ok, -1 malformed (including
 * a first byte other than 0 and N + 1 overflowing). */
int gcs_parse_range (const char *value, size_t len, uint64_t *committed);

/* Finds "crc32c=<base64 of 4 big-endian bytes>" among the comma-separated
 * hashes of an x-goog-hash value ("crc32c=n03x6A==,md5=..."). 1 found with
 * *crc, 0 when the value has no crc32c, -1 when the crc32c is malformed. */
int gcs_parse_goog_hash_crc32c (const char *value, size_t len, uint32_t *crc);

/* CRC32C (Castagnoli, reflected, as GCS uses): start with crc = 0 and feed
 * the data in any number of pieces: gcs_crc32c (gcs_crc32c (0, a), b). */
uint32_t gcs_crc32c (uint32_t crc, const uint8_t *data, size_t len);

/* For tests: non-zero makes gcs_crc32c use its table path even where the
 * CPU has the SSE4.2 crc32 instruction. */
extern int gcs_crc32c_force_sw;

/* The base64 (standard alphabet, padded) of a CRC32C in big-endian order,
 * as GCS writes it: 8 characters and a NUL into `out`. */
void gcs_crc32c_base64 (uint32_t crc, char out[9]);

/* Base64url without padding (RFC 7515 §2) of `len` bytes. Returns a string
 * the caller frees, or NULL when out of memory. */
char *gcs_base64url (const uint8_t *data, size_t len);

#endif
