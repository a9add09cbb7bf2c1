/* router: path templates and route lookup (see router.h). No state. */
#include "shim/router.h"

#include <string.h>

bool
shim_match_path (const char *tmpl, const char *url, char *id, size_t id_cap, bool *id_too_long)
{
  const char *brace = strstr (tmpl, "{id}");
  if (brace == NULL)
    return strcmp (tmpl, url) == 0;
  size_t pre = (size_t) (brace - tmpl);
  if (strncmp (tmpl, url, pre) != 0)
    return false;
  const char *start = url + pre;
  const char *end = strchr (start, '/');
  size_t len = end != NULL ? (size_t) (end - start) : strlen (start);
  const char *suffix = brace + 4;
  if (strcmp (end != NULL ? end : "", suffix) != 0)
    return false;
  if (len == 0)
    return false;
  *id_too_long = len >= id_cap;
  size_t n = *id_too_long ? id_cap - 1 : len;
  memcpy (id, start, n);
  id[n] = '\0';
  return true;
}

const shim_route_t *
shim_route_find (const shim_route_t *table, size_t n, const char *url, const char *method, char *id, bool *path_known,
                 bool *id_too_long)
{
  *path_known = false;
  *id_too_long = false;
  id[0] = '\0';
  for (size_t i = 0; i < n; i++)
    {
      char got[SHIM_ID_MAX + 2] = "";
      bool tl = false;
      if (!shim_match_path (table[i].path, url, got, sizeof got, &tl))
        continue;
      *path_known = true;
      if (strcmp (table[i].method, method) != 0)
        continue;
      *id_too_long = tl || strlen (got) > SHIM_ID_MAX;
      size_t len = *id_too_long ? SHIM_ID_MAX : strlen (got); /* a too long id is refused by the caller */
      memcpy (id, got, len);
      id[len] = '\0';
      return &table[i];
    }
  return NULL;
}
