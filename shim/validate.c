/* validate: REST input checks with FastAPI-shaped errors (see validate.h). */
#include "shim/validate.h"

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
  json_t *im = json_object_get (root, "image");
  if (im != NULL && !json_is_null (im)
      && (!json_is_string (im) || strlen (json_string_value (im)) > SHIM_IMAGE_REF_MAX))
    shim_errors_add (e, "string_type", "body", "image",
                     "Input should be an image reference of at most 255 characters");
  else if (im != NULL && json_is_string (im))
    strcpy (out->image, json_string_value (im));
  shim_parse_launch_spec (root, out, e);
  json_decref (root);
  if (shim_errors_any (e))
    shim_launch_body_release (out);
  return !shim_errors_any (e);
}

/* Adds an error at loc ["body", field, sub] (a member of an object field). */
static void
errors_add_in (shim_errors_t *e, const char *type, const char *field, const char *sub, const char *msg)
{
  json_t *loc = json_pack ("[s, s, s]", "body", field, sub);
  json_array_append_new (e->list, json_pack ("{s:s, s:o, s:s}", "type", type, "loc", loc, "msg", msg));
}

/* An integer as pydantic takes it in lax mode: an integer, a float without
 * a fraction, or a string of digits. */
static bool
lax_int (json_t *v, long *out)
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
static void
parse_int_field (json_t *root, const char *in, const char *field, long min, long max, long *out, shim_errors_t *e)
{
  json_t *t = json_object_get (root, field);
  if (t == NULL || json_is_null (t))
    return;
  long v = 0;
  char msg[96];
  const char *type = NULL;
  if (!lax_int (t, &v))
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
    errors_add_in (e, type, in, field, msg);
  else
    shim_errors_add (e, type, "body", field, msg);
}

void
shim_parse_int_member (json_t *root, const char *in, const char *field, long min, long max, long *out,
                       shim_errors_t *e)
{
  parse_int_field (root, in, field, min, max, out, e);
}

/* The required, non-empty list of strings "argv" of `root` (owned, NULL
 * ended), or the error. */
static void
parse_argv (json_t *root, char ***out, size_t *n_out, shim_errors_t *e)
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

static void parse_env (json_t *root, bool check_names, char ***keys, char ***values, size_t *n_out, shim_errors_t *e);

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

/* "cwd": an absolute path, as the gateway requires. */
static void
parse_exec_cwd (json_t *root, shim_exec_body_t *out, shim_errors_t *e)
{
  json_t *cwd = json_object_get (root, "cwd");
  if (cwd == NULL || json_is_null (cwd))
    return;
  if (!json_is_string (cwd))
    shim_errors_add (e, "string_type", "body", "cwd", "Input should be a valid string");
  else if (json_string_value (cwd)[0] != '/')
    shim_errors_add (e, "value_error", "body", "cwd", "Value error, cwd must be an absolute path");
  else
    out->cwd = strdup (json_string_value (cwd));
}

/* "stdin_b64": the command's standard input, as base64. */
static void
parse_exec_stdin (json_t *root, shim_exec_body_t *out, shim_errors_t *e)
{
  json_t *in = json_object_get (root, "stdin_b64");
  if (in == NULL || json_is_null (in))
    return;
  if (!json_is_string (in))
    {
      shim_errors_add (e, "string_type", "body", "stdin_b64", "Input should be a valid string");
      return;
    }
  size_t len = json_string_length (in);
  out->stdin_data = malloc (len / 4 * 3 + 1);
  long n = out->stdin_data != NULL ? shim_base64_decode (json_string_value (in), len, out->stdin_data) : -1;
  if (n < 0)
    {
      free (out->stdin_data);
      out->stdin_data = NULL;
      shim_errors_add (e, "base64_decode", "body", "stdin_b64",
                       "Base64 decoding error: expected standard, padded base64");
      return;
    }
  out->stdin_len = (size_t) n;
}

bool
shim_parse_exec (const char *content_type, const char *body, size_t len, shim_exec_body_t *out, shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  out->timeout = SHIM_TIMEOUT_DEFAULT;
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  parse_argv (root, &out->argv, &out->argc, e);
  parse_int_field (root, NULL, "timeout", 1, SHIM_TIMEOUT_MAX, &out->timeout, e);
  parse_exec_cwd (root, out, e);
  parse_env (root, true, &out->env_keys, &out->env_values, &out->n_env, e);
  parse_exec_stdin (root, out, e);
  json_decref (root);
  if (shim_errors_any (e))
    {
      shim_exec_body_release (out);
      return false;
    }
  return true;
}

/* Frees an argv and an environment as the body parsers made them. */
static void
free_command (char **argv, size_t argc, char **keys, char **values, size_t n_env)
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

void
shim_exec_body_release (shim_exec_body_t *b)
{
  free_command (b->argv, b->argc, b->env_keys, b->env_values, b->n_env);
  free (b->cwd);
  free (b->stdin_data);
  memset (b, 0, sizeof *b);
}

/* ---- the process routes ---------------------------------------------------- */

/* A name the gateway takes for an environment variable: not empty, no '='. */
static bool
env_name_ok (const char *name)
{
  return name[0] != '\0' && strchr (name, '=') == NULL;
}

/* "env": an object of strings (owned copies in *keys and *values, *n of
 * them), or the error. With `check_names`, names the gateway would refuse
 * are errors too. */
static void
parse_env (json_t *root, bool check_names, char ***keys, char ***values, size_t *n_out, shim_errors_t *e)
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
        errors_add_in (e, "value_error", "env", key,
                       "Value error, not an environment variable name (empty or contains '=')");
        continue;
      }
    if (!json_is_string (value))
      {
        errors_add_in (e, "string_type", "env", key, "Input should be a valid string");
        continue;
      }
    (*keys)[*n_out] = strdup (key);
    (*values)[*n_out] = strdup (json_string_value (value));
    (*n_out)++;
  }
}

/* "pty": null, or an object with rows and cols (1..65535). */
static void
parse_pty (json_t *root, shim_process_body_t *out, shim_errors_t *e)
{
  json_t *pty = json_object_get (root, "pty");
  if (pty == NULL || json_is_null (pty))
    return;
  if (!json_is_object (pty))
    {
      shim_errors_add (e, "model_type", "body", "pty", "Input should be a valid dictionary or instance of PtySize");
      return;
    }
  long rows = 0, cols = 0;
  static const char *const fields[] = {"rows", "cols"};
  for (size_t i = 0; i < 2; i++)
    if (json_object_get (pty, fields[i]) == NULL || json_is_null (json_object_get (pty, fields[i])))
      errors_add_in (e, "missing", "pty", fields[i], "Field required");
  parse_int_field (pty, "pty", "rows", 1, 65535, &rows, e);
  parse_int_field (pty, "pty", "cols", 1, 65535, &cols, e);
  out->rows = (unsigned) rows;
  out->cols = (unsigned) cols;
}

bool
shim_parse_process (const char *content_type, const char *body, size_t len, shim_process_body_t *out,
                    shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  parse_argv (root, &out->argv, &out->argc, e);
  parse_env (root, false, &out->env_keys, &out->env_values, &out->n_env, e);
  json_t *cwd = json_object_get (root, "cwd");
  if (cwd != NULL && !json_is_null (cwd) && !json_is_string (cwd))
    shim_errors_add (e, "string_type", "body", "cwd", "Input should be a valid string");
  else if (cwd != NULL && json_is_string (cwd))
    out->cwd = strdup (json_string_value (cwd));
  parse_int_field (root, NULL, "timeout", 0, SHIM_TIMEOUT_MAX, &out->timeout, e);
  parse_pty (root, out, e);
  json_t *pid = json_object_get (root, "process_id");
  if (pid != NULL && !json_is_null (pid) && !json_is_string (pid))
    shim_errors_add (e, "string_type", "body", "process_id", "Input should be a valid string");
  else if (pid != NULL && json_is_string (pid) && shim_check_id (json_string_value (pid), "body", "process_id", e))
    strcpy (out->process_id, json_string_value (pid));
  json_decref (root);
  if (shim_errors_any (e))
    {
      shim_process_body_release (out);
      return false;
    }
  return true;
}

void
shim_process_body_release (shim_process_body_t *b)
{
  free_command (b->argv, b->argc, b->env_keys, b->env_values, b->n_env);
  free (b->cwd);
  memset (b, 0, sizeof *b);
}

/* Signal names as kill(1) takes them, without their SIG prefix. */
static const struct
{
  const char *name;
  int number;
} signal_names[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},       {"QUIT", SIGQUIT}, {"ILL", SIGILL},     {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT}, {"IOT", SIGIOT},       {"BUS", SIGBUS},   {"FPE", SIGFPE},     {"KILL", SIGKILL},
    {"USR1", SIGUSR1}, {"SEGV", SIGSEGV},     {"USR2", SIGUSR2}, {"PIPE", SIGPIPE},   {"ALRM", SIGALRM},
    {"TERM", SIGTERM}, {"STKFLT", SIGSTKFLT}, {"CHLD", SIGCHLD}, {"CONT", SIGCONT},   {"STOP", SIGSTOP},
    {"TSTP", SIGTSTP}, {"TTIN", SIGTTIN},     {"TTOU", SIGTTOU}, {"URG", SIGURG},     {"XCPU", SIGXCPU},
    {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},
    {"POLL", SIGPOLL}, {"PWR", SIGPWR},       {"SYS", SIGSYS},
};

int
shim_signal_number (const char *name)
{
  if (strncasecmp (name, "SIG", 3) == 0)
    name += 3;
  for (size_t i = 0; i < sizeof signal_names / sizeof signal_names[0]; i++)
    if (strcasecmp (name, signal_names[i].name) == 0)
      return signal_names[i].number;
  return -1;
}

bool
shim_parse_signal (const char *content_type, const char *body, size_t len, int *sig, shim_errors_t *e)
{
  *sig = 0;
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  json_t *v = json_object_get (root, "signal");
  long n = 0;
  if (v == NULL || json_is_null (v))
    shim_errors_add (e, "missing", "body", "signal", "Field required");
  else if (json_is_string (v) && shim_signal_number (json_string_value (v)) > 0)
    *sig = shim_signal_number (json_string_value (v));
  else if ((json_is_string (v) || json_is_integer (v) || json_is_real (v)) && lax_int (v, &n))
    {
      if (n < 1 || n > SHIM_SIGNAL_MAX)
        shim_errors_add (e, "value_error", "body", "signal", "Value error, signal numbers go from 1 to 64");
      else
        *sig = (int) n;
    }
  else if (json_is_string (v))
    shim_errors_add (e, "value_error", "body", "signal",
                     "Value error, unknown signal name (expected e.g. \"SIGTERM\", \"term\" or a number)");
  else
    shim_errors_add (e, "value_error", "body", "signal", "Value error, a signal is a name or a number");
  json_decref (root);
  return !shim_errors_any (e);
}

bool
shim_parse_resize (const char *content_type, const char *body, size_t len, unsigned *rows, unsigned *cols,
                   shim_errors_t *e)
{
  *rows = *cols = 0;
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  long r = 0, c = 0;
  static const char *const fields[] = {"rows", "cols"};
  for (size_t i = 0; i < 2; i++)
    if (json_object_get (root, fields[i]) == NULL || json_is_null (json_object_get (root, fields[i])))
      shim_errors_add (e, "missing", "body", fields[i], "Field required");
  parse_int_field (root, NULL, "rows", 1, 65535, &r, e);
  parse_int_field (root, NULL, "cols", 1, 65535, &c, e);
  json_decref (root);
  *rows = (unsigned) r;
  *cols = (unsigned) c;
  return !shim_errors_any (e);
}

bool
shim_parse_extend (const char *content_type, const char *body, size_t len, shim_extend_body_t *out, shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  json_t *root = parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  parse_int_field (root, NULL, "idle_ttl", 0, SHIM_SPEC_UINT_MAX, &out->idle_ttl, e);
  parse_int_field (root, NULL, "max_lifetime", 0, SHIM_SPEC_UINT_MAX, &out->max_lifetime, e);
  if (!shim_errors_any (e) && out->idle_ttl == 0 && out->max_lifetime == 0)
    shim_errors_add (e, "missing", "body", "idle_ttl", "Give idle_ttl or max_lifetime (seconds, above 0)");
  json_decref (root);
  return !shim_errors_any (e);
}
