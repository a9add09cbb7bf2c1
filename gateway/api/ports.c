/* api/ports: the handlers of Forward and ListPorts — servers inside a
 * sandbox, reached from outside.
 *
 * Forward relays one TCP connection the runtime made on the sandbox's
 * loopback (runtime/ports.c) over a bidirectional stream of ForwardFrames.
 * Two threads per call: the call's own thread reads the socket and sends
 * `data` frames (its end as one `close_write` frame), each read
 * overlapping the sending of the frame before it (one frame in flight, so
 * flow control still holds the reads to the client's pace); a reader
 * thread (an idle one from an earlier call when there is one) receives
 * the client's frames and writes them to the socket, a `close_write` or
 * the client's half-close becoming shutdown(SHUT_WR). The first frame's
 * data goes to the server before `connected` goes out, which is not
 * waited for. The call ends OK when both directions are closed,
 * UNAVAILABLE when the server resets the connection; a client that goes
 * away closes the socket. Receives and sends use separate tags
 * (common/rpc): one thread each. Once the server's answer is out, the
 * sandbox's next connection gets its socket made (runtime/ports.c).
 * State: per call, and a few spare read buffers and idle reader threads
 * shared by all.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/idle_pool.h"
#include "gateway/api/internal.h"

/* The most bytes one data frame carries: a socket read's worth. Every
 * frame costs both sides a round of gRPC work (batches, wake-ups), so a
 * busy connection's go in large ones (1 MiB relays 100 MiB with half the
 * CPU of 256 KiB; 2 MiB was no better); a quiet one's are as small as its
 * reads. */
#define FWD_CHUNK (1024 * 1024)
/* Read buffers (one FWD_CHUNK each) kept for the next reads once gRPC has
 * let go of them, in all calls together. */
#define FWD_SPARE_BUFS 4
/* How often a busy connection renews its sandbox's idle timer. */
#define FWD_TOUCH_MS 10000

typedef struct fwd_s
{
  rpc_call_t *call;
  sbx_runtime_t *rt;
  const char *id;
  int sock;
  int wake;                  /* eventfd: the call is ending, stop waiting on the socket */
  int64_t idle_ms;           /* 0: no idle timeout */
  _Atomic int64_t active_ms; /* monotonic: when a byte last moved */
  bool write_closed;
  bool write_failed; /* the server stopped reading: later data is dropped */
  atomic_bool stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool input_done;  /* mu: the client closed its direction */
  bool reader_done; /* mu: the reader is done with this call */
  err_t error;      /* mu: a protocol error of the client's stream */
} fwd_t;

static int64_t
mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
fwd_wake (fwd_t *f)
{
  uint64_t one = 1;
  ssize_t w = write (f->wake, &one, sizeof one); /* fails only on overflow: awake anyway */
  (void) w;
}

/* Ends the call's relay: with `e` (taken) as its error when not NULL. */
static void
fwd_stop (fwd_t *f, err_t *e)
{
  pthread_mutex_lock (&f->mu);
  if (e != NULL && f->error.msg == NULL)
    {
      f->error = *e;
      *e = (err_t) ERR_INIT;
    }
  atomic_store (&f->stop, true);
  pthread_cond_broadcast (&f->cv);
  pthread_mutex_unlock (&f->mu);
  if (e != NULL)
    err_release (e);
  fwd_wake (f);
}

static void
fwd_input_done (fwd_t *f)
{
  pthread_mutex_lock (&f->mu);
  f->input_done = true;
  pthread_cond_broadcast (&f->cv);
  pthread_mutex_unlock (&f->mu);
}

/* ---- client -> sandbox (the reader thread) ---------------------------------- */

/* Writes `data` to the socket, waiting for room (and the wake) unless
 * `at_once`: the count written (all of it, but on a failure or at once). */
static size_t
sock_write (fwd_t *f, const uint8_t *data, size_t len, bool at_once)
{
  size_t done = 0;
  while (done < len && !f->write_failed && !atomic_load (&f->stop))
    {
      ssize_t w = send (f->sock, data + done, len - done, MSG_NOSIGNAL);
      if (w > 0)
        {
          atomic_store (&f->active_ms, mono_ms ());
          done += (size_t) w;
          continue;
        }
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0 && errno == EAGAIN && at_once)
        break;
      if (w < 0 && errno == EAGAIN)
        {
          struct pollfd p[2] = {{.fd = f->sock, .events = POLLOUT}, {.fd = f->wake, .events = POLLIN}};
          TEMP_FAILURE_RETRY (poll (p, 2, -1));
          continue;
        }
      /* EPIPE, ECONNRESET: the server no longer reads. What it sent is
       * still relayed the other way; its end says how it ended. */
      f->write_failed = true;
    }
  return done;
}

static void
sock_write_all (fwd_t *f, const uint8_t *data, size_t len)
{
  sock_write (f, data, len, false);
}

static void
close_write (fwd_t *f)
{
  if (!f->write_closed)
    shutdown (f->sock, SHUT_WR);
  f->write_closed = true;
}

/* Applies one client frame (after the first). */
static void
apply_frame (fwd_t *f, const Sandbox__V1__ForwardFrame *fr)
{
  cleanup_err err_t e = ERR_INIT;
  if ((fr->sandbox_id != NULL && fr->sandbox_id[0] != '\0') || fr->port != 0 || fr->connected
      || fr->idle_timeout_seconds != 0)
    err_make (&e, EINVAL, "Forward: only the first frame names the sandbox and the port");
  else if (f->write_closed && fr->data.len > 0)
    err_make (&e, EINVAL, "Forward: data after close_write");
  if (e.status != 0)
    {
      fwd_stop (f, &e);
      return;
    }
  sock_write_all (f, fr->data.data, fr->data.len);
  if (fr->close_write)
    {
      close_write (f);
      fwd_input_done (f);
    }
}

static void
reader_main (fwd_t *f)
{
  while (!atomic_load (&f->stop))
    {
      ProtobufCMessage *m = NULL;
      cleanup_err err_t e = ERR_INIT;
      int rc = rpc_call_recv (f->call, &sandbox__v1__forward_frame__descriptor, &m, &e);
      if (rc < 0)
        {
          /* Cancelled (the client went away), or a frame that does not decode. */
          fwd_stop (f, e.status == ECANCELED ? NULL : &e);
          return;
        }
      if (rc == 0)
        break;
      apply_frame (f, (const Sandbox__V1__ForwardFrame *) m);
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (atomic_load (&f->stop))
    return;
  /* The client half-closed: its direction is over. A client that cancels
   * later still ends the relay: watch the call until it is over. */
  close_write (f);
  fwd_input_done (f);
  if (rpc_call_wait_closed (f->call))
    fwd_stop (f, NULL);
}

/* Reader threads kept waiting for the next call once theirs is over, a
 * few: a call's second thread is then a wake-up, not a thread's start. */
#define FWD_IDLE_READERS 4

static idle_pool_t readers = IDLE_POOL_INIT (FWD_IDLE_READERS, 0);

static void
reader_job (void *arg)
{
  fwd_t *f = arg;
  reader_main (f);
  pthread_mutex_lock (&f->mu);
  f->reader_done = true; /* from here on `f` is the call's again */
  pthread_cond_broadcast (&f->cv);
  pthread_mutex_unlock (&f->mu);
}

/* Gives the call's input to a reader thread: an idle one, else a new one. */
static bool
reader_start (fwd_t *f)
{
  return idle_pool_run (&readers, reader_job, f) == 0;
}

/* Waits until the reader is done with the call. */
static void
reader_wait (fwd_t *f)
{
  pthread_mutex_lock (&f->mu);
  while (!f->reader_done)
    pthread_cond_wait (&f->cv, &f->mu);
  pthread_mutex_unlock (&f->mu);
}

/* ---- sandbox -> client (the call's thread) ---------------------------------- */

/* A read buffer: the socket's bytes go straight into it, after room for
 * the data field's header, and gRPC sends them from there. Buffers come
 * back when gRPC drops the message (from any thread) and are kept for the
 * next reads, a few in all: a fresh buffer of this size would be a fresh
 * mapping (the process's mmap threshold), every page of it faulted in
 * again. */
enum
{
  FWD_HEAD_ROOM = API_FIELD_HEADER_MAX
};

typedef struct fwd_buf_s
{
  struct fwd_buf_s *next;
  uint8_t data[FWD_HEAD_ROOM + FWD_CHUNK];
} fwd_buf_t;

static pthread_mutex_t spare_mu = PTHREAD_MUTEX_INITIALIZER;
static fwd_buf_t *spare;
static size_t n_spare;

static fwd_buf_t *
fwd_buf_get (void)
{
  pthread_mutex_lock (&spare_mu);
  fwd_buf_t *b = spare;
  if (b != NULL)
    {
      spare = b->next;
      n_spare--;
    }
  pthread_mutex_unlock (&spare_mu);
  return b != NULL ? b : malloc (sizeof *b);
}

static void
fwd_buf_put (void *p)
{
  fwd_buf_t *b = p;
  pthread_mutex_lock (&spare_mu);
  bool keep = n_spare < FWD_SPARE_BUFS;
  if (keep)
    {
      b->next = spare;
      spare = b;
      n_spare++;
    }
  pthread_mutex_unlock (&spare_mu);
  if (!keep)
    free (b);
}

/* Reads up to FWD_CHUNK bytes from the socket and starts sending them as
 * one data frame; the frame before it must have gone first (one in flight:
 * the client's pace holds the reads back), but the read overlaps its
 * sending. 1 sent, 0 the server's EOF, -1 error (*err). */
static int
relay_chunk (fwd_t *f, err_t *err)
{
  fwd_buf_t *b = fwd_buf_get ();
  if (b == NULL)
    return err_make (err, ENOMEM, "Forward: out of memory");
  uint8_t *start = b->data + FWD_HEAD_ROOM;
  ssize_t r = TEMP_FAILURE_RETRY (recv (f->sock, start, FWD_CHUNK, 0));
  if (r <= 0)
    {
      int e = errno;
      fwd_buf_put (b);
      if (r == 0)
        return 0;
      if (e == EAGAIN)
        return 1;
      if (e == ECONNRESET)
        return err_make (err, ECONNRESET, "Forward: the server in sandbox `%s` reset the connection", f->id);
      return err_make_sys (err, e, "Forward: recv");
    }
  uint8_t head[FWD_HEAD_ROOM];
  size_t hn = api_field_header (head, API_FIELD_FORWARD_FRAME_DATA, (size_t) r);
  memcpy (start - hn, head, hn);
  grpc_slice msg = grpc_slice_new_with_user_data (start - hn, hn + (size_t) r, fwd_buf_put, b);
  return rpc_call_send_raw_start (f->call, &msg, 1, err) < 0 ? -1 : 1;
}

/* Relays the server's output until its end; then waits for the client's
 * direction to close. */
static int
relay_output (fwd_t *f, err_t *err)
{
  int64_t touched = mono_ms ();
  for (;;)
    {
      struct pollfd p[2] = {{.fd = f->sock, .events = POLLIN}, {.fd = f->wake, .events = POLLIN}};
      if (TEMP_FAILURE_RETRY (poll (p, 2, f->idle_ms > 0 ? 1000 : -1)) < 0)
        return err_make_sys (err, errno, "Forward: poll");
      if (atomic_load (&f->stop))
        return 1;
      if (p[0].revents == 0)
        {
          if (f->idle_ms > 0 && mono_ms () - atomic_load (&f->active_ms) > f->idle_ms)
            return err_make (err, ETIMEDOUT, "Forward: idle for %" PRId64 " s", f->idle_ms / 1000);
          continue;
        }
      atomic_store (&f->active_ms, mono_ms ());
      int rc = relay_chunk (f, err);
      if (rc < 0)
        return -1;
      int64_t now = mono_ms ();
      if (now - touched >= FWD_TOUCH_MS)
        {
          sbx_port_touch (f->rt, f->id);
          touched = now;
        }
      if (rc == 0)
        break;
    }
  Sandbox__V1__ForwardFrame end = SANDBOX__V1__FORWARD_FRAME__INIT;
  end.close_write = true;
  if (rpc_call_send (f->call, &end.base, err) < 0)
    return -1;
  /* The answer is out (a request's, typically): now, off its path, the
   * socket the sandbox's next connection takes. */
  sbx_port_prepare (f->rt, f->id);
  pthread_mutex_lock (&f->mu);
  while (!f->input_done && !atomic_load (&f->stop))
    pthread_cond_wait (&f->cv, &f->mu);
  pthread_mutex_unlock (&f->mu);
  return atomic_load (&f->stop) ? 1 : 0;
}

/* Connects, answers `connected`, and applies the first frame's data: what
 * of it the socket takes at once goes first, so the server is at work on
 * a request while `connected` goes out (without waiting for it). */
static int
forward_open (fwd_t *f, const Sandbox__V1__ForwardFrame *first, err_t *err)
{
  if (sbx_port_connect (f->rt, f->id, first->port, &f->sock, err) < 0)
    return -1;
  size_t done = sock_write (f, first->data.data, first->data.len, true);
  static const uint8_t connected[] = {API_TAG (API_FIELD_FORWARD_FRAME_CONNECTED, API_WIRE_VARINT), 1}; /* true */
  grpc_slice ok = grpc_slice_from_static_buffer (connected, sizeof connected);
  if (rpc_call_send_raw_start (f->call, &ok, 1, err) < 0)
    return -1;
  if (done < first->data.len)
    sock_write_all (f, first->data.data + done, first->data.len - done);
  if (first->close_write)
    {
      close_write (f);
      f->input_done = true;
    }
  return 0;
}

int
api_forward (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__forward_frame__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__ForwardFrame *first = (const Sandbox__V1__ForwardFrame *) m;
  if (first->sandbox_id == NULL || first->sandbox_id[0] == '\0')
    return err_make (err, EINVAL, "Forward: the first frame must name sandbox_id and port");
  /* A half-close only shuts the connection's write side, and a cancelled
   * call closes the connection anyway: no need to tell them apart first. */
  rpc_call_quick_half_close (call);
  cleanup_close int wake = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0)
    return err_make_sys (err, errno, "Forward: eventfd");
  fwd_t f = {.call = call,
             .rt = ctx->rt,
             .id = first->sandbox_id,
             .sock = -1,
             .wake = wake,
             .idle_ms = (int64_t) first->idle_timeout_seconds * 1000,
             .error = ERR_INIT};
  atomic_init (&f.stop, false);
  atomic_init (&f.active_ms, mono_ms ());
  pthread_mutex_init (&f.mu, NULL);
  pthread_cond_init (&f.cv, NULL);
  bool reader_started = false;
  int rc = forward_open (&f, first, err);
  if (rc == 0)
    {
      reader_started = !f.input_done && reader_start (&f);
      if (!f.input_done && !reader_started)
        rc = err_make (err, EAGAIN, "Forward: cannot start the input thread");
    }
  if (rc == 0)
    rc = relay_output (&f, err);
  if (rc == 1)
    {
      /* Stopped: a protocol error, or the client went away. */
      pthread_mutex_lock (&f.mu);
      if (f.error.msg != NULL)
        {
          err_release (err);
          *err = f.error;
          f.error = (err_t) ERR_INIT;
        }
      else
        err_make (err, ECANCELED, "Forward: the client went away");
      pthread_mutex_unlock (&f.mu);
      rc = -1;
    }
  /* End the call, then the reader: its receive or its watch of the call
   * returns once the call is over, its socket wait on the wake. */
  rpc_call_finish_err (call, rc == 0 ? 0 : -1, err);
  atomic_store (&f.stop, true);
  fwd_wake (&f);
  if (reader_started)
    reader_wait (&f);
  sbx_port_prepare (f.rt, f.id); /* unless the answer's end made it */
  if (f.sock >= 0)
    close (f.sock);
  err_release (&f.error);
  pthread_cond_destroy (&f.cv);
  pthread_mutex_destroy (&f.mu);
  return rc;
}

/* ---- ListPorts ---------------------------------------------------------------- */

int
api_list_ports (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__list_ports_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__ListPortsRequest *req = (const Sandbox__V1__ListPortsRequest *) m;
  cleanup_free sbx_port_t *ports = NULL;
  size_t n = 0;
  if (sbx_port_list (ctx->rt, req->sandbox_id, &ports, &n, err) < 0)
    return -1;
  cleanup_free Sandbox__V1__ListeningPort *lp = calloc (n + 1, sizeof *lp);
  cleanup_free Sandbox__V1__ListeningPort **ptrs = calloc (n + 1, sizeof *ptrs);
  if (lp == NULL || ptrs == NULL)
    return err_make (err, ENOMEM, "ListPorts: out of memory");
  for (size_t i = 0; i < n; i++)
    {
      sandbox__v1__listening_port__init (&lp[i]);
      lp[i].port = ports[i].port;
      lp[i].address = ports[i].address;
      lp[i].loopback_only = ports[i].loopback_only;
      lp[i].ipv6 = ports[i].ipv6;
      lp[i].pid = ports[i].pid;
      ptrs[i] = &lp[i];
    }
  Sandbox__V1__ListPortsResponse resp = SANDBOX__V1__LIST_PORTS_RESPONSE__INIT;
  resp.n_ports = n;
  resp.ports = ptrs;
  return rpc_call_reply (call, &resp.base, err);
}
