/* router: path templates and route lookup (see router.h). No state. */
#include "shim/router.h"

#include <string.h>

/* Copies the component [start, start+len) into out (cap bytes, cut when
 * longer, *too_long then set). */
static void
take_component (const char *start, size_t len, char *out, size_t cap, bool *too_long)
{
  if (len >= cap)
    *too_long = true;
  size_t n = len >= cap ? cap - 1 : len;
  memcpy (out, start, n);
  out[n] = '\0';
}

bool
shim_match_path2 (const char *tmpl, const char *url, char *id, char *pid, size_t cap, bool *too_long)
{
  if (strstr (tmpl, "{id}") == NULL && strstr (tmpl, "{pid}") == NULL && strstr (tmpl, "{port}") == NULL
      && strstr (tmpl, "{*}") == NULL)
    return strcmp (tmpl, url) == 0;
  /* Component by component: literals must be equal, placeholders must be
   * non-empty; the results are written only on a match. */
  char got_id[256], got_pid[256];
  bool tl_id = false, tl_pid = false, seen_id = false, seen_pid = false;
  const char *t = tmpl, *u = url;
  for (;;)
    {
      size_t tl = strcspn (t, "/"), ul = strcspn (u, "/");
      /* "{*}", the template's last component: the rest of the path, any
       * number of components, possibly none. */
      if (tl == 3 && strncmp (t, "{*}", 3) == 0 && t[3] == '\0')
        break;
      bool is_id = tl == 4 && strncmp (t, "{id}", 4) == 0;
      /* "{port}" is taken like "{pid}", into the second slot. */
      bool is_pid = (tl == 5 && strncmp (t, "{pid}", 5) == 0) || (tl == 6 && strncmp (t, "{port}", 6) == 0);
      if (is_id || is_pid)
        {
          if (ul == 0 || (is_pid && pid == NULL))
            return false;
          size_t c = cap < sizeof got_id ? cap : sizeof got_id;
          take_component (u, ul, is_id ? got_id : got_pid, c, is_id ? &tl_id : &tl_pid);
          seen_id |= is_id;
          seen_pid |= is_pid;
        }
      else if (tl != ul || strncmp (t, u, tl) != 0)
        return false;
      t += tl;
      u += ul;
      if (*t == '\0' || *u == '\0')
        {
          if (*t != *u)
            return false;
          break;
        }
      t++;
      u++;
    }
  *too_long = tl_id || tl_pid;
  /* Only what was taken: "{id}" inside a longer component is a literal. */
  if (seen_id)
    strcpy (id, got_id);
  if (seen_pid)
    strcpy (pid, got_pid);
  return true;
}

bool
shim_match_path (const char *tmpl, const char *url, char *id, size_t id_cap, bool *id_too_long)
{
  return shim_match_path2 (tmpl, url, id, NULL, id_cap, id_too_long);
}

const shim_route_t *
shim_route_find (const shim_route_t *table, size_t n, const char *url, const char *method, char *id, char *pid,
                 bool *path_known, bool *id_too_long)
{
  *path_known = false;
  *id_too_long = false;
  id[0] = '\0';
  pid[0] = '\0';
  for (size_t i = 0; i < n; i++)
    {
      char got[SHIM_ID_MAX + 2] = "", got_pid[SHIM_ID_MAX + 2] = "";
      bool tl = false;
      if (!shim_match_path2 (table[i].path, url, got, got_pid, sizeof got, &tl))
        continue;
      *path_known = true;
      if (strcmp (table[i].method, "*") != 0 && strcmp (table[i].method, method) != 0)
        continue;
      /* a too long id is refused by the caller */
      *id_too_long = tl || strlen (got) > SHIM_ID_MAX || strlen (got_pid) > SHIM_ID_MAX;
      take_component (got, strnlen (got, SHIM_ID_MAX), id, SHIM_ID_MAX + 1, &tl);
      take_component (got_pid, strnlen (got_pid, SHIM_ID_MAX), pid, SHIM_ID_MAX + 1, &tl);
      return &table[i];
    }
  return NULL;
}
