/* Fuzz target: the parser of sandbox-written HTTP (shim/http1.h) — the
 * bytes a server inside a sandbox answers the port proxy with.
 *
 * Input: byte 0 selects (mod 2), byte 1 is a split step; the rest is the
 * server's bytes.
 *
 *   0 a response head: http1_head_scan over the bytes as they would come
 *     in pieces of 1 + step bytes, then http1_head_parse of what it found
 *   1 a chunked body: http1_chunked_feed over the bytes in pieces of
 *     1 + step bytes, and again whole
 *
 * Besides memory errors, checks what the proxy relies on: the scan finds
 * the same end in pieces as whole and never looks past HTTP1_MAX_HEAD; a
 * parsed head has a status from 100 to 999, at most HTTP1_MAX_HEADERS
 * headers whose names are non-empty and whose values hold no CR or LF,
 * and a framing its headers agree with; a chunked decoder takes no more
 * than it is given, hands out data only inside a chunk, and decodes the
 * same data to the same end however the bytes are split.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim/http1.h"

#define FUZZ_TARGET "http1_fuzz"
#include "tests/fuzz/check.h"

/* Scans in pieces of `step`: the result, the head's length in *head_len. */
static int
scan_in_pieces (const char *buf, size_t len, size_t step, size_t *head_len)
{
  size_t scanned = 0, have = 0;
  int rc = -EAGAIN;
  while (rc == -EAGAIN && have < len)
    {
      have = len - have < step ? len : have + step;
      rc = http1_head_scan (buf, have, &scanned, head_len);
      CHECK (scanned <= have && scanned <= HTTP1_MAX_HEAD);
    }
  return rc;
}

static void
fuzz_head (const uint8_t *data, size_t size, size_t step)
{
  char *buf = malloc (size + 1);
  memcpy (buf, data, size);
  size_t whole_len = 0, piece_len = 0, scanned = 0;
  int whole = http1_head_scan (buf, size, &scanned, &whole_len);
  int pieces = scan_in_pieces (buf, size, step, &piece_len);
  CHECK (whole == pieces);
  if (whole != 0)
    {
      CHECK (whole == -EAGAIN || whole == -EINVAL || whole == -E2BIG);
      free (buf);
      return;
    }
  CHECK (whole_len == piece_len && whole_len >= 4 && whole_len <= HTTP1_MAX_HEAD && whole_len <= size);
  CHECK (memcmp (buf + whole_len - 4, "\r\n\r\n", 4) == 0);
  http1_head_t h;
  int rc = http1_head_parse (buf, whole_len, &h);
  if (rc < 0)
    {
      CHECK ((rc == -EINVAL || rc == -E2BIG) && h.error != NULL);
      free (buf);
      return;
    }
  CHECK (h.status >= 100 && h.status <= 999 && h.minor <= 9);
  CHECK (h.n_header <= HTTP1_MAX_HEADERS && h.conn.n <= HTTP1_MAX_CONN_NAMES && !h.conn.over);
  bool te = false, cl = false;
  for (size_t i = 0; i < h.n_header; i++)
    {
      const char *name = h.header[i].name, *value = h.header[i].value;
      CHECK (name[0] != '\0' && strpbrk (name, " \t:\r\n") == NULL);
      CHECK (strpbrk (value, "\r\n") == NULL);
      CHECK (name >= buf && value >= buf && value < buf + whole_len);
      te = te || strcasecmp (name, "transfer-encoding") == 0;
      cl = cl || strcasecmp (name, "content-length") == 0;
    }
  CHECK (!(te && cl));
  CHECK ((h.framing == HTTP1_BODY_CHUNKED) == te);
  CHECK ((h.framing == HTTP1_BODY_LENGTH) == cl);
  CHECK (h.content_length <= HTTP1_MAX_LENGTH && (cl || h.content_length == 0));
  free (buf);
}

/* Decodes in pieces of at most `step` bytes into out: the last result;
 * the data's length in *n. */
static int
decode (const uint8_t *data, size_t size, size_t step, uint8_t *out, size_t *n)
{
  http1_chunked_t c = HTTP1_CHUNKED_INIT;
  size_t at = 0;
  int rc = 0;
  *n = 0;
  while (rc == 0 && at < size)
    {
      size_t piece = size - at < step ? size - at : step;
      size_t used = 99, got = 99;
      bool in_data = http1_chunked_in_data (&c);
      rc = http1_chunked_feed (&c, data + at, piece, &used, &got);
      CHECK (used <= piece);
      CHECK (got == 0 || (in_data && got == used));
      CHECK (rc != 0 || used > 0);
      CHECK (rc >= 0 || c.error != NULL);
      memcpy (out + *n, data + at, got);
      *n += got;
      at += used;
    }
  return rc;
}

static void
fuzz_chunked (const uint8_t *data, size_t size, size_t step)
{
  uint8_t *a = malloc (size + 1), *b = malloc (size + 1);
  size_t na = 0, nb = 0;
  int ra = decode (data, size, size + 1, a, &na);
  int rb = decode (data, size, step, b, &nb);
  CHECK (ra == rb);
  CHECK (na <= size);
  /* Data handed out before a failure may differ by where the pieces were
   * cut; when both decoded to an end or to the input's end, they agree. */
  if (ra >= 0)
    CHECK (na == nb && memcmp (a, b, na) == 0);
  free (a);
  free (b);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  if (size < 2)
    return 0;
  size_t step = 1 + data[1];
  if (data[0] % 2 == 0)
    fuzz_head (data + 2, size - 2, step);
  else
    fuzz_chunked (data + 2, size - 2, step);
  return 0;
}
