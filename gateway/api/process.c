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
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/api/internal.h"

typedef struct run_s
{
  rpc_call_t *call;
  sbx_runtime_t *rt;
  sbx_proc_t *proc; /* attached to a detached process; NULL: a command of this call */
  const Sandbox__V1__ProcessStart *start;
  /* Set once the command runs (the runtime's started callback). */
  pthread_t reader;
  bool reader_started;
  int stdin_fd; /* the reader's once it runs */
  int pidfd;
  int pty_fd; /* the terminal's master, -1 without one */
  int wake;   /* eventfd: the command has ended, the reader stops waiting */
  /* Written by the reader, read by the call's thread. */
  atomic_bool stop;       /* kill the command: the client went away or broke the protocol */
  atomic_bool input_done; /* the client half-closed and all its input was applied */
  pthread_mutex_t mu;
  pthread_cond_t input_cv; /* input_done or stop set (mu) */
  err_t error;             /* a protocol error of the input stream (mu) */
} run_t;

/* ---- the input side (the reader thread) ------------------------------------ */

/* The input stream's error, if any (taken; *err keeps it). */
static bool
take_error (run_t *r, err_t *err)
{
  pthread_mutex_lock (&r->mu);
  bool has = r->error.msg != NULL;
  if (has)
    {
      err_release (err);
      *err = r->error;
      r->error = (err_t) ERR_INIT;
    }
  pthread_mutex_unlock (&r->mu);
  return has;
}

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
  atomic_store (&r->stop, true);
  pthread_cond_broadcast (&r->input_cv);
  pthread_mutex_unlock (&r->mu);
}

static void
close_stdin (run_t *r)
{
  if (r->stdin_fd >= 0)
    close (take_fd (&r->stdin_fd));
}

/* End of input: on a terminal, its EOF character (closing the master would
 * hang the terminal up); else the pipe closes. */
static void
end_input (run_t *r)
{
  if (r->proc != NULL)
    {
      sbx_proc_end_input (r->rt, r->proc, r->wake);
      return;
    }
  cleanup_err err_t e = ERR_INIT;
  if (r->pty_fd >= 0)
    sbx_exec_end_input_pty (r->pty_fd, r->wake, &e);
  else
    close_stdin (r);
}

/* Applies one input message. */
static void
apply_input (run_t *r, const Sandbox__V1__ProcessInput *in)
{
  cleanup_err err_t e = ERR_INIT;
  switch (in->input_case)
    {
    case SANDBOX__V1__PROCESS_INPUT__INPUT_STDIN:
      /* EPIPE: it has exited (its exit event says so); ECANCELED: the call is over. */
      if (r->proc != NULL)
        {
          /* A detached process past its input is the caller's mistake. */
          if (sbx_proc_write (r->rt, r->proc, in->stdin.data, in->stdin.len, r->wake, &e) < 0
              && e.status != ECANCELED)
            {
              err_release (&e);
              err_make (&e, EBUSY, "the process takes no more input: it has exited or its stdin is closed");
              run_fail (r, &e);
            }
        }
      else if (r->stdin_fd >= 0 && sbx_exec_write (r->stdin_fd, in->stdin.data, in->stdin.len, r->wake, &e) < 0)
        close_stdin (r);
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_CLOSE_STDIN:
      if (in->close_stdin)
        end_input (r);
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_RESIZE:
      if (r->proc == NULL && r->pty_fd < 0)
        err_make (&e, EINVAL, "Run: resize of a command that has no terminal");
      else if (in->resize == NULL || in->resize->rows == 0 || in->resize->cols == 0 || in->resize->rows > 65535
               || in->resize->cols > 65535)
        err_make (&e, EINVAL, "Run: resize needs rows and cols from 1 to 65535");
      else
        {
          uint16_t rows = (uint16_t) in->resize->rows, cols = (uint16_t) in->resize->cols;
          if (r->proc != NULL)
            sbx_proc_resize (r->rt, r->proc, rows, cols, &e);
          else
            sbx_exec_resize (r->pty_fd, rows, cols, &e);
        }
      if (e.status != 0)
        run_fail (r, &e);
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_SIGNAL:
      /* ESRCH, EBUSY: it has just exited; its exit event says so. */
      if ((r->proc != NULL ? sbx_proc_signal_proc (r->rt, r->proc, in->signal, &e)
                           : sbx_exec_signal (r->pidfd, in->signal, &e))
              < 0
          && e.status != ESRCH && e.status != EBUSY)
        run_fail (r, &e);
      break;
    case SANDBOX__V1__PROCESS_INPUT__INPUT_START:
    case SANDBOX__V1__PROCESS_INPUT__INPUT_ATTACH:
      err_make (&e, EINVAL, "Run: only the first message may be `start` or `attach`");
      run_fail (r, &e);
      break;
    default:
      err_make (&e, EINVAL, "Run: an input message with nothing set");
      run_fail (r, &e);
      break;
    }
}

static void *
reader_main (void *arg)
{
  run_t *r = arg;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      cleanup_err err_t e = ERR_INIT;
      int rc = rpc_call_recv (r->call, &sandbox__v1__process_input__descriptor, &m, &e);
      if (rc <= 0)
        {
          if (rc < 0 && e.status != ECANCELED)
            run_fail (r, &e); /* a message that does not decode, or too large */
          err_release (&e);
          pthread_mutex_lock (&r->mu);
          atomic_store (rc < 0 ? &r->stop : &r->input_done, true);
          pthread_cond_broadcast (&r->input_cv);
          pthread_mutex_unlock (&r->mu);
          break;
        }
      apply_input (r, (const Sandbox__V1__ProcessInput *) m);
      protobuf_c_message_free_unpacked (m, NULL);
      if (atomic_load (&r->stop))
        break;
    }
  /* The input has ended: EOF for the call's own command (an attacher that
   * is done sending leaves a detached process's stdin alone). A client that
   * cancels later still stops the call: watch it until it is over. */
  if (!atomic_load (&r->stop) && r->proc == NULL)
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
  cleanup_err err_t e = ERR_INIT;
  if (api_argv_to_proto (r->start->argv, r->start->n_argv, &info, &e) < 0)
    atomic_store (&r->stop, true);
  info.running = true;
  info.started_at_ms = now_ms ();
  info.pty = r->start->pty;
  Sandbox__V1__ProcessEvent ev = SANDBOX__V1__PROCESS_EVENT__INIT;
  ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_STARTED;
  ev.started = &info;
  if (!atomic_load (&r->stop) && rpc_call_send (r->call, &ev.base, &e) < 0)
    atomic_store (&r->stop, true);
  api_argv_free (&info);
  err_release (&e);
  r->reader_started = pthread_create (&r->reader, NULL, reader_main, r) == 0;
  if (!r->reader_started)
    atomic_store (&r->stop, true); /* cannot follow the input: do not run blind */
}

/* Output as a ProcessEvent (stdout field 2, stderr 3): an exec's lent
 * buffer or, for an attachment, a copy of the ring's bytes. */
static int
send_output (run_t *r, int stream, const uint8_t *data, size_t len, bool lent)
{
  cleanup_err err_t e = ERR_INIT;
  int rc = api_send_bytes_field (r->call, stream == 1 ? 2 : 3, data, len, lent, &e);
  return rc;
}

static int
run_output (void *ctx, int stream, const uint8_t *data, size_t len)
{
  return send_output (ctx, stream, data, len, true);
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

/* A ProcessInfo of a detached process (pointing into `in` and the two
 * storages; api_argv_free after). */
static int
proc_info_to_proto (const sbx_proc_info_t *in, Sandbox__V1__ProcessInfo *out, Sandbox__V1__PtySize *pty,
                    Sandbox__V1__ExitStatus *st, err_t *err)
{
  sandbox__v1__process_info__init (out);
  out->process_id = (char *) in->id;
  out->pid = in->pid;
  size_t n = 0;
  while (in->argv != NULL && in->argv[n] != NULL)
    n++;
  if (api_argv_to_proto (in->argv, n, out, err) < 0)
    return -1;
  if (in->rows > 0)
    {
      sandbox__v1__pty_size__init (pty);
      pty->rows = in->rows;
      pty->cols = in->cols;
      out->pty = pty;
    }
  out->detached = true;
  out->running = in->running;
  if (in->exited)
    {
      api_exit_to_proto (&in->res, st);
      out->exit = st;
    }
  out->started_at_ms = in->started_at_ms;
  out->output_dropped_bytes = in->dropped_bytes;
  return 0;
}

/* The call as an attachment of detached process r->proc: started, its
 * output from the cursor on, its exit. The process outlives the call. */
static int
run_attached (run_t *r, bool replay, bool follow, err_t *err)
{
  sbx_proc_info_t info;
  sbx_proc_info (r->rt, r->proc, &info);
  Sandbox__V1__ProcessInfo pi;
  Sandbox__V1__PtySize pty;
  Sandbox__V1__ExitStatus st;
  if (proc_info_to_proto (&info, &pi, &pty, &st, err) < 0)
    return -1;
  Sandbox__V1__ProcessEvent ev = SANDBOX__V1__PROCESS_EVENT__INIT;
  ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_STARTED;
  ev.started = &pi;
  sbx_proc_cursor_t cur;
  sbx_proc_cursor_start (r->rt, r->proc, replay, &cur);
  int sent = rpc_call_send (r->call, &ev.base, err);
  api_argv_free (&pi);
  if (sent < 0)
    return -1;
  r->reader_started = pthread_create (&r->reader, NULL, reader_main, r) == 0;
  if (!r->reader_started)
    return err_make (err, EAGAIN, "Run: cannot start the input thread");
  cleanup_free uint8_t *buf = malloc (SBX_EXEC_CHUNK);
  if (buf == NULL)
    return err_make (err, ENOMEM, "Run: out of memory");
  if (!follow)
    {
      /* Not following: all input first (an error in it is the answer),
       * then what output there is, then the end. */
      pthread_mutex_lock (&r->mu);
      while (!atomic_load (&r->input_done) && !atomic_load (&r->stop))
        pthread_cond_wait (&r->input_cv, &r->mu);
      pthread_mutex_unlock (&r->mu);
    }
  for (;;)
    {
      int stream = 1;
      sbx_exec_result_t res;
      int n = sbx_proc_read (r->rt, r->proc, &cur, buf, SBX_EXEC_CHUNK, &stream, follow ? 100 : 0, &res);
      if (atomic_load (&r->stop))
        break;
      if (n < 0 && !follow)
        return 0;
      if (n > 0 && send_output (r, stream, buf, (size_t) n, false) < 0)
        return err_make (err, ECANCELED, "Run: the client has gone");
      if (n == 0)
        {
          api_exit_to_proto (&res, &st);
          Sandbox__V1__ProcessEvent end = SANDBOX__V1__PROCESS_EVENT__INIT;
          end.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT;
          end.exit = &st;
          return rpc_call_send (r->call, &end.base, err);
        }
    }
  /* Stopped: a protocol error, or the client went away (the process runs on). */
  if (take_error (r, err))
    return -1;
  return err_make (err, ECANCELED, "Run: the client went away");
}

/* The call runs its own command (not detached) through the runtime's exec:
 * it dies with the call. */
static int
run_command (run_t *r, const sbx_exec_req_t *xr, err_t *err)
{
  sbx_exec_sink_t sink = {.output = run_output, .cancelled = run_cancelled, .started = run_started, .ctx = r};
  sbx_exec_result_t res;
  int rc = sbx_exec (r->rt, xr, &sink, &res, err);
  if (rc == 0 && !atomic_load (&r->stop) && !res.cancelled)
    {
      Sandbox__V1__ExitStatus st;
      api_exit_to_proto (&res, &st);
      Sandbox__V1__ProcessEvent ev = SANDBOX__V1__PROCESS_EVENT__INIT;
      ev.event_case = SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT;
      ev.exit = &st;
      return rpc_call_send (r->call, &ev.base, err);
    }
  if (rc == 0)
    {
      /* Killed: the client broke the protocol, or went away. */
      if (!take_error (r, err))
        err_make (err, ECANCELED, "Run cancelled: %s", res.message);
      rc = -1;
    }
  return rc;
}

/* The command a `start` asks for, in *xr (argv and env owned by the caller
 * through *argv and *env). */
static int
start_request (const Sandbox__V1__ProcessStart *start, sbx_exec_req_t *xr, char ***argv, char ***env, err_t *err)
{
  if (start->n_argv == 0)
    return err_make (err, EINVAL, "argv must have at least one element");
  const Sandbox__V1__PtySize *pty = start->pty;
  if (pty != NULL && (pty->rows > 0 || pty->cols > 0)
      && (pty->rows == 0 || pty->cols == 0 || pty->rows > 65535 || pty->cols > 65535))
    return err_make (err, EINVAL, "pty needs rows and cols from 1 to 65535");
  *argv = calloc (start->n_argv + 1, sizeof **argv);
  if (*argv == NULL)
    return err_make (err, ENOMEM, "Run: out of memory");
  memcpy (*argv, start->argv, start->n_argv * sizeof **argv);
  if (api_env_from_start (start->env, start->n_env, env, err) < 0)
    return -1;
  *xr = (sbx_exec_req_t){
      .id = start->sandbox_id,
      .argv = *argv,
      .env = *env,
      .cwd = start->cwd,
      .stdin_stream = true,
      .pty_rows = pty != NULL ? (uint16_t) pty->rows : 0,
      .pty_cols = pty != NULL ? (uint16_t) pty->cols : 0,
      .timeout_seconds = start->timeout_seconds,
  };
  return 0;
}

int
api_run (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__process_input__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__ProcessInput *in = (const Sandbox__V1__ProcessInput *) m;
  bool attach = in->input_case == SANDBOX__V1__PROCESS_INPUT__INPUT_ATTACH && in->attach != NULL;
  if (!attach && (in->input_case != SANDBOX__V1__PROCESS_INPUT__INPUT_START || in->start == NULL))
    return err_make (err, EINVAL, "Run: the first message must be `start` or `attach`");
  /* An attacher's half-close ends nothing of the process's (its stdin stays
   * open): no need to tell it from a cancellation before going on. The
   * call's own command keeps the check: a cancelled stream must not end in
   * an EOF its command could take for a complete input. */
  if (attach)
    rpc_call_quick_half_close (call);
  cleanup_free char **argv = NULL;
  __attribute__ ((cleanup (cleanup_env_fn))) char **env = NULL;
  sbx_exec_req_t xr;
  if (!attach && start_request (in->start, &xr, &argv, &env, err) < 0)
    return -1;
  /* On an image: its Env and WorkingDir under the request's own. */
  __attribute__ ((cleanup (cleanup_env_fn))) char **img_env = NULL;
  cleanup_free char *img_cwd = NULL;
  if (!attach && api_image_defaults (ctx, xr.id, env, &img_env, &img_cwd, &xr, err) < 0)
    return -1;
  if (img_env != NULL)
    xr.env = img_env;
  if (!attach && (xr.cwd == NULL || xr.cwd[0] == '\0'))
    xr.cwd = img_cwd;
  cleanup_close int wake = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0)
    return err_make_sys (err, errno, "Run: eventfd");
  run_t r = {.call = call,
             .rt = ctx->rt,
             .start = attach ? NULL : in->start,
             .stdin_fd = -1,
             .pidfd = -1,
             .pty_fd = -1,
             .wake = wake,
             .error = ERR_INIT};
  atomic_init (&r.stop, false);
  pthread_mutex_init (&r.mu, NULL);
  pthread_cond_init (&r.input_cv, NULL);
  int rc;
  if (attach)
    rc = sbx_proc_attach (ctx->rt, in->attach->sandbox_id, in->attach->process_id, &r.proc, err) < 0
             ? -1
             : run_attached (&r, in->attach->replay, !in->attach->no_follow, err);
  else if (in->start->detach)
    rc = sbx_proc_start (ctx->rt, &xr, in->start->process_id, &r.proc, err) < 0 ? -1
                                                                                : run_attached (&r, true, true, err);
  else
    rc = run_command (&r, &xr, err);
  /* End the call, then the reader: its receive or its watch of the call
   * returns once the call is over, its stdin wait on the wake. */
  rpc_call_finish_err (call, rc == 0 ? 0 : -1, err);
  uint64_t one = 1;
  ssize_t woke = write (wake, &one, sizeof one); /* fails only on overflow: awake anyway */
  (void) woke;
  if (r.reader_started)
    pthread_join (r.reader, NULL);
  if (r.proc != NULL)
    sbx_proc_put (ctx->rt, r.proc);
  close_stdin (&r);
  if (r.pidfd >= 0)
    close (r.pidfd);
  if (r.pty_fd >= 0)
    close (r.pty_fd);
  err_release (&r.error);
  pthread_cond_destroy (&r.input_cv);
  pthread_mutex_destroy (&r.mu);
  return rc;
}

/* ---- ListProcesses, SignalProcess ------------------------------------------- */

int
api_list_processes (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__list_processes_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__ListProcessesRequest *req = (const Sandbox__V1__ListProcessesRequest *) m;
  cleanup_free sbx_proc_t **procs = NULL;
  size_t n = 0;
  if (sbx_proc_list (ctx->rt, req->sandbox_id, &procs, &n, err) < 0)
    return -1;
  sbx_proc_info_t *infos = calloc (n + 1, sizeof *infos);
  Sandbox__V1__ProcessInfo *pis = calloc (n + 1, sizeof *pis);
  Sandbox__V1__ProcessInfo **ptrs = calloc (n + 1, sizeof *ptrs);
  Sandbox__V1__PtySize *ptys = calloc (n + 1, sizeof *ptys);
  Sandbox__V1__ExitStatus *sts = calloc (n + 1, sizeof *sts);
  int rc = 0;
  size_t made = 0;
  if (infos == NULL || pis == NULL || ptrs == NULL || ptys == NULL || sts == NULL)
    rc = err_make (err, ENOMEM, "ListProcesses: out of memory");
  for (; rc == 0 && made < n; made++)
    {
      sbx_proc_info (ctx->rt, procs[made], &infos[made]);
      rc = proc_info_to_proto (&infos[made], &pis[made], &ptys[made], &sts[made], err);
      ptrs[made] = &pis[made];
    }
  if (rc == 0)
    {
      Sandbox__V1__ListProcessesResponse resp = SANDBOX__V1__LIST_PROCESSES_RESPONSE__INIT;
      resp.n_processes = n;
      resp.processes = ptrs;
      rc = rpc_call_reply (call, &resp.base, err);
    }
  for (size_t i = 0; i < made && pis != NULL; i++)
    api_argv_free (&pis[i]);
  for (size_t i = 0; i < n; i++)
    sbx_proc_put (ctx->rt, procs[i]);
  free (infos);
  free (pis);
  free (ptrs);
  free (ptys);
  free (sts);
  return rc;
}

int
api_signal_process (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__signal_process_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__SignalProcessRequest *req = (const Sandbox__V1__SignalProcessRequest *) m;
  if (sbx_proc_signal (ctx->rt, req->sandbox_id, req->process_id, req->signal, err) < 0)
    return -1;
  Sandbox__V1__SignalProcessResponse resp = SANDBOX__V1__SIGNAL_PROCESS_RESPONSE__INIT;
  return rpc_call_reply (call, &resp.base, err);
}
