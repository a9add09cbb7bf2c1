/* runtime/spec: a launch's spec (sbx_spec_t) — its resources checked
 * against the gateway's maxima, its launch environment against the caps —
 * and what a sandbox keeps of it afterwards: the copies of its environment
 * and labels, read by execs (sbx_env_overlay) and the API (sbx_labels_get).
 * Label syntax is common/labels' and checked by the API; this file only
 * stores and copies them. Threading: any thread; the copies it reads are
 * immutable once the sandbox is ready, and read while it is referenced. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/runtime/internal.h"

char **
sbx_strv_dup (char *const *v)
{
  size_t n = 0, bytes = 0;
  for (; v != NULL && v[n] != NULL; n++)
    bytes += strlen (v[n]) + 1;
  if (n == 0)
    return NULL;
  char **out = malloc ((n + 1) * sizeof *out + bytes);
  if (out == NULL)
    return NULL;
  char *p = (char *) (out + n + 1);
  for (size_t i = 0; i < n; i++)
    {
      size_t len = strlen (v[i]) + 1;
      memcpy (p, v[i], len);
      out[i] = p;
      p += len;
    }
  out[n] = NULL;
  return out;
}

/* One resource: `asked` 0 takes `def`; above `max` (0: no maximum) is
 * refused naming the field, the maximum and its variable. */
static int
resolve (const char *field, long asked, long def, long max, const char *var, long *out, err_t *err)
{
  if (asked < 0)
    return err_make (err, EINVAL, "resources.%s %ld is negative", field, asked);
  if (max > 0 && asked > max)
    return err_make (err, EINVAL, "resources.%s %ld is above the maximum of %ld (%s)", field, asked, max, var);
  *out = asked > 0 ? asked : def;
  return 0;
}

/* The launch environment within its caps, each entry "NAME=value" with a
 * name that is not empty. */
static int
check_env (char *const *env, err_t *err)
{
  size_t n = 0, total = 0;
  for (; env != NULL && env[n] != NULL; n++)
    {
      const char *e = env[n];
      size_t name = strcspn (e, "=");
      if (name == 0 || e[name] != '=')
        return err_make (err, EINVAL, "env: `%.80s` is not a variable name", e);
      if (name > SBX_LAUNCH_ENV_NAME_MAX)
        return err_make (err, EINVAL, "env: a name of %zu bytes is longer than %d", name, SBX_LAUNCH_ENV_NAME_MAX);
      size_t value = strlen (e + name + 1);
      if (value > SBX_LAUNCH_ENV_VALUE_MAX)
        return err_make (err, EINVAL, "env: the value of `%.*s` (%zu bytes) is longer than %d", (int) name, e, value,
                         SBX_LAUNCH_ENV_VALUE_MAX);
      total += name + 1 + value;
    }
  if (n > SBX_LAUNCH_ENV_MAX)
    return err_make (err, EINVAL, "env: %zu entries, more than the maximum of %d", n, SBX_LAUNCH_ENV_MAX);
  if (total > SBX_LAUNCH_ENV_TOTAL_MAX)
    return err_make (err, EINVAL, "env: %zu bytes in all, more than the maximum of %d", total,
                     SBX_LAUNCH_ENV_TOTAL_MAX);
  return 0;
}

/* The spec's lifetime against SANDBOX_MAX_IDLE_TTL and SANDBOX_MAX_LIFETIME. */
static int
check_lifetime (const sbx_config_t *c, const sbx_spec_t *spec, sbx_lifetime_t *life, err_t *err)
{
  long ttl = spec->idle_ttl_seconds, max_life = spec->max_lifetime_seconds;
  if (ttl < 0 || ttl > c->max_idle_ttl_seconds)
    return err_make (err, EINVAL, "idle_ttl_seconds %ld is above the maximum of %ld (SANDBOX_MAX_IDLE_TTL)", ttl,
                     c->max_idle_ttl_seconds);
  if (max_life < 0 || max_life > c->max_lifetime_seconds)
    return err_make (err, EINVAL, "max_lifetime_seconds %ld is above the maximum of %ld (SANDBOX_MAX_LIFETIME)",
                     max_life, c->max_lifetime_seconds);
  life->idle_ttl_seconds = ttl > 0 ? ttl : c->idle_ttl_seconds;
  life->max_lifetime_seconds = max_life;
  life->persist_on_expiry = spec->persist_on_expiry < 0 ? c->persist_on_expiry : spec->persist_on_expiry > 0;
  return 0;
}

int
sbx_spec_check (const sbx_runtime_t *rt, const sbx_spec_t *spec, sbx_resources_t *effective, sbx_lifetime_t *life,
                err_t *err)
{
  const sbx_config_t *c = &rt->cfg;
  const sbx_resources_t *r = &spec->resources;
  if (resolve ("memory_mb", r->memory_mb, c->memory_mb, c->max_memory_mb, "SANDBOX_MAX_MEMORY_MB",
               &effective->memory_mb, err)
          < 0
      || resolve ("disk_mb", r->disk_mb, c->disk_mb, c->max_disk_mb, "SANDBOX_MAX_DISK_MB", &effective->disk_mb, err)
             < 0
      || resolve ("pids_max", r->pids_max, c->pids_max, c->max_pids, "SANDBOX_MAX_PIDS", &effective->pids_max, err)
             < 0)
    return -1;
  if (r->cpu_millis < 0)
    return err_make (err, EINVAL, "resources.cpus is negative");
  if (c->max_cpu_millis > 0 && r->cpu_millis > c->max_cpu_millis)
    return err_make (err, EINVAL, "resources.cpus %.3f is above the maximum of %.3f (SANDBOX_MAX_CPUS)",
                     r->cpu_millis / 1000.0, c->max_cpu_millis / 1000.0);
  effective->cpu_millis = r->cpu_millis > 0 ? r->cpu_millis : c->cpu_millis;
  /* The smallest limits a sandbox can start under (its set-up runs in them). */
  if (effective->memory_mb < SBX_MIN_MEMORY_MB || effective->disk_mb < SBX_MIN_DISK_MB
      || effective->pids_max < SBX_MIN_PIDS)
    return err_make (err, EINVAL, "resources: memory_mb is at least %d, disk_mb at least %d, pids_max at least %d",
                     SBX_MIN_MEMORY_MB, SBX_MIN_DISK_MB, SBX_MIN_PIDS);
  if (check_lifetime (c, spec, life, err) < 0)
    return -1;
  return check_env (spec->env, err);
}

int
sbx_labels_get (sbx_runtime_t *rt, const char *id, char ***out, err_t *err)
{
  *out = NULL;
  sbx_t *s = sbx_acquire (rt, id);
  if (s == NULL)
    return sbx_err_not_found (err, id, NULL);
  int rc = 0;
  if (s->labels != NULL && (*out = sbx_strv_dup (s->labels)) == NULL)
    rc = err_make (err, ENOMEM, "labels: out of memory");
  sbx_release (rt, s);
  return rc;
}

/* Whether `env` names the variable of entry `e` ("NAME=..."). */
static bool
names (char *const *env, const char *e)
{
  size_t len = strcspn (e, "=") + 1;
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    if (strncmp (env[i], e, len) == 0)
      return true;
  return false;
}

char **
sbx_env_under (char *const *base, char *const *env, bool *oom)
{
  *oom = false;
  if (base == NULL)
    return NULL;
  size_t n = 0, k = 0;
  while (base[n] != NULL)
    n++;
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    n++;
  char **tmp = calloc (n + 1, sizeof *tmp);
  if (tmp == NULL)
    {
      *oom = true;
      return NULL;
    }
  for (size_t i = 0; base[i] != NULL; i++)
    if (!names (env, base[i]))
      tmp[k++] = base[i];
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    tmp[k++] = env[i];
  tmp[k] = NULL;
  char **out = k > 0 ? sbx_strv_dup (tmp) : NULL;
  *oom = k > 0 && out == NULL;
  free (tmp);
  return out;
}

int
sbx_env_overlay (sbx_runtime_t *rt, const char *id, char *const *env, char ***out, err_t *err)
{
  *out = NULL;
  sbx_t *s = sbx_acquire (rt, id);
  if (s == NULL)
    return sbx_err_not_found (err, id, NULL);
  bool oom = false;
  *out = sbx_env_under (s->env, env, &oom);
  sbx_release (rt, s);
  return oom ? err_make (err, ENOMEM, "env: out of memory") : 0;
}
