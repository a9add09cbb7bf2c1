/* runtime/exec: running a command in a sandbox. The gateway hands the
 * sandbox's pid 1 (the holder) one request over a connection to its control
 * socket (<state>/ctl) with the command's pipes, a report socket and its
 * exec cgroup attached; the holder forks the command inside the sandbox. This file pumps the pipes to the
 * caller's sink, feeds stdin, enforces the timeout and cancellation (killing
 * everything the command started, through its cgroup) and reads the exit
 * report. One thread per exec; no shared state beyond the registry. */
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
#include "gateway/runtime/internal.h"

/* How long a call waits for the sandbox's pid 1 to take its request. */
#define SBX_HOLDER_CONNECT_MS 15000
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
/* An exec's first output buffer, its own whatever other execs hold: its
 * reads are never smaller. While its client keeps up, later buffers double
 * up to SBX_EXEC_CHUNK, charged to the gateway's total (see bufs_get). */
#define EXEC_BUF_FIRST (16 * 1024)
/* How long the pipes wait when no buffer is free (the first one still
 * held by gRPC for a moment after its send, the total reached). */
#define EXEC_BUF_RETRY_MS 10

static const char *const default_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
};
#define TERM_ON_A_PTY "TERM=xterm-256color"

/* Builds the command's environment: defaults overridden by the request. */
static char **
build_env (char *const *extra, bool pty)
{
  size_t n_extra = 0;
  while (extra != NULL && extra[n_extra] != NULL)
    n_extra++;
  size_t n_def = sizeof default_env / sizeof default_env[0];
  char **env = calloc (n_def + n_extra + 1, sizeof *env);
  if (env == NULL)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n_def; i++)
    {
      size_t klen = strcspn (default_env[i], "=") + 1;
      bool overridden = false;
      for (size_t j = 0; j < n_extra && !overridden; j++)
        overridden = strncmp (extra[j], default_env[i], klen) == 0;
      if (!overridden)
        env[k++]
            = pty && strncmp (default_env[i], "TERM=", 5) == 0 ? (char *) TERM_ON_A_PTY : (char *) default_env[i];
    }
  for (size_t j = 0; j < n_extra; j++)
    env[k++] = extra[j];
  env[k] = NULL;
  return env;
}

/* An output buffer, lent to a sink (sbx_exec_hold): its reader holds one
 * reference to each of its own, a sink one per message in flight. */
struct sbx_outbuf_s
{
  atomic_int refs;
  size_t cap;     /* bytes in data */
  size_t charged; /* of those, counted in exec_charged (given back when freed) */
  uint8_t data[];
};

/* Bytes of exec output buffers beyond each exec's first one, in the whole
 * gateway: held to sbx_config_t.exec_buffer_total_bytes. A buffer may
 * outlive its exec and the runtime (gRPC drops its last reference), so the
 * count is the process's, not a runtime's. */
static atomic_size_t exec_charged;

static sbx_outbuf_t *
outbuf_of (const uint8_t *data)
{
  return (sbx_outbuf_t *) (void *) ((uint8_t *) data - offsetof (sbx_outbuf_t, data));
}

void
sbx_exec_hold (const uint8_t *data)
{
  atomic_fetch_add (&outbuf_of (data)->refs, 1);
}

void
sbx_exec_release (const uint8_t *data)
{
  sbx_outbuf_t *b = outbuf_of (data);
  if (atomic_fetch_sub (&b->refs, 1) == 1)
    {
      if (b->charged > 0)
        atomic_fetch_sub (&exec_charged, b->charged);
      free (b);
    }
}

size_t
sbx_exec_buffered_bytes (void)
{
  return atomic_load (&exec_charged);
}

/* A new buffer of `size` bytes, `charge` of them counted against `limit`
 * in exec_charged: NULL when they would pass it, or out of memory. */
static sbx_outbuf_t *
outbuf_new (size_t size, size_t charge, size_t limit)
{
  if (charge > 0)
    {
      size_t held = atomic_load (&exec_charged);
      do
        if (charge > limit || held > limit - charge)
          return NULL;
      while (!atomic_compare_exchange_weak (&exec_charged, &held, held + charge));
    }
  sbx_outbuf_t *b = malloc (sizeof *b + size);
  if (b == NULL)
    {
      atomic_fetch_sub (&exec_charged, charge);
      return NULL;
    }
  atomic_init (&b->refs, 1);
  b->cap = size;
  b->charged = charge;
  return b;
}

uint8_t *
sbx_outbufs_get (sbx_outbufs_t *p, size_t size)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (p->b[i] != NULL && atomic_load (&p->b[i]->refs) == 1)
      return p->b[i]->data;
  size_t slot = 0;
  while (slot < SBX_OUTBUFS - 1 && p->b[slot] != NULL)
    slot++;
  sbx_outbuf_t *b = outbuf_new (size, 0, 0);
  if (b == NULL)
    return NULL;
  if (p->b[slot] != NULL)
    sbx_exec_release (p->b[slot]->data);
  p->b[slot] = b;
  return b->data;
}

void
sbx_outbufs_free (sbx_outbufs_t *p)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (p->b[i] != NULL)
      {
        sbx_exec_release (p->b[i]->data);
        p->b[i] = NULL;
      }
}

typedef struct pump_s
{
  int fd;
  int stream;
  size_t owed; /* bytes in the pipe at the exit report: delivered whatever the drain's bound */
} pump_t;

/* One exec in flight. */
typedef struct exec_run_s
{
  sbx_runtime_t *rt;
  sbx_t *s;
  const sbx_exec_req_t *req;
  const sbx_exec_sink_t *sink;
  sbx_exec_result_t *res;
  char group[32];
  pump_t pumps[2]; /* stdout, stderr; fd -1 once closed */
  int stdin_fd;    /* -1 once all of stdin is written */
  int stream_fd;   /* stdin_stream: the write end to hand over at STARTED */
  size_t stdin_off;
  int report_fd;
  int64_t started, deadline, exited_at, drain_until, killed_at;
  int64_t cancel_checked; /* when the sink was last asked whether the caller went away */
  bool exited, killed, consumer_gone;
  bool started_seen; /* the STARTED report came (or never will) */
  bool sink_busy;    /* an asynchronous sink (sink->ready) has not taken the last output yet */
  char start_error[sizeof ((sbx_report_t *) 0)->text];
  /* Output is read into these: `first` (EXEC_BUF_FIRST bytes), or while
   * the client keeps up one of `grown` (`want` bytes each, charged). */
  sbx_outbuf_t *first;
  sbx_outbuf_t *grown[SBX_OUTBUFS];
  size_t want;
  bool buf_wait;         /* no buffer was free: the pipes wait EXEC_BUF_RETRY_MS */
  sbx_cg_counters_t ctr; /* the limit-event counters, opened while the command starts */
} exec_run_t;

/* Gives back the grown buffers no sink holds, and starts small again: the
 * client stalled, or the command is quiet. What a stalled exec holds is
 * then the one message in flight. */
static void
bufs_trim (exec_run_t *x)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (x->grown[i] != NULL && atomic_load (&x->grown[i]->refs) == 1)
      {
        sbx_exec_release (x->grown[i]->data);
        x->grown[i] = NULL;
      }
  x->want = EXEC_BUF_FIRST;
}

/* A buffer no sink holds, to read output into: one of `want` bytes when
 * one is free or the gateway's total has room for a new one, else the
 * first (reads go on, smaller); NULL when none is free. */
static sbx_outbuf_t *
bufs_get (exec_run_t *x)
{
  if (x->want > EXEC_BUF_FIRST)
    {
      size_t empty = SBX_OUTBUFS;
      for (size_t i = 0; i < SBX_OUTBUFS; i++)
        {
          sbx_outbuf_t *b = x->grown[i];
          if (b != NULL && atomic_load (&b->refs) == 1 && b->cap == x->want)
            return b;
          if (b != NULL && atomic_load (&b->refs) == 1)
            {
              /* Free, and outgrown: its room goes back. */
              sbx_exec_release (b->data);
              x->grown[i] = b = NULL;
            }
          if (b == NULL && empty == SBX_OUTBUFS)
            empty = i;
        }
      size_t total = (size_t) x->rt->cfg.exec_buffer_total_bytes;
      sbx_outbuf_t *b = empty < SBX_OUTBUFS ? outbuf_new (x->want, x->want, total) : NULL;
      if (b != NULL)
        return x->grown[empty] = b;
    }
  if (x->first == NULL)
    x->first = outbuf_new (EXEC_BUF_FIRST, 0, 0);
  if (x->first != NULL && atomic_load (&x->first->refs) == 1)
    return x->first;
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (x->grown[i] != NULL && atomic_load (&x->grown[i]->refs) == 1)
      return x->grown[i];
  return NULL;
}

static void
exec_run_close (exec_run_t *x)
{
  int *fds[] = {&x->pumps[0].fd, &x->pumps[1].fd, &x->stdin_fd, &x->report_fd, &x->stream_fd};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    if (*fds[i] >= 0)
      close (take_fd (fds[i]));
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (x->grown[i] != NULL)
      {
        sbx_exec_release (x->grown[i]->data);
        x->grown[i] = NULL;
      }
  if (x->first != NULL)
    {
      sbx_exec_release (x->first->data);
      x->first = NULL;
    }
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

/* A connection to the sandbox's pid 1: its control socket <state>/ctl,
 * named through /proc/self/fd (the state path may be longer than a socket
 * address allows). */
int
sbx_connect_holder (const char *state, const char *id, err_t *err)
{
  cleanup_close int dir = open (state, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cleanup_close int fd = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf (sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/" SBX_CTL_NAME, dir);
  if (fd < 0)
    return err_make_sys (err, errno, "exec: socket");
  /* A request is one message, and a message must fit the sender's buffer
   * (net.core.wmem_max, 208 KiB by default, is below SBX_EXEC_MAX): the
   * gateway, root in its network namespace, sets its own past that cap. */
  int sndbuf = SBX_EXEC_MAX + 64 * 1024;
  setsockopt (fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf);
  /* The holder takes one request at a time, each in a bounded time (a
   * command's start: START_DEADLINE_MS in helper/holder.c); a backlog of
   * callers waits for it no longer than this, connect and send. */
  struct timeval tv = {.tv_sec = SBX_HOLDER_CONNECT_MS / 1000, .tv_usec = (SBX_HOLDER_CONNECT_MS % 1000) * 1000};
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (dir < 0 || connect (fd, (struct sockaddr *) &sa, sizeof sa) < 0)
    {
      if (dir >= 0 && (errno == EAGAIN || errno == EINPROGRESS))
        return err_make (err, ETIMEDOUT, "sandbox `%s`: its pid 1 did not take the request within %d s", id,
                         SBX_HOLDER_CONNECT_MS / 1000);
      return err_make_sys (err, ESRCH, "sandbox `%s` is gone (its pid 1 does not answer)", id);
    }
  return take_fd (&fd);
}

/* Sends the request to the holder with the command's descriptors, keeping
 * the gateway's ends in *x. */
static int
start_command (exec_run_t *x, const char *state, err_t *err)
{
  const sbx_exec_req_t *req = x->req;
  const char *cwd = req->cwd != NULL && req->cwd[0] != '\0' ? req->cwd : "/root";
  bool pty = req->pty_rows > 0 && req->pty_cols > 0;
  cleanup_free char **env = build_env (req->env, pty);
  if (env == NULL)
    return err_make (err, ENOMEM, "exec: out of memory");
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
                        req->stdin_stream ? SBX_EXEC_F_STARTED : 0);
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
  int pass[SBX_EXEC_FDS] = {in[0], out[1], errp[1], rep[1], procs_fd};
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
  int got[2] = {-1, -1};
  int g = sbx_read_report (x->report_fd, &r, 0, got, 2);
  if (g == 1 && r.type == SBX_REPORT_STARTED)
    {
      x->started_seen = true;
      int k = 0, pidfd = (r.b & 1) ? got[k++] : -1, master = (r.b & 2) ? got[k++] : -1;
      sbx_exec_started_t st = {.pid = r.a, .pidfd = pidfd, .stdin_fd = x->stream_fd, .pty_fd = -1};
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
  for (size_t i = 0; i < 2; i++)
    if (got[i] >= 0)
      close (got[i]);
  if (g == 1 && r.type == SBX_REPORT_ERROR)
    {
      snprintf (x->start_error, sizeof x->start_error, "%s", r.text);
      x->started_seen = true;
    }
  else if (g == 1 && r.type == SBX_REPORT_EXIT)
    {
      x->res->exit_code = r.a;
      x->res->signal = r.b;
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
  sbx_outbuf_t *b = bufs_get (x);
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
      if ((size_t) n == b->cap && b->cap == x->want && x->want < SBX_EXEC_CHUNK)
        x->want *= 2;
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
          bufs_trim (x); /* the client is slow: hold only what is in flight */
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
    bufs_trim (x); /* a quiet round: nothing is kept for output that may not come */
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

static bool
sandbox_deleting (exec_run_t *x)
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
      if (owed && x->exited && x->sink_busy && sandbox_deleting (x))
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

/* Fills the result's message from how the command ended. */
static void
describe_end (exec_run_t *x, uint32_t timeout)
{
  sbx_exec_result_t *res = x->res;
  bool can_send = !x->consumer_gone && (!x->sink_busy || x->sink->ready (x->sink->ctx, 0) > 0);
  if (x->start_error[0] != '\0' && can_send)
    {
      /* In one of the exec's buffers: the sink may keep it. */
      sbx_outbuf_t *b = bufs_get (x);
      if (b != NULL)
        {
          int len = snprintf ((char *) b->data, b->cap, "sandbox: %s\n", x->start_error);
          x->sink->output (x->sink->ctx, 2, b->data, (size_t) len < b->cap ? (size_t) len : b->cap - 1);
        }
      snprintf (res->message, sizeof res->message, "%.*s", (int) sizeof res->message - 1, x->start_error);
    }
  res->duration_ms = (uint64_t) (sbx_mono_ms () - x->started);
  if (res->timed_out)
    snprintf (res->message, sizeof res->message, "killed after the %u s timeout, with everything it started",
              timeout);
  else if (res->cancelled)
    snprintf (res->message, sizeof res->message, "killed: the client went away");
}

/* Says when a limit of the sandbox hit the command. */
static void
describe_limits (sbx_runtime_t *rt, const sbx_cg_events_t *before, const sbx_cg_events_t *after,
                 sbx_exec_result_t *res)
{
  if (after->oom_kills > before->oom_kills)
    {
      res->oom_killed = true;
      snprintf (res->message, sizeof res->message, "the sandbox's memory limit (%ld MiB) killed a process",
                rt->cfg.memory_mb);
    }
  if (after->pids_max_hits > before->pids_max_hits)
    res->pids_limited = true;
  if (res->pids_limited && !res->oom_killed && res->message[0] == '\0')
    snprintf (res->message, sizeof res->message, "the sandbox's process limit (%ld) refused new processes",
              rt->cfg.pids_max);
}

int
sbx_exec_write (int fd, const uint8_t *data, size_t len, int wake, err_t *err)
{
  for (size_t off = 0; off < len;)
    {
      ssize_t w = write (fd, data + off, len - off);
      if (w > 0)
        off += (size_t) w;
      else if (w < 0 && errno == EAGAIN)
        {
          struct pollfd p[2] = {{.fd = fd, .events = POLLOUT}, {.fd = wake, .events = POLLIN}};
          if (poll (p, 2, -1) < 0 && errno != EINTR)
            return err_make_sys (err, errno, "poll");
          if (p[1].revents != 0)
            return err_make (err, ECANCELED, "stopped");
        }
      else if (!(w < 0 && errno == EINTR))
        return err_make (err, EPIPE, "the command's stdin is closed");
    }
  return 0;
}

int
sbx_exec_end_input_pty (int pty_fd, int wake, err_t *err)
{
  struct termios t;
  uint8_t eof = tcgetattr (pty_fd, &t) == 0 ? t.c_cc[VEOF] : 0x04;
  return sbx_exec_write (pty_fd, &eof, 1, wake, err);
}

int
sbx_exec_resize (int pty_fd, uint16_t rows, uint16_t cols, err_t *err)
{
  struct winsize ws = {.ws_row = rows, .ws_col = cols};
  if (ioctl (pty_fd, TIOCSWINSZ, &ws) < 0)
    return err_make_sys (err, errno, "resize the terminal");
  return 0;
}

#ifndef PIDFD_SIGNAL_PROCESS_GROUP
#define PIDFD_SIGNAL_PROCESS_GROUP (1U << 2)
#endif

int
sbx_exec_signal (int pidfd, int sig, err_t *err)
{
  if (sig <= 0 || sig >= NSIG)
    return err_make (err, EINVAL, "%d is not a signal number", sig);
  if (pidfd < 0)
    return err_make (err, ESRCH, "the process cannot be signalled");
  if (syscall (SYS_pidfd_send_signal, pidfd, sig, NULL, PIDFD_SIGNAL_PROCESS_GROUP) == 0)
    return 0;
  /* A kernel before 6.9 signals the process itself only. */
  if (errno == EINVAL && syscall (SYS_pidfd_send_signal, pidfd, sig, NULL, 0) == 0)
    return 0;
  return err_make_sys (err, errno, "signal %d", sig);
}

int
sbx_exec (sbx_runtime_t *rt, const sbx_exec_req_t *req, const sbx_exec_sink_t *sink, sbx_exec_result_t *res,
          err_t *err)
{
  memset (res, 0, sizeof *res);
  if (check_request (req, err) < 0)
    return -1;
  uint32_t timeout = req->timeout_seconds ? req->timeout_seconds : SBX_EXEC_DEFAULT_TIMEOUT;
  sbx_t *s = sbx_acquire (rt, req->id);
  if (s != NULL && req->background)
    {
      pthread_mutex_lock (&rt->mu);
      s->bg_refs++;
      pthread_mutex_unlock (&rt->mu);
    }
  if (s == NULL)
    return sbx_err_not_found (err, req->id, NULL);
  pthread_mutex_lock (&rt->mu);
  bool dead = s->dead;
  pthread_mutex_unlock (&rt->mu);
  if (dead)
    {
      if (req->background)
        {
          pthread_mutex_lock (&rt->mu);
          s->bg_refs--;
          pthread_mutex_unlock (&rt->mu);
        }
      sbx_release (rt, s);
      return err_make (err, ENOTCONN, "sandbox `%s` is dead (its pid 1 died): Delete it, or Connect to restore it",
                       req->id);
    }

  exec_run_t x = {.rt = rt,
                  .s = s,
                  .req = req,
                  .sink = sink,
                  .res = res,
                  .pumps = {{-1, 1}, {-1, 2}},
                  .stdin_fd = -1,
                  .stream_fd = -1,
                  .report_fd = -1,
                  .want = EXEC_BUF_FIRST,
                  .ctr = {.fds = {{-1, -1}, {-1, -1}}}};
  pthread_mutex_lock (&rt->mu);
  snprintf (x.group, sizeof x.group, "exec-%u", ++s->exec_seq);
  char state[sizeof s->state];
  snprintf (state, sizeof state, "%s", s->state);
  pthread_mutex_unlock (&rt->mu);
  int rc = start_command (&x, state, err);
  if (rc == 0)
    {
      x.deadline = req->no_timeout ? INT64_MAX : x.started + (int64_t) timeout * 1000;
      rc = pump_all (&x, err);
    }
  if (rc == 0)
    {
      describe_end (&x, timeout);
      /* The sandbox's limit events since the last exec's end: one read of
       * the counters per exec instead of a read before and after. */
      sbx_cg_events_t before, after;
      sbx_cg_counters_read (&rt->cg, req->id, &x.ctr, false, &after);
      pthread_mutex_lock (&rt->mu);
      before = s->cg_seen;
      s->cg_seen = after;
      s->last_used_ms = sbx_mono_ms (); /* as sbx_release would, before the answer */
      pthread_mutex_unlock (&rt->mu);
      describe_limits (rt, &before, &after, res);
      /* The answer goes out before the clean-up below. */
      if (sink->ended != NULL)
        sink->ended (sink->ctx, res);
    }
  exec_run_close (&x);
  /* The exec's cgroup goes with it. What the command left running (a
   * server started with `&`) lives on in the sandbox's background group,
   * as it would after a shell's exit, and dies with the sandbox. */
  err_t rerr = ERR_INIT;
  sbx_cg_events_t gone = {0};
  if (rc == 0) /* s->cg_seen then counts this group's events */
    sbx_cg_counters_read (&rt->cg, req->id, &x.ctr, true, &gone);
  sbx_cg_counters_close (&x.ctr);
  /* A sandbox deleted meanwhile (its groups went with it) may already
   * have a successor of the same id, whose groups are not this exec's. */
  if (sandbox_deleting (&x))
    ;
  else if ((x.exited && sbx_cg_move_all (&rt->cg, req->id, x.group, SBX_CG_BACKGROUND, &rerr) < 0)
           || sbx_cg_remove (&rt->cg, req->id, x.group, &rerr) < 0)
    err_warn_release (&rerr, "exec in `%s`", req->id);
  else
    {
      /* Where a kernel counts an event in the exec's own group (cgroup v1,
       * and v2's local pids events), the sandbox's sum loses it with the
       * group: so must what the next exec compares with, or its own events
       * would go unseen. */
      pthread_mutex_lock (&rt->mu);
      s->cg_seen.pids_max_hits -= gone.pids_max_hits;
      s->cg_seen.oom_kills -= gone.oom_kills;
      pthread_mutex_unlock (&rt->mu);
    }
  err_release (&rerr);
  if (req->background)
    {
      pthread_mutex_lock (&rt->mu);
      s->bg_refs--;
      pthread_mutex_unlock (&rt->mu);
    }
  sbx_release (rt, s);
  return rc;
}
