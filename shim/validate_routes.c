/* validate_routes: the body of each route that takes one — POST /sandboxes
 * (its spec members: validate_spec.c), exec, a process's start, signal,
 * resize, extend — parsed from the field parsers of validate.c into the
 * structs of validate.h, or the 422 error list. Pure; no state. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim/validate.h"
#include "shim/validate_internal.h"

bool
shim_parse_launch (const char *content_type, const char *body, size_t len, shim_launch_body_t *out, shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  json_t *root = shim_parse_object (content_type, body, len, e);
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
  if (eg != NULL && !json_is_null (eg) && !shim_lax_bool (eg, &out->allow_egress))
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
  json_t *root = shim_parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  shim_parse_argv (root, &out->argv, &out->argc, e);
  shim_parse_int_field (root, NULL, "timeout", 1, SHIM_TIMEOUT_MAX, &out->timeout, e);
  parse_exec_cwd (root, out, e);
  shim_parse_env (root, true, &out->env_keys, &out->env_values, &out->n_env, e);
  parse_exec_stdin (root, out, e);
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
  shim_free_command (b->argv, b->argc, b->env_keys, b->env_values, b->n_env);
  free (b->cwd);
  free (b->stdin_data);
  memset (b, 0, sizeof *b);
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
      shim_errors_add_in (e, "missing", "pty", fields[i], "Field required");
  shim_parse_int_field (pty, "pty", "rows", 1, 65535, &rows, e);
  shim_parse_int_field (pty, "pty", "cols", 1, 65535, &cols, e);
  out->rows = (unsigned) rows;
  out->cols = (unsigned) cols;
}

bool
shim_parse_process (const char *content_type, const char *body, size_t len, shim_process_body_t *out,
                    shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  json_t *root = shim_parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  shim_parse_argv (root, &out->argv, &out->argc, e);
  shim_parse_env (root, false, &out->env_keys, &out->env_values, &out->n_env, e);
  json_t *cwd = json_object_get (root, "cwd");
  if (cwd != NULL && !json_is_null (cwd) && !json_is_string (cwd))
    shim_errors_add (e, "string_type", "body", "cwd", "Input should be a valid string");
  else if (cwd != NULL && json_is_string (cwd))
    out->cwd = strdup (json_string_value (cwd));
  shim_parse_int_field (root, NULL, "timeout", 0, SHIM_TIMEOUT_MAX, &out->timeout, e);
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
  shim_free_command (b->argv, b->argc, b->env_keys, b->env_values, b->n_env);
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
  json_t *root = shim_parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  json_t *v = json_object_get (root, "signal");
  long n = 0;
  if (v == NULL || json_is_null (v))
    shim_errors_add (e, "missing", "body", "signal", "Field required");
  else if (json_is_string (v) && shim_signal_number (json_string_value (v)) > 0)
    *sig = shim_signal_number (json_string_value (v));
  else if ((json_is_string (v) || json_is_integer (v) || json_is_real (v)) && shim_lax_int (v, &n))
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
  json_t *root = shim_parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  long r = 0, c = 0;
  static const char *const fields[] = {"rows", "cols"};
  for (size_t i = 0; i < 2; i++)
    if (json_object_get (root, fields[i]) == NULL || json_is_null (json_object_get (root, fields[i])))
      shim_errors_add (e, "missing", "body", fields[i], "Field required");
  shim_parse_int_field (root, NULL, "rows", 1, 65535, &r, e);
  shim_parse_int_field (root, NULL, "cols", 1, 65535, &c, e);
  json_decref (root);
  *rows = (unsigned) r;
  *cols = (unsigned) c;
  return !shim_errors_any (e);
}

bool
shim_parse_extend (const char *content_type, const char *body, size_t len, shim_extend_body_t *out, shim_errors_t *e)
{
  memset (out, 0, sizeof *out);
  json_t *root = shim_parse_object (content_type, body, len, e);
  if (root == NULL)
    return false;
  shim_parse_int_field (root, NULL, "idle_ttl", 0, SHIM_SPEC_UINT_MAX, &out->idle_ttl, e);
  shim_parse_int_field (root, NULL, "max_lifetime", 0, SHIM_SPEC_UINT_MAX, &out->max_lifetime, e);
  if (!shim_errors_any (e) && out->idle_ttl == 0 && out->max_lifetime == 0)
    shim_errors_add (e, "missing", "body", "idle_ttl", "Give idle_ttl or max_lifetime (seconds, above 0)");
  json_decref (root);
  return !shim_errors_any (e);
}
