/* api/spec: LaunchRequest's spec (resources, env, labels) to the runtime's
 * sbx_spec_t, a sandbox's resources and labels back into a SandboxInfo,
 * and List's label selector. Label syntax is common/labels'; the runtime
 * checks resources and the environment's caps. No state. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/labels.h"
#include "gateway/api/internal.h"

/* Most memory_mb, disk_mb or pids_max a request can carry before it is
 * compared with the maxima (a uint32 fits a long; cpus must be finite). */
#define API_CPUS_MAX 4096.0

static void
free_strv (char **v)
{
  for (size_t i = 0; v != NULL && v[i] != NULL; i++)
    free (v[i]);
  free (v);
}

void
api_spec_release (api_spec_t *s)
{
  free_strv (s->env);
  free_strv (s->labels);
  memset (s, 0, sizeof *s);
}

static int
resources_from_proto (const Sandbox__V1__Resources *r, sbx_resources_t *out, err_t *err)
{
  memset (out, 0, sizeof *out);
  if (r == NULL)
    return 0;
  if (!isfinite (r->cpus) || r->cpus < 0 || r->cpus > API_CPUS_MAX)
    return err_make (err, EINVAL, "resources.cpus must be a number of CPUs in [0, %.0f]", API_CPUS_MAX);
  if (r->cpus > 0 && r->cpus < 0.01)
    return err_make (err, EINVAL, "resources.cpus %g is below the minimum of 0.01", r->cpus);
  out->memory_mb = r->memory_mb;
  out->cpu_millis = (long) (r->cpus * 1000 + 0.5);
  out->disk_mb = r->disk_mb;
  out->pids_max = r->pids_max;
  return 0;
}

/* "key=value" strings of the labels map, checked. */
static int
labels_from_proto (Sandbox__V1__LaunchRequest__LabelsEntry **entries, size_t n, char ***out, err_t *err)
{
  *out = NULL;
  if (n == 0)
    return 0;
  if (n > LBL_MAX)
    return err_make (err, EINVAL, "labels: %zu labels, more than the maximum of %d", n, LBL_MAX);
  const char *keys[LBL_MAX], *values[LBL_MAX];
  for (size_t i = 0; i < n; i++)
    {
      keys[i] = entries[i]->key;
      values[i] = entries[i]->value;
    }
  if (lbl_check (keys, values, n, err) < 0)
    return -1;
  char **v = calloc (n + 1, sizeof *v);
  if (v == NULL)
    return err_make (err, ENOMEM, "labels: out of memory");
  for (size_t i = 0; i < n; i++)
    if (asprintf (&v[i], "%s=%s", keys[i], values[i]) < 0)
      {
        v[i] = NULL;
        free_strv (v);
        return err_make (err, ENOMEM, "labels: out of memory");
      }
  *out = v;
  return 0;
}

int
api_spec_from_launch (const Sandbox__V1__LaunchRequest *req, api_spec_t *out, err_t *err)
{
  memset (out, 0, sizeof *out);
  out->spec.allow_egress = req->allow_egress;
  out->spec.idle_ttl_seconds = req->idle_ttl_seconds;
  out->spec.max_lifetime_seconds = req->max_lifetime_seconds;
  switch (req->persist_on_expiry)
    {
    case SANDBOX__V1__PERSIST_ON_EXPIRY__PERSIST_ON_EXPIRY_UNSPECIFIED: out->spec.persist_on_expiry = -1; break;
    case SANDBOX__V1__PERSIST_ON_EXPIRY__PERSIST_ON_EXPIRY_YES: out->spec.persist_on_expiry = 1; break;
    case SANDBOX__V1__PERSIST_ON_EXPIRY__PERSIST_ON_EXPIRY_NO: out->spec.persist_on_expiry = 0; break;
    default:
      return err_make (err, EINVAL, "persist_on_expiry %d is not a PersistOnExpiry", (int) req->persist_on_expiry);
    }
  if (resources_from_proto (req->resources, &out->spec.resources, err) < 0)
    return -1;
  if (req->n_env > SBX_LAUNCH_ENV_MAX)
    return err_make (err, EINVAL, "env: %zu entries, more than the maximum of %d", req->n_env, SBX_LAUNCH_ENV_MAX);
  if (api_env_from_launch (req->env, req->n_env, &out->env, err) < 0
      || labels_from_proto (req->labels, req->n_labels, &out->labels, err) < 0)
    {
      api_spec_release (out);
      return -1;
    }
  out->spec.env = out->env;
  out->spec.labels = out->labels;
  return 0;
}

void
api_resources_to_proto (const sbx_resources_t *in, Sandbox__V1__Resources *out)
{
  sandbox__v1__resources__init (out);
  out->memory_mb = (uint32_t) in->memory_mb;
  out->cpus = in->cpu_millis / 1000.0;
  out->disk_mb = (uint32_t) in->disk_mb;
  out->pids_max = (uint32_t) in->pids_max;
}

int
api_labels_to_proto (char *const *labels, api_labels_pb_t *out, Sandbox__V1__SandboxInfo *info, err_t *err)
{
  memset (out, 0, sizeof *out);
  size_t n = 0;
  while (labels != NULL && labels[n] != NULL)
    n++;
  if (n == 0)
    return 0;
  out->entries = calloc (n, sizeof *out->entries);
  out->ptrs = calloc (n, sizeof *out->ptrs);
  out->keys = calloc (n, sizeof *out->keys);
  if (out->entries == NULL || out->ptrs == NULL || out->keys == NULL)
    {
      api_labels_pb_release (out);
      return err_make (err, ENOMEM, "labels: out of memory");
    }
  for (size_t i = 0; i < n; i++)
    {
      size_t klen = strcspn (labels[i], "=");
      if ((out->keys[i] = strndup (labels[i], klen)) == NULL)
        {
          api_labels_pb_release (out);
          return err_make (err, ENOMEM, "labels: out of memory");
        }
      sandbox__v1__sandbox_info__labels_entry__init (&out->entries[i]);
      out->entries[i].key = out->keys[i];
      out->entries[i].value = labels[i][klen] == '=' ? (char *) labels[i] + klen + 1 : (char *) "";
      out->ptrs[i] = &out->entries[i];
    }
  out->n = n;
  info->n_labels = n;
  info->labels = out->ptrs;
  return 0;
}

void
api_labels_pb_release (api_labels_pb_t *p)
{
  for (size_t i = 0; p->keys != NULL && i < p->n; i++)
    free (p->keys[i]);
  free (p->keys);
  free (p->ptrs);
  free (p->entries);
  memset (p, 0, sizeof *p);
}

int
api_reply_info_labeled (rpc_call_t *call, const sbx_info_t *info, char *const *labels, err_t *err)
{
  Sandbox__V1__SandboxInfo pb;
  api_info_to_proto (info, &pb);
  Sandbox__V1__Resources res;
  api_resources_to_proto (&info->resources, &res);
  pb.resources = &res;
  pb.expires_at_unix_ms = info->expires_at_ms;
  pb.idle_ttl_seconds = (uint32_t) info->lifetime.idle_ttl_seconds;
  pb.max_lifetime_seconds = (uint32_t) info->lifetime.max_lifetime_seconds;
  api_labels_pb_t lp;
  if (api_labels_to_proto (labels, &lp, &pb, err) < 0)
    return -1;
  int rc = rpc_call_reply (call, &pb.base, err);
  api_labels_pb_release (&lp);
  return rc;
}

bool
api_selector_match (void *ctx, const char *const *labels)
{
  return lbl_selector_matches ((const lbl_selector_t *) ctx, labels);
}
