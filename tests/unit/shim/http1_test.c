/* http1_test: the parser of sandbox-written HTTP (shim/http1.c) — response
 * heads found and parsed, every malformed form and every limit refused
 * with its reason, chunked bodies decoded whole in any split, and their
 * malformed forms refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shim/http1.h"

/* ---- heads ------------------------------------------------------------------------- */

/* Scans and parses `text` as a whole head: the parse's result (the scan's
 * when it found no head). The copy parsed stays in *keep (free it). */
static int
parse (const char *text, http1_head_t *h, char **keep)
{
  size_t len = strlen (text);
  char *buf = malloc (len + 1);
  memcpy (buf, text, len + 1);
  *keep = buf;
  size_t scanned = 0, head_len = 0;
  int rc = http1_head_scan (buf, len, &scanned, &head_len);
  if (rc < 0)
    return rc;
  return http1_head_parse (buf, head_len, h);
}

/* parse() that must fail with `want`; its reason contains `why`. */
static void
refused (const char *text, int want, const char *why)
{
  http1_head_t h;
  char *buf = NULL;
  int rc = parse (text, &h, &buf);
  if (rc != want)
    fail_msg ("`%s`: %d, not %d", text, rc, want);
  if (why != NULL && (h.error == NULL || strstr (h.error, why) == NULL))
    fail_msg ("`%s`: reason `%s`, not `%s`", text, h.error ? h.error : "(none)", why);
  free (buf);
}

static const char *
header (const http1_head_t *h, const char *name)
{
  for (size_t i = 0; i < h->n_header; i++)
    if (strcmp (h->header[i].name, name) == 0)
      return h->header[i].value;
  return NULL;
}

static void
test_a_head_is_parsed_with_its_headers_and_framing (void **state)
{
  (void) state;
  http1_head_t h;
  char *buf;
  assert_int_equal (parse ("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Blank:  \t padded \t \r\n"
                           "Content-Length: 12\r\nConnection: close, X-Hop\r\n\r\n",
                           &h, &buf),
                    0);
  assert_int_equal (h.status, 200);
  assert_int_equal (h.minor, 1);
  assert_int_equal (h.n_header, 4);
  assert_string_equal (header (&h, "Content-Type"), "text/plain");
  assert_string_equal (header (&h, "X-Blank"), "padded");
  assert_int_equal (h.framing, HTTP1_BODY_LENGTH);
  assert_int_equal (h.content_length, 12);
  assert_true (http1_conn_names_has (&h.conn, "x-hop"));
  assert_true (http1_conn_names_has (&h.conn, "close"));
  assert_false (http1_conn_names_has (&h.conn, "x-ho"));
  free (buf);

  assert_int_equal (parse ("HTTP/1.0 404 \r\n\r\n", &h, &buf), 0);
  assert_int_equal (h.status, 404);
  assert_int_equal (h.minor, 0);
  assert_int_equal (h.framing, HTTP1_BODY_EOF);
  free (buf);

  assert_int_equal (parse ("HTTP/1.1 204\r\nTransfer-Encoding: Chunked\r\n\r\n", &h, &buf), 0);
  assert_int_equal (h.status, 204);
  assert_int_equal (h.framing, HTTP1_BODY_CHUNKED);
  free (buf);
}

static void
test_the_end_of_a_head_is_found_in_any_split (void **state)
{
  (void) state;
  const char *text = "HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody";
  size_t head = strlen (text) - 4;
  for (size_t cut = 1; cut < strlen (text); cut++)
    {
      size_t scanned = 0, head_len = 0;
      int rc = http1_head_scan (text, cut, &scanned, &head_len);
      if (cut < head)
        assert_int_equal (rc, -EAGAIN);
      else
        {
          assert_int_equal (rc, 0);
          assert_int_equal (head_len, head);
          continue;
        }
      assert_int_equal (http1_head_scan (text, strlen (text), &scanned, &head_len), 0);
      assert_int_equal (head_len, head);
    }
}

static void
test_bare_lf_is_refused (void **state)
{
  (void) state;
  refused ("HTTP/1.1 200 OK\nA: b\n\n", -EINVAL, NULL);
  refused ("HTTP/1.1 200 OK\r\nA: b\n\r\n", -EINVAL, NULL);
  refused ("HTTP/1.1 200 OK\r\nA: b\r\n\n", -EINVAL, NULL);
  /* A CR alone inside a line. */
  refused ("HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n", -EINVAL, "CR not followed by LF");
}

static void
test_control_characters_are_refused (void **state)
{
  (void) state;
  refused ("HTTP/1.1 200 OK\r\nA: b\x01\r\n\r\n", -EINVAL, "control character");
  refused ("HTTP/1.1 200 OK\r\nA: b\x7f\r\n\r\n", -EINVAL, "control character");
  /* A NUL: the parser sees it although a string would end there. */
  char text[] = "HTTP/1.1 200 OK\r\nA: b?c\r\n\r\n";
  *strchr (text, '?') = '\0';
  size_t len = sizeof text - 1, scanned = 0, head_len = 0;
  assert_int_equal (http1_head_scan (text, len, &scanned, &head_len), 0);
  http1_head_t h;
  assert_int_equal (http1_head_parse (text, head_len, &h), -EINVAL);
  /* HTAB and obs-text are allowed in values. */
  http1_head_t ok;
  char *buf;
  assert_int_equal (parse ("HTTP/1.1 200 OK\r\nA: b\tc \xe2\x82\xac\r\n\r\n", &ok, &buf), 0);
  assert_string_equal (header (&ok, "A"), "b\tc \xe2\x82\xac");
  free (buf);
}

static void
test_obs_fold_is_refused (void **state)
{
  (void) state;
  refused ("HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n", -EINVAL, "obs-fold");
  refused ("HTTP/1.1 200 OK\r\nA: b\r\n\tc\r\n\r\n", -EINVAL, "obs-fold");
  refused ("HTTP/1.1 200 OK\r\n A: b\r\n\r\n", -EINVAL, "obs-fold");
}

static void
test_bad_header_lines_are_refused (void **state)
{
  (void) state;
  refused ("HTTP/1.1 200 OK\r\n: b\r\n\r\n", -EINVAL, "without a name");
  refused ("HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", -EINVAL, "without a colon");
  refused ("HTTP/1.1 200 OK\r\nNocolon\r\n\r\n", -EINVAL, "without a colon");
  refused ("HTTP/1.1 200 OK\r\nA b: c\r\n\r\n", -EINVAL, "may not hold");
  refused ("HTTP/1.1 200 OK\r\nA : b\r\n\r\n", -EINVAL, "and its colon");
  refused ("HTTP/1.1 200 OK\r\nA\t: b\r\n\r\n", -EINVAL, "and its colon");
  refused ("HTTP/1.1 200 OK\r\nA(b): c\r\n\r\n", -EINVAL, "may not hold");
}

static void
test_bad_status_lines_are_refused (void **state)
{
  (void) state;
  static const char *const bad[] = {
      "HTTP/1.1 20 OK\r\n\r\n",   "HTTP/1.1 2000 OK\r\n\r\n",
      "HTTP/1.1 099 OK\r\n\r\n",  "HTTP/1.1 abc OK\r\n\r\n",
      "HTTP/1.1  200 OK\r\n\r\n", "HTTP/1.1 -20 OK\r\n\r\n",
      "HTTP/2 200 OK\r\n\r\n",    "HTTP/2.0 200 OK\r\n\r\n",
      "http/1.1 200 OK\r\n\r\n",  "HTTP/1.x 200 OK\r\n\r\n",
      "HTTP/1.1\t200 OK\r\n\r\n", "HTTP/1.1 200\tOK\r\n\r\n",
      " HTTP/1.1 200 OK\r\n\r\n", "\r\n\r\n",
      "ICY 200 OK\r\n\r\n",       "HTTP/1.1 20x OK\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    refused (bad[i], -EINVAL, NULL);
  http1_head_t h;
  char *buf;
  assert_int_equal (parse ("HTTP/1.1 999 Whatever\r\n\r\n", &h, &buf), 0);
  assert_int_equal (h.status, 999);
  free (buf);
}

static void
test_duplicate_content_length_equal_is_one_conflicting_refused (void **state)
{
  (void) state;
  http1_head_t h;
  char *buf;
  assert_int_equal (parse ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", &h, &buf), 0);
  assert_int_equal (h.framing, HTTP1_BODY_LENGTH);
  assert_int_equal (h.content_length, 5);
  free (buf);
  assert_int_equal (parse ("HTTP/1.1 200 OK\r\nContent-Length: 7 , 7\r\n\r\n", &h, &buf), 0);
  assert_int_equal (h.content_length, 7);
  free (buf);
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", -EINVAL, "differ");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", -EINVAL, "differ");
}

static void
test_bad_content_lengths_are_refused (void **state)
{
  (void) state;
  refused ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", -EINVAL, "not a number");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n", -EINVAL, "not a number");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n", -EINVAL, "not a number");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n", -EINVAL, "not a number");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\n", -EINVAL, "not a number");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n", -EINVAL, "not a number");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", -EINVAL, "overflows");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\n", -EINVAL, "overflows");
  http1_head_t h;
  char *buf;
  assert_int_equal (parse ("HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775807\r\n\r\n", &h, &buf), 0);
  assert_true (h.content_length == HTTP1_MAX_LENGTH);
  free (buf);
}

static void
test_transfer_encoding_other_than_chunked_or_with_a_length_is_refused (void **state)
{
  (void) state;
  refused ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", -EINVAL,
           "both Content-Length and Transfer-Encoding");
  refused ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", -EINVAL,
           "both Content-Length and Transfer-Encoding");
  refused ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", -EINVAL, "other than chunked");
  refused ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", -EINVAL, "other than chunked");
  refused ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", -EINVAL, "other than chunked");
  refused ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", -EINVAL, "twice");
  refused ("HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n", -EINVAL, "other than chunked");
}

static void
test_a_head_over_its_cap_is_refused_also_a_1_mib_header (void **state)
{
  (void) state;
  size_t big = 1024 * 1024;
  char *text = malloc (big + 64);
  int n = snprintf (text, big + 64, "HTTP/1.1 200 OK\r\nX-Big: ");
  memset (text + n, 'h', big);
  strcpy (text + n + big, "\r\n\r\n");
  size_t scanned = 0, head_len = 0;
  /* Refused once HTTP1_MAX_HEAD bytes are there without an end, whatever
   * follows them. */
  assert_int_equal (http1_head_scan (text, HTTP1_MAX_HEAD - 1, &scanned, &head_len), -EAGAIN);
  assert_int_equal (http1_head_scan (text, HTTP1_MAX_HEAD, &scanned, &head_len), -E2BIG);
  scanned = 0;
  assert_int_equal (http1_head_scan (text, strlen (text), &scanned, &head_len), -E2BIG);
  assert_true (scanned <= HTTP1_MAX_HEAD);
  free (text);

  /* A head of exactly HTTP1_MAX_HEAD bytes passes. */
  text = malloc (HTTP1_MAX_HEAD + 1);
  n = snprintf (text, HTTP1_MAX_HEAD, "HTTP/1.1 200 OK\r\nX-Big: ");
  memset (text + n, 'h', HTTP1_MAX_HEAD - (size_t) n - 4);
  memcpy (text + HTTP1_MAX_HEAD - 4, "\r\n\r\n", 5);
  scanned = 0;
  assert_int_equal (http1_head_scan (text, HTTP1_MAX_HEAD, &scanned, &head_len), 0);
  assert_int_equal (head_len, HTTP1_MAX_HEAD);
  http1_head_t h;
  assert_int_equal (http1_head_parse (text, head_len, &h), 0);
  assert_int_equal (strlen (header (&h, "X-Big")), HTTP1_MAX_HEAD - (size_t) n - 4);
  free (text);
}

/* A head with `n` header lines. */
static char *
head_with (size_t n)
{
  size_t cap = 64 + n * 32;
  char *text = malloc (cap);
  size_t len = (size_t) snprintf (text, cap, "HTTP/1.1 200 OK\r\n");
  for (size_t i = 0; i < n; i++)
    {
      len += (size_t) snprintf (text + len, cap - len, "X-%zu", i);
      len += (size_t) snprintf (text + len, cap - len, ": v\r\n");
    }
  snprintf (text + len, cap - len, "\r\n");
  return text;
}

static void
test_too_many_headers_are_refused (void **state)
{
  (void) state;
  char *text = head_with (HTTP1_MAX_HEADERS);
  http1_head_t h;
  char *buf;
  assert_int_equal (parse (text, &h, &buf), 0);
  assert_int_equal (h.n_header, HTTP1_MAX_HEADERS);
  free (buf);
  free (text);
  text = head_with (HTTP1_MAX_HEADERS + 1);
  refused (text, -E2BIG, "header lines");
  free (text);
}

static void
test_too_many_connection_names_are_refused (void **state)
{
  (void) state;
  char value[HTTP1_MAX_CONN_NAMES * 8 + 64];
  size_t len = 0;
  for (int i = 0; i < HTTP1_MAX_CONN_NAMES; i++)
    len += (size_t) snprintf (value + len, sizeof value - len, "x-%d, ", i);
  char text[sizeof value + 64];
  snprintf (text, sizeof text, "HTTP/1.1 200 OK\r\nConnection: %s\r\n\r\n", value);
  http1_head_t h;
  char *buf;
  assert_int_equal (parse (text, &h, &buf), 0);
  assert_int_equal (h.conn.n, HTTP1_MAX_CONN_NAMES);
  free (buf);
  snprintf (text, sizeof text, "HTTP/1.1 200 OK\r\nConnection: %s\r\nConnection: one-more\r\n\r\n", value);
  refused (text, -E2BIG, "Connection");
}

static void
test_hop_by_hop_names (void **state)
{
  (void) state;
  assert_true (http1_hop_by_hop ("Connection"));
  assert_true (http1_hop_by_hop ("TRANSFER-ENCODING"));
  assert_true (http1_hop_by_hop ("proxy-authenticate"));
  assert_false (http1_hop_by_hop ("Content-Length"));
  assert_false (http1_hop_by_hop ("X-Connection"));
}

/* ---- chunked bodies ---------------------------------------------------------------- */

/* Decodes `body` fed in pieces of at most `step` bytes: the decoder's last
 * result; the data in out (NUL-terminated), what was used in *used_all. */
static int
decode (const char *body, size_t len, size_t step, char *out, size_t cap, http1_chunked_t *c, size_t *used_all)
{
  *c = (http1_chunked_t) HTTP1_CHUNKED_INIT;
  size_t at = 0, n = 0;
  int rc = 0;
  while (at < len)
    {
      size_t piece = len - at < step ? len - at : step;
      size_t used = 0, data = 0;
      rc = http1_chunked_feed (c, (const uint8_t *) body + at, piece, &used, &data);
      assert_true (used <= piece);
      assert_true (data == 0 || data == used);
      if (data > 0)
        {
          assert_true (n + data < cap);
          memcpy (out + n, body + at, data);
          n += data;
        }
      at += used;
      if (rc != 0)
        break;
      assert_true (used > 0 || piece == 0);
    }
  out[n] = '\0';
  *used_all = at;
  return rc;
}

static void
test_a_chunked_body_decodes_whole_in_any_split (void **state)
{
  (void) state;
  const char *body = "5\r\nhello\r\n1;name=value;x\r\n \r\nA \t; ext\r\n0123456789\r\n"
                     "00\r\nX-Trailer: yes\r\nY: z\r\n\r\nafter";
  size_t len = strlen (body);
  for (size_t step = 1; step <= len; step++)
    {
      char out[64];
      http1_chunked_t c;
      size_t used = 0;
      assert_int_equal (decode (body, len, step, out, sizeof out, &c, &used), 1);
      assert_string_equal (out, "hello 0123456789");
      /* Nothing after the body's end is taken. */
      assert_int_equal (used, len - strlen ("after"));
      size_t u = 1, d = 1;
      assert_int_equal (http1_chunked_feed (&c, (const uint8_t *) "x", 1, &u, &d), 1);
      assert_int_equal (u, 0);
    }
  /* Upper-case hex and leading zeros. */
  char out[64];
  http1_chunked_t c;
  size_t used;
  const char *b2 = "0000B\r\nhello world\r\n0\r\n\r\n";
  assert_int_equal (decode (b2, strlen (b2), 3, out, sizeof out, &c, &used), 1);
  assert_string_equal (out, "hello world");
}

static void
test_a_missing_final_chunk_never_ends_the_body (void **state)
{
  (void) state;
  static const char *const cut[]
      = {"5\r\nhello\r\n", "5\r\nhello\r\n0\r\n", "5\r\nhello\r\n0\r\nX: y\r\n", "5\r\nhel"};
  for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++)
    {
      char out[64];
      http1_chunked_t c;
      size_t used;
      assert_int_equal (decode (cut[i], strlen (cut[i]), 4, out, sizeof out, &c, &used), 0);
      assert_int_equal (used, strlen (cut[i]));
    }
}

/* decode() must fail with `want` and reason `why`. */
static void
chunk_refused (const char *body, int want, const char *why)
{
  char out[256];
  http1_chunked_t c;
  size_t used;
  int rc = decode (body, strlen (body), 7, out, sizeof out, &c, &used);
  if (rc != want)
    fail_msg ("`%s`: %d, not %d", body, rc, want);
  if (c.error == NULL || strstr (c.error, why) == NULL)
    fail_msg ("`%s`: reason `%s`, not `%s`", body, c.error ? c.error : "(none)", why);
  /* A failed decoder stays failed. */
  size_t u = 1, d = 1;
  assert_true (http1_chunked_feed (&c, (const uint8_t *) "0\r\n\r\n", 5, &u, &d) < 0);
  assert_int_equal (u + d, 0);
}

static void
test_bad_chunk_sizes_are_refused (void **state)
{
  (void) state;
  chunk_refused ("-1\r\nx\r\n0\r\n\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("+1\r\nx\r\n0\r\n\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("0x10\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("zz\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("\r\n", -EINVAL, "not hexadecimal");
  chunk_refused (" 5\r\nhello\r\n", -EINVAL, "not hexadecimal");
  chunk_refused (";ext\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("5 5\r\nhello\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("10000000000000000\r\n", -EINVAL, "overflows");
  chunk_refused ("8000000000000000\r\n", -EINVAL, "overflows");
  chunk_refused ("ffffffffffffffffffff\r\n", -EINVAL, "overflows");
  /* 2^63 - 1 is a size; nothing larger. */
  http1_chunked_t c = HTTP1_CHUNKED_INIT;
  size_t u, d;
  const char *line = "7fffffffffffffff\r\n";
  assert_int_equal (http1_chunked_feed (&c, (const uint8_t *) line, strlen (line), &u, &d), 0);
  assert_true (http1_chunked_in_data (&c));
  assert_true (c.remaining == HTTP1_MAX_LENGTH);
}

static void
test_bad_chunk_framing_is_refused (void **state)
{
  (void) state;
  chunk_refused ("5\nhello\r\n0\r\n\r\n", -EINVAL, "not hexadecimal");
  chunk_refused ("5\r\rhello\r\n", -EINVAL, "not ended by CRLF");
  chunk_refused ("5\r\nhelloX\r\n0\r\n\r\n", -EINVAL, "not followed by CRLF");
  chunk_refused ("5\r\nhello\n0\r\n\r\n", -EINVAL, "not followed by CRLF");
  chunk_refused ("5;a\nb\r\nhello\r\n", -EINVAL, "control character in a chunk extension");
  chunk_refused ("5;a\x01\r\nhello\r\n", -EINVAL, "control character in a chunk extension");
  chunk_refused ("0\r\nX: y\n\r\n", -EINVAL, "control character in a trailer");
  chunk_refused ("0\r\nX: y\r\r\n", -EINVAL, "not ended by CRLF");
  chunk_refused ("0\r\n\rx", -EINVAL, "trailers not ended by CRLF");
}

static void
test_chunk_lines_and_trailers_over_their_caps_are_refused (void **state)
{
  (void) state;
  /* An extension up to the cap passes; one byte more does not. */
  char *line = malloc (HTTP1_MAX_CHUNK_LINE + 16);
  memset (line, 'e', HTTP1_MAX_CHUNK_LINE + 16);
  memcpy (line, "1;", 2);
  memcpy (line + HTTP1_MAX_CHUNK_LINE - 2, "\r\n", 2);
  http1_chunked_t c = HTTP1_CHUNKED_INIT;
  size_t u, d;
  assert_int_equal (http1_chunked_feed (&c, (uint8_t *) line, HTTP1_MAX_CHUNK_LINE, &u, &d), 0);
  assert_int_equal (u, HTTP1_MAX_CHUNK_LINE);
  assert_true (http1_chunked_in_data (&c));
  memcpy (line + HTTP1_MAX_CHUNK_LINE - 2, "ee\r\n", 4);
  c = (http1_chunked_t) HTTP1_CHUNKED_INIT;
  assert_int_equal (http1_chunked_feed (&c, (uint8_t *) line, HTTP1_MAX_CHUNK_LINE + 2, &u, &d), -E2BIG);
  assert_string_equal (c.error, "a chunk-size line over its cap");
  free (line);

  /* Trailers: a 1 MiB one is cut at the cap. */
  size_t big = 1024 * 1024;
  char *t = malloc (big);
  memset (t, 't', big);
  memcpy (t, "0\r\nX: ", 6);
  c = (http1_chunked_t) HTTP1_CHUNKED_INIT;
  size_t at = 0;
  int rc = 0;
  while (rc == 0 && at < big)
    {
      rc = http1_chunked_feed (&c, (uint8_t *) t + at, big - at, &u, &d);
      at += u;
    }
  assert_int_equal (rc, -E2BIG);
  assert_true (at <= HTTP1_MAX_TRAILERS + 3);
  free (t);
}

static void
test_chunk_data_is_handed_out_in_place_up_to_the_chunk (void **state)
{
  (void) state;
  http1_chunked_t c = HTTP1_CHUNKED_INIT;
  const char *body = "3\r\nabcdef";
  size_t u, d;
  assert_int_equal (http1_chunked_feed (&c, (const uint8_t *) body, strlen (body), &u, &d), 0);
  assert_int_equal (u, 3);
  assert_int_equal (d, 0);
  assert_int_equal (http1_chunked_feed (&c, (const uint8_t *) body + 3, strlen (body) - 3, &u, &d), 0);
  assert_int_equal (u, 3);
  assert_int_equal (d, 3);
  assert_false (http1_chunked_in_data (&c));
  /* "def" is no CRLF. */
  assert_int_equal (http1_chunked_feed (&c, (const uint8_t *) body + 6, 3, &u, &d), -EINVAL);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_a_head_is_parsed_with_its_headers_and_framing),
      cmocka_unit_test (test_the_end_of_a_head_is_found_in_any_split),
      cmocka_unit_test (test_bare_lf_is_refused),
      cmocka_unit_test (test_control_characters_are_refused),
      cmocka_unit_test (test_obs_fold_is_refused),
      cmocka_unit_test (test_bad_header_lines_are_refused),
      cmocka_unit_test (test_bad_status_lines_are_refused),
      cmocka_unit_test (test_duplicate_content_length_equal_is_one_conflicting_refused),
      cmocka_unit_test (test_bad_content_lengths_are_refused),
      cmocka_unit_test (test_transfer_encoding_other_than_chunked_or_with_a_length_is_refused),
      cmocka_unit_test (test_a_head_over_its_cap_is_refused_also_a_1_mib_header),
      cmocka_unit_test (test_too_many_headers_are_refused),
      cmocka_unit_test (test_too_many_connection_names_are_refused),
      cmocka_unit_test (test_hop_by_hop_names),
      cmocka_unit_test (test_a_chunked_body_decodes_whole_in_any_split),
      cmocka_unit_test (test_a_missing_final_chunk_never_ends_the_body),
      cmocka_unit_test (test_bad_chunk_sizes_are_refused),
      cmocka_unit_test (test_bad_chunk_framing_is_refused),
      cmocka_unit_test (test_chunk_lines_and_trailers_over_their_caps_are_refused),
      cmocka_unit_test (test_chunk_data_is_handed_out_in_place_up_to_the_chunk),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
