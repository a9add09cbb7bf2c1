/* validate_spec: the launch spec's members of a POST /sandboxes body —
 * "resources", "env", "labels", "idle_ttl", "max_lifetime" — and the
 * label selector of GET /sandboxes?labels=. Shapes and types are checked
 * here with the shim's 422 error list (pydantic's shape); label syntax
 * with common/labels, as the gateway does; the gateway's maxima and the
 * environment's sizes stay the gateway's to check (its INVALID_ARGUMENT is
 * a 422 too). Pure; no state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/labels.h"
#include "shim/validate.h"

/* Adds an error at ["body", field, sub]. */
static void
add_in (shim_errors_t *e, const char *type, const char *field, const char *sub, const char *msg)
{
  json_t *loc = json_pack ("[s, s, s]", "body", field, sub);
  json_array_append_new (e->list, json_pack ("{s:s, s:o, s:s}", "type", type, "loc", loc, "msg", msg));
}

static void
parse_resources (json_t *root, shim_launch_body_t *out, shim_errors_t *e)
{
  json_t *r = json_object_get (root, "resources");
  if (r == NULL || json_is_null (r))
    return;
  if (!json_is_object (r))
    {
      shim_errors_add (e, "dict_type", "body", "resources", "Input should be a valid dictionary");
      return;
    }
  shim_parse_int_member (r, "resources", "memory_mb", 0, SHIM_SPEC_UINT_MAX, &out->memory_mb, e);
  shim_parse_int_member (r, "resources", "disk_mb", 0, SHIM_SPEC_UINT_MAX, &out->disk_mb, e);
  shim_parse_int_member (r, "resources", "pids_max", 0, SHIM_SPEC_UINT_MAX, &out->pids_max, e);
  json_t *c = json_object_get (r, "cpus");
  if (c == NULL || json_is_null (c))
    return;
  if (!json_is_number (c))
    add_in (e, "float_parsing", "resources", "cpus", "Input should be a valid number");
  else if (!isfinite (json_number_value (c)) || json_number_value (c) < 0 || json_number_value (c) > 4096)
    add_in (e, "less_than_equal", "resources", "cpus", "Input should be a number of CPUs in [0, 4096]");
  else
    out->cpus = json_number_value (c);
}

/* An object of strings, at most `max` members, each key checked by
 * `key_ok` (NULL: any) and value by `value_ok`; a new reference in *out. */
static void
parse_map (json_t *root, const char *field, size_t max, bool (*key_ok) (const char *k, size_t len, const char **why),
           bool (*value_ok) (const char *v, size_t len), json_t **out, shim_errors_t *e)
{
  json_t *m = json_object_get (root, field);
  if (m == NULL || json_is_null (m))
    return;
  if (!json_is_object (m))
    {
      shim_errors_add (e, "dict_type", "body", field, "Input should be a valid dictionary");
      return;
    }
  if (json_object_size (m) > max)
    {
      char msg[96];
      snprintf (msg, sizeof msg, "At most %zu entries", max);
      shim_errors_add (e, "too_long", "body", field, msg);
      return;
    }
  const char *k;
  json_t *v;
  bool ok = true;
  json_object_foreach (m, k, v)
  {
    const char *why = "Invalid key";
    if (!key_ok (k, strlen (k), &why))
      {
        add_in (e, "value_error", field, k, why);
        ok = false;
      }
    else if (!json_is_string (v))
      {
        add_in (e, "string_type", field, k, "Input should be a valid string");
        ok = false;
      }
    else if (!value_ok (json_string_value (v), json_string_length (v)))
      {
        add_in (e, "value_error", field, k, "Invalid value");
        ok = false;
      }
  }
  if (ok)
    *out = json_incref (m);
}

/* A variable name: not empty, no '=' (jansson keys carry no NUL). */
static bool
env_key_ok (const char *k, size_t len, const char **why)
{
  *why = "A variable name is not empty and has no '=' or NUL";
  return len > 0 && strchr (k, '=') == NULL;
}

/* A value without NUL (which a C string, and so the gateway, cannot carry). */
static bool
env_value_ok (const char *v, size_t len)
{
  return strlen (v) == len;
}

static bool
label_key_ok (const char *k, size_t len, const char **why)
{
  return lbl_key_valid (k, why);
}

static bool
label_value_ok (const char *v, size_t len)
{
  return strlen (v) == len && lbl_value_valid (v);
}

void
shim_parse_launch_spec (json_t *root, shim_launch_body_t *out, shim_errors_t *e)
{
  parse_resources (root, out, e);
  parse_map (root, "env", SHIM_LAUNCH_ENV_MAX, env_key_ok, env_value_ok, &out->env, e);
  parse_map (root, "labels", SHIM_LAUNCH_LABELS_MAX, label_key_ok, label_value_ok, &out->labels, e);
  shim_parse_int_member (root, NULL, "idle_ttl", 0, SHIM_SPEC_UINT_MAX, &out->idle_ttl, e);
  shim_parse_int_member (root, NULL, "max_lifetime", 0, SHIM_SPEC_UINT_MAX, &out->max_lifetime, e);
}

void
shim_launch_body_release (shim_launch_body_t *b)
{
  json_decref (b->env);
  json_decref (b->labels);
  b->env = b->labels = NULL;
}

bool
shim_check_selector (const char *selector, shim_errors_t *e)
{
  lbl_selector_t *sel = malloc (sizeof *sel); /* 25 KiB: off the connection thread's stack */
  if (sel == NULL)
    {
      shim_errors_add (e, "value_error", "query", "labels", "Out of memory");
      return false;
    }
  err_t err = ERR_INIT;
  int rc = lbl_selector_parse (selector, sel, &err);
  free (sel);
  if (rc == 0)
    return true;
  shim_errors_add (e, "value_error", "query", "labels", err_msg (&err));
  err_release (&err);
  return false;
}
