/* runtime/cgroup_files: the file operations and path builders the cgroup
 * module is made of (cgroup_internal.h, cgroup.h's sbx_cg_path). No
 * state. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/cgroup_internal.h"
#include "gateway/runtime/path.h"

int
sbx_cg_write_file (const char *path, const char *value, err_t *err)
{
  cleanup_close int fd = open (path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  size_t len = strlen (value);
  if (TEMP_FAILURE_RETRY (write (fd, value, len)) != (ssize_t) len)
    return err_make_sys (err, errno, "write `%s` to `%s`", value, path);
  return 0;
}

ssize_t
sbx_cg_read_file (const char *path, char *buf, size_t cap)
{
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = TEMP_FAILURE_RETRY (read (fd, buf, cap - 1));
  if (n < 0)
    return -1;
  buf[n] = '\0';
  return n;
}

long
sbx_cg_parse_keyed (const char *buf, const char *key)
{
  size_t klen = strlen (key);
  for (const char *line = buf; line != NULL && *line != '\0';)
    {
      if (strncmp (line, key, klen) == 0 && line[klen] == ' ')
        return strtol (line + klen + 1, NULL, 10);
      line = strchr (line, '\n');
      if (line != NULL)
        line++;
    }
  return 0;
}

long
sbx_cg_read_keyed (const char *path, const char *key)
{
  char buf[4096];
  if (sbx_cg_read_file (path, buf, sizeof buf) < 0)
    return 0;
  return sbx_cg_parse_keyed (buf, key);
}

long
sbx_cg_pread_keyed (int fd, const char *key)
{
  char buf[4096];
  ssize_t n = TEMP_FAILURE_RETRY (pread (fd, buf, sizeof buf - 1, 0));
  if (n < 0)
    return 0;
  buf[n] = '\0';
  return sbx_cg_parse_keyed (buf, key);
}

/* Appends `s` at out[at] and returns where the next part goes, or
 * (size_t) -1 when it does not fit (cap counts the NUL). Paths are made on
 * every exec: this is a fraction of snprintf's cost. */
static size_t
put (char *out, size_t cap, size_t at, const char *s)
{
  size_t n = strlen (s);
  if (at == (size_t) -1 || n >= cap - at)
    return (size_t) -1;
  memcpy (out + at, s, n + 1);
  return at + n;
}

int
sbx_cg_path (char *out, size_t cap, const char *root, const char *id, const char *sub, const char *file, err_t *err)
{
  const char *parts[3] = {id, sub, file};
  size_t at = cap > 0 ? put (out, cap, 0, root) : (size_t) -1;
  for (size_t i = 0; i < 3; i++)
    if (parts[i] != NULL)
      at = put (out, cap, put (out, cap, at, "/"), parts[i]);
  if (at != (size_t) -1)
    return (int) at;
  if (cap > 0)
    out[0] = '\0';
  errno = ENAMETOOLONG;
  return err_make (err, ENAMETOOLONG, "cgroup path `%s/%s/%s/%s` is longer than %zu bytes", root,
                   id != NULL ? id : "", sub != NULL ? sub : "", file != NULL ? file : "", cap - 1);
}

int
sbx_cg_spare_path (const sbx_cg_layout_t *l, unsigned n, char *path, size_t cap, err_t *err)
{
  char name[32];
  if (sbx_path_fmt (name, sizeof name, err, SBX_CG_SPARE_PREFIX "%u", n) < 0)
    return -1;
  return sbx_cg_path (path, cap, l->roots[l->memory], name, NULL, NULL, err);
}

int
sbx_cg_mkdir (const char *path, err_t *err)
{
  if (mkdir (path, 0755) < 0 && errno != EEXIST)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  return 0;
}

static int
rmdir_at_depth (const char *dir, int depth)
{
  DIR *d = opendir (dir);
  if (d == NULL)
    return errno == ENOENT ? 0 : -1;
  struct dirent *e;
  char path[SBX_CG_TREE_PATH_MAX];
  int rc = 0;
  while ((e = readdir (d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.')
      {
        if (depth >= SBX_CG_TREE_DEPTH || sbx_path_fmt (path, sizeof path, NULL, "%s/%s", dir, e->d_name) < 0
            || rmdir_at_depth (path, depth + 1) < 0)
          rc = -1;
      }
  closedir (d);
  if (rmdir (dir) < 0 && errno != ENOENT)
    rc = -1;
  return rc;
}

int
sbx_cg_rmdir_tree (const char *dir)
{
  return rmdir_at_depth (dir, 0);
}
