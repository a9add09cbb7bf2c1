/* runtime/files: the gateway's side of the file API. An operation is one
 * request to the sandbox's pid 1 (the holder) over its control socket,
 * with a stream socket, a report socket and a fresh cgroup of the sandbox
 * attached; the holder forks a child that performs the operation inside
 * the sandbox (helper/files.c). This file sends the request, moves frames
 * over the stream in both directions in bounded pieces (waiting while
 * the other side is behind: flow control), checks every frame it reads
 * (they come from inside the sandbox), and ends the operation: waits for a
 * finished child, or stops a running one and kills its cgroup.
 *
 * The gateway never resolves a path of the sandbox here: paths go to the
 * child as strings. One thread per operation; no shared state beyond the
 * registry (a sandbox's count of running watches). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"

/* Longest wait between looks at the caller. */
#define FILE_POLL_MS 100
/* How long a finished child may take to exit, and how long a stopped one
 * may take to clean up (a temporary file) before its cgroup is killed. */
#define FILE_EXIT_WAIT_MS 2000
#define FILE_STOP_WAIT_MS 500

struct sbx_file_s
{
  sbx_runtime_t *rt;
  sbx_t *s;
  char id[SBX_ID_MAX + 1];
  char group[32];
  int sock;   /* the stream to the child (non-blocking) */
  int report; /* the holder's report of its exit */
  bool watch; /* counted in s->watches */
  bool ended; /* the child gave its last answer (END or ERROR) */
  sbx_gone_fn gone;
  void *gone_ctx;
  uint8_t *buf;       /* the last frame's payload, NUL-terminated past it */
  sbx_outbufs_t bufs; /* where frames are read: DATA payloads are lent to the sink */
};

static int
check_request (const sbx_file_req_t *req, err_t *err)
{
  if (!sbx_id_valid (req->id))
    return err_make (err, EINVAL, "invalid sandbox id");
  if (req->path == NULL || req->path[0] == '\0')
    return err_make (err, EINVAL, "the path is empty");
  if (req->op == SBX_FILE_RENAME && (req->path2 == NULL || req->path2[0] == '\0'))
    return err_make (err, EINVAL, "the destination path is empty");
  if (strlen (req->path) >= SBX_FILE_PATH_MAX || (req->path2 != NULL && strlen (req->path2) >= SBX_FILE_PATH_MAX))
    return err_make (err, ENAMETOOLONG, "a path is longer than %d bytes", SBX_FILE_PATH_MAX - 1);
  if (req->mode > 07777)
    return err_make (err, EINVAL, "mode %o has bits beyond 07777", req->mode);
  if (req->op == SBX_FILE_LIST && req->depth > SBX_LIST_MAX_DEPTH)
    return err_make (err, EINVAL, "depth %u is above the maximum of %d", req->depth, SBX_LIST_MAX_DEPTH);
  return 0;
}

/* Counts a watch against the sandbox's cap. */
static int
take_watch (sbx_runtime_t *rt, sbx_t *s, err_t *err)
{
  pthread_mutex_lock (&rt->mu);
  bool full = s->watches >= rt->cfg.max_watches;
  if (!full)
    s->watches++;
  pthread_mutex_unlock (&rt->mu);
  if (full)
    return err_make (err, EAGAIN, "sandbox `%s` has %ld watches running (SANDBOX_MAX_WATCHES)", s->id,
                     rt->cfg.max_watches);
  return 0;
}

/* Sends the request to the holder with the operation's descriptors,
 * keeping the gateway's ends in f. */
static int
send_request (sbx_file_t *f, const sbx_file_req_t *req, const char *state, err_t *err)
{
  char msg[sizeof (sbx_file_hdr_t) + 2 * SBX_FILE_PATH_MAX];
  sbx_file_hdr_t h = {.op = req->op,
                      .flags = req->flags | (req->as_user ? SBX_FILE_F_USER : 0),
                      .uid = req->uid,
                      .gid = req->gid,
                      .mode = req->mode,
                      .depth = req->depth == 0 ? 1 : req->depth,
                      .limit = SBX_WATCH_MAX_DIRS,
                      .offset = req->offset,
                      .length = req->length};
  ssize_t len = sbx_file_encode (msg, sizeof msg, &h, req->path, req->path2 != NULL ? req->path2 : "");
  if (len < 0)
    return err_make (err, ENAMETOOLONG, "a path is too long");
  cleanup_close int procs_fd = -1;
  if (sbx_cg_open_track (&f->rt->cg, f->id, f->group, &procs_fd, err) < 0)
    return -1;
  cleanup_pipe int stream[2] = {-1, -1}, rep[2] = {-1, -1};
  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream) < 0
      || socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rep) < 0)
    return err_make_sys (err, errno, "file operation: socketpair");
  int pass[SBX_FILE_FDS] = {
      [SBX_FILE_SLOT_STREAM] = stream[1],
      [SBX_FILE_SLOT_REPORT] = rep[1],
      [SBX_FILE_SLOT_PROCS] = procs_fd,
  };
  cleanup_close int ctl = sbx_connect_holder (state, f->id, err);
  if (ctl < 0)
    return -1;
  if (sbx_send_fds (ctl, msg, (size_t) len, pass, SBX_FILE_FDS) < 0)
    return err_make_sys (err, errno == EPIPE || errno == ECONNREFUSED ? ESRCH : errno,
                         "sandbox `%s` is gone (its pid 1 does not answer)", f->id);
  f->sock = take_fd (&stream[0]);
  f->report = take_fd (&rep[0]);
  fcntl (f->sock, F_SETFL, O_NONBLOCK);
  return 0;
}

int
sbx_file_start (sbx_runtime_t *rt, const sbx_file_req_t *req, sbx_gone_fn gone, void *gone_ctx, sbx_file_t **out,
                err_t *err)
{
  *out = NULL;
  if (check_request (req, err) < 0)
    return -1;
  sbx_t *s = sbx_acquire (rt, req->id);
  if (s == NULL)
    return sbx_err_not_found (err, req->id, NULL);
  sbx_file_t *f = calloc (1, sizeof *f);
  if (f == NULL)
    {
      sbx_release (rt, s);
      return err_make (err, ENOMEM, "file operation: out of memory");
    }
  *f = (sbx_file_t){.rt = rt, .s = s, .sock = -1, .report = -1, .gone = gone, .gone_ctx = gone_ctx};
  snprintf (f->id, sizeof f->id, "%s", req->id);
  if (req->op == SBX_FILE_WATCH && take_watch (rt, s, err) < 0)
    {
      sbx_file_close (f);
      return -1;
    }
  f->watch = req->op == SBX_FILE_WATCH;
  pthread_mutex_lock (&rt->mu);
  snprintf (f->group, sizeof f->group, "file-%u", ++s->exec_seq);
  char state[sizeof s->state];
  snprintf (state, sizeof state, "%s", s->state);
  pthread_mutex_unlock (&rt->mu);
  if (send_request (f, req, state, err) < 0)
    {
      sbx_file_close (f);
      return -1;
    }
  *out = f;
  return 0;
}

/* Reads exactly `len` bytes from the child, waiting as needed. 0, or -1
 * with *err (EIO at an early end, ECANCELED once the caller is gone). */
static int
read_exact (sbx_file_t *f, void *buf, size_t len, err_t *err)
{
  for (size_t off = 0; off < len;)
    {
      ssize_t n = read (f->sock, (uint8_t *) buf + off, len - off);
      if (n > 0)
        {
          off += (size_t) n;
          continue;
        }
      if (n == 0 || (errno != EAGAIN && errno != EINTR))
        return err_make (err, EIO, "the file operation in `%s` ended without an answer", f->id);
      if (f->gone (f->gone_ctx))
        return err_make (err, ECANCELED, "the caller went away");
      struct pollfd p = {.fd = f->sock, .events = POLLIN};
      poll (&p, 1, FILE_POLL_MS);
    }
  return 0;
}

/* Checks an INFO or EVENT payload: its fixed part, then two strings
 * whose lengths it gives, filling the whole payload. */
static int
parse_strings (sbx_file_t *f, size_t fixed, uint32_t l1, uint32_t l2, size_t len, sbx_file_msg_t *msg, err_t *err)
{
  if (len < fixed || (uint64_t) l1 + l2 != len - fixed || l1 == 0)
    return err_make (err, EIO, "a malformed answer from the file operation in `%s`", f->id);
  /* Room for two NULs: the strings are moved apart by one byte. */
  uint8_t *p = f->buf + fixed;
  memmove (p + l1 + 1, p + l1, l2);
  p[l1] = '\0';
  p[l1 + 1 + l2] = '\0';
  if (memchr (p, '\0', l1) != NULL || memchr (p + l1 + 1, '\0', l2) != NULL)
    return err_make (err, EIO, "a malformed answer from the file operation in `%s`", f->id);
  msg->path = (const char *) p;
  msg->target = l2 > 0 ? (const char *) p + l1 + 1 : NULL;
  return 0;
}

int
sbx_file_next (sbx_file_t *f, sbx_file_msg_t *msg, err_t *err)
{
  memset (msg, 0, sizeof *msg);
  sbx_frame_t h;
  if (f->ended)
    return err_make (err, EIO, "the file operation in `%s` has ended", f->id);
  if (read_exact (f, &h, sizeof h, err) < 0)
    return -1;
  /* A buffer no sink still holds (the last DATA may be in flight). */
  f->buf = sbx_outbufs_get (&f->bufs, SBX_FRAME_MAX + 1);
  if (f->buf == NULL)
    return err_make (err, ENOMEM, "file operation: out of memory");
  if (h.len > SBX_FRAME_MAX - 2 || read_exact (f, f->buf, h.len, err) < 0)
    return err_make (err, EIO, "a malformed answer from the file operation in `%s`", f->id);
  msg->kind = (sbx_frame_kind_t) h.kind;
  switch (h.kind)
    {
    case SBX_FRAME_END: f->ended = true; return 0;
    case SBX_FRAME_DATA:
      msg->data = f->buf;
      msg->len = h.len;
      return 1;
    case SBX_FRAME_INFO:
      if (h.len < sizeof msg->info)
        break;
      memcpy (&msg->info, f->buf, sizeof msg->info);
      return parse_strings (f, sizeof msg->info, msg->info.path_len, msg->info.target_len, h.len, msg, err) < 0 ? -1
                                                                                                                : 1;
    case SBX_FRAME_EVENT:
      if (h.len < sizeof msg->event)
        break;
      memcpy (&msg->event, f->buf, sizeof msg->event);
      return parse_strings (f, sizeof msg->event, msg->event.path_len, msg->event.old_len, h.len, msg, err) < 0 ? -1
                                                                                                                : 1;
    case SBX_FRAME_ERROR:
      {
        int32_t status;
        if (h.len < sizeof status)
          break;
        memcpy (&status, f->buf, sizeof status);
        f->ended = true;
        /* The errno the child reports, within reason; its text as told. */
        if (status <= 0 || status > 4095)
          status = EIO;
        return err_make (err, status, "%.*s", (int) (h.len - sizeof status), (const char *) f->buf + sizeof status);
      }
    }
  return err_make (err, EIO, "a malformed answer from the file operation in `%s`", f->id);
}

/* Sends one frame (header and spans), waiting while the child is behind.
 * When the child has ended (a failed write), its error is the answer. */
static int
send_frame (sbx_file_t *f, uint32_t kind, const struct iovec *iov, int n, err_t *err)
{
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += iov[i].iov_len;
  sbx_frame_t h = {.kind = kind, .len = (uint32_t) total};
  struct iovec v[9];
  if (n > 8)
    return err_make (err, EINVAL, "too many spans");
  v[0] = (struct iovec){&h, sizeof h};
  memcpy (v + 1, iov, (size_t) n * sizeof *iov);
  struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t) n + 1};
  size_t left = total + sizeof h;
  while (left > 0)
    {
      ssize_t w = sendmsg (f->sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && (errno == EAGAIN || errno == EINTR))
        {
          if (f->gone (f->gone_ctx))
            return err_make (err, ECANCELED, "the caller went away");
          struct pollfd p = {.fd = f->sock, .events = POLLOUT};
          poll (&p, 1, FILE_POLL_MS);
          continue;
        }
      if (w < 0)
        {
          /* The child stopped reading: it failed, and says why. */
          sbx_file_msg_t msg;
          if (sbx_file_next (f, &msg, err) >= 0)
            err_make (err, EIO, "the file operation in `%s` stopped taking data", f->id);
          return -1;
        }
      left -= (size_t) w;
      while (w > 0)
        {
          size_t k = (size_t) w < m.msg_iov->iov_len ? (size_t) w : m.msg_iov->iov_len;
          m.msg_iov->iov_base = (uint8_t *) m.msg_iov->iov_base + k;
          m.msg_iov->iov_len -= k;
          w -= (ssize_t) k;
          if (m.msg_iov->iov_len == 0 && m.msg_iovlen > 1)
            {
              m.msg_iov++;
              m.msg_iovlen--;
            }
        }
    }
  return 0;
}

/* The child takes at most this much per DATA frame. */
#define FILE_DATA_MAX (256 * 1024)

int
sbx_file_send (sbx_file_t *f, const struct iovec *iov, int n, err_t *err)
{
  /* Spans are cut into frames of at most FILE_DATA_MAX bytes. */
  struct iovec cur[8];
  int k = 0;
  size_t in_frame = 0;
  for (int i = 0; i < n; i++)
    {
      const uint8_t *p = iov[i].iov_base;
      size_t len = iov[i].iov_len;
      while (len > 0)
        {
          size_t take = len < FILE_DATA_MAX - in_frame ? len : FILE_DATA_MAX - in_frame;
          cur[k++] = (struct iovec){(void *) p, take};
          in_frame += take;
          p += take;
          len -= take;
          if (in_frame == FILE_DATA_MAX || k == 8)
            {
              if (send_frame (f, SBX_FRAME_DATA, cur, k, err) < 0)
                return -1;
              k = 0;
              in_frame = 0;
            }
        }
    }
  return k > 0 ? send_frame (f, SBX_FRAME_DATA, cur, k, err) : 0;
}

int
sbx_file_send_end (sbx_file_t *f, err_t *err)
{
  return send_frame (f, SBX_FRAME_END, NULL, 0, err);
}

void
sbx_file_close (sbx_file_t *f)
{
  if (f == NULL)
    return;
  sbx_runtime_t *rt = f->rt;
  if (f->report >= 0)
    {
      /* A child still at work is told to stop (its stream ends: a write
       * removes its temporary file), then killed if it lingers. */
      if (!f->ended)
        shutdown (f->sock, SHUT_RDWR);
      sbx_report_t r;
      int none[1];
      int got = sbx_read_report (f->report, &r, f->ended ? FILE_EXIT_WAIT_MS : FILE_STOP_WAIT_MS, none, 0);
      if (got != 1 || r.type != SBX_REPORT_EXIT)
        sbx_cg_kill (&rt->cg, f->id, f->group, NULL);
    }
  if (f->group[0] != '\0')
    {
      cleanup_err err_t rerr = ERR_INIT;
      if (sbx_cg_remove (&rt->cg, f->id, f->group, &rerr) < 0)
        err_warn_release (&rerr, "file operation in `%s`", f->id);
    }
  if (f->sock >= 0)
    close (f->sock);
  if (f->report >= 0)
    close (f->report);
  if (f->watch)
    {
      pthread_mutex_lock (&rt->mu);
      f->s->watches--;
      pthread_mutex_unlock (&rt->mu);
    }
  sbx_release (rt, f->s);
  sbx_outbufs_free (&f->bufs);
  free (f);
}
