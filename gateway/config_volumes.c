/* config_volumes: SANDBOX_VOLUME_MOUNTS into the gateway's checked volume
 * specs — each entry's options and owner, its host path (~ expanded,
 * normalized; a missing one skipped with a warning), and the refusal of
 * volumes that nest or hold the gateway's image (a checked spec's host
 * path read back with runtime's sbx_volume_host). What a volume does in a
 * sandbox is the helper's (helper/volumes.c). No state; start-up only. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/config.h"
#include "gateway/config_internal.h"

/* The options after a volume's sandbox path: `ro` or `rw`, then
 * `uid=N` and `gid=N` (the host owner that sandbox root's writes land as;
 * gid defaults to uid). Into *ro, *uid and *gid (-1: none). */
static int
parse_volume_options (char *opts, bool *ro, long *uid, long *gid, err_t *err)
{
  *ro = false;
  *uid = *gid = -1;
  char *save = NULL;
  for (char *o = opts != NULL ? strtok_r (opts, ":", &save) : NULL; o != NULL; o = strtok_r (NULL, ":", &save))
    {
      long *id = strncmp (o, "uid=", 4) == 0 ? uid : strncmp (o, "gid=", 4) == 0 ? gid : NULL;
      if (id == NULL && (strcmp (o, "ro") == 0 || strcmp (o, "rw") == 0))
        {
          *ro = strcmp (o, "ro") == 0;
          continue;
        }
      char *end = NULL;
      errno = 0;
      long v = id != NULL ? strtol (o + 4, &end, 10) : -1;
      if (id == NULL || end == o + 4 || *end != '\0' || errno != 0)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: option `%s` is not ro, rw, uid=N or gid=N", o);
      /* Host root would give sandbox root host root's powers over the files. */
      if (v <= 0 || v >= 4294967295L)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: the owner must be a host id above 0", o);
      *id = v;
    }
  if (*gid >= 0 && *uid < 0)
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: gid= needs uid=");
  if (*uid >= 0 && *gid < 0)
    *gid = *uid;
  return 0;
}

/* The host path of a volume, ~ expanded, into *out (caller frees). */
static int
expand_home (const char *host, char **out, err_t *err)
{
  if (host[0] == '~' && host[1] != '\0' && host[1] != '/')
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: only ~ and ~/ are expanded", host);
  const char *home = getenv ("HOME");
  int n
      = host[0] == '~' ? asprintf (out, "%s%s", home != NULL ? home : "/root", host + 1) : asprintf (out, "%s", host);
  return n < 0 ? err_make (err, ENOMEM, "out of memory") : 0;
}

/* `path` as written, absolute, without `.` or `..` components, repeated
 * or trailing slashes: into *out (caller frees). Nesting is checked on
 * this form too, so that a path a sandbox can later turn into a symlink
 * (inside another volume, missing today) is refused whatever it resolves
 * to. */
static int
normalize_host_path (const char *path, char **out, err_t *err)
{
  if (path[0] != '/')
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not an absolute host path", path);
  char *norm = malloc (strlen (path) + 2);
  if (norm == NULL)
    return err_make (err, ENOMEM, "out of memory");
  size_t n = 0;
  for (const char *p = path; *p != '\0';)
    {
      while (*p == '/')
        p++;
      size_t len = strcspn (p, "/");
      if (len == 0)
        break;
      if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
        {
          free (norm);
          return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: no . or .. in a host path", path);
        }
      norm[n++] = '/';
      memcpy (norm + n, p, len);
      n += len;
      p += len;
    }
  if (n == 0)
    norm[n++] = '/';
  norm[n] = '\0';
  *out = norm;
  return 0;
}

/* One SANDBOX_VOLUME_MOUNTS entry into its checked form
 * "realhost:sandbox[:ro][:uid=N:gid=M]" (*spec NULL: its host path is
 * missing, skipped with a warning). The host path is resolved once, here:
 * the runtime opens exactly that path, with no symlink in it. */
static int
parse_volume (char *tok, char **spec, char **lexical, err_t *err)
{
  *spec = NULL;
  *lexical = NULL;
  char *host = tok, *dst = strchr (tok, ':');
  if (dst == NULL)
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not host:sandbox[:ro][:uid=N[:gid=N]]", tok);
  *dst++ = '\0';
  char *opts = strchr (dst, ':');
  if (opts != NULL)
    {
      *opts++ = '\0';
      if (*opts == '\0' || opts[strlen (opts) - 1] == ':' || strstr (opts, "::") != NULL)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: an empty option", dst);
    }
  bool ro;
  long uid, gid;
  if (parse_volume_options (opts, &ro, &uid, &gid, err) < 0)
    return -1;
  if (dst[0] != '/' || strstr (dst, "..") != NULL || strcmp (dst, "/") == 0)
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not an absolute sandbox path", dst);
  cleanup_free char *expanded = NULL;
  if (expand_home (host, &expanded, err) < 0)
    return -1;
  if (normalize_host_path (expanded, lexical, err) < 0)
    return -1;
  cleanup_free char *real = realpath (expanded, NULL);
  if (real == NULL)
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "host_path", expanded),
                  "SANDBOX_VOLUME_MOUNTS: host path missing, skipped");
      return 0;
    }
  char owner[64] = "";
  if (uid >= 0)
    snprintf (owner, sizeof owner, ":uid=%ld:gid=%ld", uid, gid);
  if (asprintf (spec, "%s:%s%s%s", real, dst, ro ? ":ro" : "", owner) < 0)
    return err_make (err, ENOMEM, "out of memory");
  return 0;
}

/* Whether `path` is `dir` or lies below it. */
static bool
path_within (const char *path, const char *dir)
{
  size_t n = strlen (dir);
  if (n == 1 && dir[0] == '/')
    return true;
  return strncmp (path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The owner id a checked volume spec names (`:uid=` or `:gid=`), or -1. */
static long
volume_owner (const char *spec, const char *key)
{
  const char *u = strstr (spec, key);
  return u != NULL ? strtol (u + strlen (key), NULL, 10) : -1;
}

/* Whether host paths `a` and `b` of two volumes nest: one lies strictly
 * inside the other. */
static bool
paths_nest (const char *a, const char *b)
{
  return strcmp (a, b) != 0 && (path_within (a, b) || path_within (b, a));
}

/* Refuses volumes whose host paths nest (a sandbox could replace the inner
 * one's path with a symlink through the outer, for every later launch),
 * compared as written (`lexical`, n of them, missing ones included: a
 * missing inner path is where a sandbox would plant the link) and as
 * resolved; a volume that holds, or lies in, a path hidden from sandboxes
 * (it would show it) or holds the image; and an owner inside the
 * sandboxes' id block. Equal host paths bound twice are fine. */
static int
check_volume_overlaps (const gw_config_t *c, char *const *lexical, size_t n, err_t *err)
{
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (paths_nest (lexical[i], lexical[j]))
        return err_make (err, EINVAL,
                         "SANDBOX_VOLUME_MOUNTS: `%s` and `%s` nest; nested volumes are refused, also when one is "
                         "missing (mount the outer one only, or two separate directories)",
                         lexical[i], lexical[j]);
  char a[PATH_MAX + 1], b[PATH_MAX + 1];
  for (size_t i = 0; c->volumes[i] != NULL; i++)
    {
      sbx_volume_host (c->volumes[i], a, sizeof a);
      long block_end = c->uid_base + c->uid_slots * c->uid_range;
      for (int k = 0; k < 2; k++)
        {
          long owner = volume_owner (c->volumes[i], k == 0 ? ":uid=" : ":gid=");
          if (c->userns && owner >= c->uid_base && owner < block_end)
            return err_make (err, EINVAL,
                             "SANDBOX_VOLUME_MOUNTS: the owner %s%ld of `%s` lies in the sandboxes' id block "
                             "(SANDBOX_UID_BASE %ld .. %ld)",
                             k == 0 ? "uid=" : "gid=", owner, a, c->uid_base, block_end - 1);
        }
      for (size_t j = 0; c->volumes[j] != NULL; j++)
        if (paths_nest (sbx_volume_host (c->volumes[j], b, sizeof b), a))
          return err_make (err, EINVAL,
                           "SANDBOX_VOLUME_MOUNTS: `%s` and `%s` nest once resolved; nested volumes are refused", a,
                           b);
      for (size_t j = 0; j < n; j++)
        if (paths_nest (lexical[j], a))
          return err_make (err, EINVAL,
                           "SANDBOX_VOLUME_MOUNTS: `%s` and `%s` (resolved) nest; nested volumes are refused",
                           lexical[j], a);
      for (size_t m = 0; m < GW_MAX_MASKS && c->masks[m] != NULL; m++)
        {
          cleanup_free char *real = realpath (c->masks[m], NULL);
          const char *hidden = real != NULL ? real : c->masks[m];
          if (path_within (hidden, a) || path_within (a, hidden))
            return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: the volume `%s` overlaps %s `%s`", a,
                             c->mask_names[m], hidden);
        }
      cleanup_free char *image = realpath (c->rootfs, NULL);
      if (image != NULL && path_within (image, a))
        return err_make (err, EINVAL,
                         "SANDBOX_VOLUME_MOUNTS: the volume `%s` holds SANDBOX_ROOTFS `%s` (sandboxes would write "
                         "every sandbox's image)",
                         a, image);
    }
  return 0;
}

/* Parses SANDBOX_VOLUME_MOUNTS into `volumes`, expanding ~ and skipping
 * (with a warning) host paths that do not exist. */
int
gw_config_parse_volumes (gw_config_t *c, err_t *err)
{
  if (c->volume_mounts == NULL)
    return 0;
  size_t n = 0, n_lex = 0;
  char *lexical[GW_MAX_VOLUME_ENTRIES] = {NULL}; /* GCC cannot see n_lex bound the reads */
  int rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r (c->volume_mounts, ",", &save); tok != NULL && rc == 0; tok = strtok_r (NULL, ",", &save))
    {
      char *spec = NULL, *lex = NULL;
      if (n_lex == GW_MAX_VOLUME_ENTRIES)
        rc = err_make (err, E2BIG, "SANDBOX_VOLUME_MOUNTS: more than %d entries", GW_MAX_VOLUME_ENTRIES);
      else
        {
          rc = parse_volume (tok, &spec, &lex, err);
          if (lex != NULL)
            lexical[n_lex++] = lex;
        }
      if (rc < 0 || spec == NULL)
        continue;
      if (n == GW_MAX_VOLUMES)
        {
          free (spec);
          rc = err_make (err, E2BIG, "SANDBOX_VOLUME_MOUNTS: more than %d mounts", GW_MAX_VOLUMES);
          continue;
        }
      c->volumes[n++] = spec;
    }
  c->volumes[n] = NULL;
  if (rc == 0)
    rc = check_volume_overlaps (c, lexical, n_lex, err);
  for (size_t i = 0; i < n_lex; i++)
    free (lexical[i]);
  return rc;
}
