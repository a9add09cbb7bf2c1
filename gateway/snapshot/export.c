/* snap_export: upper directory → pax tar stream (see snap_export.h).
 * State: per export only (the walker context below). */
#include "gateway/snapshot/export.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"

#define OCI_WHITEOUT ".wh."
#define OCI_OPAQUE ".wh..wh..opq"
#define OVERLAY_OPAQUE_XATTR "trusted.overlay.opaque"
#define MAX_DEPTH 256

typedef struct link_s
{
  dev_t dev;
  ino_t ino;
  char *path;
} link_t;

typedef struct export_s
{
  struct archive *a;
  /* stream side */
  snap_sink_fn sink;
  void *sink_ctx;
  uint8_t *buf;
  size_t used, chunk;
  EVP_MD_CTX *sha;
  uint64_t total;
  err_t *err;
  bool failed;
  /* tree side */
  link_t *links;
  size_t n_links, cap_links;
  uint64_t entries;
  uint8_t *io;
} export_t;

static int
flush (export_t *x)
{
  if (x->used == 0)
    return 0;
  EVP_DigestUpdate (x->sha, x->buf, x->used);
  x->total += x->used;
  int rc = x->sink (x->sink_ctx, x->buf, x->used, x->err);
  x->used = 0;
  return rc;
}

static la_ssize_t
write_cb (struct archive *a, void *ctx, const void *data, size_t len)
{
  export_t *x = ctx;
  if (x->failed)
    return -1;
  const uint8_t *p = data;
  size_t left = len;
  while (left > 0)
    {
      size_t n = x->chunk - x->used < left ? x->chunk - x->used : left;
      memcpy (x->buf + x->used, p, n);
      x->used += n;
      p += n;
      left -= n;
      if (x->used == x->chunk && flush (x) < 0)
        {
          x->failed = true;
          archive_set_error (a, ECANCELED, "the snapshot's consumer stopped");
          return -1;
        }
    }
  return (la_ssize_t) len;
}

static int
close_cb (struct archive *a, void *ctx)
{
  export_t *x = ctx;
  if (!x->failed && flush (x) < 0)
    {
      x->failed = true;
      archive_set_error (a, ECANCELED, "the snapshot's consumer stopped");
      return ARCHIVE_FATAL;
    }
  return ARCHIVE_OK;
}

static int
archive_fail (export_t *x, const char *what)
{
  if (x->failed && x->err->msg != NULL)
    return -1; /* the sink's own error says it best */
  int e = archive_errno (x->a);
  return err_make (x->err, e > 0 ? e : EIO, "%s: %s", what, archive_error_string (x->a));
}

static const char *
find_link (export_t *x, const struct stat *st)
{
  for (size_t i = 0; i < x->n_links; i++)
    if (x->links[i].ino == st->st_ino && x->links[i].dev == st->st_dev)
      return x->links[i].path;
  return NULL;
}

static void
remember_link (export_t *x, const struct stat *st, const char *path)
{
  if (x->n_links == x->cap_links)
    {
      size_t cap = x->cap_links ? x->cap_links * 2 : 16;
      link_t *l = realloc (x->links, cap * sizeof *l);
      if (l == NULL)
        return; /* the file is then stored again instead of linked */
      x->links = l;
      x->cap_links = cap;
    }
  char *p = strdup (path);
  if (p != NULL)
    x->links[x->n_links++] = (link_t){st->st_dev, st->st_ino, p};
}

static void
set_meta (struct archive_entry *e, const char *path, const struct stat *st)
{
  archive_entry_set_pathname (e, path);
  archive_entry_set_mode (e, st->st_mode);
  archive_entry_set_uid (e, st->st_uid);
  archive_entry_set_gid (e, st->st_gid);
  archive_entry_set_mtime (e, st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
}

/* Copies the extended attributes of `fd`, except overlay's own. */
static void
add_xattrs (struct archive_entry *e, int fd)
{
  char names[4096];
  ssize_t n = flistxattr (fd, names, sizeof names);
  for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t) strlen (names + off) + 1)
    {
      const char *name = names + off;
      if (strncmp (name, "trusted.overlay.", 16) == 0)
        continue;
      char value[4096];
      ssize_t vlen = fgetxattr (fd, name, value, sizeof value);
      if (vlen >= 0)
        archive_entry_xattr_add_entry (e, name, value, (size_t) vlen);
    }
}

static int
write_entry (export_t *x, struct archive_entry *e, const char *path)
{
  if (archive_write_header (x->a, e) < ARCHIVE_WARN)
    {
      char what[PATH_MAX + 32];
      snprintf (what, sizeof what, "write the header of `%.4000s`", path);
      return archive_fail (x, what);
    }
  x->entries++;
  return 0;
}

static int
write_whiteout (export_t *x, const char *dir, const char *name, const struct stat *st)
{
  char path[PATH_MAX * 3];
  snprintf (path, sizeof path, "%s%s" OCI_WHITEOUT "%s", dir, dir[0] ? "/" : "", name);
  struct archive_entry *e = archive_entry_new ();
  struct stat w = *st;
  w.st_mode = S_IFREG | 0644;
  set_meta (e, path, &w);
  archive_entry_set_size (e, 0);
  int rc = write_entry (x, e, path);
  archive_entry_free (e);
  return rc;
}

static int
write_file (export_t *x, int dirfd, const char *name, const char *path, const struct stat *st)
{
  struct archive_entry *e = archive_entry_new ();
  set_meta (e, path, st);
  int rc = 0;
  if (st->st_nlink > 1)
    {
      const char *first = find_link (x, st);
      if (first != NULL)
        {
          archive_entry_set_hardlink (e, first);
          archive_entry_set_size (e, 0);
          rc = write_entry (x, e, path);
          archive_entry_free (e);
          return rc;
        }
    }
  cleanup_close int fd = openat (dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat now;
  if (fd < 0 || fstat (fd, &now) < 0 || now.st_ino != st->st_ino || !S_ISREG (now.st_mode))
    {
      archive_entry_free (e);
      return 0; /* changed under us (it cannot while frozen): skip, never follow */
    }
  if (st->st_nlink > 1)
    remember_link (x, st, path);
  archive_entry_set_size (e, now.st_size);
  add_xattrs (e, fd);
  rc = write_entry (x, e, path);
  archive_entry_free (e);
  if (rc < 0)
    return -1;
  off_t left = now.st_size;
  while (left > 0)
    {
      ssize_t r = TEMP_FAILURE_RETRY (read (fd, x->io, (size_t) (left < 1 << 20 ? left : 1 << 20)));
      if (r < 0)
        return err_make_sys (x->err, errno, "read `%s`", path);
      if (r == 0)
        {
          /* Shrunk meanwhile: pad, so the archive stays well formed. */
          memset (x->io, 0, 1 << 20);
          r = left < 1 << 20 ? left : 1 << 20;
        }
      if (archive_write_data (x->a, x->io, (size_t) r) < 0)
        return archive_fail (x, "write file data");
      left -= r;
    }
  return 0;
}

static int walk (export_t *x, int dirfd, const char *dir, int depth);

static int
name_cmp (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

static int
write_dir (export_t *x, int dirfd, const char *name, const char *path, const struct stat *st, int depth)
{
  cleanup_close int fd = openat (dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat now;
  if (fd < 0 || fstat (fd, &now) < 0 || now.st_ino != st->st_ino)
    return 0; /* swapped for something else: skip, never follow */
  struct archive_entry *e = archive_entry_new ();
  set_meta (e, path, &now);
  add_xattrs (e, fd);
  int rc = write_entry (x, e, path);
  archive_entry_free (e);
  if (rc < 0)
    return -1;
  char opaque[4];
  ssize_t olen = fgetxattr (fd, OVERLAY_OPAQUE_XATTR, opaque, sizeof opaque);
  if (olen == 1 && opaque[0] == 'y')
    {
      char wpath[PATH_MAX * 2 + 16];
      snprintf (wpath, sizeof wpath, "%s/" OCI_OPAQUE, path);
      struct archive_entry *w = archive_entry_new ();
      struct stat ws = now;
      ws.st_mode = S_IFREG | 0644;
      set_meta (w, wpath, &ws);
      archive_entry_set_size (w, 0);
      rc = write_entry (x, w, wpath);
      archive_entry_free (w);
      if (rc < 0)
        return -1;
    }
  return walk (x, fd, path, depth + 1);
}

static int
walk (export_t *x, int dirfd, const char *dir, int depth)
{
  if (depth > MAX_DEPTH)
    return err_make (x->err, ELOOP, "directories nested deeper than %d levels under `%s`", MAX_DEPTH, dir);
  int dfd = dup (dirfd);
  if (dfd < 0)
    return err_make_sys (x->err, errno, "dup");
  DIR *d = fdopendir (dfd);
  if (d == NULL)
    {
      close (dfd);
      return err_make_sys (x->err, errno, "open directory `%s`", dir);
    }
  size_t n = 0, cap = 32;
  char **names = malloc (cap * sizeof *names);
  struct dirent *de;
  int rc = 0;
  while (names != NULL && (de = readdir (d)) != NULL)
    {
      if (strcmp (de->d_name, ".") == 0 || strcmp (de->d_name, "..") == 0)
        continue;
      if (n == cap)
        {
          char **g = realloc (names, cap * 2 * sizeof *names);
          if (g == NULL)
            break;
          names = g;
          cap *= 2;
        }
      names[n] = strdup (de->d_name);
      if (names[n] != NULL)
        n++;
    }
  closedir (d);
  if (names == NULL)
    return err_make (x->err, ENOMEM, "list `%s`: out of memory", dir);
  qsort (names, n, sizeof *names, name_cmp);
  for (size_t i = 0; i < n && rc == 0; i++)
    {
      const char *name = names[i];
      char path[PATH_MAX * 2];
      int plen = snprintf (path, sizeof path, "%s%s%s", dir, dir[0] ? "/" : "", name);
      if (plen >= PATH_MAX)
        {
          rc = err_make (x->err, ENAMETOOLONG, "path too long under `%.200s`", dir);
          break;
        }
      struct stat st;
      if (fstatat (dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        continue; /* vanished */
      if (S_ISCHR (st.st_mode) && st.st_rdev == makedev (0, 0))
        rc = write_whiteout (x, dir, name, &st);
      else if (S_ISDIR (st.st_mode))
        rc = write_dir (x, dirfd, name, path, &st, depth);
      else if (S_ISREG (st.st_mode))
        rc = write_file (x, dirfd, name, path, &st);
      else if (S_ISLNK (st.st_mode))
        {
          char target[PATH_MAX];
          ssize_t tl = readlinkat (dirfd, name, target, sizeof target - 1);
          if (tl < 0)
            continue;
          target[tl] = '\0';
          struct archive_entry *e = archive_entry_new ();
          set_meta (e, path, &st);
          archive_entry_set_symlink (e, target);
          rc = write_entry (x, e, path);
          archive_entry_free (e);
        }
      else
        log_fields (SEV_DEBUG, json_pack ("{s:s}", "path", path), "snapshot: skipped a fifo, socket or device");
    }
  for (size_t i = 0; i < n; i++)
    free (names[i]);
  free (names);
  return rc;
}

int
snap_export (const char *upper, snap_compression_t compression, size_t chunk, snap_sink_fn sink, void *ctx,
             snap_export_result_t *res, err_t *err)
{
  memset (res, 0, sizeof *res);
  export_t x = {.sink = sink, .sink_ctx = ctx, .chunk = chunk, .err = err};
  cleanup_close int root = open (upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0)
    return err_make_sys (err, errno, "open the sandbox's layer `%s`", upper);
  x.buf = malloc (chunk);
  x.io = malloc (1 << 20);
  x.sha = EVP_MD_CTX_new ();
  x.a = archive_write_new ();
  int rc = -1;
  if (x.buf == NULL || x.io == NULL || x.sha == NULL || x.a == NULL)
    {
      err_make (err, ENOMEM, "export: out of memory");
      goto out;
    }
  EVP_DigestInit_ex (x.sha, EVP_sha256 (), NULL);
  archive_write_set_format_pax (x.a);
  /* No zero padding after the end of the archive: it would trail a
   * compressed stream as garbage. */
  archive_write_set_bytes_in_last_block (x.a, 1);
  int frc = ARCHIVE_OK;
  if (compression == SNAP_COMPRESSION_GZIP)
    frc = archive_write_add_filter_gzip (x.a);
  else if (compression == SNAP_COMPRESSION_ZSTD)
    frc = archive_write_add_filter_zstd (x.a);
  if (frc != ARCHIVE_OK)
    {
      archive_fail (&x, "set up compression");
      goto out;
    }
  if (archive_write_open2 (x.a, &x, NULL, write_cb, close_cb, NULL) != ARCHIVE_OK)
    {
      archive_fail (&x, "start the archive");
      goto out;
    }
  if (walk (&x, root, "", 0) < 0)
    goto out;
  if (archive_write_close (x.a) != ARCHIVE_OK)
    {
      archive_fail (&x, "finish the archive");
      goto out;
    }
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_DigestFinal_ex (x.sha, md, &mdlen);
  for (unsigned i = 0; i < mdlen; i++)
    snprintf (res->sha256 + 2 * i, 3, "%02x", md[i]);
  res->total_bytes = x.total;
  res->entries = x.entries;
  rc = 0;
out:
  if (x.a != NULL)
    archive_write_free (x.a);
  EVP_MD_CTX_free (x.sha);
  free (x.buf);
  free (x.io);
  for (size_t i = 0; i < x.n_links; i++)
    free (x.links[i].path);
  free (x.links);
  return rc;
}
