/* labels: label syntax, selectors and matching (see labels.h). Pure; no
 * state. Every loop is bounded by the text it walks, itself capped. */
#include "common/labels.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* How much of a hostile key or value an error message quotes. */
#define LBL_QUOTE_MAX 80

static bool
is_alnum (char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* A label name or a non-empty value: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?
 * of at most `max` characters, the first `len` bytes of `s`. */
static bool
name_valid (const char *s, size_t len, size_t max)
{
  if (len == 0 || len > max || !is_alnum (s[0]) || !is_alnum (s[len - 1]))
    return false;
  for (size_t i = 1; i + 1 < len; i++)
    if (!is_alnum (s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
      return false;
  return true;
}

/* A DNS subdomain (RFC 1123): lowercase labels of [a-z0-9-], each at most
 * 63, starting and ending alphanumeric, joined by '.'. */
static bool
prefix_valid (const char *s, size_t len)
{
  if (len == 0 || len > LBL_PREFIX_MAX)
    return false;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++)
    {
      if (i < len && s[i] != '.')
        {
          char c = s[i];
          if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return false;
          continue;
        }
      size_t n = i - start;
      if (n == 0 || n > 63 || s[start] == '-' || s[i - 1] == '-')
        return false;
      start = i + 1;
    }
  return true;
}

bool
lbl_key_valid (const char *key, const char **why)
{
  const char *dummy;
  why = why != NULL ? why : &dummy;
  size_t len = strnlen (key, LBL_KEY_MAX + 1);
  if (len == 0)
    return *why = "the key is empty", false;
  if (len > LBL_KEY_MAX)
    return *why = "the key is longer than 317 characters", false;
  const char *slash = memchr (key, '/', len);
  const char *name = key;
  if (slash != NULL)
    {
      if (!prefix_valid (key, (size_t) (slash - key)))
        return *why = "its prefix is not a DNS subdomain of at most 253 characters", false;
      name = slash + 1;
    }
  if (!name_valid (name, len - (size_t) (name - key), LBL_NAME_MAX))
    return *why = "its name must be 1 to 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric", false;
  return true;
}

bool
lbl_value_valid (const char *value)
{
  size_t len = strnlen (value, LBL_VALUE_MAX + 1);
  return len == 0 || name_valid (value, len, LBL_VALUE_MAX);
}

int
lbl_check (const char *const *keys, const char *const *values, size_t n, err_t *err)
{
  if (n > LBL_MAX)
    return err_make (err, EINVAL, "labels: %zu labels, more than the maximum of %d", n, LBL_MAX);
  for (size_t i = 0; i < n; i++)
    {
      const char *why = NULL;
      if (!lbl_key_valid (keys[i], &why))
        return err_make (err, EINVAL, "labels: key `%.*s` is invalid: %s", LBL_QUOTE_MAX, keys[i], why);
      if (!lbl_value_valid (values[i]))
        return err_make (err, EINVAL,
                         "labels: the value of `%s` is invalid: at most 63 characters of [A-Za-z0-9-_.], starting "
                         "and ending alphanumeric, or empty",
                         keys[i]);
      for (size_t j = 0; j < i; j++)
        if (strcmp (keys[i], keys[j]) == 0)
          return err_make (err, EINVAL, "labels: key `%s` is given twice", keys[i]);
    }
  return 0;
}

/* [s, e) with the spaces around it removed. */
static void
trim (const char **s, const char **e)
{
  while (*s < *e && (**s == ' ' || **s == '\t'))
    (*s)++;
  while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
    (*e)--;
}

/* Copies [s, e) into out (cap bytes), checked as a key. */
static int
take_key (const char *s, const char *e, char *out, size_t cap, err_t *err)
{
  trim (&s, &e);
  size_t len = (size_t) (e - s);
  if (len == 0)
    return err_make (err, EINVAL, "label selector: a requirement has no key");
  if (len >= cap)
    return err_make (err, EINVAL, "label selector: key `%.*s...` is too long", LBL_QUOTE_MAX, s);
  memcpy (out, s, len);
  out[len] = '\0';
  const char *why = NULL;
  if (!lbl_key_valid (out, &why))
    return err_make (err, EINVAL, "label selector: key `%.*s` is invalid: %s", LBL_QUOTE_MAX, out, why);
  return 0;
}

static int
take_value (const char *s, const char *e, char *out, size_t cap, err_t *err)
{
  trim (&s, &e);
  size_t len = (size_t) (e - s);
  if (len >= cap)
    return err_make (err, EINVAL, "label selector: value `%.*s...` is too long", LBL_QUOTE_MAX, s);
  memcpy (out, s, len);
  out[len] = '\0';
  if (!lbl_value_valid (out))
    return err_make (err, EINVAL, "label selector: value `%.*s` is invalid", LBL_QUOTE_MAX, out);
  return 0;
}

/* One requirement, [s, e). */
static int
parse_req (const char *s, const char *e, lbl_req_t *r, err_t *err)
{
  trim (&s, &e);
  if (s == e)
    return err_make (err, EINVAL, "label selector: an empty requirement (two commas, or one at an end)");
  if (memchr (s, '(', (size_t) (e - s)) != NULL || memchr (s, ')', (size_t) (e - s)) != NULL)
    return err_make (err, EINVAL, "label selector: set-based requirements (in, notin) are not supported");
  const char *eq = memchr (s, '=', (size_t) (e - s));
  if (eq == NULL)
    {
      r->op = LBL_OP_EXISTS;
      if (*s == '!')
        {
          r->op = LBL_OP_ABSENT;
          s++;
        }
      r->value[0] = '\0';
      return take_key (s, e, r->key, sizeof r->key, err);
    }
  const char *key_end = eq, *val = eq + 1;
  r->op = LBL_OP_EQ;
  if (eq > s && eq[-1] == '!')
    {
      r->op = LBL_OP_NE;
      key_end = eq - 1;
    }
  else if (val < e && *val == '=')
    val++;
  if (memchr (val, '=', (size_t) (e - val)) != NULL || memchr (val, '!', (size_t) (e - val)) != NULL)
    return err_make (err, EINVAL, "label selector: `%.*s` has more than one operator", LBL_QUOTE_MAX, s);
  if (take_key (s, key_end, r->key, sizeof r->key, err) < 0)
    return -1;
  return take_value (val, e, r->value, sizeof r->value, err);
}

int
lbl_selector_parse (const char *text, lbl_selector_t *out, err_t *err)
{
  out->n = 0;
  if (text == NULL)
    return 0;
  size_t len = strnlen (text, LBL_SELECTOR_MAX + 1);
  if (len > LBL_SELECTOR_MAX)
    return err_make (err, EINVAL, "label selector: longer than %d bytes", LBL_SELECTOR_MAX);
  const char *s = text, *end = text + len;
  trim (&s, &end);
  if (s == end)
    return 0;
  for (;;)
    {
      const char *comma = memchr (s, ',', (size_t) (end - s));
      const char *e = comma != NULL ? comma : end;
      if (out->n == LBL_SELECTOR_REQS)
        return err_make (err, EINVAL, "label selector: more than %d requirements", LBL_SELECTOR_REQS);
      if (parse_req (s, e, &out->reqs[out->n], err) < 0)
        return -1;
      out->n++;
      if (comma == NULL)
        return 0;
      s = comma + 1;
    }
}

/* The value of `key` in kv, or NULL when absent. */
static const char *
lookup (const char *const *kv, const char *key)
{
  size_t klen = strlen (key);
  for (size_t i = 0; kv != NULL && kv[i] != NULL; i++)
    if (strncmp (kv[i], key, klen) == 0 && kv[i][klen] == '=')
      return kv[i] + klen + 1;
  return NULL;
}

bool
lbl_selector_matches (const lbl_selector_t *sel, const char *const *kv)
{
  for (size_t i = 0; i < sel->n; i++)
    {
      const lbl_req_t *r = &sel->reqs[i];
      const char *v = lookup (kv, r->key);
      bool ok = false;
      switch (r->op)
        {
        case LBL_OP_EQ: ok = v != NULL && strcmp (v, r->value) == 0; break;
        case LBL_OP_NE: ok = v == NULL || strcmp (v, r->value) != 0; break;
        case LBL_OP_EXISTS: ok = v != NULL; break;
        case LBL_OP_ABSENT: ok = v == NULL; break;
        }
      if (!ok)
        return false;
    }
  return true;
}
