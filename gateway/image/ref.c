/* image/ref: see ref.h. */
#include "gateway/image/ref.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int
img_digest_valid (const char *d)
{
  if (strncmp (d, "sha256:", 7) != 0 || strlen (d) != 7 + 64)
    return 0;
  for (const char *p = d + 7; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return 0;
  return 1;
}

static int
all_in (const char *s, size_t n, const char *set)
{
  for (size_t i = 0; i < n; i++)
    if (strchr (set, s[i]) == NULL || s[i] == '\0')
      return 0;
  return 1;
}

int
img_ref_parse (const char *ref, img_ref_t *out, err_t *err)
{
  memset (out, 0, sizeof *out);
  size_t len = strlen (ref);
  if (len == 0 || len > 255)
    return err_make (err, EINVAL, "image reference `%.64s`: empty or longer than 255 characters", ref);
  char buf[256];
  snprintf (buf, sizeof buf, "%s", ref);
  char *at = strchr (buf, '@');
  if (at != NULL)
    {
      *at = '\0';
      if (!img_digest_valid (at + 1))
        return err_make (err, EINVAL, "image `%s`: the digest is not sha256:<64 hex digits>", ref);
      snprintf (out->digest, sizeof out->digest, "%s", at + 1);
    }
  char *name = buf, *slash = strchr (buf, '/');
  if (slash != NULL
      && (memchr (buf, '.', (size_t) (slash - buf)) != NULL || memchr (buf, ':', (size_t) (slash - buf)) != NULL
          || strncmp (buf, "localhost/", 10) == 0))
    {
      *slash = '\0';
      if (strlen (buf) > IMG_HOST_MAX
          || !all_in (buf, strlen (buf), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]"))
        return err_make (err, EINVAL, "image `%s`: `%s` is not a registry host[:port]", ref, buf);
      const char *host = strcmp (buf, "docker.io") == 0 ? "registry-1.docker.io" : buf;
      memcpy (out->host, host, strlen (host) + 1); /* at most IMG_HOST_MAX, checked above */
      name = slash + 1;
    }
  else
    snprintf (out->host, sizeof out->host, "registry-1.docker.io");
  char *colon = strrchr (name, ':');
  if (colon != NULL)
    {
      *colon = '\0';
      size_t tl = strlen (colon + 1);
      if (tl == 0 || tl > IMG_TAG_MAX || colon[1] == '.' || colon[1] == '-'
          || !all_in (colon + 1, tl, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"))
        return err_make (err, EINVAL, "image `%s`: the tag is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", ref);
      snprintf (out->tag, sizeof out->tag, "%s", colon + 1);
    }
  else if (out->digest[0] == '\0')
    snprintf (out->tag, sizeof out->tag, "latest");
  size_t nl = strlen (name);
  if (nl == 0 || name[0] == '/' || name[nl - 1] == '/' || strstr (name, "//") != NULL || strstr (name, "..") != NULL
      || name[0] == '.' || name[0] == '-' || !all_in (name, nl, "abcdefghijklmnopqrstuvwxyz0123456789._/-"))
    return err_make (err, EINVAL, "image `%s`: `%s` is not a repository name ([a-z0-9._/-], no `..`)", ref, name);
  bool hub = strcmp (out->host, "registry-1.docker.io") == 0;
  if (snprintf (out->repo, sizeof out->repo, "%s%s", hub && strchr (name, '/') == NULL ? "library/" : "", name)
      >= (int) sizeof out->repo)
    return err_make (err, EINVAL, "image `%s`: the repository name is too long", ref);
  return 0;
}
