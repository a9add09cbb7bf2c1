/* runtime/exec: running a command in a sandbox. The gateway hands the
 * sandbox's pid 1 (the holder) one request over a connection to its control
 * socket (<state>/ctl) with the command's pipes, a report socket and its
 * exec cgroup attached; the holder forks the command inside the sandbox.
 * This file pumps the pipes to the caller's sink, feeds stdin, enforces the
 * timeout and cancellation (killing everything the command started, through
 * its cgroup) and reads the exit report; exec_end.c says how it ended and
 * removes its group. The steps read in order: sbx_exec_run (start, pump,
 * describe), the caller answers, sbx_exec_finish (clean up). One thread per
 * exec; no shared state beyond the registry. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/exec_run.h"
#include "gateway/runtime/internal.h"

/* Longest wait between looks at cancellation. */
#define EXEC_POLL_MS 100
/* After the exit report: how long output may still arrive, how long more
 * once some did, and the longest drain whatever keeps the pipes busy (a
 * background child, or another process of the sandbox that opened the
 * exec's pipe through /proc). */
#define EXEC_DRAIN_MS 200
#define EXEC_DRAIN_MORE_MS 50
#define EXEC_DRAIN_MAX_MS 500
/* Pipe buffers: fewer wake-ups for a chatty command. */
#define EXEC_STDOUT_PIPE (1024 * 1024)
#define EXEC_STDERR_PIPE (256 * 1024)
/* How long the pipes wait when no buffer is free (the first one still
 * held by gRPC for a moment after its send, the total reached). */
#define EXEC_BUF_RETRY_MS 10

static void
exec_run_close (exec_run_t *x)
{
  int *fds[] = {&x->pumps[0].fd, &x->pumps[1].fd, &x->stdin_fd, &x->report_fd, &x->stream_fd};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    if (*fds[i] >= 0)
      close (take_fd (fds[i]));
  sbx_exec_bufs_free (&x->bufs);
}

static int
check_request (const sbx_exec_req_t *req, err_t *err)
{
  if (!sbx_id_valid (req->id))
    return err_make (err, EINVAL, "invalid sandbox id");
  if (req->argv == NULL || req->argv[0] == NULL || req->argv[0][0] == '\0')
    return err_make (err, EINVAL, "argv must name a program");
  if (req->timeout_seconds > SBX_EXEC_MAX_TIMEOUT)
    return err_make (err, EINVAL, "timeout_seconds %u is above the maximum of %d", req->timeout_seconds,
                     SBX_EXEC_MAX_TIMEOUT);
  if (req->cwd != NULL && req->cwd[0] != '\0' && req->cwd[0] != '/')
    return err_make (err, EINVAL, "cwd `%s` is not an absolute path", req->cwd);
  if ((req->pty_rows > 0) != (req->pty_cols > 0))
    return err_make (err, EINVAL, "a terminal needs both rows and cols");
  if (req->pty_rows > 0 && !req->stdin_stream)
    return err_make (err, EINVAL, "a terminal needs streamed stdin");
  return 0;
}

/* The holder takes at most SBX_EXEC_MAX_ARGS arguments and
 * SBX_EXEC_MAX_ENV environment entries: more is refused here, by name. */
static int
check_counts (const sbx_exec_req_t *req, char *const *env, err_t *err)
{
  size_t argc = 0, envc = 0;
  while (req->argv[argc] != NULL)
    argc++;
  while (env[envc] != NULL)
    envc++;
  if (argc <= SBX_EXEC_MAX_ARGS && envc <= SBX_EXEC_MAX_ENV)
    return 0;
  log_msg (SEV_INFO, "exec in `%s`: %zu arguments and %zu environment entries, above SBX_EXEC_MAX_ARGS/ENV", req->id,
           argc, envc);
  return err_make (err, E2BIG, "a command may have at most %d arguments and %d environment entries",
                   SBX_EXEC_MAX_ARGS, SBX_EXEC_MAX_ENV);
}

/* Sends the holder the request to start the command, with the command's
 * descriptors, keeping the gateway's ends in *x. */
static int
send_exec_request (exec_run_t *x, const char *state, err_t *err)
{
  const sbx_exec_req_t *req = x->req;
  const char *cwd = req->cwd != NULL && req->cwd[0] != '\0' ? req->cwd : "/root";
  bool pty = req->pty_rows > 0 && req->pty_cols > 0;
  /* The sandbox's launch environment (immutable, the sandbox held)
   * beneath the request's own. */
  bool oom = false;
  cleanup_free char **launch_env = sbx_env_under (x->s->env, req->env, &oom);
  cleanup_free char **env = oom ? NULL : sbx_exec_build_env (launch_env != NULL ? launch_env : req->env, pty);
  if (env == NULL)
    return err_make (err, ENOMEM, "exec: out of memory");
  if (check_counts (req, env, err) < 0)
    return -1;
  /* Sized to the request: the largest one allowed would be a mapping of
   * its own, made and unmade per exec. */
  size_t size = sbx_exec_size (cwd, req->argv, env);
  if (size > SBX_EXEC_MAX)
    return err_make (err, E2BIG, "argv and env together exceed %d KiB", SBX_EXEC_MAX / 1024);
  cleanup_free char *msg = malloc (size);
  if (msg == NULL)
    return err_make (err, ENOMEM, "exec: out of memory");
  ssize_t msg_len = sbx_exec_encode (msg, size, cwd, req->argv, env);
  if (msg_len < 0)
    return err_make (err, E2BIG, "argv and env together exceed %d KiB", SBX_EXEC_MAX / 1024);
  /* Only a caller that streams stdin uses the STARTED report: a plain
   * exec spares the command a pidfd and the gateway a wake-up. */
  sbx_exec_set_options (msg, pty ? req->pty_rows : 0, pty ? req->pty_cols : 0,
                        (req->stdin_stream ? SBX_EXEC_F_STARTED : 0) | (req->as_user ? SBX_EXEC_F_USER : 0));
  if (req->as_user)
    sbx_exec_set_user (msg, req->uid, req->gid);
  cleanup_close int procs_fd = -1;
  if (sbx_cg_open_track (&x->rt->cg, req->id, x->group, &procs_fd, err) < 0)
    return -1;
  cleanup_pipe int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, rep[2] = {-1, -1};
  if (pipe2 (in, O_CLOEXEC) < 0 || pipe2 (out, O_CLOEXEC) < 0 || pipe2 (errp, O_CLOEXEC) < 0
      || socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rep) < 0)
    return err_make_sys (err, errno, "exec: pipe");
  x->started = sbx_mono_ms ();
  /* The holder forks the command inside the sandbox with these as its
   * stdin, stdout, stderr, report socket and cgroup. */
  int pass[SBX_EXEC_FDS] = {
      [SBX_EXEC_SLOT_STDIN] = in[0],   [SBX_EXEC_SLOT_STDOUT] = out[1],  [SBX_EXEC_SLOT_STDERR] = errp[1],
      [SBX_EXEC_SLOT_REPORT] = rep[1], [SBX_EXEC_SLOT_PROCS] = procs_fd,
  };
  cleanup_close int ctl = sbx_connect_holder (state, req->id, err);
  if (ctl < 0)
    return -1;
  if (sbx_send_fds (ctl, msg, (size_t) msg_len, pass, SBX_EXEC_FDS) < 0)
    {
      if (errno == EMSGSIZE) /* a buffer the gateway could not enlarge */
        return err_make (err, E2BIG,
                         "argv and env together (%zd bytes) are more than this host lets the gateway "
                         "hand to a sandbox in one message",
                         msg_len);
      return err_make_sys (err, errno == EPIPE || errno == ECONNREFUSED ? ESRCH : errno,
                           "sandbox `%s` is gone (its pid 1 does not answer)", req->id);
    }
  x->report_fd = take_fd (&rep[0]);
  x->pumps[0] = (pump_t){take_fd (&out[0]), 1};
  x->pumps[1] = (pump_t){take_fd (&errp[0]), 2};
  /* While the holder starts the command: nothing is written into them
   * before its exec. */
  fcntl (x->pumps[0].fd, F_SETPIPE_SZ, EXEC_STDOUT_PIPE);
  fcntl (x->pumps[1].fd, F_SETPIPE_SZ, EXEC_STDERR_PIPE);
  fcntl (x->pumps[0].fd, F_SETFL, O_NONBLOCK);
  fcntl (x->pumps[1].fd, F_SETFL, O_NONBLOCK);
  /* Also meanwhile: the counters read after the command's end (see
   * sbx_exec), then only read again. */
  sbx_cg_counters_open (&x->rt->cg, req->id, x->group, &x->ctr);
  if (req->stdin_stream)
    x->stream_fd = take_fd (&in[1]);
  else if (req->stdin_len > 0)
    {
      x->stdin_fd = take_fd (&in[1]);
      fcntl (x->stdin_fd, F_SETFL, O_NONBLOCK);
    }
  return 0;
}

/* Kills the command's cgroup once it is past its deadline or unwanted. */
static void
kill_if_due (exec_run_t *x, int64_t now)
{
  /* Once the command has exited its status stands: what it left running
   * is not killed for the deadline (see sbx_exec). */
  if (x->exited)
    return;
  if (x->killed)
    {
      /* The command may join its cgroup after the kill found it empty (a
       * holder slow to fork): kill again until its exit report comes. */
      if (now - x->killed_at >= EXEC_POLL_MS)
        {
          x->killed_at = now;
          sbx_cg_kill (&x->rt->cg, x->req->id, x->group, NULL);
        }
      return;
    }
  /* The caller's cancellation is looked at every EXEC_POLL_MS, not on
   * every wake-up (output, the pipes' end): each look asks gRPC. */
  bool look = now - x->cancel_checked >= EXEC_POLL_MS;
  if (look)
    x->cancel_checked = now;
  if (!(now >= x->deadline || x->consumer_gone || (look && x->sink->cancelled (x->sink->ctx))))
    return;
  if (now >= x->deadline)
    x->res->timed_out = true;
  else
    x->res->cancelled = true;
  x->killed = true;
  x->killed_at = now;
  err_t kerr = ERR_INIT;
  if (sbx_cg_kill (&x->rt->cg, x->req->id, x->group, &kerr) < 0)
    err_warn_release (&kerr, "exec in `%s`", x->req->id);
}

static void
on_report (exec_run_t *x)
{
  sbx_report_t r;
  int got[SBX_REPORT_MAX_FDS] = {-1, -1};
  int g = sbx_read_report (x->report_fd, &r, 0, got, SBX_REPORT_MAX_FDS);
  if (g == 1 && r.type == SBX_REPORT_STARTED)
    {
      x->started_seen = true;
      int pidfd, master;
      sbx_report_started_fds (&r, got, &pidfd, &master);
      sbx_exec_started_t st = {.pid = r.u.started.pid, .pidfd = pidfd, .stdin_fd = x->stream_fd, .pty_fd = -1};
      x->stream_fd = -1;
      if (master >= 0)
        {
          /* On a terminal: its master is the output (stream 1) and the
           * input; the pipes stay unused and close. */
          if (x->pumps[0].fd >= 0)
            close (x->pumps[0].fd);
          x->pumps[0].fd = fcntl (master, F_DUPFD_CLOEXEC, 3);
          if (x->pumps[0].fd >= 0)
            fcntl (x->pumps[0].fd, F_SETFL, O_NONBLOCK);
          if (st.stdin_fd >= 0)
            close (st.stdin_fd);
          st.stdin_fd = fcntl (master, F_DUPFD_CLOEXEC, 3);
          st.pty_fd = master;
        }
      if (x->sink->started != NULL)
        x->sink->started (x->sink->ctx, &st);
      else
        {
          int own[] = {st.pidfd, st.stdin_fd, st.pty_fd};
          for (size_t i = 0; i < 3; i++)
            if (own[i] >= 0)
              close (own[i]);
        }
      return;
    }
  for (size_t i = 0; i < SBX_REPORT_MAX_FDS; i++)
    if (got[i] >= 0)
      close (got[i]);
  if (g == 1 && r.type == SBX_REPORT_ERROR)
    {
      snprintf (x->start_error, sizeof x->start_error, "%s", r.text);
      x->started_seen = true;
    }
  else if (g == 1 && r.type == SBX_REPORT_EXIT)
    {
      x->res->exit_code = r.u.exit.code;
      x->res->signal = r.u.exit.signal;
      x->exited = true;
    }
  else if (g <= 0)
    {
      /* The sandbox's pid 1 died without a word (deleted). */
      x->res->exit_code = -1;
      x->res->signal = SIGKILL;
      x->exited = true;
    }
  if (x->exited)
    {
      x->started_seen = true;
      x->exited_at = sbx_mono_ms ();
      x->drain_until = x->exited_at + EXEC_DRAIN_MS;
      /* What the command wrote before it exited is its output, however
       * long a slow consumer takes for it; the bound is for what comes
       * after. */
      for (size_t i = 0; i < 2; i++)
        {
          int queued = 0;
          if (x->pumps[i].fd >= 0 && ioctl (x->pumps[i].fd, FIONREAD, &queued) == 0 && queued > 0)
            x->pumps[i].owed = (size_t) queued;
        }
    }
}

static void
on_stdin (exec_run_t *x)
{
  const sbx_exec_req_t *req = x->req;
  ssize_t w = write (x->stdin_fd, req->stdin_data + x->stdin_off, req->stdin_len - x->stdin_off);
  if (w > 0)
    x->stdin_off += (size_t) w;
  if ((w < 0 && errno != EAGAIN) || x->stdin_off >= req->stdin_len)
    close (take_fd (&x->stdin_fd));
}

/* Reads what is there on `p` and hands it to the sink. */
static void
on_output (exec_run_t *x, pump_t *p, bool *got)
{
  sbx_outbuf_t *b = sbx_exec_bufs_get (&x->bufs);
  if (b == NULL)
    {
      x->buf_wait = true; /* held a moment longer, or out of memory: the next round */
      return;
    }
  ssize_t n = TEMP_FAILURE_RETRY (read (p->fd, b->data, b->cap));
  if (n > 0)
    {
      *got = true;
      p->owed = (size_t) n < p->owed ? p->owed - (size_t) n : 0;
      /* It filled the buffer: more is waiting, and the client took the
       * last message (no read happens before): the next buffer doubles. */
      if ((size_t) n == b->cap && b->cap == x->bufs.want && x->bufs.want < SBX_EXEC_CHUNK)
        x->bufs.want *= 2;
      if (x->sink->output (x->sink->ctx, p->stream, b->data, (size_t) n) < 0)
        x->consumer_gone = true;
      x->sink_busy = x->sink->ready != NULL;
    }
  else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
    close (take_fd (&p->fd));
}

/* One round: waits for the pipes, the report or stdin's room, and serves
 * what is ready. */
static int
pump_once (exec_run_t *x, int64_t now, err_t *err)
{
  struct pollfd p[4];
  int np = 0;
  int64_t wait = x->exited ? x->drain_until - now : x->killed ? EXEC_POLL_MS : x->deadline - now;
  wait = wait > EXEC_POLL_MS ? EXEC_POLL_MS : wait < 0 ? 0 : wait;
  /* A consumer still taking the last output: no more is read (the pipes
   * fill and the command waits) but the round, and with it the deadline
   * and cancellation, comes as often as ever. */
  if (x->sink_busy && !x->consumer_gone)
    {
      int r = x->sink->ready (x->sink->ctx, (int) wait);
      x->consumer_gone = r < 0;
      x->sink_busy = r == 0;
      if (r == 0)
        {
          wait = 0;
          sbx_exec_bufs_trim (&x->bufs); /* the client is slow: hold only what is in flight */
        }
    }
  /* A streamed run's caller hears of the start before any output; no
   * output is read without a buffer to read it into. */
  bool hold = (x->req->stdin_stream && !x->started_seen) || (x->sink_busy && !x->consumer_gone) || x->buf_wait;
  if (x->buf_wait && wait > EXEC_BUF_RETRY_MS)
    wait = EXEC_BUF_RETRY_MS;
  x->buf_wait = false;
  for (int i = 0; i < 2; i++)
    p[np++] = (struct pollfd){.fd = hold ? -1 : x->pumps[i].fd, .events = POLLIN}; /* fd -1: ignored */
  p[np++] = (struct pollfd){.fd = x->exited ? -1 : x->report_fd, .events = POLLIN};
  p[np++] = (struct pollfd){.fd = x->stdin_fd, .events = POLLOUT};
  int ready = TEMP_FAILURE_RETRY (poll (p, (nfds_t) np, (int) wait));
  if (ready < 0)
    return err_make_sys (err, errno, "exec: poll");
  if (ready == 0 && !hold && wait >= EXEC_POLL_MS)
    sbx_exec_bufs_trim (&x->bufs); /* a quiet round: nothing is kept for output that may not come */
  bool got = false;
  for (int i = 0; i < 2; i++)
    if (p[i].revents != 0 && !(p[i].revents & POLLIN))
      close (take_fd (&x->pumps[i].fd)); /* empty and closed on the other side: nothing to read */
    else if (p[i].revents != 0 && !x->consumer_gone)
      on_output (x, &x->pumps[i], &got);
    else if (x->exited && now >= x->drain_until)
      x->pumps[i].owed = 0; /* an empty pipe owes nothing (another reader took the bytes) */
  if (p[2].revents != 0)
    on_report (x);
  if (p[3].revents != 0)
    on_stdin (x);
  if (x->exited && got && sbx_mono_ms () + EXEC_DRAIN_MORE_MS > x->drain_until)
    {
      int64_t more = sbx_mono_ms () + EXEC_DRAIN_MORE_MS, cap = x->exited_at + EXEC_DRAIN_MAX_MS;
      x->drain_until = more < cap ? more : cap;
    }
  return 0;
}

bool
sbx_exec_sandbox_deleting (exec_run_t *x)
{
  pthread_mutex_lock (&x->rt->mu);
  bool deleting = x->s->deleting;
  pthread_mutex_unlock (&x->rt->mu);
  return deleting;
}

/* Pumps until the command has exited and its output is drained. */
static int
pump_all (exec_run_t *x, err_t *err)
{
  for (;;)
    {
      int64_t now = sbx_mono_ms ();
      kill_if_due (x, now);
      bool drained = x->pumps[0].fd < 0 && x->pumps[1].fd < 0;
      bool owed = (x->pumps[0].fd >= 0 && x->pumps[0].owed > 0) || (x->pumps[1].fd >= 0 && x->pumps[1].owed > 0);
      /* What a slow consumer is owed waits for it, but not past the
       * sandbox's delete. */
      if (owed && x->exited && x->sink_busy && sbx_exec_sandbox_deleting (x))
        owed = false;
      if (x->exited
          && (drained || (now >= x->drain_until && !owed) || x->consumer_gone || x->sink->cancelled (x->sink->ctx)))
        return 0;
      if (pump_once (x, now, err) < 0)
        {
          /* The command must not outlive the exec that lost track of it. */
          sbx_cg_kill (&x->rt->cg, x->req->id, x->group, NULL);
          return -1;
        }
    }
}

/* Holds sandbox `req->id` for an exec (and, for a background one, keeps it
 * from idling): *out, or -1 with *err (ENOENT unknown, ENOTCONN dead). */
static int
exec_acquire (sbx_runtime_t *rt, const sbx_exec_req_t *req, sbx_t **out, err_t *err)
{
  sbx_t *s = sbx_acquire (rt, req->id);
  if (s == NULL)
    return sbx_err_not_found (err, req->id, NULL);
  pthread_mutex_lock (&rt->mu);
  bool dead = s->dead;
  if (!dead && req->background)
    s->bg_refs++;
  pthread_mutex_unlock (&rt->mu);
  if (dead)
    {
      sbx_release (rt, s);
      return err_make (err, ENOTCONN, "sandbox `%s` is dead (its pid 1 died): Delete it, or Connect to restore it",
                       req->id);
    }
  *out = s;
  return 0;
}

/* Cleans up after an exec, whether its command ran (`ran`) or not. */
static void
exec_end (exec_run_t *x, bool ran)
{
  sbx_runtime_t *rt = x->rt;
  exec_run_close (x);
  sbx_exec_remove_group (x, ran);
  if (x->req->background)
    {
      pthread_mutex_lock (&rt->mu);
      x->s->bg_refs--;
      pthread_mutex_unlock (&rt->mu);
    }
  sbx_release (rt, x->s);
  free (x);
}

int
sbx_exec_run (sbx_runtime_t *rt, const sbx_exec_req_t *req, const sbx_exec_sink_t *sink, sbx_exec_result_t *res,
              sbx_exec_t **out, err_t *err)
{
  *out = NULL;
  memset (res, 0, sizeof *res);
  if (check_request (req, err) < 0)
    return -1;
  uint32_t timeout = req->timeout_seconds ? req->timeout_seconds : SBX_EXEC_DEFAULT_TIMEOUT;
  sbx_t *s = NULL;
  if (exec_acquire (rt, req, &s, err) < 0)
    return -1;
  exec_run_t *x = calloc (1, sizeof *x);
  if (x == NULL)
    {
      pthread_mutex_lock (&rt->mu);
      if (req->background)
        s->bg_refs--;
      pthread_mutex_unlock (&rt->mu);
      sbx_release (rt, s);
      return err_make (err, ENOMEM, "exec: out of memory");
    }
  *x = (exec_run_t){.rt = rt,
                    .s = s,
                    .req = req,
                    .sink = sink,
                    .res = res,
                    .pumps = {{-1, 1}, {-1, 2}},
                    .stdin_fd = -1,
                    .stream_fd = -1,
                    .report_fd = -1,
                    .bufs = {.want = SBX_EXEC_BUF_FIRST, .total = (size_t) rt->cfg.exec_buffer_total_bytes},
                    .ctr = {.fds = {{-1, -1}, {-1, -1}}}};
  pthread_mutex_lock (&rt->mu);
  snprintf (x->group, sizeof x->group, "exec-%u", ++s->exec_seq);
  char state[sizeof s->state];
  snprintf (state, sizeof state, "%s", s->state);
  pthread_mutex_unlock (&rt->mu);
  int rc = send_exec_request (x, state, err);
  if (rc == 0)
    {
      x->deadline = req->no_timeout ? INT64_MAX : x->started + (int64_t) timeout * 1000;
      rc = pump_all (x, err);
    }
  if (rc < 0)
    {
      exec_end (x, false);
      return -1;
    }
  sbx_exec_describe (x, timeout);
  *out = x;
  return 0;
}

void
sbx_exec_finish (sbx_exec_t *x)
{
  if (x != NULL)
    exec_end (x, true);
}

int
sbx_exec (sbx_runtime_t *rt, const sbx_exec_req_t *req, const sbx_exec_sink_t *sink, sbx_exec_result_t *res,
          err_t *err)
{
  sbx_exec_t *x = NULL;
  if (sbx_exec_run (rt, req, sink, res, &x, err) < 0)
    return -1;
  sbx_exec_finish (x);
  return 0;
}
