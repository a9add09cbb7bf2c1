/* runtime/proc: detached processes — commands that outlive the call that
 * started them (see runtime.h). Each runs through sbx_exec on a thread of
 * its own whose sink never blocks: stdout and stderr go into per-process
 * ring buffers (the newest SANDBOX_PROCESS_BUFFER_BYTES of each), from
 * which any number of attachers read, each at its own offsets. Records stay
 * after the exit (its status) until the sandbox goes or the retention count
 * drops the oldest.
 *
 * Memory: a ring is one mapping of exactly SANDBOX_PROCESS_BUFFER_BYTES,
 * made when its first output comes (never grown, unmapped when dropped),
 * and every ring a sandbox's records hold, running or exited, counts
 * against its budget of SANDBOX_MAX_PROCESSES × 2 rings: a ring that would
 * pass it first takes the rings of the oldest exited records (their output
 * is then dropped, counted in output_dropped_bytes; their status stays).
 * Running processes alone never pass it (at most SANDBOX_MAX_PROCESSES of
 * them run), so the documented budget is what the gateway holds.
 *
 * State: the runtime's process list, under proc_mu; proc_cv signals
 * output, starts and exits. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/proc_ring.h"

struct sbx_proc_s
{
  struct sbx_proc_s *next;
  sbx_runtime_t *rt;
  char sandbox[SBX_ID_MAX + 1];
  char id[SBX_ID_MAX + 1];
  char **argv; /* owned, NULL-terminated */
  char **env;  /* owned */
  char *cwd;
  uint16_t rows, cols;
  uint32_t timeout;
  int64_t started_ms;
  int pid, pidfd, stdin_fd, pty_fd;
  sbx_ring_t out, err;
  bool started, exited, stop, listed;
  char start_error[256];
  int start_status; /* errno of a start that failed */
  sbx_exec_result_t res;
  int refs; /* the thread, and each attacher */
  pthread_t thread;
};

static void
free_strv (char **v)
{
  for (size_t i = 0; v != NULL && v[i] != NULL; i++)
    free (v[i]);
  free (v);
}

static char **
dup_strv (char *const *v)
{
  size_t n = 0;
  while (v != NULL && v[n] != NULL)
    n++;
  char **out = calloc (n + 1, sizeof *out);
  for (size_t i = 0; out != NULL && i < n; i++)
    if ((out[i] = strdup (v[i])) == NULL)
      {
        free_strv (out);
        return NULL;
      }
  return out;
}

static void
proc_free (sbx_proc_t *p)
{
  int *fds[] = {&p->pidfd, &p->stdin_fd, &p->pty_fd};
  for (size_t i = 0; i < 3; i++)
    if (*fds[i] >= 0)
      close (*fds[i]);
  free_strv (p->argv);
  free_strv (p->env);
  free (p->cwd);
  sbx_ring_release (&p->out);
  sbx_ring_release (&p->err);
  free (p);
}

/* Drops a reference (proc_mu held); the last one frees an unlisted record. */
static void
put_locked (sbx_proc_t *p)
{
  if (--p->refs == 0 && !p->listed)
    proc_free (p);
}

static void
unlink_locked (sbx_runtime_t *rt, sbx_proc_t *p)
{
  for (sbx_proc_t **pp = &rt->procs; *pp != NULL; pp = &(*pp)->next)
    if (*pp == p)
      {
        *pp = p->next;
        p->listed = false;
        return;
      }
}

/* Keeps at most `retain` exited records of sandbox `sid`, the newest. */
static void
prune_locked (sbx_runtime_t *rt, const char *sid)
{
  for (;;)
    {
      size_t exited = 0;
      sbx_proc_t *oldest = NULL;
      for (sbx_proc_t *p = rt->procs; p != NULL; p = p->next)
        if (strcmp (p->sandbox, sid) == 0 && p->exited)
          {
            exited++;
            if (oldest == NULL || p->started_ms < oldest->started_ms)
              oldest = p;
          }
      if (exited <= (size_t) rt->cfg.process_retain || oldest == NULL)
        return;
      unlink_locked (rt, oldest);
      /* An attacher still reading it keeps the status, not the output. */
      sbx_ring_release (&oldest->out);
      sbx_ring_release (&oldest->err);
      if (oldest->refs == 0)
        proc_free (oldest);
    }
}

/* The ring bytes the records of sandbox `sid` hold. */
static size_t
held_locked (sbx_runtime_t *rt, const char *sid)
{
  size_t held = 0;
  for (sbx_proc_t *p = rt->procs; p != NULL; p = p->next)
    if (strcmp (p->sandbox, sid) == 0)
      held += (p->out.buf != NULL ? p->out.cap : 0) + (p->err.buf != NULL ? p->err.cap : 0);
  return held;
}

/* Maps ring `r` of `p` within the sandbox's budget, taking the rings of
 * its oldest exited records as needed. -1 when it cannot (the output is
 * then counted, not kept). */
static int
ring_map_locked (sbx_runtime_t *rt, sbx_proc_t *p, sbx_ring_t *r)
{
  if (!p->listed || r->cap == 0)
    return -1;
  size_t budget = (size_t) rt->cfg.max_processes * 2 * (size_t) rt->cfg.process_buffer_bytes;
  while (held_locked (rt, p->sandbox) + r->cap > budget)
    {
      sbx_proc_t *oldest = NULL;
      for (sbx_proc_t *q = rt->procs; q != NULL; q = q->next)
        if (q->exited && (q->out.buf != NULL || q->err.buf != NULL) && strcmp (q->sandbox, p->sandbox) == 0
            && (oldest == NULL || q->started_ms < oldest->started_ms))
          oldest = q;
      if (oldest == NULL)
        return -1;
      sbx_ring_release (&oldest->out);
      sbx_ring_release (&oldest->err);
    }
  return sbx_ring_map (r);
}

/* ---- the process's own thread ------------------------------------------------- */

static int
proc_output (void *ctx, int stream, const uint8_t *data, size_t len)
{
  sbx_proc_t *p = ctx;
  sbx_ring_t *r = stream == 1 ? &p->out : &p->err;
  pthread_mutex_lock (&p->rt->proc_mu);
  if (r->buf == NULL && r->total == 0)
    ring_map_locked (p->rt, p, r);
  sbx_ring_put (r, data, len);
  pthread_cond_broadcast (&p->rt->proc_cv);
  pthread_mutex_unlock (&p->rt->proc_mu);
  return 0;
}

static bool
proc_cancelled (void *ctx)
{
  sbx_proc_t *p = ctx;
  pthread_mutex_lock (&p->rt->proc_mu);
  bool stop = p->stop;
  pthread_mutex_unlock (&p->rt->proc_mu);
  return stop;
}

static void
proc_started (void *ctx, const sbx_exec_started_t *st)
{
  sbx_proc_t *p = ctx;
  pthread_mutex_lock (&p->rt->proc_mu);
  p->pid = st->pid;
  p->pidfd = st->pidfd;
  p->stdin_fd = st->stdin_fd;
  p->pty_fd = st->pty_fd;
  if (p->stdin_fd >= 0)
    fcntl (p->stdin_fd, F_SETFL, O_NONBLOCK);
  p->started = true;
  pthread_cond_broadcast (&p->rt->proc_cv);
  pthread_mutex_unlock (&p->rt->proc_mu);
}

static void *
proc_main (void *arg)
{
  sbx_proc_t *p = arg;
  sbx_runtime_t *rt = p->rt;
  sbx_exec_req_t req = {.id = p->sandbox,
                        .argv = p->argv,
                        .env = p->env,
                        .cwd = p->cwd,
                        .stdin_stream = true,
                        .pty_rows = p->rows,
                        .pty_cols = p->cols,
                        .background = true,
                        .timeout_seconds = p->timeout,
                        .no_timeout = p->timeout == 0};
  sbx_exec_sink_t sink = {.output = proc_output, .cancelled = proc_cancelled, .started = proc_started, .ctx = p};
  sbx_exec_result_t res;
  cleanup_err err_t err = ERR_INIT;
  int rc = sbx_exec (rt, &req, &sink, &res, &err);
  pthread_mutex_lock (&rt->proc_mu);
  if (rc < 0)
    {
      snprintf (p->start_error, sizeof p->start_error, "%s", err_msg (&err));
      p->start_status = err.status;
      memset (&res, 0, sizeof res);
      res.exit_code = -1;
      snprintf (res.message, sizeof res.message, "%s", err_msg (&err));
    }
  p->res = res;
  p->exited = true;
  if (p->stdin_fd >= 0)
    close (take_fd (&p->stdin_fd));
  pthread_cond_broadcast (&rt->proc_cv);
  if (p->listed)
    prune_locked (rt, p->sandbox);
  put_locked (p);
  rt->proc_threads--;
  pthread_cond_broadcast (&rt->proc_cv);
  pthread_mutex_unlock (&rt->proc_mu);
  return NULL;
}

void
sbx_proc_wait_threads (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->proc_mu);
  while (rt->proc_threads > 0)
    pthread_cond_wait (&rt->proc_cv, &rt->proc_mu);
  pthread_mutex_unlock (&rt->proc_mu);
}

/* ---- the API ------------------------------------------------------------------ */

/* A new record of a process to run `req` (its strings copied), not yet
 * listed; NULL when out of memory. */
static sbx_proc_t *
proc_new (sbx_runtime_t *rt, const sbx_exec_req_t *req)
{
  sbx_proc_t *p = calloc (1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->rt = rt;
  p->pidfd = p->stdin_fd = p->pty_fd = -1;
  snprintf (p->sandbox, sizeof p->sandbox, "%s", req->id);
  p->argv = dup_strv (req->argv);
  p->env = dup_strv (req->env);
  p->cwd = strdup (req->cwd != NULL ? req->cwd : "");
  p->rows = req->pty_rows;
  p->cols = req->pty_cols;
  p->timeout = req->timeout_seconds;
  p->out.cap = p->err.cap = (size_t) rt->cfg.process_buffer_bytes;
  p->started_ms = sbx_wall_ms ();
  if (p->argv == NULL || (req->env != NULL && p->env == NULL) || p->cwd == NULL)
    {
      proc_free (p);
      return NULL;
    }
  return p;
}

int
sbx_proc_start (sbx_runtime_t *rt, const sbx_exec_req_t *req, const char *proc_id, sbx_proc_t **out, err_t *err)
{
  *out = NULL;
  if (proc_id != NULL && proc_id[0] != '\0' && !sbx_id_valid (proc_id))
    return err_make (err, EINVAL, "invalid process id `%s`", proc_id);
  sbx_info_t info;
  if (sbx_get (rt, req->id, &info, err) < 0)
    return -1;
  sbx_proc_t *p = proc_new (rt, req);
  if (p == NULL)
    return err_make (err, ENOMEM, "out of memory");
  pthread_mutex_lock (&rt->proc_mu);
  size_t running = 0;
  bool taken = false;
  uint64_t seq = 0;
  for (sbx_proc_t *q = rt->procs; q != NULL; q = q->next)
    if (strcmp (q->sandbox, p->sandbox) == 0)
      {
        running += !q->exited;
        taken = taken || (proc_id != NULL && strcmp (q->id, proc_id) == 0);
        seq++;
      }
  if (running >= (size_t) rt->cfg.max_processes || taken)
    {
      pthread_mutex_unlock (&rt->proc_mu);
      proc_free (p);
      return taken ? err_make (err, EEXIST, "process `%s` exists in sandbox `%s`", proc_id, req->id)
                   : err_make (err, EAGAIN, "sandbox `%s` has %ld processes running, the most it may", req->id,
                               rt->cfg.max_processes);
    }
  if (proc_id != NULL && proc_id[0] != '\0')
    snprintf (p->id, sizeof p->id, "%s", proc_id);
  else
    {
      /* A name no other process of the sandbox has: p<n>-<random>. */
      unsigned rnd = (unsigned) (sbx_mono_ms () ^ (uintptr_t) p);
      snprintf (p->id, sizeof p->id, "p%llu-%06x", (unsigned long long) seq + 1, rnd & 0xffffff);
    }
  p->refs = 2; /* the thread's, and the caller's */
  p->listed = true;
  p->next = rt->procs;
  rt->procs = p;
  rt->proc_threads++;
  if (pthread_create (&p->thread, NULL, proc_main, p) != 0)
    {
      rt->proc_threads--;
      unlink_locked (rt, p);
      pthread_mutex_unlock (&rt->proc_mu);
      proc_free (p);
      return err_make (err, EAGAIN, "cannot start a thread for the process");
    }
  pthread_detach (p->thread);
  while (!p->started && !p->exited)
    pthread_cond_wait (&rt->proc_cv, &rt->proc_mu);
  if (!p->started)
    {
      int rc = err_make (err, p->start_status != 0 ? p->start_status : EIO, "%s",
                         p->start_error[0] != '\0' ? p->start_error : "the process did not start");
      unlink_locked (rt, p);
      put_locked (p);
      pthread_mutex_unlock (&rt->proc_mu);
      return rc;
    }
  pthread_mutex_unlock (&rt->proc_mu);
  *out = p;
  return 0;
}

int
sbx_proc_attach (sbx_runtime_t *rt, const char *sid, const char *proc_id, sbx_proc_t **out, err_t *err)
{
  pthread_mutex_lock (&rt->proc_mu);
  for (sbx_proc_t *p = rt->procs; p != NULL; p = p->next)
    if (strcmp (p->sandbox, sid) == 0 && strcmp (p->id, proc_id) == 0)
      {
        p->refs++;
        pthread_mutex_unlock (&rt->proc_mu);
        *out = p;
        return 0;
      }
  pthread_mutex_unlock (&rt->proc_mu);
  return err_make (err, ENOENT, "no process `%s` in sandbox `%s`", proc_id, sid);
}

void
sbx_proc_put (sbx_runtime_t *rt, sbx_proc_t *p)
{
  pthread_mutex_lock (&rt->proc_mu);
  put_locked (p);
  pthread_mutex_unlock (&rt->proc_mu);
}

void
sbx_proc_cursor_start (sbx_runtime_t *rt, sbx_proc_t *p, bool replay, sbx_proc_cursor_t *c)
{
  pthread_mutex_lock (&rt->proc_mu);
  c->out = replay ? 0 : p->out.total;
  c->err = replay ? 0 : p->err.total;
  pthread_mutex_unlock (&rt->proc_mu);
}

int
sbx_proc_read (sbx_runtime_t *rt, sbx_proc_t *p, sbx_proc_cursor_t *c, uint8_t *buf, size_t cap, int *stream,
               int timeout_ms, sbx_exec_result_t *res)
{
  struct timespec until;
  clock_gettime (CLOCK_MONOTONIC, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long) (timeout_ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000)
    {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
  pthread_mutex_lock (&rt->proc_mu);
  for (;;)
    {
      size_t n = 0;
      if (c->out < p->out.total)
        {
          n = sbx_ring_get (&p->out, &c->out, buf, cap);
          *stream = 1;
        }
      else if (c->err < p->err.total)
        {
          n = sbx_ring_get (&p->err, &c->err, buf, cap);
          *stream = 2;
        }
      if (n > 0 || (p->exited && c->out >= p->out.total && c->err >= p->err.total))
        {
          if (n == 0)
            *res = p->res;
          pthread_mutex_unlock (&rt->proc_mu);
          return (int) n;
        }
      if (pthread_cond_timedwait (&rt->proc_cv, &rt->proc_mu, &until) == ETIMEDOUT)
        {
          pthread_mutex_unlock (&rt->proc_mu);
          return -1;
        }
    }
}

/* A descriptor of `p` to use outside the lock: a duplicate, or -1. */
static int
dup_of (sbx_runtime_t *rt, const int *fd)
{
  pthread_mutex_lock (&rt->proc_mu);
  int d = *fd >= 0 ? fcntl (*fd, F_DUPFD_CLOEXEC, 3) : -1;
  pthread_mutex_unlock (&rt->proc_mu);
  return d;
}

int
sbx_proc_write (sbx_runtime_t *rt, sbx_proc_t *p, const uint8_t *data, size_t len, int wake, err_t *err)
{
  pthread_mutex_lock (&rt->proc_mu);
  bool exited = p->exited;
  pthread_mutex_unlock (&rt->proc_mu);
  if (exited)
    return err_make (err, EPIPE, "the process has exited");
  cleanup_close int fd = dup_of (rt, &p->stdin_fd);
  if (fd < 0)
    return err_make (err, EPIPE, "the process's stdin is closed");
  return sbx_exec_write (fd, data, len, wake, err);
}

void
sbx_proc_end_input (sbx_runtime_t *rt, sbx_proc_t *p, int wake)
{
  cleanup_close int pty = dup_of (rt, &p->pty_fd);
  if (pty >= 0)
    {
      cleanup_err err_t e = ERR_INIT;
      sbx_exec_end_input_pty (pty, wake, &e);
      return;
    }
  pthread_mutex_lock (&rt->proc_mu);
  if (p->stdin_fd >= 0)
    close (take_fd (&p->stdin_fd));
  pthread_mutex_unlock (&rt->proc_mu);
}

int
sbx_proc_resize (sbx_runtime_t *rt, sbx_proc_t *p, uint16_t rows, uint16_t cols, err_t *err)
{
  cleanup_close int pty = dup_of (rt, &p->pty_fd);
  if (pty < 0)
    return err_make (err, EINVAL, "process `%s` has no terminal", p->id);
  return sbx_exec_resize (pty, rows, cols, err);
}

int
sbx_proc_signal_proc (sbx_runtime_t *rt, sbx_proc_t *p, int sig, err_t *err)
{
  pthread_mutex_lock (&rt->proc_mu);
  bool exited = p->exited;
  int pidfd = p->pidfd >= 0 ? fcntl (p->pidfd, F_DUPFD_CLOEXEC, 3) : -1;
  pthread_mutex_unlock (&rt->proc_mu);
  if (exited)
    {
      if (pidfd >= 0)
        close (pidfd);
      return err_make (err, EBUSY, "process `%s` has exited", p->id);
    }
  int rc = sbx_exec_signal (pidfd, sig, err);
  if (pidfd >= 0)
    close (pidfd);
  return rc;
}

int
sbx_proc_signal (sbx_runtime_t *rt, const char *sid, const char *proc_id, int sig, err_t *err)
{
  sbx_proc_t *p;
  if (sbx_proc_attach (rt, sid, proc_id, &p, err) < 0)
    return -1;
  int rc = sbx_proc_signal_proc (rt, p, sig, err);
  sbx_proc_put (rt, p);
  return rc;
}

static void
info_locked (const sbx_proc_t *p, sbx_proc_info_t *out)
{
  memset (out, 0, sizeof *out);
  snprintf (out->id, sizeof out->id, "%s", p->id);
  out->pid = p->pid;
  out->argv = p->argv;
  out->rows = p->rows;
  out->cols = p->cols;
  out->running = !p->exited;
  out->exited = p->exited;
  out->res = p->res;
  out->started_at_ms = p->started_ms;
  out->dropped_bytes = sbx_ring_dropped (&p->out) + sbx_ring_dropped (&p->err);
}

void
sbx_proc_info (sbx_runtime_t *rt, sbx_proc_t *p, sbx_proc_info_t *out)
{
  pthread_mutex_lock (&rt->proc_mu);
  info_locked (p, out);
  pthread_mutex_unlock (&rt->proc_mu);
}

int
sbx_proc_list (sbx_runtime_t *rt, const char *sid, sbx_proc_t ***out, size_t *n, err_t *err)
{
  *out = NULL;
  *n = 0;
  sbx_info_t info;
  if (sbx_get (rt, sid, &info, err) < 0)
    return -1;
  pthread_mutex_lock (&rt->proc_mu);
  size_t count = 0;
  for (sbx_proc_t *p = rt->procs; p != NULL; p = p->next)
    count += strcmp (p->sandbox, sid) == 0;
  sbx_proc_t **list = calloc (count + 1, sizeof *list);
  if (list == NULL)
    {
      pthread_mutex_unlock (&rt->proc_mu);
      return err_make (err, ENOMEM, "out of memory");
    }
  for (sbx_proc_t *p = rt->procs; p != NULL; p = p->next)
    if (strcmp (p->sandbox, sid) == 0)
      {
        p->refs++;
        list[(*n)++] = p;
      }
  pthread_mutex_unlock (&rt->proc_mu);
  /* Oldest first. */
  for (size_t i = 0; i + 1 < *n; i++)
    for (size_t j = i + 1; j < *n; j++)
      if (list[j]->started_ms < list[i]->started_ms)
        {
          sbx_proc_t *t = list[i];
          list[i] = list[j];
          list[j] = t;
        }
  *out = list;
  return 0;
}

void
sbx_proc_forget_sandbox (sbx_runtime_t *rt, const char *sid)
{
  pthread_mutex_lock (&rt->proc_mu);
  for (sbx_proc_t **pp = &rt->procs; *pp != NULL;)
    {
      sbx_proc_t *p = *pp;
      if (strcmp (p->sandbox, sid) != 0)
        {
          pp = &p->next;
          continue;
        }
      *pp = p->next;
      p->listed = false;
      p->stop = true;
      if (p->refs == 0)
        proc_free (p);
    }
  pthread_cond_broadcast (&rt->proc_cv);
  pthread_mutex_unlock (&rt->proc_mu);
}
