/* Fuzz target: the shim's request parsing (shim/validate.h) and path
 * matching (shim/router.h).
 *
 * Input: byte 0 selects the function (mod 8), byte 1 is a parameter; the
 * rest is split at the first NUL into a first part (a content type, an id,
 * a boolean text, a template) and the rest (a body, a URL), which may hold
 * further NULs for the length-based parsers.
 *
 *   0 shim_parse_launch (content_type, body)   content type "" means NULL
 *   1 shim_parse_exec (content_type, body)
 *   2 shim_check_id (part)
 *   3 shim_parse_bool_text (part)
 *   4 shim_match_path (template, url): template is the first part, or one
 *     of the shim's routes when the parameter's high bit is set; id_cap is
 *     1 + parameter % 70
 *   5 shim_parse_process (content_type, body)
 *   6 shim_parse_signal (content_type, body)
 *   7 shim_parse_resize (content_type, body)
 *
 * Besides memory errors, checks what callers rely on: a valid parse has no
 * errors and in-range values, a failed one has errors and owns nothing, a
 * matched id fits its buffer and rebuilds the URL.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim/router.h"
#include "shim/validate.h"

#define FUZZ_TARGET "shim_fuzz"
#include "tests/fuzz/check.h"

static const char *const routes[] = {
    "/health",
    "/sandboxes",
    "/sandboxes/{id}",
    "/sandboxes/{id}/exec",
    "/sandboxes/{id}/restore",
    "/sandboxes/{id}/tar",
    "/sandboxes/{id}/snapshot",
    "/sandboxes/{id}/connect",
    "/sandboxes/{id}/processes",
    "/sandboxes/{id}/ports",
    "/p/{*}",
    "/metrics",
};

/* The error list is well formed and serialisable, as the shim sends it. */
static void
check_errors (shim_errors_t *e, bool expect_any)
{
  CHECK (shim_errors_any (e) == expect_any);
  json_t *doc = shim_errors_take (e);
  CHECK (doc != NULL);
  json_t *detail = json_object_get (doc, "detail");
  CHECK (json_is_array (detail));
  size_t i;
  json_t *item;
  json_array_foreach (detail, i, item)
  {
    CHECK (json_is_string (json_object_get (item, "type")));
    CHECK (json_is_array (json_object_get (item, "loc")));
    CHECK (json_is_string (json_object_get (item, "msg")));
  }
  char *text = json_dumps (doc, JSON_COMPACT);
  CHECK (text != NULL);
  free (text);
  json_decref (doc);
  shim_errors_release (e);
}

static bool
id_ok (const char *id)
{
  size_t n = strlen (id);
  if (n == 0 || n > SHIM_ID_MAX || !isalnum ((unsigned char) id[0]))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!isalnum ((unsigned char) id[i]) && id[i] != '_' && id[i] != '-')
      return false;
  return true;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  if (size < 2)
    return 0;
  unsigned sel = data[0] % 8, param = data[1];
  /* first: NUL-terminated copy of the bytes up to the first NUL; rest: the
   * bytes after it (a separate allocation, so ASan sees overreads). */
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  const uint8_t *nul = memchr (p, 0, n);
  size_t flen = nul != NULL ? (size_t) (nul - p) : n;
  size_t rlen = nul != NULL ? n - flen - 1 : 0;
  char *first = malloc (flen + 1);
  char *rest = malloc (rlen + 1);
  memcpy (first, p, flen);
  first[flen] = '\0';
  if (rlen > 0)
    memcpy (rest, nul + 1, rlen);
  rest[rlen] = '\0';

  shim_errors_t e;
  shim_errors_init (&e);
  switch (sel)
    {
    case 0:
      {
        shim_launch_body_t b;
        /* Body without its NUL terminator: a separate exact-size copy. */
        char *body = malloc (rlen ? rlen : 1);
        memcpy (body, rest, rlen);
        bool ok = shim_parse_launch (flen ? first : NULL, body, rlen, &b, &e);
        if (ok)
          CHECK (id_ok (b.id));
        check_errors (&e, !ok);
        shim_launch_body_release (&b);
        free (body);
        break;
      }
    case 1:
      {
        shim_exec_body_t b;
        char *body = malloc (rlen ? rlen : 1);
        memcpy (body, rest, rlen);
        bool ok = shim_parse_exec (flen ? first : NULL, body, rlen, &b, &e);
        if (ok)
          {
            CHECK (b.argc >= 1 && b.argv != NULL);
            for (size_t i = 0; i < b.argc; i++)
              CHECK (b.argv[i] != NULL);
            CHECK (b.argv[b.argc] == NULL);
            CHECK (b.timeout >= 1 && b.timeout <= SHIM_TIMEOUT_MAX);
            CHECK (b.cwd == NULL || b.cwd[0] == '/');
            for (size_t i = 0; i < b.n_env; i++)
              CHECK (b.env_keys[i][0] != '\0' && strchr (b.env_keys[i], '=') == NULL && b.env_values[i] != NULL);
            CHECK (b.stdin_len == 0 || b.stdin_data != NULL);
            CHECK (b.stdin_len <= rlen);
          }
        else
          CHECK (b.argv == NULL && b.argc == 0 && b.cwd == NULL && b.env_keys == NULL && b.stdin_data == NULL);
        check_errors (&e, !ok);
        shim_exec_body_release (&b);
        free (body);
        break;
      }
    case 2:
      {
        bool ok = shim_check_id (first, "path", "sandbox_id", &e);
        CHECK (ok == id_ok (first));
        check_errors (&e, !ok);
        break;
      }
    case 3:
      {
        bool v = false;
        int rc = shim_parse_bool_text (first, &v);
        CHECK (rc == 0 || rc == -1);
        check_errors (&e, false);
        break;
      }
    case 4:
      {
        const char *tmpl = (param & 0x80) ? routes[param % (sizeof routes / sizeof routes[0])] : first;
        const char *url = (param & 0x80) ? first : rest;
        size_t cap = 1 + (param & 0x7f) % 70;
        char *id = malloc (cap);
        memset (id, 'Z', cap);
        bool too_long = false;
        bool m = shim_match_path (tmpl, url, id, cap, &too_long);
        const char *brace = strstr (tmpl, "{id}");
        /* The router's templates hold at most one "{id}", as a whole
         * component; other arbitrary templates are only run, not checked. */
        bool one_id = brace != NULL && strstr (brace + 4, "{id}") == NULL && (brace == tmpl || brace[-1] == '/')
                      && (brace[4] == '\0' || brace[4] == '/');
        /* "{*}" (the rest of the path) as the last component: a match
         * shares the template's text before it. */
        const char *rest_at = strstr (tmpl, "{*}");
        bool tail = rest_at != NULL && rest_at[3] == '\0' && (rest_at == tmpl || rest_at[-1] == '/');
        if (m && brace == NULL && rest_at == NULL)
          CHECK (strcmp (tmpl, url) == 0);
        else if (m && tail && brace == NULL && strchr (tmpl, '{') == rest_at)
          CHECK (strncmp (tmpl, url, (size_t) (rest_at - tmpl)) == 0);
        else if (m && one_id && rest_at == NULL)
          {
            size_t idlen = strnlen (id, cap);
            CHECK (idlen < cap);
            CHECK (idlen > 0 || too_long);
            CHECK (strchr (id, '/') == NULL);
            if (!too_long)
              {
                /* prefix + id + suffix == url */
                size_t pre = (size_t) (brace - tmpl);
                char *rebuilt = malloc (pre + idlen + strlen (brace + 4) + 1);
                sprintf (rebuilt, "%.*s%s%s", (int) pre, tmpl, id, brace + 4);
                CHECK (strcmp (rebuilt, url) == 0);
                free (rebuilt);
              }
          }
        free (id);
        check_errors (&e, false);
        break;
      }
    case 5:
      {
        shim_process_body_t b;
        char *body = malloc (rlen ? rlen : 1);
        memcpy (body, rest, rlen);
        bool ok = shim_parse_process (flen ? first : NULL, body, rlen, &b, &e);
        if (ok)
          {
            CHECK (b.argc >= 1 && b.argv != NULL && b.argv[b.argc] == NULL);
            for (size_t i = 0; i < b.n_env; i++)
              CHECK (b.env_keys[i] != NULL && b.env_values[i] != NULL);
            CHECK (b.timeout >= 0 && b.timeout <= SHIM_TIMEOUT_MAX);
            CHECK ((b.rows == 0) == (b.cols == 0) && b.rows <= 65535 && b.cols <= 65535);
            CHECK (b.process_id[0] == '\0' || id_ok (b.process_id));
          }
        else
          CHECK (b.argv == NULL && b.env_keys == NULL && b.cwd == NULL);
        check_errors (&e, !ok);
        shim_process_body_release (&b);
        free (body);
        break;
      }
    case 6:
      {
        int sig = -1;
        char *body = malloc (rlen ? rlen : 1);
        memcpy (body, rest, rlen);
        bool ok = shim_parse_signal (flen ? first : NULL, body, rlen, &sig, &e);
        CHECK (!ok || (sig >= 1 && sig <= SHIM_SIGNAL_MAX));
        check_errors (&e, !ok);
        free (body);
        break;
      }
    case 7:
      {
        unsigned rows = 0, cols = 0;
        char *body = malloc (rlen ? rlen : 1);
        memcpy (body, rest, rlen);
        bool ok = shim_parse_resize (flen ? first : NULL, body, rlen, &rows, &cols, &e);
        CHECK (!ok || (rows >= 1 && rows <= 65535 && cols >= 1 && cols <= 65535));
        check_errors (&e, !ok);
        free (body);
        break;
      }
    }
  free (first);
  free (rest);
  return 0;
}
