/* snapshot/unpack: extracts a snapshot tar into the current directory (see
 * unpack.h). libarchive's secure flags on top of its own checks:
 * relative paths without "..", no writing through symlinks, hard links
 * only to files already unpacked, no device nodes, fifos or sockets, at
 * most max_entries entries, overlay's own xattrs dropped. OCI whiteouts
 * become overlay whiteouts. Failures are EINVAL for a bad or hostile tar,
 * ENOSPC when the disk quota is exceeded.
 */
#include "gateway/snapshot/unpack.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

/* Makes `path` and its missing parents (a relative path), refusing to go
 * through a symlink or anything but a directory: without the chroot a
 * symlink in the tar could otherwise point the new directories (and a
 * whiteout's device node or opaque mark) outside the extraction directory,
 * and even in it the entry would land somewhere else than it says. */
static int
mkdir_p (const char *path, mode_t mode, err_t *err)
{
  char buf[PATH_MAX];
  if (snprintf (buf, sizeof buf, "%s", path) >= (int) sizeof buf)
    return err_make (err, EINVAL, "path too long in the snapshot: `%.200s`", path);
  size_t n = strlen (buf);
  while (n > 1 && buf[n - 1] == '/')
    buf[--n] = '\0';
  for (char *p = buf + 1;; p++)
    {
      char c = *p;
      if (c != '/' && c != '\0')
        continue;
      if (p[-1] != '/') /* not an empty component ("a//b") */
        {
          *p = '\0';
          struct stat st;
          if (mkdir (buf, mode) < 0)
            {
              if (errno != EEXIST)
                return err_make_sys (err, errno, "mkdir `%s`", buf);
              if (lstat (buf, &st) < 0)
                return err_make_sys (err, errno, "lstat `%s`", buf);
              if (S_ISLNK (st.st_mode))
                return err_make (err, EINVAL,
                                 "unsafe path in the snapshot: `%.200s` goes through the symlink `%.200s`", path,
                                 buf);
              if (!S_ISDIR (st.st_mode))
                return err_make (err, EINVAL, "bad snapshot at `%.200s`: `%.200s` is not a directory", path, buf);
            }
          *p = c;
        }
      if (c == '\0')
        break;
    }
  return 0;
}

/* A tar path is acceptable when relative, without "..", and not empty. */
static bool
safe_path (const char *p)
{
  if (p == NULL || p[0] == '\0' || p[0] == '/')
    return false;
  for (const char *c = p; *c;)
    {
      const char *end = strchr (c, '/');
      size_t len = end != NULL ? (size_t) (end - c) : strlen (c);
      if (len == 2 && c[0] == '.' && c[1] == '.')
        return false;
      c += len;
      while (*c == '/')
        c++;
    }
  return true;
}

static int
ensure_parent (const char *path, err_t *err)
{
  char parent[PATH_MAX];
  snprintf (parent, sizeof parent, "%s", path);
  char *slash = strrchr (parent, '/');
  if (slash == NULL)
    return 0;
  *slash = '\0';
  return mkdir_p (parent, 0755, err);
}

/* OCI whiteouts become overlay whiteouts: ".wh..wh..opq" marks its
 * directory opaque, ".wh.NAME" becomes a 0:0 character device NAME. */
/* Names a sandbox gave to its own files that begin with the whiteout
 * prefix travel escaped (see export.c): ".wh.x" is stored as
 * ".wh..wh.u.wh.x". Real whiteouts and the opaque marker are never
 * escaped, so every name round-trips. */
#define ESCAPE_PREFIX ".wh..wh.u"
#define ESCAPE_LEN (sizeof ESCAPE_PREFIX - 1)

int
snap_unpack_unescape_path (const char *in, char *out, size_t cap)
{
  size_t o = 0;
  for (const char *c = in; *c != '\0';)
    {
      const char *end = strchr (c, '/');
      size_t len = end != NULL ? (size_t) (end - c) : strlen (c);
      if (len >= ESCAPE_LEN + 4 && strncmp (c, ESCAPE_PREFIX ".wh.", ESCAPE_LEN + 4) == 0)
        {
          c += ESCAPE_LEN;
          len -= ESCAPE_LEN;
        }
      if (o + len + 2 > cap)
        return -1;
      memcpy (out + o, c, len);
      o += len;
      c += len;
      if (*c == '/')
        {
          out[o++] = '/';
          while (*c == '/')
            c++;
        }
    }
  out[o] = '\0';
  return 0;
}

static int
apply_whiteout (const char *path, const char *opaque_xattr, err_t *err)
{
  const char *base = strrchr (path, '/');
  base = base != NULL ? base + 1 : path;
  char dir[PATH_MAX];
  snprintf (dir, sizeof dir, "%.*s", (int) (base - path), path);
  if (dir[0] == '\0')
    snprintf (dir, sizeof dir, ".");
  if (mkdir_p (dir, 0755, err) < 0)
    return -1;
  if (strcmp (base, ".wh..wh..opq") == 0)
    {
      if (setxattr (dir, opaque_xattr, "y", 1, 0) < 0)
        return err_make_sys (err, errno, "mark `%s` opaque", dir);
      return 0;
    }
  const char *name = base + 4;
  if (strncmp (name, ESCAPE_PREFIX ".wh.", ESCAPE_LEN + 4) == 0)
    name += ESCAPE_LEN; /* the whiteout of a name that began with the prefix */
  if (name[0] == '\0' || strcmp (name, ".") == 0 || strcmp (name, "..") == 0)
    return err_make (err, EINVAL, "bad whiteout `%s`", path);
  char target[PATH_MAX * 2];
  snprintf (target, sizeof target, "%s/%s", dir, name);
  struct stat st;
  if (lstat (target, &st) == 0)
    return err_make (err, EINVAL, "whiteout `%s` for a path the snapshot also contains", path);
  if (mknod (target, S_IFCHR | 0000, makedev (0, 0)) < 0)
    return err_make_sys (err, errno, "whiteout `%s`", target);
  return 0;
}

/* Copies the entry's extended attributes, dropping overlay's own in both
 * namespaces it may use (a snapshot must not steer the overlay: redirects,
 * origins, metacopy, opaque marks other than the OCI one). */
static void
filter_xattrs (struct archive_entry *e)
{
  const char *name;
  const void *value;
  size_t size;
  size_t n = archive_entry_xattr_reset (e);
  if (n == 0)
    return;
  struct kept
  {
    char *name;
    void *value;
    size_t size;
  } *keep = calloc (n, sizeof *keep);
  size_t k = 0;
  while (keep != NULL && archive_entry_xattr_next (e, &name, &value, &size) == ARCHIVE_OK)
    if (strncmp (name, "trusted.overlay.", 16) != 0 && strncmp (name, "user.overlay.", 13) != 0 && k < n)
      {
        keep[k].name = strdup (name);
        keep[k].value = malloc (size ? size : 1);
        if (keep[k].value != NULL)
          memcpy (keep[k].value, value, size);
        keep[k].size = size;
        k++;
      }
  archive_entry_xattr_clear (e);
  for (size_t i = 0; i < k; i++)
    {
      if (keep[i].name != NULL && keep[i].value != NULL)
        archive_entry_xattr_add_entry (e, keep[i].name, keep[i].value, keep[i].size);
      free (keep[i].name);
      free (keep[i].value);
    }
  free (keep);
}

static int
extract_fail (struct archive *a, const char *path, err_t *err)
{
  int e = archive_errno (a);
  if (e == ENOSPC || e == EDQUOT)
    return err_make (err, ENOSPC, "the snapshot does not fit in the sandbox's disk quota (at `%.200s`)",
                     path != NULL ? path : "?");
  return err_make (err, EINVAL, "bad snapshot at `%.200s`: %s", path != NULL ? path : "?",
                   archive_error_string (a) != NULL ? archive_error_string (a) : "unreadable");
}

/* Directories whose times are set last: their entries change them. */
typedef struct dir_time_s
{
  char *path;
  struct timespec mtime;
} dir_time_t;

/* One extraction in progress. */
/* The tar's source: a descriptor read 1 MiB at a time (as large as the
 * restore pipe: fewer reads, and file writes large enough for the disk's
 * large folios), with its first bytes kept to name a refused compression. */
#define UNPACK_READ_SIZE (1024 * 1024)

typedef struct unpack_src_s
{
  int fd;
  uint8_t *buf;
  uint8_t head[8]; /* the stream's first bytes */
  size_t n_head;
} unpack_src_t;

static la_ssize_t
src_read (struct archive *a, void *cls, const void **out)
{
  unpack_src_t *s = cls;
  ssize_t n;
  do
    n = read (s->fd, s->buf, UNPACK_READ_SIZE);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    {
      archive_set_error (a, errno, "read the snapshot");
      return ARCHIVE_FATAL;
    }
  for (ssize_t i = 0; i < n && s->n_head < sizeof s->head; i++)
    s->head[s->n_head++] = s->buf[i];
  *out = s->buf;
  return n;
}

/* The name of a compression snapshots do not use, from a stream's first
 * bytes; NULL when they are none of those. Only named, never decoded:
 * every decoder is attack surface a hostile tar could reach. */
static const char *
refused_compression (const uint8_t *head, size_t n)
{
  static const struct
  {
    const char *name;
    uint8_t magic[6];
    size_t len;
  } known[] = {
      {"xz", {0xfd, '7', 'z', 'X', 'Z', 0x00}, 6},
      {"bzip2", {'B', 'Z', 'h'}, 3},
      {"lzip", {'L', 'Z', 'I', 'P'}, 4},
      {"lz4", {0x04, 0x22, 0x4d, 0x18}, 4},
      {"lzma", {0x5d, 0x00, 0x00}, 3},
      {"compress (.Z)", {0x1f, 0x9d}, 2},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (n >= known[i].len && memcmp (head, known[i].magic, known[i].len) == 0)
      return known[i].name;
  return NULL;
}

/* Why the stream could not be opened: a refused compression by name, else
 * libarchive's reason. */
static int
open_fail (struct archive *a, const unpack_src_t *src, err_t *err)
{
  const char *name = refused_compression (src->head, src->n_head);
  if (name != NULL)
    return err_make (err, EINVAL,
                     "the snapshot is %s-compressed: restore reads a tar that is uncompressed, gzip- or "
                     "zstd-compressed",
                     name);
  return extract_fail (a, "(start)", err);
}

typedef struct unpack_s
{
  struct archive *a; /* the tar being read */
  struct archive *w; /* the disk being written */
  dir_time_t *dirs;
  size_t n_dirs, cap_dirs;
  /* dirs by path: open addressing, slot = index + 1, 0 empty; a power of
   * two at least twice n_dirs. */
  size_t *index;
  size_t index_cap;
  const char *opaque_xattr;   /* overlay's opaque mark for this layer */
  long long bytes, max_bytes; /* file data written; its cap (0: none) */
} unpack_t;

static size_t
path_hash (const char *p)
{
  size_t h = 14695981039346656037u; /* FNV-1a */
  for (; *p != '\0'; p++)
    h = (h ^ (unsigned char) *p) * 1099511628211u;
  return h;
}

/* The slot of `path` in the index: its record, or the empty slot to fill. */
static size_t *
index_slot (unpack_t *u, const char *path)
{
  size_t mask = u->index_cap - 1;
  for (size_t k = path_hash (path) & mask;; k = (k + 1) & mask)
    if (u->index[k] == 0 || strcmp (u->dirs[u->index[k] - 1].path, path) == 0)
      return &u->index[k];
}

/* Doubles the index (and rehashes). false when out of memory. */
static bool
index_grow (unpack_t *u)
{
  size_t cap = u->index_cap ? u->index_cap * 2 : 128;
  size_t *old = u->index, old_cap = u->index_cap;
  u->index = calloc (cap, sizeof *u->index);
  if (u->index == NULL)
    {
      u->index = old;
      return false;
    }
  u->index_cap = cap;
  for (size_t k = 0; k < old_cap; k++)
    if (old[k] != 0)
      *index_slot (u, u->dirs[old[k] - 1].path) = old[k];
  free (old);
  return true;
}

/* Records a directory's time, once per directory however often the tar
 * repeats it (the last time wins): memory follows the directories, never
 * the entries. Best effort: out of memory, the time is left as extracted. */
static void
remember_dir_time (unpack_t *u, const char *path, struct archive_entry *e)
{
  if (!archive_entry_mtime_is_set (e))
    return;
  struct timespec t = {archive_entry_mtime (e), archive_entry_mtime_nsec (e)};
  if ((u->n_dirs + 1) * 2 > u->index_cap && !index_grow (u))
    return;
  size_t *slot = index_slot (u, path);
  if (*slot != 0)
    {
      u->dirs[*slot - 1].mtime = t;
      return;
    }
  if (u->n_dirs == u->cap_dirs)
    {
      size_t c = u->cap_dirs ? u->cap_dirs * 2 : 64;
      dir_time_t *g = realloc (u->dirs, c * sizeof *g);
      if (g == NULL)
        return;
      u->dirs = g;
      u->cap_dirs = c;
    }
  char *p = strdup (path);
  if (p == NULL)
    return;
  u->dirs[u->n_dirs++] = (dir_time_t){p, t};
  *slot = u->n_dirs;
}

/* Checks an entry's path, hard link and type, normalising "./" prefixes.
 * 1 skip it (the root itself), 0 extract it, -1 refuse the tar. */
static int
check_entry (struct archive_entry *e, const char **path_out, const char **link_out, bool *literal, err_t *err)
{
  const char *path = archive_entry_pathname (e);
  while (path != NULL && path[0] == '.' && path[1] == '/')
    path += 2;
  if (path != NULL && (strcmp (path, ".") == 0 || path[0] == '\0'))
    return 1; /* the root itself ("./" of `tar -C dir -cf - .`) */
  if (!safe_path (path))
    return err_make (err, EINVAL, "unsafe path in the snapshot: `%.200s` (absolute or with ..)", path ? path : "");
  /* Escaped names become the sandbox's names again; a last component that
   * is a whiteout keeps its prefix (unpack_entry reads it). */
  const char *last = strrchr (path, '/');
  last = last != NULL ? last + 1 : path;
  *literal = strncmp (last, ESCAPE_PREFIX ".wh.", ESCAPE_LEN + 4) == 0;
  char plain[PATH_MAX];
  if (snap_unpack_unescape_path (path, plain, sizeof plain) < 0)
    return err_make (err, ENAMETOOLONG, "path too long in the snapshot: `%.200s`", path);
  archive_entry_set_pathname (e, plain);
  const char *link = archive_entry_hardlink (e);
  char plain_link[PATH_MAX];
  if (link != NULL)
    {
      while (link[0] == '.' && link[1] == '/')
        link += 2;
      if (snap_unpack_unescape_path (link, plain_link, sizeof plain_link) < 0)
        return err_make (err, ENAMETOOLONG, "link too long in the snapshot: `%.200s`", link);
      link = plain_link;
      struct stat lst;
      if (!safe_path (link) || lstat (link, &lst) < 0 || !S_ISREG (lst.st_mode))
        return err_make (err, EINVAL, "hard link `%.200s` points outside the snapshot's files: `%.200s`", path, link);
      archive_entry_set_hardlink (e, link);
    }
  mode_t type = archive_entry_filetype (e);
  if (link == NULL && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
    return err_make (err, EINVAL, "device nodes, fifos and sockets are not allowed in a snapshot: `%.200s`", plain);
  *path_out = archive_entry_pathname (e);
  *link_out = link != NULL ? archive_entry_hardlink (e) : NULL;
  return 0;
}

/* Copies the entry's data blocks to the disk. */
static int
copy_data (unpack_t *u, const char *path, err_t *err)
{
  const void *buf;
  size_t size;
  la_int64_t off;
  int r;
  while ((r = archive_read_data_block (u->a, &buf, &size, &off)) == ARCHIVE_OK)
    {
      u->bytes += (long long) size;
      if (u->max_bytes > 0 && u->bytes > u->max_bytes)
        return err_make (err, EFBIG, "the layer unpacks to more than %lld MiB (SANDBOX_IMAGE_LAYER_MAX_MB)",
                         u->max_bytes >> 20);
      if (archive_write_data_block (u->w, buf, size, off) != ARCHIVE_OK)
        return extract_fail (u->w, path, err);
    }
  return r == ARCHIVE_EOF ? 0 : extract_fail (u->a, path, err);
}

/* Writes one checked entry (not a whiteout) to the disk. */
static int
write_entry (unpack_t *u, struct archive_entry *e, const char *path, const char *link, err_t *err)
{
  if (ensure_parent (path, err) < 0)
    return -1;
  struct stat wst;
  if (lstat (path, &wst) == 0 && S_ISCHR (wst.st_mode) && wst.st_rdev == makedev (0, 0))
    return err_make (err, EINVAL, "`%.200s` is in the snapshot and also has a whiteout", path);
  filter_xattrs (e);
  if (archive_entry_filetype (e) == AE_IFDIR && link == NULL)
    remember_dir_time (u, path, e);
  if (archive_write_header (u->w, e) < ARCHIVE_WARN)
    return extract_fail (u->w, path, err);
  if (archive_entry_size (e) > 0 && link == NULL && copy_data (u, path, err) < 0)
    return -1;
  int fin = archive_write_finish_entry (u->w);
  if (fin < ARCHIVE_WARN
      || (fin == ARCHIVE_WARN && (archive_errno (u->w) == ENOSPC || archive_errno (u->w) == EDQUOT)))
    return extract_fail (u->w, path, err);
  return 0;
}

/* Extracts one entry: a whiteout becomes an overlay whiteout, anything
 * else is written. */
static int
unpack_entry (unpack_t *u, struct archive_entry *e, err_t *err)
{
  const char *path = NULL, *link = NULL;
  bool literal = false;
  int c = check_entry (e, &path, &link, &literal, err);
  if (c != 0)
    return c > 0 ? 0 : -1;
  /* A user name that began with the prefix was unescaped by check_entry:
   * what still begins with it is a whiteout or the opaque marker. */
  const char *base = strrchr (path, '/');
  base = base != NULL ? base + 1 : path;
  if (strncmp (base, ".wh.", 4) != 0 || literal)
    return write_entry (u, e, path, link, err);
  if (archive_entry_filetype (e) != AE_IFREG || link != NULL)
    return err_make (err, EINVAL, "whiteout `%.200s` is not a plain file", path);
  return apply_whiteout (path, u->opaque_xattr, err);
}

/* Reads every entry of the tar. */
static int
unpack_all (unpack_t *u, long max_entries, err_t *err)
{
  long entries = 0;
  for (;;)
    {
      struct archive_entry *e = NULL;
      int r = archive_read_next_header (u->a, &e);
      if (r == ARCHIVE_EOF)
        return 0;
      if (r < ARCHIVE_WARN)
        return extract_fail (u->a, "(next entry)", err);
      if (++entries > max_entries)
        return err_make (err, EINVAL, "the snapshot has more than %ld entries (SANDBOX_SNAPSHOT_MAX_ENTRIES)",
                         max_entries);
      if (unpack_entry (u, e, err) < 0)
        return -1;
    }
}

int
snap_unpack (int fd, long max_entries, long long max_bytes, bool userxattr, err_t *err)
{
  unpack_t u = {.max_bytes = max_bytes,
                .a = archive_read_new (),
                .w = archive_write_disk_new (),
                .opaque_xattr = userxattr ? "user.overlay.opaque" : "trusted.overlay.opaque"};
  /* Only the compressions snapshots use: every other decoder is attack
   * surface a hostile tar could reach. */
  archive_read_support_filter_gzip (u.a);
  archive_read_support_filter_zstd (u.a);
  archive_read_support_format_tar (u.a);
  archive_write_disk_set_options (u.w, ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_TIME
                                           | ARCHIVE_EXTRACT_XATTR | ARCHIVE_EXTRACT_SECURE_SYMLINKS
                                           | ARCHIVE_EXTRACT_SECURE_NODOTDOT
                                           | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
  int rc = -1;
  unpack_src_t src = {.fd = fd, .buf = malloc (UNPACK_READ_SIZE)};
  if (src.buf == NULL)
    err_make (err, ENOMEM, "out of memory");
  else if (archive_read_open (u.a, &src, NULL, src_read, NULL) != ARCHIVE_OK)
    open_fail (u.a, &src, err);
  else if (unpack_all (&u, max_entries, err) == 0)
    {
      if (archive_write_close (u.w) < ARCHIVE_WARN)
        extract_fail (u.w, "(end)", err);
      else
        rc = 0;
    }
  /* Last, the directories' mtimes, deepest (latest) first, never through a
   * symlink. */
  for (size_t i = u.n_dirs; rc == 0 && i-- > 0;)
    {
      struct timespec ts[2] = {{0, UTIME_OMIT}, u.dirs[i].mtime};
      utimensat (AT_FDCWD, u.dirs[i].path, ts, AT_SYMLINK_NOFOLLOW);
    }
  for (size_t i = 0; i < u.n_dirs; i++)
    free (u.dirs[i].path);
  free (u.dirs);
  free (u.index);
  archive_read_free (u.a);
  archive_write_free (u.w);
  free (src.buf);
  return rc;
}
