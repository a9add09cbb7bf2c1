/* config: environment parsing and --help output (see config.h). No state. */
#include "common/config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"

int
cfg_parse_bool (const char *text, bool *out)
{
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < 4; i++)
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

/* The text of `v` and, in *from, the variable it came from (v's name, its
 * fallback's, or v's name for the default). */
static const char *
lookup (const cfg_var_t *v, const char **from)
{
  *from = v->name;
  const char *s = getenv (v->name);
  if (s != NULL && *s != '\0')
    return s;
  if (v->fallback != NULL)
    {
      s = getenv (v->fallback);
      if (s != NULL && *s != '\0')
        {
          *from = v->fallback;
          return s;
        }
    }
  return v->def;
}

/* A secret as written by `echo` or a mounted file ends with "\n" (or
 * "\r\n" from a Windows editor): that one line end is removed, with a
 * warning that names the variable, never the value. Any other whitespace or
 * control character, inside or around, is refused: a bearer token cannot
 * carry it, so the secret could never match and every call would fail. */
static int
clean_secret (char *s, const char *from, bool warn, err_t *err)
{
  size_t n = strlen (s);
  bool stripped = false;
  if (n > 0 && s[n - 1] == '\n')
    {
      s[--n] = '\0';
      if (n > 0 && s[n - 1] == '\r')
        s[--n] = '\0';
      stripped = true;
    }
  for (size_t i = 0; i < n; i++)
    {
      unsigned char ch = (unsigned char) s[i];
      if (ch <= ' ' || ch == 0x7f)
        return err_make (err, EINVAL, "%s: the secret contains whitespace or a control character (byte %zu of %zu)",
                         from, i + 1, n);
    }
  if (n == 0)
    return err_make (err, EINVAL, "%s: the secret is only a line end", from);
  if (stripped && warn)
    log_msg (SEV_WARNING, "%s: removed the line end that ended the secret", from);
  return 0;
}

static int
load_one (const cfg_var_t *v, err_t *err)
{
  const char *from = NULL;
  const char *text = lookup (v, &from);
  switch (v->type)
    {
    case CFG_STRING:
      {
        char **dst = v->target;
        *dst = text != NULL ? strdup (text) : NULL;
        if (text != NULL && *dst == NULL)
          return err_make (err, ENOMEM, "%s: out of memory", v->name);
        /* A value taken from the fallback variable was already warned
         * about when that variable was read itself. */
        if (*dst != NULL && v->secret && clean_secret (*dst, from, from == v->name, err) < 0)
          {
            free (*dst);
            *dst = NULL;
            return -1;
          }
        return 0;
      }
    case CFG_INT:
      {
        long *dst = v->target;
        if (text == NULL)
          {
            *dst = 0;
            return 0;
          }
        char *end = NULL;
        errno = 0;
        long val = strtol (text, &end, 10);
        if (errno != 0 || end == text || *end != '\0')
          return err_make (err, EINVAL, "%s: `%s` is not an integer", v->name, v->secret ? "***" : text);
        if (val < v->min || val > v->max)
          return err_make (err, EINVAL, "%s: %ld is out of range [%ld, %ld]", v->name, val, v->min, v->max);
        *dst = val;
        return 0;
      }
    case CFG_BOOL:
      {
        bool *dst = v->target;
        if (text == NULL)
          {
            *dst = false;
            return 0;
          }
        if (cfg_parse_bool (text, dst) < 0)
          return err_make (err, EINVAL, "%s: `%s` is not a boolean (true/false)", v->name, text);
        return 0;
      }
    }
  return err_make (err, EINVAL, "%s: unknown type", v->name);
}

int
cfg_load (const cfg_var_t *vars, size_t n, err_t *err)
{
  for (size_t i = 0; i < n; i++)
    if (load_one (&vars[i], err) < 0)
      return -1;
  return 0;
}

void
cfg_print_help (FILE *out, const char *usage, const cfg_var_t *vars, size_t n)
{
  fprintf (out, "%s\n\nEnvironment variables:\n", usage);
  for (size_t i = 0; i < n; i++)
    {
      const cfg_var_t *v = &vars[i];
      fprintf (out, "  %s\n      %s\n      default: ", v->name, v->help);
      if (v->fallback != NULL)
        fprintf (out, "the value of %s", v->fallback);
      else if (v->def == NULL)
        fprintf (out, "(unset)");
      else if (v->secret)
        fprintf (out, "(set)");
      else
        fprintf (out, "%s", v->def);
      if (v->type == CFG_INT)
        fprintf (out, "  [%ld..%ld]", v->min, v->max);
      fputc ('\n', out);
    }
}
