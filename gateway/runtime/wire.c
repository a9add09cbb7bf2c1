/* runtime/wire: descriptor passing, the reports (their writers and their
 * reader together), and request encoding (see wire.h). No state. */
#include "gateway/runtime/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int
sbx_send_fds (int sock, const void *buf, size_t len, const int *fds, size_t n_fds)
{
  if (n_fds > SBX_WIRE_MAX_FDS)
    {
      errno = EINVAL;
      return -1;
    }
  struct iovec iov = {.iov_base = (void *) buf, .iov_len = len};
  union
  {
    char buf[CMSG_SPACE (SBX_WIRE_MAX_FDS * sizeof (int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n_fds > 0)
    {
      memset (&ctl, 0, sizeof ctl);
      msg.msg_control = ctl.buf;
      msg.msg_controllen = CMSG_SPACE (n_fds * sizeof (int));
      struct cmsghdr *c = CMSG_FIRSTHDR (&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN (n_fds * sizeof (int));
      memcpy (CMSG_DATA (c), fds, n_fds * sizeof (int));
    }
  ssize_t n;
  do
    n = sendmsg (sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == (ssize_t) len ? 0 : -1;
}

ssize_t
sbx_recv_fds (int sock, void *buf, size_t cap, int *fds, size_t *n_fds, size_t max_fds)
{
  *n_fds = 0;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  union
  {
    char buf[CMSG_SPACE (SBX_WIRE_MAX_FDS * sizeof (int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  ssize_t n;
  do
    n = recvmsg (sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR (&msg); c != NULL; c = CMSG_NXTHDR (&msg, c))
    {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      size_t k = (c->cmsg_len - CMSG_LEN (0)) / sizeof (int);
      int got[SBX_WIRE_MAX_FDS];
      memcpy (got, CMSG_DATA (c), (k > SBX_WIRE_MAX_FDS ? SBX_WIRE_MAX_FDS : k) * sizeof (int));
      for (size_t i = 0; i < k && i < SBX_WIRE_MAX_FDS; i++)
        {
          if (*n_fds < max_fds && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
            fds[(*n_fds)++] = got[i];
          else
            close (got[i]);
        }
    }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
    {
      for (size_t i = 0; i < *n_fds; i++)
        close (fds[i]);
      *n_fds = 0;
      errno = EMSGSIZE;
      return -1;
    }
  return n;
}

/* ---- reports ------------------------------------------------------------ */

/* Sends `r` with fds[0..n_fds); every byte of `r` set (no stack garbage
 * crosses to the gateway). */
static int
report_send (int sock, sbx_report_t *r, const int *fds, size_t n_fds)
{
  return sbx_send_fds (sock, r, sizeof *r, fds, n_fds);
}

int
sbx_report_error (int sock, int status, const char *text)
{
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  r.type = SBX_REPORT_ERROR;
  r.status = status;
  /* strlen and memcpy, not snprintf: async-signal-safe. */
  size_t n = text != NULL ? strlen (text) : 0;
  if (n > sizeof r.text - 1)
    n = sizeof r.text - 1;
  if (n > 0)
    memcpy (r.text, text, n);
  return report_send (sock, &r, NULL, 0);
}

int
sbx_report_ready (int sock, pid_t holder_pid, int fd)
{
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  r.type = SBX_REPORT_READY;
  r.u.ready.holder_pid = (int32_t) holder_pid;
  return report_send (sock, &r, &fd, fd >= 0 ? 1 : 0);
}

int
sbx_report_exit (int sock, int code, int signal)
{
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  r.type = SBX_REPORT_EXIT;
  r.u.exit.code = code;
  r.u.exit.signal = signal;
  return report_send (sock, &r, NULL, 0);
}

int
sbx_report_started (int sock, pid_t pid, int pidfd, int master)
{
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  r.type = SBX_REPORT_STARTED;
  r.u.started.pid = (int32_t) pid;
  int fds[SBX_REPORT_MAX_FDS];
  size_t n = 0;
  if (pidfd >= 0)
    {
      r.u.started.flags |= SBX_STARTED_F_PIDFD;
      fds[n++] = pidfd;
    }
  if (master >= 0)
    {
      r.u.started.flags |= SBX_STARTED_F_MASTER;
      fds[n++] = master;
    }
  return report_send (sock, &r, fds, n);
}

int
sbx_read_report (int sock, sbx_report_t *r, int timeout_ms, int *fds, size_t max_fds)
{
  for (size_t i = 0; i < max_fds; i++)
    fds[i] = -1;
  struct pollfd p = {.fd = sock, .events = POLLIN};
  int rc;
  do
    rc = poll (&p, 1, timeout_ms);
  while (rc < 0 && errno == EINTR);
  if (rc <= 0)
    return -1;
  int got[SBX_REPORT_MAX_FDS];
  size_t n_fds = 0;
  ssize_t n
      = sbx_recv_fds (sock, r, sizeof *r, got, &n_fds, max_fds < SBX_REPORT_MAX_FDS ? max_fds : SBX_REPORT_MAX_FDS);
  if (n == 0)
    return 0;
  if (n != (ssize_t) sizeof *r)
    {
      for (size_t i = 0; i < n_fds; i++)
        close (got[i]);
      return -1;
    }
  for (size_t i = 0; i < n_fds; i++)
    fds[i] = got[i];
  r->text[sizeof r->text - 1] = '\0';
  return 1;
}

void
sbx_report_started_fds (const sbx_report_t *r, const int *got, int *pidfd, int *master)
{
  size_t k = 0;
  *pidfd = (r->u.started.flags & SBX_STARTED_F_PIDFD) ? got[k++] : -1;
  *master = (r->u.started.flags & SBX_STARTED_F_MASTER) ? got[k++] : -1;
}

/* ---- exec requests ------------------------------------------------------ */

size_t
sbx_exec_size (const char *cwd, char *const *argv, char *const *env)
{
  size_t n = sizeof (sbx_exec_hdr_t) + strlen (cwd) + 1;
  for (size_t i = 0; argv[i] != NULL; i++)
    n += strlen (argv[i]) + 1;
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    n += strlen (env[i]) + 1;
  return n;
}

ssize_t
sbx_exec_encode (char *buf, size_t cap, const char *cwd, char *const *argv, char *const *env)
{
  sbx_exec_hdr_t h = {.magic = SBX_EXEC_MAGIC};
  size_t off = sizeof h;
#define PUT(s)                                                                                                       \
  do                                                                                                                 \
    {                                                                                                                \
      size_t l_ = strlen (s) + 1;                                                                                    \
      if (off + l_ > cap)                                                                                            \
        return -1;                                                                                                   \
      memcpy (buf + off, (s), l_);                                                                                   \
      off += l_;                                                                                                     \
    }                                                                                                                \
  while (0)
  PUT (cwd);
  for (size_t i = 0; argv[i] != NULL; i++, h.argc++)
    PUT (argv[i]);
  for (size_t i = 0; env != NULL && env[i] != NULL; i++, h.envc++)
    PUT (env[i]);
#undef PUT
  h.len = (uint32_t) (off - sizeof h);
  memcpy (buf, &h, sizeof h);
  return (ssize_t) off;
}

void
sbx_exec_set_options (char *buf, uint16_t rows, uint16_t cols, uint32_t flags)
{
  sbx_exec_hdr_t h;
  memcpy (&h, buf, sizeof h);
  h.pty_rows = rows;
  h.pty_cols = cols;
  h.flags = flags;
  memcpy (buf, &h, sizeof h);
}

void
sbx_exec_get_options (const char *buf, uint16_t *rows, uint16_t *cols, uint32_t *flags)
{
  sbx_exec_hdr_t h;
  memcpy (&h, buf, sizeof h);
  *rows = h.pty_rows;
  *cols = h.pty_cols;
  *flags = h.flags;
}

void
sbx_exec_set_user (char *buf, uint32_t uid, uint32_t gid)
{
  sbx_exec_hdr_t h;
  memcpy (&h, buf, sizeof h);
  h.uid = uid;
  h.gid = gid;
  memcpy (buf, &h, sizeof h);
}

void
sbx_exec_get_user (const char *buf, uint32_t *uid, uint32_t *gid)
{
  sbx_exec_hdr_t h;
  memcpy (&h, buf, sizeof h);
  *uid = h.uid;
  *gid = h.gid;
}

int
sbx_exec_decode (char *buf, size_t len, const char **cwd, char **argv, size_t argv_cap, char **env, size_t env_cap)
{
  sbx_exec_hdr_t h;
  if (len < sizeof h)
    return -1;
  memcpy (&h, buf, sizeof h);
  /* Compared in size_t against the caps first: counts near UINT32_MAX
   * must not wrap around into a small number. */
  if (h.magic != SBX_EXEC_MAGIC || h.len != len - sizeof h || h.argc == 0 || (size_t) h.argc >= argv_cap
      || (size_t) h.envc >= env_cap || buf[len - 1] != '\0')
    return -1;
  char *p = buf + sizeof h, *end = buf + len;
  size_t total = 1 + (size_t) h.argc + (size_t) h.envc;
  for (size_t i = 0; i < total; i++)
    {
      if (p >= end)
        return -1;
      if (i == 0)
        *cwd = p;
      else if (i <= h.argc)
        argv[i - 1] = p;
      else
        env[i - 1 - h.argc] = p;
      p += strlen (p) + 1;
    }
  if (p != end)
    return -1;
  argv[h.argc] = NULL;
  env[h.envc] = NULL;
  return 0;
}

ssize_t
sbx_file_encode (char *buf, size_t cap, sbx_file_hdr_t *h, const char *path, const char *path2)
{
  size_t l1 = strlen (path) + 1, l2 = strlen (path2) + 1;
  if (l1 > SBX_FILE_PATH_MAX || l2 > SBX_FILE_PATH_MAX || sizeof *h + l1 + l2 > cap)
    return -1;
  h->magic = SBX_FILE_MAGIC;
  h->path_len = (uint32_t) l1;
  h->path2_len = (uint32_t) l2;
  memcpy (buf, h, sizeof *h);
  memcpy (buf + sizeof *h, path, l1);
  memcpy (buf + sizeof *h + l1, path2, l2);
  return (ssize_t) (sizeof *h + l1 + l2);
}

int
sbx_file_decode (char *buf, size_t len, sbx_file_hdr_t *h, const char **path, const char **path2)
{
  if (len < sizeof *h)
    return -1;
  memcpy (h, buf, sizeof *h);
  if (h->magic != SBX_FILE_MAGIC || h->path_len == 0 || h->path2_len == 0 || h->path_len > SBX_FILE_PATH_MAX
      || h->path2_len > SBX_FILE_PATH_MAX || (size_t) h->path_len + h->path2_len != len - sizeof *h)
    return -1;
  char *p = buf + sizeof *h, *p2 = p + h->path_len;
  /* Each string ends exactly at its NUL: no NUL inside. */
  if (p[h->path_len - 1] != '\0' || strlen (p) != h->path_len - 1 || p2[h->path2_len - 1] != '\0'
      || strlen (p2) != h->path2_len - 1)
    return -1;
  *path = p;
  *path2 = p2;
  return 0;
}
