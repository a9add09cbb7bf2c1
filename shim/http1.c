/* http1: the response heads and chunked bodies a server inside a sandbox
 * writes, parsed by hand-written, bounded scanners (no sscanf, no strtok:
 * every byte is looked at once, every count checked against its cap).
 * What is refused and why: shim/http1.h. No I/O, no allocation, no state
 * beyond the caller's structs.
 */
#include "shim/http1.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* ---- characters ------------------------------------------------------------------- */

static bool
is_blank (char c)
{
  return c == ' ' || c == '\t';
}

/* A control character a line may not hold (HTAB may). */
static bool
is_ctl (unsigned char c)
{
  return (c < 0x20 && c != '\t') || c == 0x7f;
}

static bool
is_digit (char c)
{
  return c >= '0' && c <= '9';
}

/* A token character (RFC 9110 §5.6.2): what a header name is made of. */
static bool
is_tchar (char c)
{
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit (c))
    return true;
  return c != '\0' && strchr ("!#$%&'*+-.^_`|~", c) != NULL;
}

/* The value of a hexadecimal digit, -1 for anything else. */
static int
hex_value (char c)
{
  if (is_digit (c))
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* ---- the head ---------------------------------------------------------------------- */

int
http1_head_scan (const char *buf, size_t len, size_t *scanned, size_t *head_len)
{
  size_t end = len < HTTP1_MAX_HEAD ? len : HTTP1_MAX_HEAD;
  size_t i = *scanned;
  for (; i < end; i++)
    {
      if (buf[i] != '\n')
        continue;
      if (i == 0 || buf[i - 1] != '\r')
        {
          *scanned = i;
          return -EINVAL;
        }
      if (i >= 3 && buf[i - 2] == '\n' && buf[i - 3] == '\r')
        {
          *scanned = i + 1;
          *head_len = i + 1;
          return 0;
        }
    }
  *scanned = i;
  return end == HTTP1_MAX_HEAD ? -E2BIG : -EAGAIN;
}

static int
head_fail (http1_head_t *h, int rc, const char *why)
{
  h->error = why;
  return rc;
}

/* The next line of buf[*at..end): NUL-terminated in place at its CR,
 * *at moved past its LF. -EINVAL at a control character, a CR without LF,
 * or no line end before `end`. */
static int
take_line (char *buf, size_t end, size_t *at, char **line, http1_head_t *h)
{
  for (size_t i = *at; i < end; i++)
    {
      unsigned char c = (unsigned char) buf[i];
      if (c == '\r')
        {
          if (i + 1 >= end || buf[i + 1] != '\n')
            return head_fail (h, -EINVAL, "a CR not followed by LF");
          buf[i] = '\0';
          *line = buf + *at;
          *at = i + 2;
          return 0;
        }
      if (c == '\n')
        return head_fail (h, -EINVAL, "a line ended by a bare LF");
      if (is_ctl (c))
        return head_fail (h, -EINVAL, "a control character in the head");
    }
  return head_fail (h, -EINVAL, "a line without its end");
}

/* "HTTP/1.<d> <ddd>[ <reason>]". */
static int
parse_status_line (const char *s, http1_head_t *h)
{
  if (strncmp (s, "HTTP/1.", 7) != 0 || !is_digit (s[7]) || s[8] != ' ')
    return head_fail (h, -EINVAL, "a status line not opening with HTTP/1.x");
  const char *code = s + 9;
  if (!is_digit (code[0]) || code[0] == '0' || !is_digit (code[1]) || !is_digit (code[2]))
    return head_fail (h, -EINVAL, "a status code that is not three digits from 100");
  if (code[3] != '\0' && code[3] != ' ')
    return head_fail (h, -EINVAL, "a status code that is not three digits from 100");
  h->minor = (unsigned) (s[7] - '0');
  h->status = (unsigned) ((code[0] - '0') * 100 + (code[1] - '0') * 10 + (code[2] - '0'));
  return 0;
}

/* One header line, "Name: value", cut apart in place into the next slot. */
static int
parse_header_line (char *line, http1_head_t *h)
{
  if (is_blank (line[0]))
    return head_fail (h, -EINVAL, "a header line continuing the last (obs-fold)");
  size_t n = 0;
  while (is_tchar (line[n]))
    n++;
  if (n == 0)
    return head_fail (h, -EINVAL, "a header line without a name");
  if (line[n] != ':')
    {
      const char *colon = strchr (line + n, ':');
      if (colon == NULL)
        return head_fail (h, -EINVAL, "a header line without a colon");
      if (strspn (line + n, " \t") == (size_t) (colon - (line + n)))
        return head_fail (h, -EINVAL, "blanks between a header's name and its colon");
      return head_fail (h, -EINVAL, "a header name with a character a name may not hold");
    }
  if (h->n_header == HTTP1_MAX_HEADERS)
    return head_fail (h, -E2BIG, "more header lines than the proxy takes");
  line[n] = '\0';
  char *value = line + n + 1;
  while (is_blank (*value))
    value++;
  size_t len = strlen (value);
  while (len > 0 && is_blank (value[len - 1]))
    value[--len] = '\0';
  h->header[h->n_header].name = line;
  h->header[h->n_header].value = value;
  h->n_header++;
  return 0;
}

/* A Content-Length value: one length, or a list of equal ones ("5, 5");
 * equal to *length when *seen. */
static int
parse_content_length (const char *v, bool *seen, uint64_t *length, http1_head_t *h)
{
  for (const char *p = v;;)
    {
      while (is_blank (*p))
        p++;
      if (!is_digit (*p))
        return head_fail (h, -EINVAL, "a Content-Length that is not a number");
      uint64_t n = 0;
      for (; is_digit (*p); p++)
        {
          uint64_t d = (uint64_t) (*p - '0');
          if (n > (HTTP1_MAX_LENGTH - d) / 10)
            return head_fail (h, -EINVAL, "a Content-Length that overflows");
          n = n * 10 + d;
        }
      if (*seen && n != *length)
        return head_fail (h, -EINVAL, "Content-Length values that differ");
      *seen = true;
      *length = n;
      while (is_blank (*p))
        p++;
      if (*p == '\0')
        return 0;
      if (*p != ',')
        return head_fail (h, -EINVAL, "a Content-Length that is not a number");
      p++;
    }
}

/* The body's framing and the Connection names, from the parsed headers. */
static int
parse_framing (http1_head_t *h)
{
  bool length = false, chunked = false;
  for (size_t i = 0; i < h->n_header; i++)
    {
      const char *name = h->header[i].name, *value = h->header[i].value;
      if (strcasecmp (name, "connection") == 0)
        {
          http1_conn_names_add (&h->conn, value);
          if (h->conn.over)
            return head_fail (h, -E2BIG, "more names in Connection than the proxy takes");
        }
      else if (strcasecmp (name, "content-length") == 0)
        {
          int rc = parse_content_length (value, &length, &h->content_length, h);
          if (rc < 0)
            return rc;
        }
      else if (strcasecmp (name, "transfer-encoding") == 0)
        {
          if (chunked)
            return head_fail (h, -EINVAL, "Transfer-Encoding given twice");
          if (strcasecmp (value, "chunked") != 0)
            return head_fail (h, -EINVAL, "a transfer coding other than chunked");
          chunked = true;
        }
    }
  if (chunked && length)
    return head_fail (h, -EINVAL, "both Content-Length and Transfer-Encoding");
  h->framing = chunked ? HTTP1_BODY_CHUNKED : length ? HTTP1_BODY_LENGTH : HTTP1_BODY_EOF;
  if (!length)
    h->content_length = 0;
  return 0;
}

int
http1_head_parse (char *buf, size_t head_len, http1_head_t *h)
{
  memset (h, 0, sizeof *h);
  size_t at = 0;
  char *line = NULL;
  int rc = take_line (buf, head_len, &at, &line, h);
  if (rc < 0)
    return rc;
  if ((rc = parse_status_line (line, h)) < 0)
    return rc;
  for (;;)
    {
      if ((rc = take_line (buf, head_len, &at, &line, h)) < 0)
        return rc;
      if (line[0] == '\0')
        break;
      if ((rc = parse_header_line (line, h)) < 0)
        return rc;
    }
  if (at != head_len)
    return head_fail (h, -EINVAL, "bytes after the head's blank line");
  return parse_framing (h);
}

/* ---- header names ------------------------------------------------------------------ */

void
http1_conn_names_add (http1_conn_names_t *c, const char *value)
{
  for (const char *p = value;;)
    {
      p += strspn (p, " \t,");
      size_t len = strcspn (p, " \t,");
      if (len == 0)
        return;
      if (c->n == HTTP1_MAX_CONN_NAMES)
        {
          c->over = true;
          return;
        }
      c->name[c->n].p = p;
      c->name[c->n].len = len;
      c->n++;
      p += len;
    }
}

bool
http1_conn_names_has (const http1_conn_names_t *c, const char *name)
{
  size_t len = strlen (name);
  for (size_t i = 0; i < c->n; i++)
    if (c->name[i].len == len && strncasecmp (c->name[i].p, name, len) == 0)
      return true;
  return false;
}

bool
http1_hop_by_hop (const char *name)
{
  static const char *const names[] = {
      "connection", "keep-alive",          "proxy-connection",   "te", "trailer", "transfer-encoding",
      "upgrade",    "proxy-authorization", "proxy-authenticate",
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcasecmp (name, names[i]) == 0)
      return true;
  return false;
}

/* ---- chunked bodies ---------------------------------------------------------------- */

enum
{
  CH_SIZE,          /* the size's hex digits */
  CH_SIZE_BLANK,    /* blanks after the size, before an extension */
  CH_EXT,           /* an extension, up to the CR */
  CH_SIZE_LF,       /* the LF of the size line */
  CH_DATA,          /* the chunk's data */
  CH_DATA_CR,       /* the CRLF after it */
  CH_DATA_LF,       /* ... */
  CH_TRAILER_START, /* a trailer line's first byte, or the final CRLF */
  CH_TRAILER,       /* a trailer line, up to its CR */
  CH_TRAILER_LF,    /* its LF */
  CH_END_LF,        /* the final LF */
  CH_DONE,
  CH_FAILED,
};

static int
chunk_fail (http1_chunked_t *c, int rc, const char *why)
{
  c->state = CH_FAILED;
  c->error = why;
  return rc;
}

/* One byte of a size line (CH_SIZE .. CH_EXT). */
static int
size_line_byte (http1_chunked_t *c, char ch)
{
  if (++c->line > HTTP1_MAX_CHUNK_LINE)
    return chunk_fail (c, -E2BIG, "a chunk-size line over its cap");
  int v = c->state == CH_SIZE ? hex_value (ch) : -1;
  if (v >= 0)
    {
      if (c->remaining > (HTTP1_MAX_LENGTH - (uint64_t) v) / 16)
        return chunk_fail (c, -EINVAL, "a chunk size that overflows");
      c->remaining = c->remaining * 16 + (uint64_t) v;
      c->digits = true;
    }
  else if (!c->digits)
    return chunk_fail (c, -EINVAL, "a chunk size that is not hexadecimal");
  else if (ch == '\r')
    c->state = CH_SIZE_LF;
  else if (c->state == CH_EXT)
    {
      if (is_ctl ((unsigned char) ch))
        return chunk_fail (c, -EINVAL, "a control character in a chunk extension");
    }
  else if (ch == ';')
    c->state = CH_EXT;
  else if (is_blank (ch))
    c->state = CH_SIZE_BLANK;
  else
    return chunk_fail (c, -EINVAL, "a chunk size that is not hexadecimal");
  return 0;
}

/* One byte of the trailers (CH_TRAILER_START .. CH_TRAILER_LF). */
static int
trailer_byte (http1_chunked_t *c, char ch)
{
  if (++c->trailers > HTTP1_MAX_TRAILERS)
    return chunk_fail (c, -E2BIG, "trailers over their cap");
  if (c->state == CH_TRAILER_LF)
    {
      if (ch != '\n')
        return chunk_fail (c, -EINVAL, "a trailer line not ended by CRLF");
      c->state = CH_TRAILER_START;
    }
  else if (ch == '\r')
    c->state = c->state == CH_TRAILER_START ? CH_END_LF : CH_TRAILER_LF;
  else if (is_ctl ((unsigned char) ch))
    return chunk_fail (c, -EINVAL, "a control character in a trailer");
  else
    c->state = CH_TRAILER;
  return 0;
}

/* One framing byte, outside a chunk's data. */
static int
framing_byte (http1_chunked_t *c, char ch)
{
  switch (c->state)
    {
    case CH_SIZE:
    case CH_SIZE_BLANK:
    case CH_EXT: return size_line_byte (c, ch);
    case CH_SIZE_LF:
      if (++c->line > HTTP1_MAX_CHUNK_LINE)
        return chunk_fail (c, -E2BIG, "a chunk-size line over its cap");
      if (ch != '\n')
        return chunk_fail (c, -EINVAL, "a chunk-size line not ended by CRLF");
      c->line = 0;
      c->digits = false;
      c->state = c->remaining == 0 ? CH_TRAILER_START : CH_DATA;
      return 0;
    case CH_DATA_CR:
    case CH_DATA_LF:
      if (ch != (c->state == CH_DATA_CR ? '\r' : '\n'))
        return chunk_fail (c, -EINVAL, "a chunk's data not followed by CRLF");
      c->state = c->state == CH_DATA_CR ? CH_DATA_LF : CH_SIZE;
      return 0;
    case CH_END_LF:
      if (ch != '\n')
        return chunk_fail (c, -EINVAL, "the trailers not ended by CRLF");
      c->state = CH_DONE;
      return 0;
    default: return trailer_byte (c, ch);
    }
}

int
http1_chunked_feed (http1_chunked_t *c, const uint8_t *in, size_t len, size_t *used, size_t *data)
{
  *used = 0;
  *data = 0;
  if (c->state == CH_DONE)
    return 1;
  if (c->state == CH_FAILED)
    return -EINVAL;
  if (c->state == CH_DATA)
    {
      size_t k = c->remaining < len ? (size_t) c->remaining : len;
      c->remaining -= k;
      if (c->remaining == 0)
        c->state = CH_DATA_CR;
      *used = k;
      *data = k;
      return 0;
    }
  for (size_t i = 0; i < len; i++)
    {
      int rc = framing_byte (c, (char) in[i]);
      if (rc < 0)
        {
          *used = i;
          return rc;
        }
      if (c->state == CH_DATA || c->state == CH_DONE)
        {
          *used = i + 1;
          return c->state == CH_DONE ? 1 : 0;
        }
    }
  *used = len;
  return 0;
}

bool
http1_chunked_in_data (const http1_chunked_t *c)
{
  return c->state == CH_DATA;
}
