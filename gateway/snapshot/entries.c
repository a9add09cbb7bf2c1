/* snapshot/entries: one entry of an export at a time — metadata, extended
 * attributes, hard links (through the compact table of links.h), whiteouts,
 * and regular files' contents, sparse files as pax sparse entries (see
 * export_internal.h) — and the export's cancellation check, which each of
 * their loops calls. State: per export. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/snapshot/export_internal.h"

int
export_fail (export_t *x, const char *what)
{
  if (x->failed && x->err->msg != NULL)
    return -1; /* the sink's own error says it best */
  int e = archive_errno (x->a);
  return err_make (x->err, e > 0 ? e : EIO, "%s: %s", what, archive_error_string (x->a));
}

int
export_check (export_t *x)
{
  bool stop = x->abort != NULL && atomic_load (x->abort);
  if (!stop && x->cancelled != NULL && x->checks++ % EXPORT_CANCEL_POLL == 0)
    stop = x->cancelled (x->cancelled_ctx);
  if (!stop)
    return 0;
  x->failed = true;
  if (x->err->msg == NULL)
    err_make (x->err, ECANCELED, "the export was cancelled");
  return -1;
}

int
export_dir_node (export_t *x, uint32_t *out)
{
  /* The deepest frame with a node (the root is node 0), then one node for
   * each frame below it, named by its component of x->path. */
  size_t d = x->depth - 1;
  while (d > 0 && x->stack[d].node == 0)
    d--;
  for (d++; d < x->depth; d++)
    {
      size_t start = x->stack[d - 1].len + (x->stack[d - 1].len > 0 ? 1 : 0);
      if (snap_links_add_dir (&x->links, x->stack[d - 1].node, x->path + start, x->stack[d].len - start,
                              &x->stack[d].node, x->err)
          < 0)
        return -1;
    }
  *out = x->stack[x->depth - 1].node;
  return 0;
}

uint32_t
export_inside_id (uint32_t id, uint32_t base, uint32_t range)
{
  if (range == 0 || id == 0)
    return id;
  if (id >= base && id - base < range)
    return id - base;
  return EXPORT_NOBODY_ID;
}

bool
export_name_escaped (const char *name)
{
  return strncmp (name, OCI_WHITEOUT, sizeof OCI_WHITEOUT - 1) == 0;
}

void
export_set_meta (const export_t *x, struct archive_entry *e, const char *path, const struct stat *st)
{
  archive_entry_set_pathname (e, path);
  archive_entry_set_mode (e, st->st_mode);
  archive_entry_set_uid (e, export_inside_id (st->st_uid, x->id_base, x->id_range));
  archive_entry_set_gid (e, export_inside_id (st->st_gid, x->id_base, x->id_range));
  archive_entry_set_mtime (e, st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
}

/* Copies the extended attributes of `fd`, except overlay's own, whatever
 * their size. Failing to read one fails the export (never a silent drop). */
int
export_add_xattrs (export_t *x, struct archive_entry *e, int fd, const char *path)
{
  ssize_t n = flistxattr (fd, NULL, 0);
  if (n < 0 && (errno == ENOTSUP || errno == ENODATA))
    return 0;
  if (n < 0)
    return err_make_sys (x->err, errno, "list the xattrs of `%s`", path);
  if (n == 0)
    return 0;
  cleanup_free char *names = malloc ((size_t) n);
  if (names == NULL)
    return err_make (x->err, ENOMEM, "export: out of memory");
  n = flistxattr (fd, names, (size_t) n);
  if (n < 0)
    return err_make_sys (x->err, errno, "list the xattrs of `%s`", path);
  for (ssize_t off = 0; off < n; off += (ssize_t) strlen (names + off) + 1)
    {
      const char *name = names + off;
      if (strncmp (name, x->overlay_xattrs, strlen (x->overlay_xattrs)) == 0)
        continue;
      ssize_t vlen = fgetxattr (fd, name, NULL, 0);
      cleanup_free char *value = vlen > 0 ? malloc ((size_t) vlen) : NULL;
      if (vlen > 0 && value == NULL)
        return err_make (x->err, ENOMEM, "export: out of memory");
      if (vlen > 0)
        vlen = fgetxattr (fd, name, value, (size_t) vlen);
      if (vlen < 0 && errno == ENODATA)
        continue; /* removed meanwhile */
      if (vlen < 0)
        return err_make_sys (x->err, errno, "read xattr `%s` of `%s`", name, path);
      archive_entry_xattr_add_entry (e, name, value, (size_t) vlen);
    }
  return 0;
}

int
export_write_entry (export_t *x, struct archive_entry *e, const char *path)
{
  if (archive_write_header (x->a, e) < ARCHIVE_WARN)
    {
      char what[PATH_MAX + 32];
      snprintf (what, sizeof what, "write the header of `%.4000s`", path);
      return export_fail (x, what);
    }
  x->entries++;
  return 0;
}

int
export_write_whiteout (export_t *x, const char *dir, const char *name, const struct stat *st)
{
  char path[PATH_MAX * 3];
  bool escape = export_name_escaped (name);
  snprintf (path, sizeof path, "%s%s" OCI_WHITEOUT "%s%s", dir, dir[0] ? "/" : "", escape ? ESCAPE_PREFIX : "", name);
  struct archive_entry *e = archive_entry_new ();
  struct stat w = *st;
  w.st_mode = S_IFREG | 0644;
  export_set_meta (x, e, path, &w);
  archive_entry_set_size (e, 0);
  int rc = export_write_entry (x, e, path);
  archive_entry_free (e);
  return rc;
}

/* A file's data regions, found with SEEK_DATA/SEEK_HOLE. */
typedef struct extent_s
{
  off_t off, len;
} extent_t;

/* Data regions of one file at most: each costs a few dozen bytes in the
 * archive's sparse map and in memory. A file with more fails the export
 * (only an attack makes one: the disk quota bounds the data). */
#define EXPORT_MAX_EXTENTS 262144

/* Lists the data regions of `fd` (size `size`) into *out. A file without
 * holes gives one region; a filesystem that cannot tell gives one too. */
static int
data_extents (export_t *x, int fd, off_t size, const char *path, extent_t **out, size_t *n)
{
  *out = NULL;
  *n = 0;
  size_t cap = 0;
  off_t pos = 0;
  while (pos < size)
    {
      if (export_check (x) < 0)
        return -1;
      off_t d = lseek (fd, pos, SEEK_DATA);
      if (d < 0 && errno == ENXIO)
        break; /* a hole to the end */
      if (d < 0 && (errno == EINVAL || errno == EOPNOTSUPP))
        d = pos, errno = 0;
      if (d < 0)
        return err_make_sys (x->err, errno, "find the data of `%s`", path);
      off_t h = lseek (fd, d, SEEK_HOLE);
      if (h < 0 || h > size)
        h = size;
      if (*n == EXPORT_MAX_EXTENTS)
        return err_make (x->err, EFBIG, "`%s` has more than %d separate data regions: it cannot be exported", path,
                         EXPORT_MAX_EXTENTS);
      if (*n == cap)
        {
          cap = cap ? cap * 2 : 8;
          extent_t *g = realloc (*out, cap * sizeof *g);
          if (g == NULL)
            return err_make (x->err, ENOMEM, "export: out of memory");
          *out = g;
        }
      (*out)[(*n)++] = (extent_t){d, h - d};
      pos = h;
    }
  return 0;
}

/* Hands `len` bytes of hole between two data regions to the archive (not
 * read: see EXPORT_HOLE_CHUNK), checking for cancellation as it goes. */
static int
write_hole (export_t *x, off_t len)
{
  while (len > 0)
    {
      if (export_check (x) < 0)
        return -1;
      size_t n = (uint64_t) len < EXPORT_HOLE_CHUNK ? (size_t) len : EXPORT_HOLE_CHUNK;
      la_ssize_t w = archive_write_data (x->a, x->holes, n);
      if (w < 0)
        return export_fail (x, "write file data");
      if (w == 0)
        return err_make (x->err, EIO, "write file data: the archive took none of a hole");
      len -= (off_t) w;
    }
  return 0;
}

/* Copies `len` bytes of `fd` from `off` into the archive. */
static int
write_data (export_t *x, int fd, off_t off, off_t len, const char *path)
{
  while (len > 0)
    {
      if (export_check (x) < 0)
        return -1;
      size_t want = len < 1 << 20 ? (size_t) len : 1 << 20;
      ssize_t r = TEMP_FAILURE_RETRY (pread (fd, x->io, want, off));
      if (r < 0)
        return err_make_sys (x->err, errno, "read `%s`", path);
      if (r == 0)
        {
          /* Shrunk meanwhile: pad, so the archive stays well formed. */
          memset (x->io, 0, want);
          r = (ssize_t) want;
        }
      if (archive_write_data (x->a, x->io, (size_t) r) < 0)
        return export_fail (x, "write file data");
      off += r;
      len -= r;
    }
  return 0;
}

/* Writes the contents of a regular file: sparse files as pax sparse
 * entries, so the archive holds only the data the file holds. */
static int
write_contents (export_t *x, struct archive_entry *e, int fd, off_t size, const char *path)
{
  cleanup_free extent_t *ext = NULL;
  size_t n = 0;
  if (data_extents (x, fd, size, path, &ext, &n) < 0)
    return -1;
  bool sparse = !(n == 1 && ext[0].off == 0 && ext[0].len == size) && size > 0;
  for (size_t i = 0; sparse && i < n; i++)
    archive_entry_sparse_add_entry (e, ext[i].off, ext[i].len);
  /* All hole: an empty region at 0 makes it a sparse entry whose map holds
   * no data (a region at the end would make the writer wait for the whole
   * hole's bytes). */
  if (sparse && n == 0)
    archive_entry_sparse_add_entry (e, 0, 0);
  if (export_add_xattrs (x, e, fd, path) < 0 || export_write_entry (x, e, path) < 0)
    return -1;
  if (!sparse)
    return write_data (x, fd, 0, size, path);
  /* The writer puts the sparse map out with the first data it is given:
   * nothing, for a file without any. */
  if (archive_write_data (x->a, x->holes, 0) < 0)
    return export_fail (x, "write file data");
  off_t pos = 0;
  for (size_t i = 0; i < n; i++)
    {
      if (write_hole (x, ext[i].off - pos) < 0 || write_data (x, fd, ext[i].off, ext[i].len, path) < 0)
        return -1;
      pos = ext[i].off + ext[i].len;
    }
  /* The hole after the last region is the map's to say (its real size):
   * the writer expects no bytes for it. */
  return 0;
}

int
export_write_file (export_t *x, int dirfd, const char *name, const char *path, const struct stat *st)
{
  struct archive_entry *e = archive_entry_new ();
  export_set_meta (x, e, path, st);
  int rc = 0;
  if (st->st_nlink > 1)
    {
      const link_rec_t *first = snap_links_find (&x->links, st->st_dev, st->st_ino);
      if (first != NULL)
        {
          snap_links_path (&x->links, first, x->link_path, PATH_MAX + 1);
          archive_entry_set_hardlink (e, x->link_path);
          archive_entry_set_size (e, 0);
          rc = export_write_entry (x, e, path);
          archive_entry_free (e);
          return rc;
        }
    }
  cleanup_close int fd = openat (dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno != ENOENT && errno != ELOOP)
    {
      archive_entry_free (e);
      return err_make_sys (x->err, errno, "open `%s`", path);
    }
  struct stat now;
  if (fd < 0 || fstat (fd, &now) < 0 || now.st_ino != st->st_ino || !S_ISREG (now.st_mode))
    {
      /* Changed under us (it cannot while frozen): skip, never follow. */
      log_fields (SEV_WARNING, json_pack ("{s:s}", "path", path), "snapshot: a file changed during export");
      archive_entry_free (e);
      return 0;
    }
  uint32_t dir = 0;
  if (st->st_nlink > 1
      && (export_dir_node (x, &dir) < 0
          || snap_links_add (&x->links, st->st_dev, st->st_ino, dir,
                             strrchr (path, '/') != NULL ? strrchr (path, '/') + 1 : path, x->err)
                 < 0))
    {
      archive_entry_free (e);
      return -1;
    }
  archive_entry_set_size (e, now.st_size);
  rc = write_contents (x, e, fd, now.st_size, path);
  archive_entry_free (e);
  return rc;
}
