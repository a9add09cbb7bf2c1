/* image/user: what an image's config gives its commands (see image.h):
 * its Env beneath a request's own, and its User as ids. The names of
 * `user[:group]` are looked up in the image's own /etc/passwd and
 * /etc/group: the file of the topmost layer that has one, opened inside
 * that layer (RESOLVE_IN_ROOT: a link in it cannot lead out), at most
 * IMG_PASSWD_MAX bytes read. No state. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/image/image.h"

/* The most of an image's /etc/passwd or /etc/group read. */
#define IMG_PASSWD_MAX (1024 * 1024)

/* A decimal id, or -1. */
static long long
numeric (const char *s)
{
  if (s[0] == '\0' || strlen (s) > 10 || strspn (s, "0123456789") != strlen (s))
    return -1;
  long long v = strtoll (s, NULL, 10);
  return v <= 0xfffffffeLL ? v : -1;
}

/* The contents of `rel` in the topmost layer of `layers` that has it
 * (NULL: none). */
static char *
layer_file (const char *layers, const char *rel)
{
  cleanup_free char *list = strdup (layers);
  char *save = NULL;
  for (char *dir = list != NULL ? strtok_r (list, ":", &save) : NULL; dir != NULL; dir = strtok_r (NULL, ":", &save))
    {
      cleanup_close int root = open (dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
      struct open_how how
          = {.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
      cleanup_close int fd = root >= 0 ? (int) syscall (SYS_openat2, root, rel, &how, sizeof how) : -1;
      if (fd < 0)
        continue;
      char *buf = malloc (IMG_PASSWD_MAX + 1);
      size_t len = 0;
      ssize_t n = 1;
      while (buf != NULL && len < IMG_PASSWD_MAX && (n = read (fd, buf + len, IMG_PASSWD_MAX - len)) > 0)
        len += (size_t) n;
      if (buf != NULL)
        buf[len] = '\0';
      return buf;
    }
  return NULL;
}

/* Field 3 (and 4) of the line of `file` whose first field is `name`. */
static int
look_up (const char *file, const char *name, long long *id, long long *gid)
{
  size_t nl = strlen (name);
  for (const char *line = file; line != NULL && *line != '\0';)
    {
      const char *end = strchr (line, '\n');
      if (strncmp (line, name, nl) == 0 && line[nl] == ':')
        {
          /* name:password:id[:gid:...] */
          const char *f = strchr (line + nl + 1, ':');
          if (f == NULL || (end != NULL && f > end))
            return -1;
          char a[16] = "", b[16] = "";
          sscanf (f + 1, "%15[0-9]:%15[0-9]", a, b);
          *id = numeric (a);
          if (gid != NULL)
            *gid = numeric (b);
          return *id >= 0 ? 0 : -1;
        }
      line = end != NULL ? end + 1 : NULL;
    }
  return -1;
}

int
img_user_ids (const img_t *img, bool *set, uint32_t *uid, uint32_t *gid, err_t *err)
{
  *set = false;
  *uid = *gid = 0;
  if (img->user == NULL || img->user[0] == '\0')
    return 0;
  char user[256], group[256] = "";
  if (strlen (img->user) >= sizeof user)
    return err_make (err, EINVAL, "image `%s`: its User is longer than %zu bytes", img->ref, sizeof user - 1);
  snprintf (user, sizeof user, "%s", img->user);
  char *colon = strchr (user, ':');
  if (colon != NULL)
    {
      *colon = '\0';
      snprintf (group, sizeof group, "%s", colon + 1);
    }
  long long u = numeric (user), g = -1, pg = -1;
  if (u < 0)
    {
      cleanup_free char *passwd = layer_file (img->layers, "etc/passwd");
      if (look_up (passwd, user, &u, &pg) < 0)
        return err_make (err, EINVAL, "image `%s`: its User `%s` is not in its /etc/passwd", img->ref, user);
    }
  if (group[0] != '\0' && (g = numeric (group)) < 0)
    {
      cleanup_free char *groups = layer_file (img->layers, "etc/group");
      if (look_up (groups, group, &g, NULL) < 0)
        return err_make (err, EINVAL, "image `%s`: its group `%s` is not in its /etc/group", img->ref, group);
    }
  if (group[0] == '\0')
    g = pg >= 0 ? pg : u; /* a name's primary group, else the uid's number */
  *uid = (uint32_t) u;
  *gid = (uint32_t) g;
  *set = u != 0 || g != 0;
  return 0;
}

void
img_env_free (char **env)
{
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    free (env[i]);
  free (env);
}

int
img_env_merge (const img_t *img, char *const *req, char ***out, err_t *err)
{
  size_t ni = 0, nr = 0;
  while (img != NULL && img->env != NULL && img->env[ni] != NULL)
    ni++;
  while (req != NULL && req[nr] != NULL)
    nr++;
  char **env = calloc (ni + nr + 1, sizeof *env);
  if (env == NULL)
    return err_make (err, ENOMEM, "out of memory");
  size_t n = 0;
  for (size_t i = 0; i < ni; i++)
    {
      const char *eq = strchr (img->env[i], '=');
      size_t kl = eq != NULL ? (size_t) (eq - img->env[i]) : strlen (img->env[i]);
      bool overridden = false;
      for (size_t j = 0; j < nr && !overridden; j++)
        overridden = strncmp (req[j], img->env[i], kl) == 0 && req[j][kl] == '=';
      if (!overridden && eq != NULL && (env[n++] = strdup (img->env[i])) == NULL)
        goto oom;
    }
  for (size_t j = 0; j < nr; j++)
    if ((env[n++] = strdup (req[j])) == NULL)
      goto oom;
  *out = env;
  return 0;
oom:
  img_env_free (env);
  return err_make (err, ENOMEM, "out of memory");
}
