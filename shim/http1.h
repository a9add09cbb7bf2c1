/* http1: parsing of the HTTP/1.1 a server inside a sandbox writes — a
 * response head (status line, header list, body framing) and a chunked
 * body — for the port proxy (shim/routes/proxy.c).
 *
 * Pure: bytes in, parsed head and chunk sizes out; no I/O, no allocation.
 * Every input is hostile: each count and size is bounded by a named limit
 * below, and what RFC 9112 lets a recipient refuse is refused, never
 * guessed at (a proxy that guesses where a message ends differently from
 * its client is a smuggling channel):
 *  - a line that ends in a bare LF, a CR not followed by LF, a NUL or
 *    another control character in a line (HTAB aside);
 *  - a status line other than `HTTP/1.<digit> <3 digits>[ <reason>]`;
 *  - a header line without a name, with blanks before its colon, or
 *    continuing the last one (obs-fold, a line opening with a blank);
 *  - Content-Length that is not all digits, overflows, or whose values
 *    (in one header or several) differ — equal repeats are one length;
 *  - Transfer-Encoding other than exactly `chunked` (other codings cannot
 *    be relayed: the client's side is framed anew), and Transfer-Encoding
 *    together with Content-Length;
 *  - in a chunked body: a size that is not hexadecimal, is signed or
 *    overflows, a chunk not followed by CRLF, a size line or the trailers
 *    over their cap. Chunk extensions and trailers are read and dropped.
 *
 * Threading: none of its own; a parser's state belongs to its caller.
 */
#ifndef SBX_SHIM_HTTP1_H
#define SBX_SHIM_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest response head accepted, blank line included. */
#define HTTP1_MAX_HEAD (64 * 1024)
/* The most header lines in one head. */
#define HTTP1_MAX_HEADERS 128
/* The most header names a message's Connection headers may list (their
 * headers are hop-by-hop: dropping some and forwarding the rest would pass
 * on headers meant for the proxy alone, so more is refused). */
#define HTTP1_MAX_CONN_NAMES 32
/* The longest chunk-size line, extensions and CRLF included. */
#define HTTP1_MAX_CHUNK_LINE 1024
/* The most bytes of trailers after the last chunk, final CRLF included. */
#define HTTP1_MAX_TRAILERS (16 * 1024)
/* The largest Content-Length or chunk size (2^63 - 1: any larger is no
 * length a stream will carry, and overflows signed offsets). */
#define HTTP1_MAX_LENGTH ((uint64_t) INT64_MAX)

/* The names a message's Connection headers list; pointers into the
 * headers' values (which must outlive it). */
typedef struct http1_conn_names_s
{
  struct
  {
    const char *p;
    size_t len;
  } name[HTTP1_MAX_CONN_NAMES];
  size_t n;
  bool over; /* more than HTTP1_MAX_CONN_NAMES were listed */
} http1_conn_names_t;

typedef enum http1_framing_e
{
  HTTP1_BODY_EOF,     /* to the end of the connection */
  HTTP1_BODY_LENGTH,  /* content_length bytes */
  HTTP1_BODY_CHUNKED, /* chunked (http1_chunked_feed) */
} http1_framing_t;

typedef struct http1_header_s
{
  const char *name;  /* NUL-terminated, as sent */
  const char *value; /* NUL-terminated, blanks around it trimmed */
} http1_header_t;

/* A parsed response head. Its strings point into the buffer given to
 * http1_head_parse. */
typedef struct http1_head_s
{
  unsigned minor;  /* HTTP/1.<minor> */
  unsigned status; /* 100..999 */
  http1_header_t header[HTTP1_MAX_HEADERS];
  size_t n_header;
  http1_conn_names_t conn; /* what its Connection headers list */
  http1_framing_t framing; /* as its headers say (the caller knows when a
                            * status or a HEAD request means no body) */
  uint64_t content_length; /* HTTP1_BODY_LENGTH */
  const char *error;       /* after a failure: what is wrong (static text) */
} http1_head_t;

/* Looks for the end of a head (its blank line) in buf[0..len), resuming
 * at *scanned (0 at first; updated). 0 with *head_len (bytes up to and
 * including the blank line); -EAGAIN when it has not come yet; -EINVAL at
 * a bare LF; -E2BIG when HTTP1_MAX_HEAD bytes hold no end. */
int http1_head_scan (const char *buf, size_t len, size_t *scanned, size_t *head_len);

/* Parses the head in buf[0..head_len) (as found by http1_head_scan) into
 * *h, cutting its lines apart in place (buf must stay alive as long as h).
 * 0; -EINVAL when malformed, -E2BIG over HTTP1_MAX_HEADERS or
 * HTTP1_MAX_CONN_NAMES (h->error says which). */
int http1_head_parse (char *buf, size_t head_len, http1_head_t *h);

/* Adds the names one Connection header value lists ("close, X-A ,x-b");
 * sets c->over beyond HTTP1_MAX_CONN_NAMES. */
void http1_conn_names_add (http1_conn_names_t *c, const char *value);

/* True when `name` is one of the listed names (case-insensitive). */
bool http1_conn_names_has (const http1_conn_names_t *c, const char *name);

/* True for the hop-by-hop headers of RFC 9110 §7.6.1 and their older kin
 * (Connection, Keep-Alive, Proxy-Connection, TE, Trailer,
 * Transfer-Encoding, Upgrade, Proxy-Authorization, Proxy-Authenticate). */
bool http1_hop_by_hop (const char *name);

/* A chunked body's decoder. Zero-initialised (HTTP1_CHUNKED_INIT) before
 * the body's first byte. */
typedef struct http1_chunked_s
{
  int state;
  uint64_t remaining; /* of the current chunk's data */
  size_t line;        /* bytes of the current size line */
  size_t trailers;    /* bytes of trailers so far */
  bool digits;        /* the size line has a digit */
  const char *error;  /* after a failure: what is wrong (static text) */
} http1_chunked_t;

#define HTTP1_CHUNKED_INIT                                                                                           \
  {                                                                                                                  \
    .state = 0                                                                                                       \
  }

/* Feeds the next bytes of a chunked body, in[0..len). *used: how many it
 * took. When the decoder is in a chunk's data, those are body data (the
 * first *used bytes of `in`, *data == *used); else framing (*data == 0),
 * taken until a chunk's data begins or the body ends. 1 when the body has
 * ended (its last chunk and trailers read: nothing more is taken), 0 when
 * more is to come, -EINVAL malformed, -E2BIG over HTTP1_MAX_CHUNK_LINE or
 * HTTP1_MAX_TRAILERS (c->error says which). */
int http1_chunked_feed (http1_chunked_t *c, const uint8_t *in, size_t len, size_t *used, size_t *data);

/* True when the decoder is inside a chunk's data: c->remaining bytes of it
 * are next. */
bool http1_chunked_in_data (const http1_chunked_t *c);

#endif
