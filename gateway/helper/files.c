/* helper/files: a file operation of the file API, performed by a child of
 * the sandbox's pid 1 from inside the sandbox (see wire.h, "File
 * requests"). The child is a process of the sandbox like any command: in
 * its mount, pid and user namespaces and its root, with its root's
 * credentials, capabilities and seccomp filter, in a cgroup of its own. So
 * a path means here exactly what it means to the sandbox's own processes —
 * symlinks, `..` and /proc/self/root all resolve within the sandbox's root —
 * and nothing on the host's side ever resolves a name of the sandbox.
 *
 * It answers in frames on the stream socket it was given and exits; the
 * gateway learns of its exit through the report socket the holder keeps.
 * Single-threaded (a forked child of the single-threaded holder). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/files.h"
#include "gateway/runtime/path.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

/* Bytes of file data per DATA frame. */
#define FILE_CHUNK (256 * 1024)
/* Symlinks followed to find the file a write replaces (as the kernel's
 * own limit). */
#define FILE_MAX_LINKS 40

int file_sock = -1;

/* ---- frames ------------------------------------------------------------------ */

int
file_send (uint32_t kind, const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen)
{
  sbx_frame_t f = {.kind = kind, .len = (uint32_t) (alen + blen + clen)};
  struct iovec iov[4] = {{&f, sizeof f}, {(void *) a, alen}, {(void *) b, blen}, {(void *) c, clen}};
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 4};
  size_t left = sizeof f + alen + blen + clen;
  while (left > 0)
    {
      ssize_t n = sendmsg (file_sock, &msg, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return -1;
      left -= (size_t) n;
      while (n > 0 && msg.msg_iovlen > 0)
        {
          size_t k = (size_t) n < msg.msg_iov->iov_len ? (size_t) n : msg.msg_iov->iov_len;
          msg.msg_iov->iov_base = (char *) msg.msg_iov->iov_base + k;
          msg.msg_iov->iov_len -= k;
          n -= (ssize_t) k;
          if (msg.msg_iov->iov_len == 0)
            {
              msg.msg_iov++;
              msg.msg_iovlen--;
            }
        }
    }
  return 0;
}

int
file_send_error (int status, const char *fmt, ...)
{
  char text[768];
  va_list ap;
  va_start (ap, fmt);
  int n = vsnprintf (text, sizeof text, fmt, ap);
  va_end (ap);
  if (n < 0)
    n = 0;
  if ((size_t) n >= sizeof text)
    n = sizeof text - 1;
  int32_t st = status != 0 ? status : EIO;
  file_send (SBX_FRAME_ERROR, &st, sizeof st, text, (size_t) n, NULL, 0);
  return -1;
}

/* The error of a failed system call on `path`: "`path`: reason". */
static int
fail_sys (int status, const char *what, const char *path)
{
  return file_send_error (status, "%s `%s`: %s", what, path, strerror (status));
}

/* Reads exactly `len` bytes; 0 ok, -1 EOF or error. */
static int
read_exact (void *buf, size_t len)
{
  for (size_t off = 0; off < len;)
    {
      ssize_t n = read (file_sock, (char *) buf + off, len - off);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return -1;
      off += (size_t) n;
    }
  return 0;
}

/* The gateway's next frame (DATA or END only; its payload in buf, at most
 * FILE_CHUNK). 1 DATA, 0 END, -1 the stream ended or broke the protocol. */
static int
recv_frame (uint8_t *buf, size_t *len)
{
  sbx_frame_t f;
  if (read_exact (&f, sizeof f) < 0)
    return -1;
  if (f.kind == SBX_FRAME_END && f.len == 0)
    return 0;
  if (f.kind != SBX_FRAME_DATA || f.len > FILE_CHUNK || read_exact (buf, f.len) < 0)
    return -1;
  *len = f.len;
  return 1;
}

int
file_send_info (const char *path, const struct stat *st, const char *target)
{
  sbx_file_wire_t w = {.mode = st->st_mode & 07777,
                       .uid = st->st_uid,
                       .gid = st->st_gid,
                       .size = (uint64_t) st->st_size,
                       .mtime_ms = (int64_t) st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000,
                       .path_len = (uint32_t) strlen (path),
                       .target_len = target != NULL ? (uint32_t) strlen (target) : 0};
  w.type = S_ISREG (st->st_mode)   ? SBX_FTYPE_FILE
           : S_ISDIR (st->st_mode) ? SBX_FTYPE_DIR
           : S_ISLNK (st->st_mode) ? SBX_FTYPE_SYMLINK
                                   : SBX_FTYPE_OTHER;
  return file_send (SBX_FRAME_INFO, &w, sizeof w, path, w.path_len, target, w.target_len);
}

/* Describes `path` itself (a symlink as a symlink, with its target). */
static int
send_lstat (const char *path)
{
  struct stat st;
  if (lstat (path, &st) < 0)
    return fail_sys (errno, "stat", path);
  char target[PATH_MAX] = "";
  if (S_ISLNK (st.st_mode))
    {
      ssize_t n = readlink (path, target, sizeof target - 1);
      target[n > 0 ? n : 0] = '\0';
    }
  return file_send_info (path, &st, S_ISLNK (st.st_mode) ? target : NULL);
}

/* ---- paths ------------------------------------------------------------------- */

/* Makes every missing directory above `path` (and `path` itself when
 * `self`), mode 0755 as `mkdir -p` would. 0 or -1 with errno. */
static int
mkdir_parents (const char *path, bool self, mode_t mode)
{
  char p[SBX_FILE_PATH_MAX + 8];
  snprintf (p, sizeof p, "%s", path);
  size_t len = strlen (p);
  while (len > 1 && p[len - 1] == '/')
    p[--len] = '\0';
  for (char *s = p + 1; *s != '\0'; s++)
    if (*s == '/')
      {
        *s = '\0';
        if (mkdir (p, 0755) < 0 && errno != EEXIST)
          return -1;
        *s = '/';
      }
  if (self && mkdir (p, mode) < 0)
    {
      struct stat st;
      if (errno != EEXIST)
        return -1;
      if (stat (p, &st) < 0 || !S_ISDIR (st.st_mode))
        {
          errno = EEXIST;
          return -1;
        }
    }
  return 0;
}

/* Follows `path` while it names a symlink, as writing through it would:
 * the file a replacement must take the place of, in out (cap bytes). */
static int
follow_links (const char *path, char *out, size_t cap)
{
  if (sbx_path_fmt (out, cap, NULL, "%s", path) < 0)
    return -1;
  for (int i = 0; i < FILE_MAX_LINKS; i++)
    {
      struct stat st;
      if (lstat (out, &st) < 0 || !S_ISLNK (st.st_mode))
        return 0;
      char link[PATH_MAX];
      ssize_t n = readlink (out, link, sizeof link - 1);
      if (n < 0)
        return -1;
      link[n] = '\0';
      if (link[0] == '/')
        {
          if (sbx_path_fmt (out, cap, NULL, "%s", link) < 0)
            return -1; /* errno ENAMETOOLONG */
        }
      else
        {
          char *slash = strrchr (out, '/');
          size_t dlen = slash != NULL ? (size_t) (slash - out) + 1 : 0;
          if (dlen + (size_t) n + 1 > cap)
            {
              errno = ENAMETOOLONG;
              return -1;
            }
          memmove (out + dlen, link, (size_t) n + 1);
        }
    }
  errno = ELOOP;
  return -1;
}

/* ---- operations -------------------------------------------------------------- */

static int
op_read (const char *path, uint64_t offset, uint64_t length)
{
  /* Non-blocking open: a FIFO must not hang the call. */
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  struct stat st;
  if (fd < 0)
    return fail_sys (errno, "open", path);
  if (fstat (fd, &st) < 0)
    return fail_sys (errno, "stat", path);
  if (S_ISDIR (st.st_mode))
    return fail_sys (EISDIR, "read", path);
  if (!S_ISREG (st.st_mode))
    return file_send_error (EINVAL, "read `%s`: not a regular file", path);
  fcntl (fd, F_SETFL, 0);
  cleanup_free uint8_t *buf = malloc (FILE_CHUNK);
  if (buf == NULL)
    return file_send_error (ENOMEM, "read `%s`: out of memory", path);
  if (file_send_info (path, &st, NULL) < 0)
    return -1;
  uint64_t left = length == 0 ? UINT64_MAX : length;
  while (left > 0)
    {
      size_t want = left < FILE_CHUNK ? (size_t) left : FILE_CHUNK;
      ssize_t n = pread (fd, buf, want, (off_t) offset);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return fail_sys (errno, "read", path);
      if (n == 0)
        break;
      if (file_send (SBX_FRAME_DATA, buf, (size_t) n, NULL, 0, NULL, 0) < 0)
        return -1;
      offset += (uint64_t) n;
      left -= (uint64_t) n;
    }
  return file_send (SBX_FRAME_END, NULL, 0, NULL, 0, NULL, 0);
}

/* Copies the gateway's DATA frames into fd until END. 0 END, 1 the stream
 * ended early (the call is gone), -1 a write failed (reported). */
static int
receive_into (int fd, const char *path)
{
  cleanup_free uint8_t *buf = malloc (FILE_CHUNK);
  if (buf == NULL)
    return file_send_error (ENOMEM, "write `%s`: out of memory", path);
  for (;;)
    {
      size_t len = 0;
      int rc = recv_frame (buf, &len);
      if (rc < 0)
        return 1;
      if (rc == 0)
        return 0;
      for (size_t off = 0; off < len;)
        {
          ssize_t n = write (fd, buf + off, len - off);
          if (n < 0 && errno == EINTR)
            continue;
          if (n < 0)
            return fail_sys (errno, "write", path);
          off += (size_t) n;
        }
    }
}

static int
op_append (const char *path, mode_t mode)
{
  cleanup_close int fd
      = open (path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, mode != 0 ? mode : 0644);
  struct stat st;
  if (fd < 0)
    return fail_sys (errno, "open", path);
  if (fstat (fd, &st) < 0 || !S_ISREG (st.st_mode))
    return file_send_error (EINVAL, "append to `%s`: not a regular file", path);
  fcntl (fd, F_SETFL, O_APPEND);
  int rc = receive_into (fd, path);
  if (rc != 0)
    return -1;
  if (mode != 0 && fchmod (fd, mode) < 0)
    return fail_sys (errno, "chmod", path);
  if (fstat (fd, &st) < 0)
    return fail_sys (errno, "stat", path);
  return file_send_info (path, &st, NULL);
}

/* Replaces the file `path` names (through its symlinks) atomically: a
 * temporary file in the same directory, renamed over it once complete.
 * Readers see the old file or the whole new one; a failed write removes
 * the temporary file and leaves the old one as it was. */
static int
op_replace (const char *path, mode_t mode)
{
  char target[SBX_FILE_PATH_MAX + 64];
  if (follow_links (path, target, sizeof target) < 0)
    return fail_sys (errno, "resolve", path);
  struct stat old;
  bool existed = stat (target, &old) == 0;
  if (existed && S_ISDIR (old.st_mode))
    return fail_sys (EISDIR, "write", path);
  char *slash = strrchr (target, '/');
  const char *base = slash != NULL ? slash + 1 : target;
  if (base[0] == '\0')
    return fail_sys (EISDIR, "write", path);
  char dir[sizeof target];
  snprintf (dir, sizeof dir, "%.*s", slash != NULL && slash != target ? (int) (slash - target) : 1,
            slash != NULL ? target : ".");
  cleanup_close int dfd = open (dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return fail_sys (errno, "open the directory of", path);
  char tmp[NAME_MAX + 1];
  snprintf (tmp, sizeof tmp, ".%.200s.%d.sbx-tmp", base, (int) getpid ());
  cleanup_close int fd = openat (dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0600);
  /* A directory that exists but makes no files (/proc) answers ENOENT:
   * a refusal, not a missing path. */
  if (fd < 0)
    return fail_sys (errno == ENOENT ? EACCES : errno, "create a temporary file beside", path);
  int rc = receive_into (fd, path);
  if (rc == 0 && fchmod (fd, mode != 0 ? mode : existed ? old.st_mode & 07777 : 0644) < 0)
    rc = fail_sys (errno, "chmod", path);
  if (rc == 0 && existed)
    (void) !fchown (fd, old.st_uid, old.st_gid); /* best effort: the owner the file had */
  if (rc == 0 && close (take_fd (&fd)) < 0)
    rc = fail_sys (errno, "write", path);
  if (rc == 0 && renameat (dfd, tmp, dfd, base) < 0)
    rc = fail_sys (errno, "rename the temporary file over", path);
  if (rc != 0)
    {
      unlinkat (dfd, tmp, 0);
      return -1;
    }
  struct stat st;
  if (fstatat (dfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return fail_sys (errno, "stat", path);
  return file_send_info (path, &st, NULL);
}

static int
op_write (const char *path, mode_t mode, uint32_t flags)
{
  if ((flags & SBX_FILE_F_PARENTS) && mkdir_parents (path, false, 0) < 0)
    return fail_sys (errno, "make the parent directories of", path);
  return (flags & SBX_FILE_F_APPEND) ? op_append (path, mode) : op_replace (path, mode);
}

static int
op_mkdir (const char *path, mode_t mode, uint32_t flags)
{
  mode = mode != 0 ? mode : 0755;
  if (flags & SBX_FILE_F_PARENTS ? mkdir_parents (path, true, mode) < 0 : mkdir (path, mode) < 0)
    return fail_sys (errno, "mkdir", path);
  return send_lstat (path);
}

static int
remove_entry (const char *fpath, const struct stat *sb, int type, struct FTW *ftw)
{
  (void) sb;
  (void) ftw;
  return (type == FTW_DP ? rmdir (fpath) : unlink (fpath)) < 0 ? -1 : 0;
}

static int
op_remove (const char *path, uint32_t flags)
{
  struct stat st;
  if (lstat (path, &st) < 0)
    return fail_sys (errno, "remove", path);
  int rc;
  if (!S_ISDIR (st.st_mode))
    rc = unlink (path);
  else if (flags & SBX_FILE_F_RECURSIVE)
    rc = nftw (path, remove_entry, 64, FTW_DEPTH | FTW_PHYS);
  else
    rc = rmdir (path);
  if (rc < 0)
    return fail_sys (errno, "remove", path);
  return file_send (SBX_FRAME_END, NULL, 0, NULL, 0, NULL, 0);
}

static int
op_rename (const char *from, const char *to, uint32_t flags)
{
  bool overwrite = (flags & SBX_FILE_F_OVERWRITE) != 0;
  long rc = syscall (SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, overwrite ? 0 : RENAME_NOREPLACE);
  if (rc < 0 && errno == EINVAL && !overwrite)
    {
      /* A file system without RENAME_NOREPLACE. */
      struct stat st;
      if (lstat (to, &st) == 0)
        errno = EEXIST;
      else
        rc = rename (from, to);
    }
  if (rc < 0 && errno == EXDEV)
    return file_send_error (EXDEV,
                            "rename `%s`: a directory of the image cannot be renamed in the sandbox's overlay "
                            "(copy it instead)",
                            from);
  if (rc < 0)
    return file_send_error (errno, "rename `%s` to `%s`: %s", from, to, strerror (errno));
  return send_lstat (to);
}

/* ---- the child ----------------------------------------------------------------- */

/* "/root/<path>" for a relative path (the sandbox's working directory), the
 * path itself when absolute. */
static int
absolute (const char *in, char *out, size_t cap)
{
  if (in[0] == '\0')
    return file_send_error (EINVAL, "the path is empty");
  int n = in[0] == '/' ? snprintf (out, cap, "%s", in) : snprintf (out, cap, "/root/%s", in);
  if (n < 0 || (size_t) n >= cap)
    return file_send_error (ENAMETOOLONG, "the path is too long");
  return 0;
}

static int
dispatch (const sbx_file_hdr_t *h, const char *path, const char *path2)
{
  char p[SBX_FILE_PATH_MAX + 8], p2[SBX_FILE_PATH_MAX + 8];
  if (absolute (path, p, sizeof p) < 0)
    return -1;
  mode_t mode = (mode_t) (h->mode & 07777);
  switch (h->op)
    {
    case SBX_FILE_STAT: return send_lstat (p);
    case SBX_FILE_READ: return op_read (p, h->offset, h->length);
    case SBX_FILE_WRITE: return op_write (p, mode, h->flags);
    case SBX_FILE_LIST: return file_op_list (p, h->depth, h->offset);
    case SBX_FILE_REMOVE: return op_remove (p, h->flags);
    case SBX_FILE_RENAME: return absolute (path2, p2, sizeof p2) < 0 ? -1 : op_rename (p, p2, h->flags);
    case SBX_FILE_MKDIR: return op_mkdir (p, mode, h->flags);
    case SBX_FILE_WATCH: return file_op_watch (p, h->flags, h->limit);
    }
  return file_send_error (EINVAL, "unknown file operation %u", h->op);
}

/* Closes every descriptor but `a` and `b` (both > 2). */
static void
close_others (int a, int b)
{
  int lo = a < b ? a : b, hi = a < b ? b : a;
  syscall (SYS_close_range, 3, lo - 1, 0);
  if (hi > lo + 1)
    syscall (SYS_close_range, lo + 1, hi - 1, 0);
  syscall (SYS_close_range, hi + 1, ~0U, 0);
}

void
helper_file_child (const sbx_confine_t *confine, char *buf, size_t len, const int *fds)
{
  err_t err = ERR_INIT;
  file_sock = fds[SBX_FILE_SLOT_STREAM];
  close (fds[SBX_FILE_SLOT_REPORT]); /* the report socket: the holder reports the exit */
  /* Its own session, and its cgroup: a cancelled call kills it there. */
  setsid ();
  bool joined = TEMP_FAILURE_RETRY (write (fds[SBX_FILE_SLOT_PROCS], "0", 1)) == 1;
  int join_errno = errno;
  close (fds[SBX_FILE_SLOT_PROCS]);
  sigset_t none;
  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++)
    signal (s, SIG_DFL);
  if (!joined)
    {
      fail_sys (join_errno, "join the cgroup of", "a file operation");
      _exit (1);
    }
  /* Not traceable by the sandbox's processes; modes exactly as asked. */
  prctl (PR_SET_DUMPABLE, 0, 0, 0, 0);
  umask (0);
  struct rlimit nofile = {.rlim_cur = 1024, .rlim_max = 1024};
  setrlimit (RLIMIT_NOFILE, &nofile);
  int devnull = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0)
    {
      dup2 (devnull, 0);
      dup2 (devnull, 1);
      dup2 (devnull, 2);
    }
  if (file_sock <= 2)
    file_sock = fcntl (file_sock, F_DUPFD_CLOEXEC, 3);
  close_others (file_sock, file_sock);
  if (chdir ("/root") < 0 && chdir ("/") < 0)
    _exit (1);
  if (sbx_confine_apply (confine, &err) < 0)
    {
      file_send_error (err.status, "%s", err_msg (&err));
      _exit (1);
    }
  sbx_file_hdr_t h;
  const char *path = NULL, *path2 = NULL;
  if (sbx_file_decode (buf, len, &h, &path, &path2) < 0)
    {
      file_send_error (EINVAL, "malformed file request");
      _exit (1);
    }
  /* An image's User, as its commands run: those ids, no supplementary
   * groups, and with a non-zero uid no capability left. */
  if ((h.flags & SBX_FILE_F_USER) != 0
      && ((setgroups (0, NULL) < 0 && (errno != EPERM || getgroups (0, NULL) != 0))
          || setresgid (h.gid, h.gid, h.gid) < 0 || setresuid (h.uid, h.uid, h.uid) < 0))
    {
      int e = errno;
      file_send_error (e, "switch to the image's User (%u:%u): %s", h.uid, h.gid, strerror (e));
      _exit (1);
    }
  _exit (dispatch (&h, path, path2) < 0 ? 1 : 0);
}
