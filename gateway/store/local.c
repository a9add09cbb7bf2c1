/* store/local: the local-directory snapshot store (see local.h).
 *
 * An object is a file under the store's directory. A writer writes a
 * temporary file beside its final name (".<name>.tmp-XXXXXX"), fsyncs it,
 * renames it over the final name and fsyncs the directory, so a crash
 * never leaves a half snapshot under the real name; temporary files a
 * crash left are removed when the store opens. Object names come from
 * snap_object_name (a validated sandbox id under a prefix), never from
 * clients directly.
 *
 * Threading: the store is immutable after creation; writers and readers
 * belong to their thread.
 */
#include "gateway/store/local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"

typedef struct local_store_s
{
  snap_store_t base;
  char *dir;
} local_store_t;

struct snap_writer_s
{
  int fd;
  char tmp[PATH_MAX];
  char final[PATH_MAX];
};

struct snap_reader_s
{
  int fd;
};

/* The path of `object` under the store's directory. No component of it
 * below that directory may be a symbolic link (ELOOP): another writer of
 * the directory cannot steer an operation out of it. A component planted
 * between this check and the operation is not seen; the store's directory
 * is the gateway's to give to writers it trusts that far. */
static int
object_path (const local_store_t *s, const char *object, char *out, size_t cap, err_t *err)
{
  if (object[0] == '/' || strstr (object, "..") != NULL)
    return err_make (err, EINVAL, "object name `%s` is not a relative name", object);
  if ((size_t) snprintf (out, cap, "%s/%s", s->dir, object) >= cap)
    return err_make (err, ENAMETOOLONG, "object name `%s` is too long", object);
  size_t base = strlen (s->dir) + 1;
  for (char *p = out + base;; p++)
    if (*p == '/' || *p == '\0')
      {
        char was = *p;
        *p = '\0';
        struct stat st;
        bool link = lstat (out, &st) == 0 && S_ISLNK (st.st_mode);
        *p = was;
        if (link)
          return err_make (err, ELOOP, "object `%s`: a symbolic link in the store's tree", object);
        if (was == '\0')
          return 0;
      }
}

static int
mkdirs_for (const char *path, err_t *err)
{
  char buf[PATH_MAX];
  snprintf (buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/')
      {
        *p = '\0';
        if (mkdir (buf, 0700) < 0 && errno != EEXIST)
          return err_make_sys (err, errno, "mkdir `%s`", buf);
        *p = '/';
      }
  return 0;
}

static int
fsync_dir_of (const char *path)
{
  char dir[PATH_MAX];
  snprintf (dir, sizeof dir, "%s", path);
  char *slash = strrchr (dir, '/');
  if (slash == NULL)
    return 0;
  *slash = '\0';
  cleanup_close int fd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return fd >= 0 ? fsync (fd) : -1;
}

static int
local_writer_open (snap_store_t *store, const char *object, snap_writer_t **out, err_t *err)
{
  local_store_t *s = (local_store_t *) store;
  snap_writer_t *w = calloc (1, sizeof *w);
  if (w == NULL)
    return err_make (err, ENOMEM, "out of memory");
  w->fd = -1;
  if (object_path (s, object, w->final, sizeof w->final, err) < 0 || mkdirs_for (w->final, err) < 0)
    {
      free (w);
      return -1;
    }
  char *slash = strrchr (w->final, '/');
  snprintf (w->tmp, sizeof w->tmp, "%.*s/.%.200s.tmp-XXXXXX", (int) (slash - w->final), w->final, slash + 1);
  w->fd = mkostemp (w->tmp, O_CLOEXEC);
  if (w->fd < 0)
    {
      int e = errno;
      free (w);
      return err_make_sys (err, e, "create a temporary file in the local store");
    }
  *out = w;
  return 0;
}

static int
local_writer_write (snap_writer_t *w, const uint8_t *data, size_t len, err_t *err)
{
  while (len > 0)
    {
      ssize_t n = TEMP_FAILURE_RETRY (write (w->fd, data, len));
      if (n < 0)
        return err_make_sys (err, errno, "write `%s`", w->tmp);
      data += n;
      len -= (size_t) n;
    }
  return 0;
}

static void
local_writer_abort (snap_writer_t *w)
{
  if (w->fd >= 0)
    close (w->fd);
  unlink (w->tmp);
  free (w);
}

static int
local_writer_commit (snap_writer_t *w, err_t *err)
{
  if (fsync (w->fd) < 0)
    {
      err_make_sys (err, errno, "fsync `%s`", w->tmp);
      local_writer_abort (w);
      return -1;
    }
  if (close (w->fd) < 0)
    {
      w->fd = -1;
      err_make_sys (err, errno, "close `%s`", w->tmp);
      local_writer_abort (w);
      return -1;
    }
  w->fd = -1;
  if (rename (w->tmp, w->final) < 0)
    {
      err_make_sys (err, errno, "rename `%s` to `%s`", w->tmp, w->final);
      local_writer_abort (w);
      return -1;
    }
  fsync_dir_of (w->final);
  free (w);
  return 0;
}

static int
local_reader_open (snap_store_t *store, const char *object, snap_reader_t **out, err_t *err)
{
  local_store_t *s = (local_store_t *) store;
  char path[PATH_MAX];
  if (object_path (s, object, path, sizeof path, err) < 0)
    return -1;
  /* Non-blocking, so that a FIFO planted under the name cannot hold the
   * open; then it must be a regular file. */
  int fd = open (path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return errno == ENOENT ? err_make (err, ENOENT, "no snapshot `%s` in the local store", object)
                           : err_make_sys (err, errno, "open `%s`", path);
  struct stat st;
  if (fstat (fd, &st) < 0 || !S_ISREG (st.st_mode) || fcntl (fd, F_SETFL, O_RDONLY) < 0)
    {
      close (fd);
      return err_make (err, EINVAL, "object `%s` in the local store is not a regular file", object);
    }
  snap_reader_t *r = calloc (1, sizeof *r);
  if (r == NULL)
    {
      close (fd);
      return err_make (err, ENOMEM, "out of memory");
    }
  r->fd = fd;
  *out = r;
  return 0;
}

static ssize_t
local_reader_read (snap_reader_t *r, uint8_t *buf, size_t cap, err_t *err)
{
  ssize_t n = TEMP_FAILURE_RETRY (read (r->fd, buf, cap));
  if (n < 0)
    return err_make_sys (err, errno, "read a local snapshot");
  return n;
}

static void
local_reader_close (snap_reader_t *r)
{
  if (r == NULL)
    return;
  close (r->fd);
  free (r);
}

static int
local_remove (snap_store_t *store, const char *object, err_t *err)
{
  char path[PATH_MAX];
  if (object_path ((local_store_t *) store, object, path, sizeof path, err) < 0)
    return -1;
  if (unlink (path) < 0)
    return errno == ENOENT ? err_make (err, ENOENT, "no snapshot `%s` in the local store", object)
                           : err_make_sys (err, errno, "remove `%s`", path);
  fsync_dir_of (path);
  /* The directories it leaves empty go too (a name's last object gone,
   * nothing of it is listed). */
  size_t base = strlen (((local_store_t *) store)->dir);
  for (char *slash = strrchr (path, '/'); slash != NULL && (size_t) (slash - path) > base;
       slash = strrchr (path, '/'))
    {
      *slash = '\0';
      if (rmdir (path) < 0)
        break;
    }
  return 0;
}

static int
local_exists (snap_store_t *store, const char *object, err_t *err)
{
  char path[PATH_MAX];
  if (object_path ((local_store_t *) store, object, path, sizeof path, err) < 0)
    return -1;
  struct stat st;
  if (lstat (path, &st) == 0)
    return S_ISREG (st.st_mode) ? 1 : 0;
  return errno == ENOENT ? 0 : err_make_sys (err, errno, "stat `%s`", path);
}

static int
local_stat (snap_store_t *store, const char *object, snap_gen_t *out, err_t *err)
{
  memset (out, 0, sizeof *out);
  char path[PATH_MAX];
  if (object_path ((local_store_t *) store, object, path, sizeof path, err) < 0)
    return -1;
  struct stat st;
  if (lstat (path, &st) < 0)
    return errno == ENOENT ? 0 : err_make_sys (err, errno, "stat `%s`", path);
  if (!S_ISREG (st.st_mode))
    return 0;
  /* A commit renames a new file over the name: a new inode every write. */
  snprintf (out->gen, sizeof out->gen, "%llu.%lld.%09ld", (unsigned long long) st.st_ino,
            (long long) st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  out->mtime_ms = (int64_t) st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
  return 1;
}

static int
local_list_dirs (snap_store_t *store, const char *dir, size_t max, int (*fn) (void *ctx, const char *name), void *ctx,
                 err_t *err)
{
  char path[PATH_MAX];
  if (object_path ((local_store_t *) store, dir, path, sizeof path, err) < 0)
    return -1;
  DIR *d = opendir (path);
  if (d == NULL)
    return errno == ENOENT ? 0 : err_make_sys (err, errno, "open `%s`", path);
  int rc = 0;
  size_t n = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir (d)) != NULL)
    {
      struct stat st;
      if (e->d_name[0] == '.' || fstatat (dirfd (d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0
          || !S_ISDIR (st.st_mode))
        continue;
      rc = ++n > max ? err_make (err, E2BIG, "more than %zu entries under `%s`", max, path) : fn (ctx, e->d_name);
    }
  closedir (d);
  return rc;
}

static void
local_destroy (snap_store_t *store)
{
  local_store_t *s = (local_store_t *) store;
  if (s == NULL)
    return;
  free (s->dir);
  free (s->base.prefix);
  free (s);
}

static const snap_store_ops_t local_ops = {
    .writer_open = local_writer_open,
    .writer_write = local_writer_write,
    .writer_commit = local_writer_commit,
    .writer_abort = local_writer_abort,
    .reader_open = local_reader_open,
    .reader_read = local_reader_read,
    .reader_close = local_reader_close,
    .remove = local_remove,
    .exists = local_exists,
    .stat = local_stat,
    .list_dirs = local_list_dirs,
    .cancel_all = NULL, /* local writes end on their own */
    .destroy = local_destroy,
};

/* Removes temporary files a crash left mid-write (".NAME.tmp-XXXXXX"),
 * once untouched for an hour: another gateway sharing the directory may be
 * writing a fresh one. */
static int
remove_stale_temp (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  const char *base = path + ftw->base;
  if (flag == FTW_F && base[0] == '.' && strstr (base, ".tmp-") != NULL && st->st_mtime < time (NULL) - 3600)
    unlink (path);
  return 0;
}

int
snap_store_local_new (const char *dir, const char *prefix, snap_store_t **out, err_t *err)
{
  if (dir[0] != '/')
    return err_make (err, EINVAL, "the local snapshot directory `%s` is not absolute", dir);
  if (mkdirs_for (dir, err) < 0 || (mkdir (dir, 0700) < 0 && errno != EEXIST))
    return err_make_sys (err, errno, "create the local snapshot directory `%s`", dir);
  nftw (dir, remove_stale_temp, 16, FTW_PHYS | FTW_MOUNT);
  local_store_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return err_make (err, ENOMEM, "out of memory");
  s->base.ops = &local_ops;
  s->base.kind = "local";
  s->base.prefix = strdup (prefix);
  s->dir = strdup (dir);
  if (s->base.prefix == NULL || s->dir == NULL)
    {
      local_destroy (&s->base);
      return err_make (err, ENOMEM, "out of memory");
    }
  *out = &s->base;
  return 0;
}
