/* validate: REST input checks with FastAPI-shaped errors (see validate.h). */
#include "shim/validate.h"

#include <ctype.h>
#include <math.h>
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
static json_t *
parse_object (const char *content_type, const char *body, size_t len, shim_errors_t *e)
{
  if (len == 0)
    {
      shim_errors_add (e, "missing", "body", NULL, "Field required");
      return NULL;
    }
  if (!json_content (content_type))
    {
      shim_errors_add (e, "model_attributes_type", "body", NULL,
                       "Input should be a valid dictionary or object to extract fields from");
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

static bool
lax_bool (json_t *v, bool *out)
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

bool
shim_parse_launch (const char *content_type, const char *body, size_t len, shim_launch_body_t *out, shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  json_t *id = json_object_get (root, "sandbox_id");
  if (id == NULL)
    shim_errors_add (e, "missing", "body", "sandbox_id", "Field required");
  else if (!json_is_string (id))
    shim_errors_add (e, "string_type", "body", "sandbox_id", "Input should be a valid string");
  else if (shim_check_id (json_string_value (id), "body", "sandbox_id", e))
    strcpy (out->id, json_string_value (id));
  json_t *eg = json_object_get (root, "allow_egress");
  if (eg != NULL && !json_is_null (eg) && !lax_bool (eg, &out->allow_egress))
    shim_errors_add (e, "bool_parsing", "body", "allow_egress", "Input should be a valid boolean");
  json_decref (root);
  return !shim_errors_any (e);
}

bool
shim_parse_exec (const char *content_type, const char *body, size_t len, shim_exec_body_t *out, shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  out->timeout = SHIM_TIMEOUT_DEFAULT;
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
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
          out->argv = calloc (n + 1, sizeof *out->argv);
          for (size_t i = 0; out->argv != NULL && i < n; i++)
            out->argv[i] = strdup (json_string_value (json_array_get (argv, i)));
          out->argc = out->argv != NULL ? n : 0;
        }
    }
  json_t *t = json_object_get (root, "timeout");
  if (t != NULL && !json_is_null (t))
    {
      double v = 0;
      bool num = false;
      if (json_is_integer (t))
        {
          v = (double) json_integer_value (t);
          num = true;
        }
      else if (json_is_real (t) && floor (json_real_value (t)) == json_real_value (t))
        {
          v = json_real_value (t);
          num = true;
        }
      else if (json_is_string (t))
        {
          char *end = NULL;
          const char *s = json_string_value (t);
          long lv = strtol (s, &end, 10);
          num = end != s && *end == '\0';
          v = (double) lv;
        }
      if (!num)
        shim_errors_add (e, "int_parsing", "body", "timeout", "Input should be a valid integer");
      else if (v < 1)
        shim_errors_add (e, "greater_than_equal", "body", "timeout", "Input should be greater than or equal to 1");
      else if (v > SHIM_TIMEOUT_MAX)
        shim_errors_add (e, "less_than_equal", "body", "timeout", "Input should be less than or equal to 3600");
      else
        out->timeout = (long) v;
    }
  json_decref (root);
  if (shim_errors_any (e))
    {
      shim_exec_body_release (out);
      return false;
    }
  return true;
}

void
shim_exec_body_release (shim_exec_body_t *b)
{
  for (size_t i = 0; b->argv != NULL && i < b->argc; i++)
    free (b->argv[i]);
  free (b->argv);
  b->argv = NULL;
  b->argc = 0;
}
