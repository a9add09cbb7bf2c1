/* snapshot/export: a sandbox's upper directory as a pax tar stream (see
 * export.h) — the stream and the walk; single entries are written by
 * entries.c. State: per export only. */
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

/* The stream side runs on a thread of its own: the walk fills a buffer
 * while the previous one is hashed and handed to the sink (a gRPC send, a
 * store upload), so reading files and hashing/sending overlap. Buffers go
 * round in order; the sink sees them in the order they were filled. A sink
 * may keep a buffer past its return (snap_export_hold: gRPC sends it without
 * a copy); it rejoins the round when the sink lets it go. */

static export_buf_t *
buf_of (const uint8_t *data)
{
  return (export_buf_t *) (void *) (data - offsetof (export_buf_t, data));
}

/* A buffer nobody holds any more: back on the free list, or freed once the
 * export is over (the last one frees the stream). st->mu held; returns
 * true when the stream itself was freed (and its mutex with it). */
static bool
buf_unheld_locked (export_stream_t *st, export_buf_t *b)
{
  if (!st->closed)
    {
      st->free_[st->n_free++] = b;
      pthread_cond_broadcast (&st->cv);
      return false;
    }
  free (b);
  if (--st->live > 0)
    return false;
  pthread_mutex_unlock (&st->mu);
  pthread_mutex_destroy (&st->mu);
  pthread_cond_destroy (&st->cv);
  err_release (&st->err);
  free (st);
  return true;
}

void
snap_export_hold (const uint8_t *data)
{
  export_buf_t *b = buf_of (data);
  pthread_mutex_lock (&b->st->mu);
  b->holds++;
  pthread_mutex_unlock (&b->st->mu);
}

void
snap_export_release (const uint8_t *data)
{
  export_buf_t *b = buf_of (data);
  export_stream_t *st = b->st;
  pthread_mutex_lock (&st->mu);
  if (--b->holds == 0 && buf_unheld_locked (st, b))
    return;
  pthread_mutex_unlock (&st->mu);
}

static void *
stream_main (void *arg)
{
  export_t *x = arg;
  export_stream_t *st = x->stream;
  pthread_mutex_lock (&st->mu);
  for (;;)
    {
      while (st->n_queued == 0 && !st->done)
        pthread_cond_wait (&st->cv, &st->mu);
      if (st->n_queued == 0)
        break;
      export_buf_t *b = st->queue[st->q_head];
      st->q_head = (st->q_head + 1) % EXPORT_BUFFERS;
      st->n_queued--;
      b->holds = 1;
      bool failed = st->failed;
      pthread_mutex_unlock (&st->mu);
      int rc = 0;
      if (!failed)
        {
          if (x->sha != NULL)
            EVP_DigestUpdate (x->sha, b->data, b->len);
          x->total += b->len;
          rc = x->sink (x->sink_ctx, b->data, b->len, &st->err);
        }
      pthread_mutex_lock (&st->mu);
      if (rc < 0)
        st->failed = true;
      if (--b->holds == 0)
        buf_unheld_locked (st, b); /* the export is running: never frees st */
      pthread_cond_broadcast (&st->cv);
    }
  pthread_mutex_unlock (&st->mu);
  return NULL;
}

/* Hands the current buffer to the stream thread and, unless `last`, takes
 * the next free one. -1 when the sink has failed or the export was told to
 * stop while it waited for a buffer its sink still held. */
static int
submit (export_t *x, bool last)
{
  export_stream_t *st = x->stream;
  pthread_mutex_lock (&st->mu);
  if (x->used > 0)
    {
      st->cur->len = x->used;
      st->queue[(st->q_head + st->n_queued) % EXPORT_BUFFERS] = st->cur;
      st->n_queued++;
      st->cur = NULL;
      pthread_cond_broadcast (&st->cv);
    }
  bool stopped = false;
  if (!last && st->cur == NULL)
    {
      /* A sink's held buffers come back when the consumer takes the
       * bytes; one that never does is stopped through `abort`, which is
       * looked at every 100 ms. */
      while (st->n_free == 0 && !st->failed && !(stopped = st->abort != NULL && atomic_load (st->abort)))
        {
          struct timespec until;
          clock_gettime (CLOCK_REALTIME, &until);
          until.tv_nsec += 100 * 1000 * 1000;
          if (until.tv_nsec >= 1000 * 1000 * 1000)
            {
              until.tv_sec++;
              until.tv_nsec -= 1000 * 1000 * 1000;
            }
          pthread_cond_timedwait (&st->cv, &st->mu, &until);
        }
      if (st->n_free > 0 && !st->failed && !stopped)
        st->cur = st->free_[--st->n_free];
    }
  bool failed = st->failed || stopped;
  pthread_mutex_unlock (&st->mu);
  x->used = 0;
  x->buf = st->cur != NULL ? st->cur->data : NULL;
  return failed || (!last && x->buf == NULL) ? -1 : 0;
}

int
export_stream_start (export_t *x, const atomic_bool *abort)
{
  export_stream_t *st = calloc (1, sizeof *st);
  if (st == NULL)
    return -1;
  x->stream = st;
  pthread_mutex_init (&st->mu, NULL);
  pthread_cond_init (&st->cv, NULL);
  st->err = (err_t) ERR_INIT;
  st->abort = abort;
  for (int i = 0; i < EXPORT_BUFFERS; i++)
    {
      export_buf_t *b = malloc (sizeof *b + x->chunk);
      if (b == NULL)
        return -1;
      b->st = st;
      b->holds = 0;
      st->live++;
      st->free_[st->n_free++] = b;
    }
  st->cur = st->free_[--st->n_free];
  x->buf = st->cur->data;
  if (pthread_create (&st->thread, NULL, stream_main, x) != 0)
    return -1;
  st->started = true;
  return 0;
}

/* Waits for the stream thread to send what is queued and stop; its error,
 * if any, becomes the export's. 0, or -1 when the sink failed. */
int
export_stream_finish (export_t *x)
{
  export_stream_t *st = x->stream;
  if (st == NULL)
    return 0;
  if (st->started)
    {
      pthread_mutex_lock (&st->mu);
      st->done = true;
      pthread_cond_broadcast (&st->cv);
      pthread_mutex_unlock (&st->mu);
      pthread_join (st->thread, NULL);
      st->started = false;
    }
  int rc = st->failed ? -1 : 0;
  if (st->failed && st->err.msg != NULL)
    {
      err_release (x->err);
      *x->err = st->err;
      st->err = (err_t) ERR_INIT;
    }
  return rc;
}

/* Finishes, frees every buffer nobody holds, and leaves those a sink still
 * holds to free themselves (and, the last of them, the stream). */
void
export_stream_release (export_t *x)
{
  export_stream_t *st = x->stream;
  if (st == NULL)
    return;
  export_stream_finish (x);
  x->stream = NULL;
  x->buf = NULL;
  pthread_mutex_lock (&st->mu);
  st->closed = true;
  if (st->cur != NULL)
    st->free_[st->n_free++] = st->cur;
  st->cur = NULL;
  for (size_t i = 0; i < st->n_queued; i++) /* left behind by a failed sink */
    st->free_[st->n_free++] = st->queue[(st->q_head + i) % EXPORT_BUFFERS];
  st->n_queued = 0;
  size_t n = st->n_free;
  st->n_free = 0;
  for (size_t i = 0; i < n; i++)
    if (buf_unheld_locked (st, st->free_[i]))
      return;
  if (st->live == 0) /* nothing was allocated, or start failed half-way */
    {
      pthread_mutex_unlock (&st->mu);
      pthread_mutex_destroy (&st->mu);
      pthread_cond_destroy (&st->cv);
      err_release (&st->err);
      free (st);
      return;
    }
  pthread_mutex_unlock (&st->mu);
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
      if (x->used == x->chunk && submit (x, false) < 0)
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
  if (!x->failed && (submit (x, true) < 0 || export_stream_finish (x) < 0))
    {
      x->failed = true;
      archive_set_error (a, ECANCELED, "the snapshot's consumer stopped");
      return ARCHIVE_FATAL;
    }
  return ARCHIVE_OK;
}

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
  x.io = malloc (1 << 20);
  x.path = malloc (PATH_MAX + 1);
  x.link_path = malloc (PATH_MAX + 1);
  void *holes = mmap (NULL, EXPORT_HOLE_CHUNK, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  x.holes = holes != MAP_FAILED ? holes : NULL;
  if (!opts->skip_digest)
    x.sha = EVP_MD_CTX_new ();
  x.a = archive_write_new ();
  int rc = -1;
  if (x.io == NULL || x.path == NULL || x.link_path == NULL || x.holes == NULL
      || (x.sha == NULL && !opts->skip_digest) || x.a == NULL || export_stream_start (&x, opts->abort) < 0)
    {
      err_make (err, ENOMEM, "export: out of memory");
      goto out;
    }
  if (x.sha != NULL)
    EVP_DigestInit_ex (x.sha, EVP_sha256 (), NULL);
  archive_write_set_format_pax (x.a);
  /* No zero padding after the end of the archive: it would trail a
   * compressed stream as garbage. */
  archive_write_set_bytes_in_last_block (x.a, 1);
  int frc = ARCHIVE_OK;
  if (opts->compression == SNAP_COMPRESSION_GZIP)
    frc = archive_write_add_filter_gzip (x.a);
  else if (opts->compression == SNAP_COMPRESSION_ZSTD)
    frc = archive_write_add_filter_zstd (x.a);
  if (frc != ARCHIVE_OK)
    {
      export_fail (&x, "set up compression");
      goto out;
    }
  if (archive_write_open2 (x.a, &x, NULL, write_cb, close_cb, NULL) != ARCHIVE_OK)
    {
      export_fail (&x, "start the archive");
      goto out;
    }
  if (walk (&x, root) < 0)
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
  if (x.a != NULL)
    archive_write_free (x.a);
  /* The stream thread has stopped before the digest, the sink or *err go. */
  if (export_stream_finish (&x) < 0)
    rc = -1;
  export_stream_release (&x);
  if (x.sha != NULL)
    EVP_MD_CTX_free (x.sha);
  free (x.io);
  free (x.path);
  free (x.link_path);
  if (x.holes != NULL)
    munmap ((void *) x.holes, EXPORT_HOLE_CHUNK);
  /* A large table's memory goes back to the system, not only to malloc's
   * arenas (where another thread's allocations would keep it). */
  if (snap_links_free (&x.links) >= EXPORT_TRIM_AFTER)
    malloc_trim (0);
  return rc;
}
