/* ws: the server side of a WebSocket (RFC 6455) on a socket that
 * libmicrohttpd has handed over after a 101 answer: the opening handshake's
 * checks and accept key, the bearer secret offered as a subprotocol, and a
 * connection that frames messages with wslay (the frame codec is wslay's,
 * not ours) over the non-blocking socket.
 *
 * It does not own the socket (MHD closes it) and knows nothing of
 * terminals or gRPC: routes/terminal.c drives it.
 *
 * Threading: the handshake helpers are pure. A ws_t belongs to one thread;
 * the only way in from another thread is the wake descriptor passed to
 * ws_poll.
 */
#ifndef SBX_SHIM_WS_H
#define SBX_SHIM_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Close codes this server sends. */
#define WS_CLOSE_NORMAL 1000
#define WS_CLOSE_GOING_AWAY 1001
#define WS_CLOSE_POLICY 1008
#define WS_CLOSE_INTERNAL 1011

/* The answer to a handshake: Sec-WebSocket-Accept for `key` (the
 * request's Sec-WebSocket-Key), NUL-terminated in `out`. -1 when the key is
 * not the base64 of 16 bytes (a bad handshake). */
#define WS_ACCEPT_LEN 28
int ws_accept_key (const char *key, char out[WS_ACCEPT_LEN + 1]);

/* True when the comma-separated header `value` holds `token` (case-
 * insensitive, surrounding spaces ignored): "keep-alive, Upgrade" holds
 * "upgrade". NULL holds nothing. */
bool ws_header_has_token (const char *value, const char *token);

/* NULL when a request with these (any may be NULL) is a WebSocket opening
 * handshake this server speaks — HTTP/1.1, `Upgrade: websocket`,
 * `Connection: Upgrade`, Sec-WebSocket-Version 13, a well-formed key (its
 * accept value then in `accept`) — else why not (static text, for a 400). */
const char *ws_handshake_problem (const char *http_version, const char *upgrade, const char *connection,
                                  const char *version, const char *key, char accept[WS_ACCEPT_LEN + 1]);

/* Browsers cannot set headers on a WebSocket, so the bearer secret may come
 * as an offered subprotocol "bearer.<secret>". True when the
 * Sec-WebSocket-Protocol `offer` holds that protocol for `secret`
 * (constant-time comparison, as bearer.h). */
#define WS_BEARER_PREFIX "bearer."
bool ws_offer_has_bearer (const char *offer, const char *secret);

/* The subprotocol to answer for `offer` (RFC 6455: one of those offered,
 * or none): `preferred` when offered, else the offered "bearer.<secret>"
 * when `secret` is not NULL, copied into `buf` (`cap` bytes), else NULL. */
const char *ws_pick_protocol (const char *offer, const char *preferred, const char *secret, char *buf, size_t cap);

/* ---- a connection ---------------------------------------------------------- */

typedef struct ws_s ws_t;

/* A whole message from the client: text (UTF-8 checked by wslay) or
 * binary. `data` is valid during the call only. */
typedef void (*ws_message_fn) (void *user, bool text, const uint8_t *data, size_t len);

/* Wraps `sock` (borrowed; made non-blocking) for a server-side WebSocket.
 * `extra`: bytes MHD read past the request head, taken as the first input
 * (copied). Messages above `max_message` bytes close the connection (1009).
 * NULL when out of memory. */
ws_t *ws_new (int sock, const char *extra, size_t extra_len, uint64_t max_message, ws_message_fn on_message,
              void *user);
void ws_free (ws_t *ws);

/* Queues a message (copied). -1 once a close has been queued or on ENOMEM. */
int ws_send (ws_t *ws, bool text, const void *data, size_t len);
/* Queues a ping (the answer is not awaited: it keeps idle paths open and
 * makes a dead peer's socket fail). */
int ws_ping (ws_t *ws);
/* Queues the close frame (`reason` at most 123 bytes; cut otherwise). Later
 * ws_send calls fail; the connection ends when the client answers. */
int ws_close (ws_t *ws, uint16_t code, const char *reason);
/* True once a close frame is queued or sent. */
bool ws_closing (const ws_t *ws);
/* True once the client left too many answers unread (its pings' pongs
 * among them): nothing more of it is read, a close 1008 is queued, and
 * the caller should give it a short while to take it, then let go. */
bool ws_flooded (const ws_t *ws);
/* Messages queued and not yet written. */
size_t ws_queued (const ws_t *ws);

/* Writes what it can, waits up to `timeout_ms` for the socket or for
 * `wake_fd` (an eventfd, drained here; *woken then true), then reads and
 * writes what it can; incoming messages go to `on_message`. Returns 1 while
 * the connection is open, 0 once it has ended: the close handshake is done,
 * or the client has gone (EOF, reset, protocol error, write failure). */
int ws_poll (ws_t *ws, int wake_fd, int timeout_ms, bool *woken);

#endif
