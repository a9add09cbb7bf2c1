/* api/convert: protobuf messages <-> the runtime's and the snapshot layer's
 * types (see internal.h). No state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "gateway/api/internal.h"
#include "gateway/code/kernel.h"

void
api_info_to_proto (const sbx_info_t *in, Sandbox__V1__SandboxInfo *out)
{
  sandbox__v1__sandbox_info__init (out);
  out->sandbox_id = (char *) in->id;
  out->created_at_unix_ms = in->created_ms;
  out->last_used_unix_ms = in->last_used_ms;
  out->allow_egress = in->allow_egress;
  out->process_count = (uint32_t) in->process_count;
  out->disk_used_bytes = in->disk_used_bytes;
  out->disk_limit_bytes = in->disk_limit_bytes;
  out->dead = in->dead;
  out->dead_reason = (char *) in->dead_reason;
  out->image = (char *) in->image;
  out->image_digest = (char *) in->image_digest;
  out->context_count = (uint32_t) code_count (in->id, in->created_ms);
}

int
api_reply_info (rpc_call_t *call, const sbx_info_t *info, err_t *err)
{
  return api_reply_info_labeled (call, info, NULL, err);
}

void
api_exit_to_proto (const sbx_exec_result_t *in, Sandbox__V1__ExitStatus *out)
{
  sandbox__v1__exit_status__init (out);
  out->exit_code = in->exit_code;
  out->signal = in->signal;
  out->timed_out = in->timed_out;
  out->duration_ms = in->duration_ms;
  out->oom_killed = in->oom_killed;
  out->pids_limited = in->pids_limited;
  out->message = (char *) in->message;
}

int
api_compression_from_proto (Sandbox__V1__Compression c, snap_compression_t *out, err_t *err)
{
  switch (c)
    {
    case SANDBOX__V1__COMPRESSION__COMPRESSION_NONE: *out = SNAP_COMPRESSION_NONE; return 0;
    case SANDBOX__V1__COMPRESSION__COMPRESSION_GZIP: *out = SNAP_COMPRESSION_GZIP; return 0;
    case SANDBOX__V1__COMPRESSION__COMPRESSION_ZSTD: *out = SNAP_COMPRESSION_ZSTD; return 0;
    default: return err_make (err, EINVAL, "unknown compression %d", (int) c);
    }
}

void
api_env_free (char **env)
{
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    free (env[i]);
  free (env);
}

/* One variable of a request's env map: the entry types of ExecRequest and
 * ProcessStart differ only in name. */
static int
env_add (char **env, size_t i, const char *key, const char *val, err_t *err)
{
  if (key[0] == '\0' || strchr (key, '=') != NULL)
    return err_make (err, EINVAL, "env: `%s` is not a variable name", key);
  if (asprintf (&env[i], "%s=%s", key, val) < 0)
    {
      env[i] = NULL;
      return err_make (err, ENOMEM, "env: out of memory");
    }
  return 0;
}

#define ENV_FROM(entries, n, out, err)                                                                               \
  do                                                                                                                 \
    {                                                                                                                \
      char **env_ = calloc ((n) + 1, sizeof *env_);                                                                  \
      if (env_ == NULL)                                                                                              \
        return err_make (err, ENOMEM, "env: out of memory");                                                         \
      for (size_t i_ = 0; i_ < (n); i_++)                                                                            \
        if (env_add (env_, i_, (entries)[i_]->key, (entries)[i_]->value, err) < 0)                                   \
          {                                                                                                          \
            api_env_free (env_);                                                                                     \
            return -1;                                                                                               \
          }                                                                                                          \
      *(out) = env_;                                                                                                 \
      return 0;                                                                                                      \
    }                                                                                                                \
  while (0)

int
api_env_from_proto (Sandbox__V1__ExecRequest__EnvEntry **entries, size_t n, char ***out, err_t *err)
{
  ENV_FROM (entries, n, out, err);
}

int
api_env_from_start (Sandbox__V1__ProcessStart__EnvEntry **entries, size_t n, char ***out, err_t *err)
{
  ENV_FROM (entries, n, out, err);
}

int
api_env_from_launch (Sandbox__V1__LaunchRequest__EnvEntry **entries, size_t n, char ***out, err_t *err)
{
  ENV_FROM (entries, n, out, err);
}

int
api_env_from_context (Sandbox__V1__CreateContextRequest__EnvEntry **entries, size_t n, char ***out, err_t *err)
{
  ENV_FROM (entries, n, out, err);
}

static void
release_lent (void *data)
{
  sbx_exec_release (data);
}

static int
send_bytes_field (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, bool lent, bool start,
                  err_t *err)
{
  uint8_t head[API_FIELD_HEADER_MAX];
  size_t n = api_field_header (head, field, len);
  int (*send) (rpc_call_t *, grpc_slice *, size_t, err_t *) = start ? rpc_call_send_raw_start : rpc_call_send_raw;
  if (!lent)
    {
      grpc_slice one = grpc_slice_malloc (n + len);
      memcpy (GRPC_SLICE_START_PTR (one), head, n);
      memcpy (GRPC_SLICE_START_PTR (one) + n, data, len);
      return send (call, &one, 1, err);
    }
  sbx_exec_hold (data);
  grpc_slice slices[2] = {grpc_slice_from_copied_buffer ((const char *) head, n),
                          grpc_slice_new_with_user_data ((void *) data, len, release_lent, (void *) data)};
  return send (call, slices, 2, err);
}

int
api_send_bytes_field (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, bool lent, err_t *err)
{
  return send_bytes_field (call, field, data, len, lent, false, err);
}

int
api_send_bytes_field_start (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, err_t *err)
{
  return send_bytes_field (call, field, data, len, true, true, err);
}

/* The length of the valid UTF-8 sequence at s (n bytes left), 0 when the
 * byte there does not start one: the strict form proto3 requires (no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t
utf8_seq (const uint8_t *s, size_t n)
{
  uint8_t c = s[0];
  if (c < 0x80)
    return 1;
  size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (len == 0 || len > n)
    return 0;
  uint8_t lo = 0x80, hi = 0xbf; /* the range of the second byte */
  if (c == 0xe0)
    lo = 0xa0;
  else if (c == 0xed)
    hi = 0x9f;
  else if (c == 0xf0)
    lo = 0x90;
  else if (c == 0xf4)
    hi = 0x8f;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < len; i++)
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  return len;
}

bool
api_utf8_valid (const char *s, size_t n)
{
  const uint8_t *p = (const uint8_t *) s;
  for (size_t i = 0, k; i < n; i += k)
    if ((k = utf8_seq (p + i, n - i)) == 0)
      return false;
  return true;
}

const char *
api_utf8_text (const char *s, ProtobufCBinaryData *raw, char **owned)
{
  size_t n = strlen (s);
  *raw = (ProtobufCBinaryData){0, NULL};
  *owned = NULL;
  if (api_utf8_valid (s, n))
    return s;
  /* Each invalid byte becomes the three of U+FFFD. */
  char *out = malloc (3 * n + 1);
  if (out == NULL)
    return NULL;
  const uint8_t *p = (const uint8_t *) s;
  size_t o = 0;
  for (size_t i = 0; i < n;)
    {
      size_t k = utf8_seq (p + i, n - i);
      if (k == 0)
        {
          memcpy (out + o, "\xef\xbf\xbd", 3);
          o += 3;
          i++;
          continue;
        }
      memcpy (out + o, p + i, k);
      o += k;
      i += k;
    }
  out[o] = '\0';
  *raw = (ProtobufCBinaryData){n, (uint8_t *) s};
  *owned = out;
  return out;
}

int
api_argv_to_proto (char *const *argv, size_t n, Sandbox__V1__ProcessInfo *out, err_t *err)
{
  out->n_argv = n;
  out->argv = (char **) argv;
  bool valid = true;
  for (size_t i = 0; valid && i < n; i++)
    valid = api_utf8_valid (argv[i], strlen (argv[i]));
  if (valid)
    return 0;
  char **text = calloc (n, sizeof *text);
  ProtobufCBinaryData *raw = calloc (n, sizeof *raw);
  if (text == NULL || raw == NULL)
    {
      free (text);
      free (raw);
      return err_make (err, ENOMEM, "out of memory");
    }
  out->argv = text;
  out->argv_bytes = raw;
  out->n_argv_bytes = n;
  for (size_t i = 0; i < n; i++)
    {
      char *owned = NULL;
      ProtobufCBinaryData exact;
      const char *t = api_utf8_text (argv[i], &exact, &owned);
      text[i] = owned != NULL ? owned : strdup (t != NULL ? t : "");
      raw[i] = (ProtobufCBinaryData){strlen (argv[i]), (uint8_t *) argv[i]};
      if (t == NULL || text[i] == NULL)
        {
          api_argv_free (out);
          return err_make (err, ENOMEM, "out of memory");
        }
    }
  return 0;
}

void
api_argv_free (Sandbox__V1__ProcessInfo *out)
{
  if (out->n_argv_bytes == 0)
    return;
  for (size_t i = 0; i < out->n_argv; i++)
    free (out->argv[i]);
  free (out->argv);
  free (out->argv_bytes);
  out->argv = NULL;
  out->argv_bytes = NULL;
  out->n_argv = out->n_argv_bytes = 0;
}
