/* snapshot/export: a sandbox's upper directory as a pax tar stream (see
 * export.h) — the walk; the stream to the sink is export_stream.c, single
 * entries are written by entries.c. State: per export only. */
#include "gateway/snapshot/export_internal.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"

/* A hard-link table this large is given back to the system at the end. */
#define EXPORT_TRIM_AFTER ((size_t) 1 << 20)

static void
frame_free (frame_t *f)
{
  for (size_t i = 0; i < f->n; i++)
    free (f->names[i]);
  free (f->names);
  if (f->fd >= 0)
    close (f->fd);
}

static int
name_cmp (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* Lists the directory of `f` (sorted). Any failure fails the export: a
 * listing cut short would silently drop files. */
static int
list_dir (export_t *x, frame_t *f)
{
  int dfd = dup (f->fd);
  if (dfd < 0)
    return err_make_sys (x->err, errno, "dup");
  DIR *d = fdopendir (dfd);
  if (d == NULL)
    {
      close (dfd);
      return err_make_sys (x->err, errno, "open directory `%s`", x->path);
    }
  size_t cap = 0;
  struct dirent *de;
  int rc = 0;
  errno = 0;
  while (rc == 0 && (f->n % 4096 != 0 || (rc = export_check (x)) == 0) && (de = readdir (d)) != NULL)
    {
      if (strcmp (de->d_name, ".") == 0 || strcmp (de->d_name, "..") == 0)
        continue;
      if (f->n == cap)
        {
          size_t c = cap ? cap * 2 : 32;
          char **g = realloc (f->names, c * sizeof *g);
          if (g == NULL)
            {
              rc = err_make (x->err, ENOMEM, "list `%s`: out of memory", x->path);
              break;
            }
          f->names = g;
          cap = c;
        }
      if ((f->names[f->n] = strdup (de->d_name)) == NULL)
        rc = err_make (x->err, ENOMEM, "list `%s`: out of memory", x->path);
      else
        f->n++;
      errno = 0;
    }
  if (rc == 0 && errno != 0)
    rc = err_make_sys (x->err, errno, "list `%s`", x->path);
  closedir (d);
  if (rc == 0 && f->n > 0)
    qsort (f->names, f->n, sizeof *f->names, name_cmp);
  return rc;
}

/* Writes directory `name`'s entry (and its opaque marker) and opens it for
 * the walk: *fd, or -1 when it vanished or was swapped meanwhile. */
static int
write_dir (export_t *x, int dirfd, const char *name, const char *path, const struct stat *st, int *out)
{
  *out = -1;
  cleanup_close int fd = openat (dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat now;
  if (fd < 0 && errno != ENOENT && errno != ENOTDIR && errno != ELOOP)
    return err_make_sys (x->err, errno, "open directory `%s`", path);
  if (fd < 0 || fstat (fd, &now) < 0 || now.st_ino != st->st_ino)
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "path", path), "snapshot: a directory changed during export");
      return 0;
    }
  struct archive_entry *e = archive_entry_new ();
  export_set_meta (x, e, path, &now);
  int rc = export_add_xattrs (x, e, fd, path);
  if (rc == 0)
    rc = export_write_entry (x, e, path);
  archive_entry_free (e);
  if (rc < 0)
    return -1;
  char opaque[4];
  ssize_t olen = fgetxattr (fd, x->opaque_xattr, opaque, sizeof opaque);
  if (olen == 1 && opaque[0] == 'y')
    {
      size_t plen = strlen (path);
      char *wpath = malloc (plen + sizeof "/" OCI_OPAQUE);
      if (wpath == NULL)
        return err_make (x->err, ENOMEM, "export: out of memory");
      memcpy (wpath, path, plen);
      memcpy (wpath + plen, "/" OCI_OPAQUE, sizeof "/" OCI_OPAQUE);
      struct archive_entry *w = archive_entry_new ();
      struct stat ws = now;
      ws.st_mode = S_IFREG | 0644;
      export_set_meta (x, w, wpath, &ws);
      archive_entry_set_size (w, 0);
      rc = export_write_entry (x, w, wpath);
      archive_entry_free (w);
      free (wpath);
      if (rc < 0)
        return -1;
    }
  *out = take_fd (&fd);
  return 0;
}

static int
write_symlink (export_t *x, int dirfd, const char *name, const char *path, const struct stat *st)
{
  char target[PATH_MAX];
  ssize_t tl = readlinkat (dirfd, name, target, sizeof target - 1);
  if (tl < 0 && errno == ENOENT)
    return 0; /* vanished */
  if (tl < 0)
    return err_make_sys (x->err, errno, "read link `%s`", path);
  target[tl] = '\0';
  struct archive_entry *e = archive_entry_new ();
  export_set_meta (x, e, path, st);
  archive_entry_set_symlink (e, target);
  int rc = export_write_entry (x, e, path);
  archive_entry_free (e);
  return rc;
}

/* Exports one entry of directory `f`; a directory is opened into *child. */
static int
export_entry (export_t *x, const frame_t *f, const char *name, int *child)
{
  *child = -1;
  size_t nlen = strlen (name);
  bool escape = export_name_escaped (name); /* a user name that looks like a whiteout */
  size_t len = f->len + (f->len > 0 ? 1 : 0) + (escape ? ESCAPE_LEN : 0) + nlen;
  if (len >= PATH_MAX)
    return err_make (x->err, ENAMETOOLONG, "a path under `%.200s` is longer than the tar format allows here",
                     x->path);
  char *p = x->path + f->len;
  if (f->len > 0)
    *p++ = '/';
  if (escape)
    {
      memcpy (p, ESCAPE_PREFIX, ESCAPE_LEN);
      p += ESCAPE_LEN;
    }
  memcpy (p, name, nlen + 1);
  struct stat st;
  if (fstatat (f->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : err_make_sys (x->err, errno, "stat `%s`", x->path);
  if (S_ISCHR (st.st_mode) && st.st_rdev == makedev (0, 0))
    {
      char saved = x->path[f->len];
      x->path[f->len] = '\0'; /* the directory's path */
      int rc = export_write_whiteout (x, x->path, name, &st);
      x->path[f->len] = saved;
      return rc;
    }
  if (S_ISDIR (st.st_mode))
    return write_dir (x, f->fd, name, x->path, &st, child);
  if (S_ISREG (st.st_mode))
    return export_write_file (x, f->fd, name, x->path, &st);
  if (S_ISLNK (st.st_mode))
    return write_symlink (x, f->fd, name, x->path, &st);
  log_fields (SEV_DEBUG, json_pack ("{s:s}", "path", x->path), "snapshot: skipped a fifo, socket or device");
  return 0;
}

/* Walks the tree below `root` depth first, in name order, without
 * recursion. */
static int
walk (export_t *x, int root)
{
  frame_t *stack = NULL;
  size_t depth = 0, cap = 0;
  int rc = 0;
  int top_fd = dup (root);
  if (top_fd < 0)
    return err_make_sys (x->err, errno, "dup");
  x->path[0] = '\0';
  for (;;)
    {
      if (top_fd >= 0)
        {
          if (depth == cap)
            {
              size_t c = cap ? cap * 2 : 16;
              frame_t *g = realloc (stack, c * sizeof *g);
              if (g == NULL)
                {
                  close (top_fd);
                  rc = err_make (x->err, ENOMEM, "export: out of memory");
                  break;
                }
              stack = g;
              cap = c;
            }
          stack[depth] = (frame_t){.fd = top_fd, .len = strlen (x->path)};
          top_fd = -1;
          x->stack = stack;
          x->depth = ++depth;
          if ((rc = list_dir (x, &stack[depth - 1])) < 0)
            break;
        }
      if (depth == 0)
        break;
      frame_t *f = &stack[depth - 1];
      if (f->next == f->n)
        {
          frame_free (f);
          x->depth = --depth;
          continue;
        }
      if ((rc = export_check (x)) < 0 || (rc = export_entry (x, f, f->names[f->next++], &top_fd)) < 0)
        break;
      if (top_fd < 0)
        x->path[f->len] = '\0';
    }
  while (depth > 0)
    frame_free (&stack[--depth]);
  free (stack);
  x->stack = NULL;
  x->depth = 0;
  return rc;
}

/* The export's buffers and writer: 0, or -1 (out of memory). */
static int
export_alloc (export_t *x, const snap_export_opts_t *opts)
{
  x->io = malloc (1 << 20);
  x->path = malloc (PATH_MAX + 1);
  x->link_path = malloc (PATH_MAX + 1);
  void *holes = mmap (NULL, EXPORT_HOLE_CHUNK, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  x->holes = holes != MAP_FAILED ? holes : NULL;
  if (!opts->skip_digest)
    x->sha = EVP_MD_CTX_new ();
  x->a = archive_write_new ();
  if (x->io == NULL || x->path == NULL || x->link_path == NULL || x->holes == NULL
      || (x->sha == NULL && !opts->skip_digest) || x->a == NULL || export_stream_start (x, opts->abort) < 0)
    return err_make (x->err, ENOMEM, "export: out of memory");
  if (x->sha != NULL)
    EVP_DigestInit_ex (x->sha, EVP_sha256 (), NULL);
  return 0;
}

/* A pax writer with the options' compression, open on the stream. */
static int
export_open (export_t *x, const snap_export_opts_t *opts)
{
  archive_write_set_format_pax (x->a);
  /* No zero padding after the end of the archive: it would trail a
   * compressed stream as garbage. */
  archive_write_set_bytes_in_last_block (x->a, 1);
  int frc = ARCHIVE_OK;
  if (opts->compression == SNAP_COMPRESSION_GZIP)
    frc = archive_write_add_filter_gzip (x->a);
  else if (opts->compression == SNAP_COMPRESSION_ZSTD)
    frc = archive_write_add_filter_zstd (x->a);
  if (frc != ARCHIVE_OK)
    return export_fail (x, "set up compression");
  if (archive_write_open2 (x->a, x, NULL, export_write_cb, export_close_cb, NULL) != ARCHIVE_OK)
    return export_fail (x, "start the archive");
  return 0;
}

/* Stops the stream (its error, if any, is the export's: -1) and frees
 * what export_alloc made. */
static int
export_free (export_t *x)
{
  int rc = 0;
  if (x->a != NULL)
    archive_write_free (x->a);
  /* The stream thread has stopped before the digest, the sink or *err go. */
  if (export_stream_finish (x) < 0)
    rc = -1;
  export_stream_release (x);
  if (x->sha != NULL)
    EVP_MD_CTX_free (x->sha);
  free (x->io);
  free (x->path);
  free (x->link_path);
  if (x->holes != NULL)
    munmap ((void *) x->holes, EXPORT_HOLE_CHUNK);
  /* A large table's memory goes back to the system, not only to malloc's
   * arenas (where another thread's allocations would keep it). */
  if (snap_links_free (&x->links) >= EXPORT_TRIM_AFTER)
    malloc_trim (0);
  return rc;
}

int
snap_export (const snap_layer_t *layer, const snap_export_opts_t *opts, size_t chunk, snap_sink_fn sink, void *ctx,
             snap_export_result_t *res, err_t *err)
{
  memset (res, 0, sizeof *res);
  export_t x = {.sink = sink,
                .sink_ctx = ctx,
                .chunk = chunk,
                .err = err,
                .id_base = layer->id_base,
                .id_range = layer->id_range,
                .overlay_xattrs = layer->userxattr ? "user.overlay." : "trusted.overlay.",
                .opaque_xattr = layer->userxattr ? "user.overlay.opaque" : "trusted.overlay.opaque",
                .abort = opts->abort,
                .cancelled = opts->cancelled,
                .cancelled_ctx = opts->cancelled_ctx};
  cleanup_close int root = openat (layer->upper_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0)
    return err_make_sys (err, errno, "open the sandbox's layer");
  int rc = -1;
  if (export_alloc (&x, opts) < 0 || export_open (&x, opts) < 0 || walk (&x, root) < 0)
    goto out;
  if (archive_write_close (x.a) != ARCHIVE_OK)
    {
      export_fail (&x, "finish the archive");
      goto out;
    }
  if (x.sha != NULL)
    {
      unsigned char md[32];
      unsigned int mdlen = 0;
      EVP_DigestFinal_ex (x.sha, md, &mdlen);
      for (unsigned i = 0; i < mdlen; i++)
        snprintf (res->sha256 + 2 * i, 3, "%02x", md[i]);
    }
  res->total_bytes = x.total;
  res->entries = x.entries;
  rc = 0;
out:
  if (export_free (&x) < 0)
    rc = -1;
  return rc;
}
