/* validate: REST input checks with FastAPI-shaped errors (see validate.h)
 * — the error list and the field parsers every body shares (a sandbox id,
 * booleans, integers, a JSON object body, "argv", "env", base64). The
 * bodies of the routes are validate_routes.c's, the launch spec's members
 * validate_spec.c's. Pure; no state. */
#include "shim/validate.h"
#include "shim/validate_internal.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void
shim_errors_init (shim_errors_t *e)
{
  e->list = json_array ();
}

void
shim_errors_add (shim_errors_t *e, const char *type, const char *where, const char *field, const char *msg)
{
  json_t *loc = field != NULL ? json_pack ("[s, s]", where, field) : json_pack ("[s]", where);
  json_array_append_new (e->list, json_pack ("{s:s, s:o, s:s}", "type", type, "loc", loc, "msg", msg));
}

bool
shim_errors_any (const shim_errors_t *e)
{
  return json_array_size (e->list) > 0;
}

json_t *
shim_errors_take (shim_errors_t *e)
{
  json_t *out = json_pack ("{s:o}", "detail", e->list);
  e->list = NULL;
  return out;
}

void
shim_errors_release (shim_errors_t *e)
{
  json_decref (e->list);
  e->list = NULL;
}

bool
shim_check_id (const char *id, const char *where, const char *field, shim_errors_t *e)
{
  size_t n = strlen (id);
  if (n > SHIM_ID_MAX)
    {
      shim_errors_add (e, "string_too_long", where, field, "String should have at most 64 characters");
      return false;
    }
  bool ok = n > 0;
  for (size_t i = 0; ok && i < n; i++)
    {
      unsigned char c = (unsigned char) id[i];
      ok = isalnum (c) || (i > 0 && (c == '_' || c == '-'));
    }
  if (!ok)
    shim_errors_add (e, "string_pattern_mismatch", where, field,
                     "String should match pattern '^[A-Za-z0-9][A-Za-z0-9_-]*$'");
  return ok;
}

int
shim_parse_bool_text (const char *text, bool *out)
{
  static const char *const yes[] = {"true", "1", "yes", "on", "t", "y"};
  static const char *const no[] = {"false", "0", "no", "off", "f", "n"};
  for (size_t i = 0; i < 6; i++)
    {
      if (strcasecmp (text, yes[i]) == 0)
        {
          *out = true;
          return 0;
        }
      if (strcasecmp (text, no[i]) == 0)
        {
          *out = false;
          return 0;
        }
    }
  return -1;
}

static bool
json_content (const char *content_type)
{
  if (content_type == NULL || content_type[0] == '\0')
    return true;
  size_t n = strcspn (content_type, ";");
  while (n > 0 && content_type[n - 1] == ' ')
    n--;
  if (n == 16 && strncasecmp (content_type, "application/json", 16) == 0)
    return true;
  return n > 5 && strncasecmp (content_type + n - 5, "+json", 5) == 0;
}

/* Parses the body as a JSON object, or adds the error FastAPI gives. */
json_t *
shim_parse_object (const char *content_type, const char *body, size_t len, shim_errors_t *e)
{
  if (len == 0)
    {
      shim_errors_add (e, "missing", "body", NULL, "Field required");
      return NULL;
    }
  if (!json_content (content_type))
    {
      /* FastAPI's type and words, and what is wrong: the body's type. */
      shim_errors_add (e, "model_attributes_type", "body", NULL,
                       "Input should be a valid dictionary or object to extract fields from: the body was not sent "
                       "as JSON (send it with Content-Type: application/json)");
      return NULL;
    }
  json_error_t jerr;
  json_t *root = json_loadb (body, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    {
      shim_errors_add (e, "json_invalid", "body", NULL, "JSON decode error");
      return NULL;
    }
  if (!json_is_object (root))
    {
      json_decref (root);
      shim_errors_add (e, "model_attributes_type", "body", NULL,
                       "Input should be a valid dictionary or object to extract fields from");
      return NULL;
    }
  return root;
}

bool
shim_lax_bool (json_t *v, bool *out)
{
  if (json_is_boolean (v))
    {
      *out = json_is_true (v);
      return true;
    }
  if (json_is_integer (v) && (json_integer_value (v) == 0 || json_integer_value (v) == 1))
    {
      *out = json_integer_value (v) == 1;
      return true;
    }
  if (json_is_string (v))
    return shim_parse_bool_text (json_string_value (v), out) == 0;
  return false;
}

/* Adds an error at loc ["body", field, sub] (a member of an object field). */
void
shim_errors_add_in (shim_errors_t *e, const char *type, const char *field, const char *sub, const char *msg)
{
  json_t *loc = json_pack ("[s, s, s]", "body", field, sub);
  json_array_append_new (e->list, json_pack ("{s:s, s:o, s:s}", "type", type, "loc", loc, "msg", msg));
}

/* An integer as pydantic takes it in lax mode: an integer, a float without
 * a fraction, or a string of digits. */
bool
shim_lax_int (json_t *v, long *out)
{
  if (json_is_integer (v))
    {
      *out = (long) json_integer_value (v);
      return true;
    }
  if (json_is_real (v) && floor (json_real_value (v)) == json_real_value (v))
    {
      /* Far out of any range: kept out of range rather than overflowing. */
      double d = json_real_value (v);
      *out = d >= 9e18 ? LONG_MAX : d <= -9e18 ? LONG_MIN : (long) d;
      return true;
    }
  if (json_is_string (v))
    {
      char *end = NULL;
      const char *s = json_string_value (v);
      *out = strtol (s, &end, 10);
      return end != s && *end == '\0';
    }
  return false;
}

/* Reads integer member `field` of `root` into *out (unchanged when absent
 * or null), within [min, max]; otherwise adds the error (at ["body", field],
 * or ["body", in, field] when `in` is not NULL). */
void
shim_parse_int_field (json_t *root, const char *in, const char *field, long min, long max, long *out,
                      shim_errors_t *e)
{
  json_t *t = json_object_get (root, field);
  if (t == NULL || json_is_null (t))
    return;
  long v = 0;
  char msg[96];
  const char *type = NULL;
  if (!shim_lax_int (t, &v))
    {
      type = "int_parsing";
      snprintf (msg, sizeof msg, "Input should be a valid integer");
    }
  else if (v < min)
    {
      type = "greater_than_equal";
      snprintf (msg, sizeof msg, "Input should be greater than or equal to %ld", min);
    }
  else if (v > max)
    {
      type = "less_than_equal";
      snprintf (msg, sizeof msg, "Input should be less than or equal to %ld", max);
    }
  if (type == NULL)
    *out = v;
  else if (in != NULL)
    shim_errors_add_in (e, type, in, field, msg);
  else
    shim_errors_add (e, type, "body", field, msg);
}

void
shim_parse_int_member (json_t *root, const char *in, const char *field, long min, long max, long *out,
                       shim_errors_t *e)
{
  shim_parse_int_field (root, in, field, min, max, out, e);
}

/* The required, non-empty list of strings "argv" of `root` (owned, NULL
 * ended), or the error. */
void
shim_parse_argv (json_t *root, char ***out, size_t *n_out, shim_errors_t *e)
{
  json_t *argv = json_object_get (root, "argv");
  if (argv == NULL)
    shim_errors_add (e, "missing", "body", "argv", "Field required");
  else if (!json_is_array (argv))
    shim_errors_add (e, "list_type", "body", "argv", "Input should be a valid list");
  else if (json_array_size (argv) == 0)
    shim_errors_add (e, "too_short", "body", "argv", "List should have at least 1 item after validation, not 0");
  else
    {
      size_t n = json_array_size (argv);
      bool ok = true;
      for (size_t i = 0; i < n && ok; i++)
        ok = json_is_string (json_array_get (argv, i));
      if (!ok)
        shim_errors_add (e, "string_type", "body", "argv", "Input should be a valid string");
      else
        {
          *out = calloc (n + 1, sizeof **out);
          for (size_t i = 0; *out != NULL && i < n; i++)
            (*out)[i] = strdup (json_string_value (json_array_get (argv, i)));
          *n_out = *out != NULL ? n : 0;
        }
    }
}

long
shim_base64_decode (const char *text, size_t len, unsigned char *out)
{
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (len % 4 != 0)
    return -1;
  size_t pad = 0;
  while (pad < 2 && pad < len && text[len - 1 - pad] == '=')
    pad++;
  long n = 0;
  uint32_t acc = 0;
  for (size_t i = 0; i < len; i++)
    {
      const char *p = i < len - pad && text[i] != '\0' ? strchr (alphabet, text[i]) : NULL;
      if (i < len - pad && p == NULL)
        return -1;
      acc = (acc << 6) | (uint32_t) (p != NULL ? p - alphabet : 0);
      if (i % 4 != 3)
        continue;
      size_t keep = i == len - 1 ? 3 - pad : 3;
      for (size_t k = 0; k < keep; k++)
        out[n++] = (unsigned char) (acc >> (16 - 8 * k));
      acc = 0;
    }
  return n;
}

/* Frees an argv and an environment as the body parsers made them. */
void
shim_free_command (char **argv, size_t argc, char **keys, char **values, size_t n_env)
{
  for (size_t i = 0; argv != NULL && i < argc; i++)
    free (argv[i]);
  for (size_t i = 0; keys != NULL && i < n_env; i++)
    {
      free (keys[i]);
      free (values[i]);
    }
  free (argv);
  free (keys);
  free (values);
}

/* A name the gateway takes for an environment variable: not empty, no '='. */
static bool
env_name_ok (const char *name)
{
  return name[0] != '\0' && strchr (name, '=') == NULL;
}

/* "env": an object of strings (owned copies in *keys and *values, *n of
 * them), or the error. With `check_names`, names the gateway would refuse
 * are errors too. */
void
shim_parse_env (json_t *root, bool check_names, char ***keys, char ***values, size_t *n_out, shim_errors_t *e)
{
  json_t *env = json_object_get (root, "env");
  if (env == NULL || json_is_null (env))
    return;
  if (!json_is_object (env))
    {
      shim_errors_add (e, "dict_type", "body", "env", "Input should be a valid dictionary");
      return;
    }
  size_t n = json_object_size (env);
  *keys = calloc (n + 1, sizeof **keys);
  *values = calloc (n + 1, sizeof **values);
  if (*keys == NULL || *values == NULL)
    return;
  const char *key;
  json_t *value;
  json_object_foreach (env, key, value)
  {
    if (check_names && !env_name_ok (key))
      {
        shim_errors_add_in (e, "value_error", "env", key,
                            "Value error, not an environment variable name (empty or contains '=')");
        continue;
      }
    if (!json_is_string (value))
      {
        shim_errors_add_in (e, "string_type", "env", key, "Input should be a valid string");
        continue;
      }
    (*keys)[*n_out] = strdup (key);
    (*values)[*n_out] = strdup (json_string_value (value));
    (*n_out)++;
  }
}
