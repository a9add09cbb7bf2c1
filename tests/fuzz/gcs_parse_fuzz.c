/* Fuzz target: the GCS client's parsers of server bytes (gateway/store/gcs/parse.h).
 *
 * Input: byte 0 selects the function (mod 6), byte 1 is a parameter, the
 * rest is the data, passed as an exact-size copy without a NUL terminator
 * (curl hands header lines that way), so ASan sees any read past `len`.
 *
 *   0 gcs_parse_status_line
 *   1 gcs_header_value with the name Location / Range / x-goog-hash /
 *     Content-Length / "" (parameter % 5)
 *   2 gcs_parse_range
 *   3 gcs_parse_goog_hash_crc32c
 *   4 gcs_crc32c: table and hardware paths agree, and feeding the data in
 *     two pieces (split at parameter) gives the same CRC
 *   5 gcs_base64url and gcs_crc32c_base64: length and alphabet
 *
 * The token responses' JSON is parsed inside gateway/store/gcs/auth.c (static,
 * from a gcs_resp_t) and is not reachable from here.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/store/gcs/parse.h"

#define FUZZ_TARGET "gcs_parse_fuzz"
#include "tests/fuzz/check.h"

static const char *const names[] = {"Location", "Range", "x-goog-hash", "Content-Length", ""};

static int
is_b64url (char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  if (size < 2)
    return 0;
  unsigned sel = data[0] % 6, param = data[1];
  size_t len = size - 2;
  char *buf = malloc (len ? len : 1);
  memcpy (buf, data + 2, len);

  switch (sel)
    {
    case 0:
      {
        long code = -1;
        int r = gcs_parse_status_line (buf, len, &code);
        CHECK (r >= -1 && r <= 1);
        if (r == 1)
          CHECK (code >= 100 && code <= 599 && len >= 5 && memcmp (buf, "HTTP/", 5) == 0);
        break;
      }
    case 1:
      {
        const char *name = names[param % 5];
        const char *value = NULL;
        size_t vlen = 0;
        int r = gcs_header_value (buf, len, name, &value, &vlen);
        CHECK (r == 0 || r == 1);
        if (r == 1)
          {
            CHECK (value >= buf && value + vlen <= buf + len);
            CHECK (len > strlen (name) && strncasecmp (buf, name, strlen (name)) == 0);
            if (vlen > 0)
              CHECK (value[0] != ' ' && value[0] != '\t' && value[vlen - 1] != '\n' && value[vlen - 1] != '\r');
          }
        break;
      }
    case 2:
      {
        uint64_t committed = 0;
        int r = gcs_parse_range (buf, len, &committed);
        CHECK (r == 0 || r == -1);
        if (r == 0)
          CHECK (committed >= 1);
        break;
      }
    case 3:
      {
        uint32_t crc = 0;
        int r = gcs_parse_goog_hash_crc32c (buf, len, &crc);
        CHECK (r >= -1 && r <= 1);
        if (r == 1)
          {
            /* What we would send for that CRC parses back to it. */
            char b64[9], hdr[16];
            gcs_crc32c_base64 (crc, b64);
            int n = snprintf (hdr, sizeof hdr, "crc32c=%s", b64);
            uint32_t back = 0;
            CHECK (gcs_parse_goog_hash_crc32c (hdr, (size_t) n, &back) == 1 && back == crc);
          }
        break;
      }
    case 4:
      {
        const uint8_t *d = (const uint8_t *) buf;
        gcs_crc32c_force_sw = 0;
        uint32_t hw = gcs_crc32c (0, d, len);
        size_t cut = len ? (size_t) param % (len + 1) : 0;
        uint32_t split = gcs_crc32c (gcs_crc32c (0, d, cut), d + cut, len - cut);
        gcs_crc32c_force_sw = 1;
        uint32_t sw = gcs_crc32c (0, d, len);
        uint32_t sw_split = gcs_crc32c (gcs_crc32c (0, d, cut), d + cut, len - cut);
        gcs_crc32c_force_sw = 0;
        CHECK (hw == sw && hw == split && sw == sw_split);
        break;
      }
    case 5:
      {
        char *s = gcs_base64url ((const uint8_t *) buf, len);
        CHECK (s != NULL);
        size_t want = len / 3 * 4 + (len % 3 == 0 ? 0 : len % 3 + 1);
        CHECK (strlen (s) == want);
        for (size_t i = 0; s[i]; i++)
          CHECK (is_b64url (s[i]));
        free (s);
        char b64[9];
        uint32_t c = 0;
        memcpy (&c, buf, len < 4 ? len : 4);
        gcs_crc32c_base64 (c, b64);
        CHECK (strlen (b64) == 8 && b64[6] == '=' && b64[7] == '=');
        break;
      }
    }
  free (buf);
  return 0;
}
