/* routes/proxy_relay: the bytes of a proxied request over its Forward
 * call — upstream frames read in place (shim/frames.c), data sent up —
 * and, after a 101 to a request that asked for an upgrade (WebSocket), the
 * two threads that relay the client's socket and the call both ways until
 * both sides are closed.
 *
 * Limits: PROXY_CHUNK bytes per frame sent up from an upgraded socket,
 * PROXY_IOV pieces per write to it; the down thread's sends time out after
 * SHIM_FORWARD_IDLE_SECONDS (a client that stops reading is cut).
 *
 * Threading: until an upgrade, the request's connection thread; after it,
 * the up thread is the call's only sender and the down thread its only
 * receiver; the last of the two to end frees the request's state.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include "common/log.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/routes/proxy.h"
#include "shim/routes/proxy_px.h"
#include "shim/watchdog.h"

/* The most bytes a client socket read carries in one frame (upgraded). */
#define PROXY_CHUNK (64 * 1024)
/* The most pieces of a frame written to an upgraded client in one call. */
#define PROXY_IOV 64
#define PROXY_THREAD_STACK (256 * 1024)

/* Receives the next frame from upstream: false at its end. */
static bool
up_recv (px_t *px)
{
  if (px->up_end)
    return false;
  err_t err = ERR_INIT;
  grpc_byte_buffer *bb = NULL;
  bool close_write = false;
  int rc = rpc_client_recv_raw (px->call, &bb, &err);
  if (rc > 0 && frames_take (&px->up, bb, &close_write, NULL, &err) < 0)
    {
      rpc_client_cancel (px->call);
      rc = -1;
    }
  err_release (&err);
  if (rc <= 0)
    {
      px->up_end = true;
      px->up_fail = true; /* the call ended before the server closed its side */
      return false;
    }
  px->up_end = close_write;
  return true;
}

/* True when upstream bytes are at hand without waiting for a frame. */
bool
px_up_buffered (const px_t *px)
{
  return frames_buffered (&px->up);
}

/* Up to `max` next bytes from upstream at *p (valid while px_up_buffered, or
 * until the next call): their count, 0 at upstream's end. */
size_t
px_up_next (px_t *px, const uint8_t **p, size_t max)
{
  for (;;)
    {
      size_t k = frames_next (&px->up, p, max);
      if (k > 0)
        return k;
      if (!up_recv (px))
        return 0;
    }
}

/* Up to `max` next bytes from upstream copied into buf: at least one
 * unless at upstream's end, then as many as are at hand without waiting. */
size_t
px_up_copy (px_t *px, uint8_t *buf, size_t max)
{
  size_t n = 0;
  while (n < max && (n == 0 || px_up_buffered (px)))
    {
      const uint8_t *p;
      size_t k = px_up_next (px, &p, max - n);
      if (k == 0)
        break;
      memcpy (buf + n, p, k);
      n += k;
    }
  return n;
}

int
px_send_data (px_t *px, const void *data, size_t len)
{
  Sandbox__V1__ForwardFrame f = SANDBOX__V1__FORWARD_FRAME__INIT;
  f.data.data = (uint8_t *) data;
  f.data.len = len;
  err_t err = ERR_INIT;
  int rc = rpc_client_send (px->call, &f.base, &err);
  err_release (&err);
  return rc;
}

void
px_free (px_t *px)
{
  hangup_remove (px->hangup);
  if (px->call != NULL)
    rpc_client_destroy (px->call);
  frames_drop (&px->up);
  if (px->slot)
    ports_slot_release (px->id, px->preview);
  free (px->head);
  free (px->extra);
  free (px);
}

static void
thread_done (px_t *px)
{
  if (atomic_fetch_sub (&px->threads, 1) != 1)
    return;
  MHD_upgrade_action (px->urh, MHD_UPGRADE_ACTION_CLOSE);
  px_free (px);
}

/* The client -> sandbox direction: the call's only sender. */
static void *
up_main (void *arg)
{
  px_t *px = arg;
  char *buf = malloc (PROXY_CHUNK);
  bool ok = px->extra_len == 0 || px_send_data (px, px->extra, px->extra_len) == 0;
  free (px->extra);
  px->extra = NULL;
  px->extra_len = 0;
  if (!ok)
    rpc_client_cancel (px->call);
  while (ok)
    {
      ssize_t n = buf == NULL ? -1 : recv (px->sock, buf, PROXY_CHUNK, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n > 0 && px_send_data (px, buf, (size_t) n) == 0)
        continue;
      if (n == 0)
        {
          /* The client closed its side: so does the stream. */
          Sandbox__V1__ForwardFrame f = SANDBOX__V1__FORWARD_FRAME__INIT;
          f.close_write = true;
          err_t err = ERR_INIT;
          if (rpc_client_send (px->call, &f.base, &err) == 0)
            rpc_client_close_send (px->call, &err);
          err_release (&err);
        }
      else
        rpc_client_cancel (px->call); /* the client is gone, or the call is */
      break;
    }
  free (buf);
  thread_done (px);
  return NULL;
}

/* The sandbox -> client direction: the call's only receiver. */
static void *
down_main (void *arg)
{
  px_t *px = arg;
  bool ok = true;
  for (;;)
    {
      /* The frame's pieces at hand, in one send. */
      struct iovec iov[PROXY_IOV];
      size_t n = 0;
      while (n < PROXY_IOV && (n == 0 || px_up_buffered (px)))
        {
          const uint8_t *p;
          size_t k = px_up_next (px, &p, SIZE_MAX);
          if (k == 0)
            break;
          iov[n++] = (struct iovec){.iov_base = (void *) p, .iov_len = k};
        }
      if (n == 0)
        break;
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = n};
      while (ok && mh.msg_iovlen > 0)
        {
          ssize_t w = sendmsg (px->sock, &mh, MSG_NOSIGNAL);
          if (w < 0 && errno == EINTR)
            continue;
          ok = w > 0;
          for (size_t done = ok ? (size_t) w : 0; done > 0;)
            {
              size_t k = done < mh.msg_iov->iov_len ? done : mh.msg_iov->iov_len;
              mh.msg_iov->iov_base = (uint8_t *) mh.msg_iov->iov_base + k;
              mh.msg_iov->iov_len -= k;
              done -= k;
              if (mh.msg_iov->iov_len == 0)
                {
                  mh.msg_iov++;
                  mh.msg_iovlen--;
                }
            }
        }
      if (!ok)
        break;
    }
  /* The server closed its side (or the call ended): so does the client's
   * socket; on failure both ways, which also ends the up thread's read. */
  shutdown (px->sock, ok && !px->up_fail ? SHUT_WR : SHUT_RDWR);
  if (!ok)
    rpc_client_cancel (px->call);
  thread_done (px);
  return NULL;
}

void
px_upgraded (void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in, size_t extra_in_size,
             MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
  px_t *px = cls;
  shim_req_t *r = con_cls;
  r->state = NULL; /* the threads own it now */
  watchdog_stage (conn, STAGE_UPGRADED, false);
  hangup_remove (px->hangup); /* the socket is ours now; the threads see its end */
  px->hangup = NULL;
  px->urh = urh;
  px->sock = sock;
  /* MHD hands the socket over non-blocking; each thread blocks on its way,
   * the down thread's sends at most SHIM_FORWARD_IDLE_SECONDS (a client
   * that stops reading is cut). */
  int fl = fcntl (sock, F_GETFL);
  if (fl >= 0)
    fcntl (sock, F_SETFL, fl & ~O_NONBLOCK);
  struct timeval snd = {.tv_sec = shim.cfg.forward_idle_seconds};
  setsockopt (sock, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd);
  if (extra_in_size > 0)
    {
      px->extra = malloc (extra_in_size);
      if (px->extra != NULL)
        {
          memcpy (px->extra, extra_in, extra_in_size);
          px->extra_len = extra_in_size;
        }
      else
        rpc_client_cancel (px->call);
    }
  pthread_attr_t attr;
  pthread_attr_init (&attr);
  pthread_attr_setstacksize (&attr, PROXY_THREAD_STACK);
  pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
  atomic_store (&px->threads, 2);
  pthread_t t;
  if (pthread_create (&t, &attr, down_main, px) != 0)
    {
      rpc_client_cancel (px->call);
      shutdown (sock, SHUT_RDWR);
      atomic_store (&px->threads, 1);
    }
  if (pthread_create (&t, &attr, up_main, px) != 0)
    {
      log_msg (SEV_WARNING, "port proxy: cannot start a thread for an upgraded connection");
      rpc_client_cancel (px->call);
      shutdown (sock, SHUT_RDWR);
      thread_done (px);
    }
  pthread_attr_destroy (&attr);
}
