/* ws: the WebSocket handshake helpers and the wslay-driven connection (see
 * ws.h). wslay parses and writes frames, answers pings and closes; this
 * file feeds it the socket (first the bytes MHD read ahead), polls, and
 * notices a client that has gone.
 *
 * wslay queues a pong for every ping, and a route may answer a message
 * with one of its own: a client that sends and never reads would grow the
 * queue without end. So no more is read while WS_MAX_QUEUED messages wait
 * to be written; the client is then closed with 1008 (it has WS_CLOSE_WAIT
 * to take the close before the route gives up on it). What one read may
 * add beyond the cap is bounded by that read (wslay's 4 KiB buffer). */
#include "shim/ws.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "common/bearer.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#define WS_MAX_REASON 123
/* Messages (pongs and answers) queued and not yet written past which no
 * more of the client is read and it is closed with 1008. */
#define WS_MAX_QUEUED 64

/* ---- handshake ------------------------------------------------------------- */

int
ws_accept_key (const char *key, char out[WS_ACCEPT_LEN + 1])
{
  /* 16 bytes in base64: 22 characters and "==". */
  if (key == NULL || strlen (key) != 24 || key[22] != '=' || key[23] != '=')
    return -1;
  unsigned char raw[24];
  if (EVP_DecodeBlock (raw, (const unsigned char *) key, 24) != 18)
    return -1;
  char joined[24 + sizeof WS_GUID];
  memcpy (joined, key, 24);
  memcpy (joined + 24, WS_GUID, sizeof WS_GUID);
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1 ((const unsigned char *) joined, strlen (joined), digest);
  EVP_EncodeBlock ((unsigned char *) out, digest, SHA_DIGEST_LENGTH);
  return 0;
}

/* Calls `fn` on each comma-separated item of `value`, trimmed; stops when
 * it returns true. */
static bool
each_item (const char *value, bool (*fn) (const char *item, size_t len, void *arg), void *arg)
{
  if (value == NULL)
    return false;
  const char *p = value;
  for (;;)
    {
      size_t n = strcspn (p, ",");
      const char *s = p, *e = p + n;
      while (s < e && (*s == ' ' || *s == '\t'))
        s++;
      while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
      if (e > s && fn (s, (size_t) (e - s), arg))
        return true;
      if (p[n] == '\0')
        return false;
      p += n + 1;
    }
}

static bool
item_is_token (const char *item, size_t len, void *arg)
{
  const char *token = arg;
  return len == strlen (token) && strncasecmp (item, token, len) == 0;
}

bool
ws_header_has_token (const char *value, const char *token)
{
  return each_item (value, item_is_token, (void *) token);
}

typedef struct bearer_find_s
{
  const char *secret;
  char *buf; /* where a matching offer is copied, or NULL */
  size_t cap;
} bearer_find_t;

static bool
item_is_bearer (const char *item, size_t len, void *arg)
{
  bearer_find_t *b = arg;
  size_t plen = strlen (WS_BEARER_PREFIX);
  if (len <= plen || strncmp (item, WS_BEARER_PREFIX, plen) != 0 || len > 4096)
    return false;
  char header[4096 + 8];
  snprintf (header, sizeof header, "Bearer %.*s", (int) (len - plen), item + plen);
  if (!bearer_matches (header, b->secret))
    return false;
  if (b->buf != NULL)
    {
      if (len >= b->cap)
        return false;
      memcpy (b->buf, item, len);
      b->buf[len] = '\0';
    }
  return true;
}

bool
ws_offer_has_bearer (const char *offer, const char *secret)
{
  bearer_find_t b = {secret, NULL, 0};
  return each_item (offer, item_is_bearer, &b);
}

static bool
item_is_exact (const char *item, size_t len, void *arg)
{
  const char *want = arg;
  return len == strlen (want) && strncmp (item, want, len) == 0;
}

const char *
ws_pick_protocol (const char *offer, const char *preferred, const char *secret, char *buf, size_t cap)
{
  if (preferred != NULL && each_item (offer, item_is_exact, (void *) preferred))
    return preferred;
  bearer_find_t b = {secret, buf, cap};
  if (secret != NULL && buf != NULL && each_item (offer, item_is_bearer, &b))
    return buf;
  return NULL;
}

/* ---- a connection ---------------------------------------------------------- */

struct ws_s
{
  int sock;
  wslay_event_context_ptr ctx;
  char *extra; /* read ahead by MHD, served first */
  size_t extra_len, extra_off;
  ws_message_fn on_message;
  void *user;
  bool close_queued;
  bool gone;    /* EOF, reset or a failed write: nothing more goes either way */
  bool flooded; /* WS_MAX_QUEUED reached: nothing more is read */
};

static ssize_t
recv_cb (wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user_data)
{
  ws_t *ws = user_data;
  if (ws->flooded || wslay_event_get_queued_msg_count (ctx) >= WS_MAX_QUEUED)
    {
      ws->flooded = true;
      wslay_event_set_error (ctx, WSLAY_ERR_WOULDBLOCK);
      return -1;
    }
  if (ws->extra_off < ws->extra_len)
    {
      size_t n = ws->extra_len - ws->extra_off < len ? ws->extra_len - ws->extra_off : len;
      memcpy (buf, ws->extra + ws->extra_off, n);
      ws->extra_off += n;
      return (ssize_t) n;
    }
  ssize_t n;
  do
    n = recv (ws->sock, buf, len, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n > 0)
    return n;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    wslay_event_set_error (ctx, WSLAY_ERR_WOULDBLOCK);
  else
    {
      ws->gone = true; /* EOF or a socket error */
      wslay_event_set_error (ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
  return -1;
}

static ssize_t
send_cb (wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user_data)
{
  ws_t *ws = user_data;
  int f = MSG_DONTWAIT | MSG_NOSIGNAL | ((flags & WSLAY_MSG_MORE) ? MSG_MORE : 0);
  ssize_t n;
  do
    n = send (ws->sock, data, len, f);
  while (n < 0 && errno == EINTR);
  if (n >= 0)
    return n;
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    wslay_event_set_error (ctx, WSLAY_ERR_WOULDBLOCK);
  else
    {
      ws->gone = true;
      wslay_event_set_error (ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
  return -1;
}

static void
msg_cb (wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user_data)
{
  ws_t *ws = user_data;
  if (arg->opcode == WSLAY_TEXT_FRAME || arg->opcode == WSLAY_BINARY_FRAME)
    ws->on_message (ws->user, arg->opcode == WSLAY_TEXT_FRAME, arg->msg, arg->msg_length);
}

ws_t *
ws_new (int sock, const char *extra, size_t extra_len, uint64_t max_message, ws_message_fn on_message, void *user)
{
  ws_t *ws = calloc (1, sizeof *ws);
  if (ws == NULL)
    return NULL;
  ws->sock = sock;
  ws->on_message = on_message;
  ws->user = user;
  if (extra_len > 0)
    {
      ws->extra = malloc (extra_len);
      if (ws->extra == NULL)
        {
          free (ws);
          return NULL;
        }
      memcpy (ws->extra, extra, extra_len);
      ws->extra_len = extra_len;
    }
  struct wslay_event_callbacks cbs = {
      .recv_callback = recv_cb,
      .send_callback = send_cb,
      .on_msg_recv_callback = msg_cb,
  };
  if (wslay_event_context_server_init (&ws->ctx, &cbs, ws) != 0)
    {
      free (ws->extra);
      free (ws);
      return NULL;
    }
  wslay_event_config_set_max_recv_msg_length (ws->ctx, max_message);
  int fl = fcntl (sock, F_GETFL);
  if (fl >= 0)
    fcntl (sock, F_SETFL, fl | O_NONBLOCK);
  return ws;
}

void
ws_free (ws_t *ws)
{
  if (ws == NULL)
    return;
  wslay_event_context_free (ws->ctx);
  free (ws->extra);
  free (ws);
}

int
ws_send (ws_t *ws, bool text, const void *data, size_t len)
{
  if (ws->close_queued)
    return -1;
  struct wslay_event_msg m = {text ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME, data, len};
  return wslay_event_queue_msg (ws->ctx, &m) == 0 ? 0 : -1;
}

int
ws_ping (ws_t *ws)
{
  if (ws->close_queued)
    return -1;
  struct wslay_event_msg m = {WSLAY_PING, (const uint8_t *) "", 0};
  return wslay_event_queue_msg (ws->ctx, &m) == 0 ? 0 : -1;
}

int
ws_close (ws_t *ws, uint16_t code, const char *reason)
{
  if (ws->close_queued)
    return -1;
  ws->close_queued = true;
  size_t n = reason != NULL ? strlen (reason) : 0;
  if (n > WS_MAX_REASON)
    n = WS_MAX_REASON; /* may cut a UTF-8 sequence: our reasons are ASCII */
  return wslay_event_queue_close (ws->ctx, code, (const uint8_t *) reason, n) == 0 ? 0 : -1;
}

bool
ws_flooded (const ws_t *ws)
{
  return ws->flooded;
}

bool
ws_closing (const ws_t *ws)
{
  return ws->close_queued || wslay_event_get_close_sent (ws->ctx);
}

size_t
ws_queued (const ws_t *ws)
{
  return wslay_event_get_queued_msg_count (ws->ctx);
}

static bool
ended (ws_t *ws)
{
  return ws->gone || (!wslay_event_want_read (ws->ctx) && !wslay_event_want_write (ws->ctx));
}

static void
drain_wake (int fd)
{
  uint64_t v;
  while (read (fd, &v, sizeof v) > 0)
    ;
}

int
ws_poll (ws_t *ws, int wake_fd, int timeout_ms, bool *woken)
{
  *woken = false;
  if (wslay_event_want_write (ws->ctx) && wslay_event_send (ws->ctx) < 0)
    ws->gone = true;
  if (ended (ws))
    return 0;
  bool reading = wslay_event_want_read (ws->ctx) && !ws->flooded;
  bool ahead = reading && ws->extra_off < ws->extra_len;
  struct pollfd p[2] = {
      {ws->sock, (short) ((reading ? POLLIN : 0) | (wslay_event_want_write (ws->ctx) ? POLLOUT : 0)), 0},
      {wake_fd, POLLIN, 0},
  };
  int n = poll (p, 2, ahead ? 0 : timeout_ms);
  if (n < 0 && errno != EINTR)
    {
      ws->gone = true;
      return 0;
    }
  if (n > 0 && (p[1].revents & POLLIN))
    {
      drain_wake (wake_fd);
      *woken = true;
    }
  bool readable = ahead || (n > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR)));
  if (readable && reading && wslay_event_recv (ws->ctx) < 0)
    ws->gone = true;
  else if (readable && !reading && (p[0].revents & (POLLHUP | POLLERR)))
    ws->gone = true;
  if (ws->flooded && !ws->close_queued && !ws->gone)
    ws_close (ws, WS_CLOSE_POLICY, "too many answers unread");
  if (!ws->gone && wslay_event_want_write (ws->ctx) && wslay_event_send (ws->ctx) < 0)
    ws->gone = true;
  return ended (ws) ? 0 : 1;
}

const char *
ws_handshake_problem (const char *http_version, const char *upgrade, const char *connection, const char *version,
                      const char *key, char accept[WS_ACCEPT_LEN + 1])
{
  if (http_version == NULL || strcmp (http_version, "HTTP/1.1") != 0)
    return "A WebSocket upgrade needs HTTP/1.1";
  if (!ws_header_has_token (upgrade, "websocket"))
    return "Not a WebSocket upgrade: missing `Upgrade: websocket`";
  if (!ws_header_has_token (connection, "upgrade"))
    return "Not a WebSocket upgrade: missing `Connection: Upgrade`";
  if (version == NULL || strcmp (version, "13") != 0)
    return "Unsupported Sec-WebSocket-Version (this server speaks 13)";
  if (ws_accept_key (key, accept) < 0)
    return "Missing or malformed Sec-WebSocket-Key";
  return NULL;
}
