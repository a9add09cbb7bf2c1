/* code/spec: what a context reads and writes inside its sandbox through
 * the file API — kernelspecs (kernel.json under the Jupyter data
 * directories, parsed and bounded), the list of the languages the image
 * has, and the connection file (written, then removed) — and the small string-vector helpers the
 * other files share. It never resolves a sandbox path on the host side.
 * State: none; any thread. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "gateway/code/internal.h"

/* The most of a kernel.json read. */
#define CODE_KERNELSPEC_MAX (64 * 1024)
/* The most argv elements and env entries a kernelspec may have. */
#define CODE_SPEC_ARGS_MAX 64
/* Where kernelspecs are looked for, in this order (Jupyter's data path). */
static const char *const spec_dirs[] = {
    "/root/.local/share/jupyter/kernels",
    "/usr/local/share/jupyter/kernels",
    "/usr/share/jupyter/kernels",
};
#define N_SPEC_DIRS (sizeof spec_dirs / sizeof spec_dirs[0])

void
code_strv_free (char **v)
{
  if (v == NULL)
    return;
  for (char **p = v; *p != NULL; p++)
    free (*p);
  free (v);
}

/* ---- files inside the sandbox (the file API) ------------------------------ */

/* The file API's "caller gone" test: never (its own deadlines hold). */
static bool
never_gone (void *ctx)
{
  (void) ctx;
  return false;
}

/* Reads sandbox file `path` whole, at most `max` bytes (EFBIG beyond). */
static int
sandbox_read (sbx_runtime_t *rt, const char *sid, const char *path, size_t max, char **out, size_t *len, err_t *err)
{
  sbx_file_req_t req = {.id = sid, .op = SBX_FILE_READ, .path = path};
  sbx_file_t *f = NULL;
  if (sbx_file_start (rt, &req, never_gone, NULL, &f, err) < 0)
    return -1;
  cleanup_free char *buf = malloc (max + 1);
  size_t n = 0;
  int rc = 0;
  sbx_file_msg_t msg;
  while (buf != NULL && (rc = sbx_file_next (f, &msg, err)) > 0)
    {
      if (msg.kind != SBX_FRAME_DATA)
        continue;
      if (msg.len > max - n)
        {
          rc = err_make (err, EFBIG, "`%s` is larger than %zu bytes", path, max);
          break;
        }
      memcpy (buf + n, msg.data, msg.len);
      n += msg.len;
    }
  sbx_file_close (f);
  if (buf == NULL)
    return err_make (err, ENOMEM, "read `%s`: out of memory", path);
  if (rc < 0)
    return -1;
  buf[n] = '\0';
  *len = n;
  *out = take_ptr (&buf);
  return 0;
}

int
code_sandbox_write (sbx_runtime_t *rt, const char *sid, const char *path, const char *data, err_t *err)
{
  sbx_file_req_t req = {.id = sid, .op = SBX_FILE_WRITE, .path = path, .flags = SBX_FILE_F_PARENTS, .mode = 0600};
  sbx_file_t *f = NULL;
  if (sbx_file_start (rt, &req, never_gone, NULL, &f, err) < 0)
    return -1;
  sbx_file_msg_t msg;
  int rc = sbx_file_send (f, &(struct iovec){(void *) data, strlen (data)}, 1, err);
  if (rc == 0)
    rc = sbx_file_send_end (f, err);
  if (rc == 0)
    rc = sbx_file_next (f, &msg, err) < 0 ? -1 : 0;
  sbx_file_close (f);
  return rc;
}

int
code_sandbox_remove (sbx_runtime_t *rt, const char *sid, const char *path, err_t *err)
{
  sbx_file_req_t req = {.id = sid, .op = SBX_FILE_REMOVE, .path = path};
  sbx_file_t *f = NULL;
  if (sbx_file_start (rt, &req, never_gone, NULL, &f, err) < 0)
    return -1;
  sbx_file_msg_t msg;
  int rc = sbx_file_next (f, &msg, err) < 0 ? -1 : 0;
  sbx_file_close (f);
  return rc;
}

bool
code_name_valid (const char *s, size_t max)
{
  size_t n = strlen (s);
  if (n == 0 || n > max || s[0] == '.')
    return false;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'
          || *p == '.'))
      return false;
  return true;
}

void
code_spec_free (code_spec_t *s)
{
  code_strv_free (s->argv);
  code_strv_free (s->env);
  *s = (code_spec_t){0};
}

static int
spec_parse (const char *text, size_t len, const char *lang, code_spec_t *out, err_t *err)
{
  json_error_t je;
  json_t *j = json_loadb (text, len, 0, &je);
  json_t *argv = json_object_get (j, "argv"), *env = json_object_get (j, "env");
  const char *mode = json_string_value (json_object_get (j, "interrupt_mode"));
  size_t n = json_array_size (argv);
  int rc = 0;
  if (!json_is_array (argv) || n == 0 || n > CODE_SPEC_ARGS_MAX
      || (env != NULL && (!json_is_object (env) || json_object_size (env) > CODE_SPEC_ARGS_MAX)))
    {
      rc = err_make (err, EINVAL, "kernelspec `%s`: kernel.json has no usable argv", lang);
      goto out;
    }
  out->interrupt_message = mode != NULL && strcmp (mode, "message") == 0;
  out->argv = calloc (n + 1, sizeof *out->argv);
  out->env = calloc (json_object_size (env) + 1, sizeof *out->env);
  if (out->argv == NULL || out->env == NULL)
    {
      rc = err_make (err, ENOMEM, "kernelspec `%s`: out of memory", lang);
      goto out;
    }
  for (size_t i = 0; i < n; i++)
    {
      const char *a = json_string_value (json_array_get (argv, i));
      if (a == NULL || (out->argv[i] = strdup (a)) == NULL)
        {
          rc = err_make (err, EINVAL, "kernelspec `%s`: argv[%zu] is not a string", lang, i);
          goto out;
        }
    }
  const char *k;
  json_t *v;
  size_t e = 0;
  json_object_foreach (env, k, v)
  {
    if (!json_is_string (v) || asprintf (&out->env[e], "%s=%s", k, json_string_value (v)) < 0)
      {
        out->env[e] = NULL;
        rc = err_make (err, EINVAL, "kernelspec `%s`: env `%s` is not a string", lang, k);
        goto out;
      }
    e++;
  }
out:
  json_decref (j);
  if (rc < 0)
    code_spec_free (out);
  return rc;
}

int
code_spec_load (sbx_runtime_t *rt, const char *sid, const char *lang, code_spec_t *out, err_t *err)
{
  if (!code_name_valid (lang, CODE_LANGUAGE_MAX))
    return err_make (err, EINVAL, "invalid language `%s`", lang);
  for (size_t i = 0; i < N_SPEC_DIRS; i++)
    {
      char path[256];
      snprintf (path, sizeof path, "%s/%s/kernel.json", spec_dirs[i], lang);
      cleanup_free char *text = NULL;
      size_t len = 0;
      err_t e = ERR_INIT;
      if (sandbox_read (rt, sid, path, CODE_KERNELSPEC_MAX, &text, &len, &e) < 0)
        {
          bool missing = e.status == ENOENT && sbx_get (rt, sid, &(sbx_info_t){0}, &(err_t) ERR_INIT) == 0;
          if (!missing)
            {
              *err = e;
              return -1;
            }
          err_release (&e);
          continue;
        }
      return spec_parse (text, len, lang, out, err);
    }
  return err_make (err, ENOENT, "no kernelspec `%s` in the sandbox (looked in %s, %s, %s)", lang, spec_dirs[0],
                   spec_dirs[1], spec_dirs[2]);
}

int
code_env_merge (char *const *a, char *const *b, char ***out, err_t *err)
{
  size_t n = 0, k = 0;
  for (char *const *p = a; p && *p; p++)
    n++;
  for (char *const *p = b; p && *p; p++)
    n++;
  char **v = calloc (n + 1, sizeof *v);
  if (v == NULL)
    return err_make (err, ENOMEM, "kernel env: out of memory");
  for (char *const *p = a; p && *p; p++)
    if ((v[k++] = strdup (*p)) == NULL)
      goto oom;
  for (char *const *p = b; p && *p; p++)
    if ((v[k++] = strdup (*p)) == NULL)
      goto oom;
  *out = v;
  return 0;
oom:
  code_strv_free (v);
  return err_make (err, ENOMEM, "kernel env: out of memory");
}

/* The kernelspec names found in the sandbox's image. */
int
code_list_languages (sbx_runtime_t *rt, const char *sid, char ***out, size_t *n, err_t *err)
{
  char **v = calloc (CODE_MAX_LANGUAGES + 1, sizeof *v);
  if (v == NULL)
    return err_make (err, ENOMEM, "ListContexts: out of memory");
  size_t k = 0;
  for (size_t d = 0; d < N_SPEC_DIRS; d++)
    {
      sbx_file_req_t req = {.id = sid, .op = SBX_FILE_LIST, .path = spec_dirs[d], .depth = 1};
      sbx_file_t *f = NULL;
      err_t e = ERR_INIT;
      if (sbx_file_start (rt, &req, never_gone, NULL, &f, &e) < 0)
        {
          err_release (&e);
          continue;
        }
      sbx_file_msg_t msg;
      while (sbx_file_next (f, &msg, &e) > 0)
        {
          if (msg.kind != SBX_FRAME_INFO || msg.info.type != SBX_FTYPE_DIR)
            continue;
          const char *slash = strrchr (msg.path, '/');
          const char *name = slash ? slash + 1 : msg.path;
          bool dup = !code_name_valid (name, CODE_LANGUAGE_MAX);
          for (size_t i = 0; i < k && !dup; i++)
            dup = strcmp (v[i], name) == 0;
          if (dup)
            continue;
          if (k == CODE_MAX_LANGUAGES)
            {
              err_release (&e);
              sbx_file_close (f);
              code_strv_free (v);
              return err_make (err, E2BIG, "more than %d kernelspecs in the sandbox", CODE_MAX_LANGUAGES);
            }
          if ((v[k] = strdup (name)) != NULL)
            k++;
        }
      err_release (&e);
      sbx_file_close (f);
    }
  *out = v;
  *n = k;
  return 0;
}
