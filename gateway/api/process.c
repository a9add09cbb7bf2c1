/* api/process: the handler of Run — a command driven over a bidirectional
 * stream (see internal.h). The call's thread runs the command through the
 * runtime's exec (output out as ProcessEvents, its exit last); a second
 * thread reads the input stream: stdin bytes into the command's stdin,
 * close_stdin (or a half-close) as EOF, signals to its process group, the
 * terminal's size when the command runs on one. Input
 * is applied in order: while the command does not read its stdin, later
 * messages wait behind the bytes it has not taken. State: per call. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/api/internal.h"

typedef struct run_s
{
  rpc_call_t *call;
  const Sandbox__V1__ProcessStart *start;
  /* Set once the command runs (the runtime's started callback). */
  pthread_t reader;
  bool reader_started;
  int stdin_fd; /* the reader's once it runs */
  int pidfd;
  int pty_fd; /* the terminal's master, -1 without one */
  int wake;   /* eventfd: the command has ended, the reader stops waiting */
  /* Written by the reader, read by the call's thread. */
  atomic_bool stop; /* kill the command: the client went away or broke the protocol */
  pthread_mutex_t mu;
  err_t error; /* a protocol error of the input stream (mu) */
} run_t;

/* ---- the input side (the reader thread) ------------------------------------ */

/* Makes the call fail with `e` (taken) and the command be killed. */
static void
run_fail (run_t *r, err_t *e)
{
  pthread_mutex_lock (&r->mu);
  if (r->error.msg == NULL && r->error.status == 0)
    r->error = *e;
  else
    err_release (e);
  *e = (err_t) ERR_INIT;
  pthread_mutex_unlock (&r->mu);
  atomic_store (&r->stop, true);
}

static void
close_stdin (run_t *r)
{
  if (r->stdin_fd >= 0)
    close (take_fd (&r->stdin_fd));
}

static void write_stdin (run_t *r, const uint8_t *data, size_t len);

/* End of input: on a terminal, its EOF character (closing the master would
 * hang the terminal up); else the pipe closes. */
static void
end_input (run_t *r)
{
  if (r->pty_fd >= 0)
    {
      struct termios t;
      uint8_t eof = tcgetattr (r->pty_fd, &t) == 0 ? t.c_cc[VEOF] : 0x04;
      write_stdin (r, &eof, 1);
      return;
    }
  close_stdin (r);
}

/* Writes all of `data` to the command's stdin, waiting while the pipe is
 * full; gives up when the command has ended (EPIPE, or the wake). */
static void
write_stdin (run_t *r, const uint8_t *data, size_t len)
{
  size_t off = 0;
  while (r->stdin_fd >= 0 && off < len)
    {
      ssize_t w = write (r->stdin_fd, data + off, len - off);
      if (w > 0)
        {
          off += (size_t) w;
          continue;
        }
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0 && errno == EAGAIN)
        {
          struct pollfd p[2] = {{.fd = r->stdin_fd, .events = POLLOUT}, {.fd = r->wake, .events = POLLIN}};
          if (poll (p, 2, -1) < 0 && errno != EINTR)
            break;
          if (p[1].revents != 0)
            break;
          continue;
        }
      close_stdin (r); /* EPIPE: nobody reads it any more */
    }
}

/* Applies one input message. */
static void
apply_input (run_t *r, const Sandbox__V1__ProcessInput *in)
{
  err_t e = ERR_INIT;
  switch (in->input_case)
    {
    case SANDBOX__V1__PROCESS_INPUT__INPUT_STDIN: write_stdin (r, in->stdin.data, in->stdin.len); break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_CLOSE_STDIN:
      if (in->close_stdin)
        end_input (r);
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_RESIZE:
      if (r->pty_fd < 0)
        {
          err_make (&e, EINVAL, "Run: resize of a command that has no terminal");
          run_fail (r, &e);
        }
      else if (in->resize == NULL || in->resize->rows == 0 || in->resize->cols == 0 || in->resize->rows > 65535
               || in->resize->cols > 65535)
        {
          err_make (&e, EINVAL, "Run: resize needs rows and cols from 1 to 65535");
          run_fail (r, &e);
        }
      else
        {
          struct winsize ws
              = {.ws_row = (unsigned short) in->resize->rows, .ws_col = (unsigned short) in->resize->cols};
          ioctl (r->pty_fd, TIOCSWINSZ, &ws); /* the kernel sends SIGWINCH */
        }
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_SIGNAL:
      /* ESRCH: it has just exited; its exit event says so. */
      if (sbx_exec_signal (r->pidfd, in->signal, &e) < 0 && e.status != ESRCH)
        run_fail (r, &e);
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_START:
      err_make (&e, EINVAL, "Run: only the first message may be `start`");
      run_fail (r, &e);
      break;
    default:
      err_make (&e, EINVAL, "Run: an input message with nothing set");
      run_fail (r, &e);
      break;
    }
  err_release (&e);
}

static void *
reader_main (void *arg)
{
  run_t *r = arg;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      err_t e = ERR_INIT;
      int rc = rpc_call_recv (r->call, &sandbox__v1__process_input__descriptor, &m, &e);
      if (rc <= 0)
        {
          if (rc < 0 && e.status != ECANCELED)
            run_fail (r, &e); /* a message that does not decode, or too large */
          err_release (&e);
          if (rc < 0)
            atomic_store (&r->stop, true);
          break;
        }
      apply_input (r, (const Sandbox__V1__ProcessInput *) m);
      protobuf_c_message_free_unpacked (m, NULL);
      if (atomic_load (&r->stop))
        break;
    }
  /* The input has ended: EOF for the command. A client that cancels later
   * still kills it: watch the call until it is over. */
  if (!atomic_load (&r->stop))
    end_input (r);
  close_stdin (r);
  if (!atomic_load (&r->stop) && rpc_call_wait_closed (r->call))
    atomic_store (&r->stop, true);
  return NULL;
}

/* ---- the output side (the call's thread, through the exec's sink) ---------- */

static int64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
run_started (void *ctx, const sbx_exec_started_t *st)
{
  run_t *r = ctx;
  r->pidfd = st->pidfd;
  r->stdin_fd = st->stdin_fd;
  r->pty_fd = st->pty_fd;
  if (r->stdin_fd >= 0)
    fcntl (r->stdin_fd, F_SETFL, O_NONBLOCK);
  Sandbox__V1__ProcessInfo info = SANDBOX__V1__PROCESS_INFO__INIT;
  info.pid = st->pid;
  info.n_argv = r->start->n_argv;
  info.argv = r->start->argv;
  info.running = true;
  info.started_at_ms = now_ms ();
  info.pty = r->start->pty;
  Sandbox__V1__ProcessEvent ev = SANDBOX__V1__PROCESS_EVENT__INIT;
  ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_STARTED;
  ev.started = &info;
  err_t e = ERR_INIT;
  if (rpc_call_send (r->call, &ev.base, &e) < 0)
    atomic_store (&r->stop, true);
  err_release (&e);
  r->reader_started = pthread_create (&r->reader, NULL, reader_main, r) == 0;
  if (!r->reader_started)
    atomic_store (&r->stop, true); /* cannot follow the input: do not run blind */
}

static int
run_output (void *ctx, int stream, const uint8_t *data, size_t len)
{
  run_t *r = ctx;
  Sandbox__V1__ProcessEvent ev = SANDBOX__V1__PROCESS_EVENT__INIT;
  ProtobufCBinaryData bytes = {.len = len, .data = (uint8_t *) data};
  if (stream == 1)
    {
      ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_STDOUT;
      ev.stdout = bytes;
    }
  else
    {
      ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_STDERR;
      ev.stderr = bytes;
    }
  err_t e = ERR_INIT;
  int rc = rpc_call_send (r->call, &ev.base, &e);
  err_release (&e);
  return rc;
}

static bool
run_cancelled (void *ctx)
{
  /* Not rpc_call_cancelled: the reader is the one watching the call. */
  return atomic_load (&((run_t *) ctx)->stop);
}

static void
cleanup_env_fn (char ***env)
{
  api_env_free (*env);
}

int
api_run (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__process_input__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__ProcessInput *in = (const Sandbox__V1__ProcessInput *) m;
  if (in->input_case != SANDBOX__V1__PROCESS_INPUT__INPUT_START || in->start == NULL)
    return err_make (err, EINVAL, "Run: the first message must be `start`");
  const Sandbox__V1__ProcessStart *start = in->start;
  if (start->n_argv == 0)
    return err_make (err, EINVAL, "argv must have at least one element");
  const Sandbox__V1__PtySize *pty = start->pty;
  if (pty != NULL && (pty->rows > 0 || pty->cols > 0)
      && (pty->rows == 0 || pty->cols == 0 || pty->rows > 65535 || pty->cols > 65535))
    return err_make (err, EINVAL, "pty needs rows and cols from 1 to 65535");
  cleanup_free char **argv = calloc (start->n_argv + 1, sizeof *argv);
  if (argv == NULL)
    return err_make (err, ENOMEM, "Run: out of memory");
  memcpy (argv, start->argv, start->n_argv * sizeof *argv);
  __attribute__ ((cleanup (cleanup_env_fn))) char **env = NULL;
  if (api_env_from_start (start->env, start->n_env, &env, err) < 0)
    return -1;
  cleanup_close int wake = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0)
    return err_make_sys (err, errno, "Run: eventfd");
  run_t r
      = {.call = call, .start = start, .stdin_fd = -1, .pidfd = -1, .pty_fd = -1, .wake = wake, .error = ERR_INIT};
  atomic_init (&r.stop, false);
  pthread_mutex_init (&r.mu, NULL);
  sbx_exec_req_t xr = {
      .id = start->sandbox_id,
      .argv = argv,
      .env = env,
      .cwd = start->cwd,
      .stdin_stream = true,
      .pty_rows = pty != NULL ? (uint16_t) pty->rows : 0,
      .pty_cols = pty != NULL ? (uint16_t) pty->cols : 0,
      .timeout_seconds = start->timeout_seconds,
  };
  sbx_exec_sink_t sink = {.output = run_output, .cancelled = run_cancelled, .started = run_started, .ctx = &r};
  sbx_exec_result_t res;
  int rc = sbx_exec (ctx->rt, &xr, &sink, &res, err);
  if (rc == 0 && r.error.msg == NULL && !res.cancelled)
    {
      Sandbox__V1__ExitStatus st;
      api_exit_to_proto (&res, &st);
      Sandbox__V1__ProcessEvent ev = SANDBOX__V1__PROCESS_EVENT__INIT;
      ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT;
      ev.exit = &st;
      rc = rpc_call_send (call, &ev.base, err);
    }
  else if (rc == 0)
    {
      /* Killed: the client broke the protocol, or went away. */
      if (r.error.msg != NULL)
        {
          *err = r.error;
          r.error = (err_t) ERR_INIT;
        }
      else
        err_make (err, ECANCELED, "Run cancelled: %s", res.message);
      rc = -1;
    }
  /* End the call, then the reader: its receive or its watch of the call
   * returns once the call is over, its stdin wait on the wake. */
  rpc_call_finish (call, rc == 0 ? GRPC_STATUS_OK : rpc_status_from_errno (err->status),
                   rc == 0 ? NULL : err_msg (err));
  uint64_t one = 1;
  ssize_t woke = write (wake, &one, sizeof one); /* fails only on overflow: awake anyway */
  (void) woke;
  if (r.reader_started)
    pthread_join (r.reader, NULL);
  close_stdin (&r);
  if (r.pidfd >= 0)
    close (r.pidfd);
  if (r.pty_fd >= 0)
    close (r.pty_fd);
  err_release (&r.error);
  pthread_mutex_destroy (&r.mu);
  return rc;
}
