/* routes/proxy_px: what the port proxy's files share — one proxied
 * request's state (px_t) and the functions over it that live apart from
 * proxy.c: the request head built for upstream (proxy_request.c) and the
 * bytes of the Forward call both ways, upgraded connections included
 * (proxy_relay.c). Private to shim/routes/proxy*.c.
 *
 * Threading: as proxy.c says — one thread at a time per px_t until an
 * upgrade, then one sender and one receiver.
 */
#ifndef SBX_SHIM_ROUTES_PROXY_PX_H
#define SBX_SHIM_ROUTES_PROXY_PX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc/rpc.h"
#include "shim/frames.h"
#include "shim/hangup.h"
#include "shim/http1.h"
#include "shim/shim.h"

typedef enum body_e
{
  BODY_NONE,
  BODY_LENGTH,
  BODY_CHUNKED,
  BODY_EOF,
} body_t;

typedef struct px_s
{
  char id[SHIM_ID_MAX + 1];
  unsigned port;
  bool preview;
  bool slot;     /* holds a forwarded-connection slot */
  bool relaying; /* the answer is the server's, with a body or upgraded */
  rpc_client_call_t *call;
  hangup_t *hangup;
  bool chunked_up; /* the request body goes upstream re-chunked */
  bool upgrade;    /* the client asked for an upgrade */
  bool head_method;
  frames_t up;         /* upstream bytes: the current frame */
  bool up_end;         /* upstream closed its side (or the call ended) */
  bool up_fail;        /* ... abnormally */
  char *head;          /* the response head's bytes (parsed in place) */
  http1_head_t parsed; /* ... and what they say */
  /* The response body. */
  body_t body;
  uint64_t remaining; /* BODY_LENGTH: bytes left */
  http1_chunked_t chunked;
  bool chunked_end; /* its last chunk and trailers are read */
  /* Upgraded. */
  struct MHD_UpgradeResponseHandle *urh;
  /* What the client sent right behind its upgrade request: the up thread
   * sends it first (a send may wait on flow control; MHD's event thread,
   * which hands the socket over, must not). */
  char *extra;
  size_t extra_len;
  int sock;
  atomic_int threads;
} px_t;

/* A request head being written, at most `cap` bytes; `over` once it did
 * not fit. */
typedef struct px_head_s
{
  char *buf;
  size_t len, cap;
  bool over;
} px_head_t;

/* The header names the client's Connection headers list, into *named
 * (pointers into the request's header values). */
void px_request_conn_names (shim_req_t *r, http1_conn_names_t *named);

/* The request head for upstream, into h; `named`: as px_request_conn_names
 * found. Sets px->chunked_up and px->upgrade. */
void px_request_head (shim_req_t *r, px_t *px, const http1_conn_names_t *named, px_head_t *h);

/* True when upstream bytes are at hand without waiting for a frame. */
bool px_up_buffered (const px_t *px);

/* Up to `max` next bytes from upstream at *p (valid while px_up_buffered,
 * or until the next call): their count, 0 at upstream's end. */
size_t px_up_next (px_t *px, const uint8_t **p, size_t max);

/* Up to `max` next bytes from upstream copied into buf: at least one
 * unless at upstream's end, then as many as are at hand without waiting. */
size_t px_up_copy (px_t *px, uint8_t *buf, size_t max);

/* Sends `len` bytes upstream in one data frame: 0, or -1 when the call is
 * gone. */
int px_send_data (px_t *px, const void *data, size_t len);

/* Frees px with all it holds (its call, frame, slot, head). */
void px_free (px_t *px);

/* MHD's upgrade handler (cls: the px_t): hands the client's socket to two
 * relay threads, which own px from then on and free it when both end. */
void px_upgraded (void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in, size_t extra_in_size,
                  MHD_socket sock, struct MHD_UpgradeResponseHandle *urh);

#endif
