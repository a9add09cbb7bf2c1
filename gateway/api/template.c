/* api/template: the handlers of the template methods — CreateTemplate,
 * ListTemplates, DeleteTemplate. A template is made of the sandbox's
 * layer, exported (frozen, as for a snapshot) as an uncompressed tar into a
 * file of the image cache, then handed to image/template.c, which stores
 * it. Launching from one is Launch with image `template:<name>`
 * (api/image.c). No state. */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/api/internal.h"
#include "gateway/image/image.h"
#include "gateway/snapshot/session.h"

/* Templates made at once: each holds a copy of a sandbox's layer on disk
 * while it is stored. */
#define API_MAX_TEMPLATE_MAKES 4
/* Listings at once: each reads every template's index.json. */
#define API_MAX_TEMPLATE_LISTS 4

static atomic_int makes, lists;

/* Takes one of `max` places of `n`; EAGAIN (RESOURCE_EXHAUSTED) when all
 * are taken. */
static int
take_place (atomic_int *n, int max, const char *what, err_t *err)
{
  if (atomic_fetch_add (n, 1) < max)
    return 0;
  atomic_fetch_sub (n, 1);
  return err_make (err, EAGAIN, "%d %s under way already: retry later", max, what);
}

static int
no_templates (const api_ctx_t *ctx, err_t *err)
{
  return ctx->images == NULL ? err_make (err, ENOSYS, "this gateway has no image cache") : 0;
}

static void
template_to_proto (const img_template_t *t, Sandbox__V1__TemplateInfo *pb)
{
  sandbox__v1__template_info__init (pb);
  pb->name = (char *) t->name;
  pb->image_digest = (char *) t->digest;
  pb->base_image = (char *) t->base;
  pb->base_image_digest = (char *) t->base_digest;
  pb->sandbox_id = (char *) t->sandbox_id;
  pb->created_at_unix_ms = t->created_ms;
  pb->size_bytes = t->bytes;
  pb->layers = t->n_layers;
}

/* Where the export goes: the file of the template's new layer. */
static int
to_file (void *ctx, const uint8_t *data, size_t len, err_t *err)
{
  int fd = *(int *) ctx;
  for (size_t off = 0; off < len;)
    {
      ssize_t w = TEMP_FAILURE_RETRY (write (fd, data + off, len - off));
      if (w <= 0)
        return err_make_sys (err, w < 0 ? errno : EIO, "write the template's layer");
      off += (size_t) w;
    }
  return 0;
}

/* The layer of `info`'s sandbox exported into a file, then made a
 * template and answered. */
static int
make (rpc_call_t *call, const api_ctx_t *ctx, const Sandbox__V1__CreateTemplateRequest *req, const sbx_info_t *info,
      err_t *err)
{
  char path[PATH_MAX];
  int fd = img_template_tmp (ctx->images, path, err);
  if (fd < 0)
    return -1;
  /* Uncompressed: the layer's digest is its diff id, and what a launch
   * unpacks is read at disk speed. */
  snap_export_opts_t opts = {.compression = SNAP_COMPRESSION_NONE};
  snap_export_result_t res;
  /* A deleted sandbox, a freeze held too long or the client's going ends it. */
  snap_canceller_t stop = api_call_canceller (call);
  int rc = snap_export_stoppable (ctx->rt, req->sandbox_id, &opts, to_file, &fd, &stop, &res, err);
  close (fd);
  img_template_t t;
  if (rc == 0)
    rc = img_template_create (ctx->images, req->name, info->image_digest, path, res.total_bytes, res.sha256,
                              req->sandbox_id, &t, err);
  unlink (path); /* when the export failed */
  if (rc < 0)
    return err_wrap (err, "template `%s` of sandbox `%s`", req->name, req->sandbox_id);
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:I}", "template", t.name, "sandbox_id", req->sandbox_id, "digest",
                         t.digest, "bytes", (json_int_t) t.bytes),
              "template made");
  Sandbox__V1__TemplateInfo pb;
  template_to_proto (&t, &pb);
  return rpc_call_reply (call, &pb.base, err);
}

int
api_create_template (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (no_templates (ctx, err) < 0
      || api_recv_request (call, &sandbox__v1__create_template_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__CreateTemplateRequest *req = (Sandbox__V1__CreateTemplateRequest *) m;
  if (!img_template_name_valid (req->name))
    return err_make (err, EINVAL,
                     "invalid template name `%.80s`: names match ^[a-z0-9][a-z0-9._-]*$, at most %d "
                     "characters",
                     req->name, IMG_TEMPLATE_NAME_MAX);
  sbx_info_t info;
  if (sbx_get (ctx->rt, req->sandbox_id, &info, err) < 0
      || take_place (&makes, API_MAX_TEMPLATE_MAKES, "template creations", err) < 0)
    return -1;
  int rc = make (call, ctx, req, &info, err);
  atomic_fetch_sub (&makes, 1);
  return rc;
}

int
api_list_templates (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (no_templates (ctx, err) < 0
      || api_recv_request (call, &sandbox__v1__list_templates_request__descriptor, &m, err) < 0)
    return -1;
  cleanup_free img_template_t *ts = NULL;
  size_t n = 0;
  if (take_place (&lists, API_MAX_TEMPLATE_LISTS, "template listings", err) < 0)
    return -1;
  int rc = img_template_list (ctx->images, &ts, &n, err);
  atomic_fetch_sub (&lists, 1);
  if (rc < 0)
    return -1;
  cleanup_free Sandbox__V1__TemplateInfo *pbs = calloc (n + 1, sizeof *pbs);
  cleanup_free Sandbox__V1__TemplateInfo **ptrs = calloc (n + 1, sizeof *ptrs);
  if (pbs == NULL || ptrs == NULL)
    return err_make (err, ENOMEM, "ListTemplates: out of memory");
  for (size_t i = 0; i < n; i++)
    {
      template_to_proto (&ts[i], &pbs[i]);
      ptrs[i] = &pbs[i];
    }
  Sandbox__V1__ListTemplatesResponse resp = SANDBOX__V1__LIST_TEMPLATES_RESPONSE__INIT;
  resp.n_templates = n;
  resp.templates = ptrs;
  return rpc_call_reply (call, &resp.base, err);
}

int
api_delete_template (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (no_templates (ctx, err) < 0
      || api_recv_request (call, &sandbox__v1__delete_template_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__DeleteTemplateRequest *req = (Sandbox__V1__DeleteTemplateRequest *) m;
  if (img_template_delete (ctx->images, req->name, err) < 0)
    return -1;
  log_fields (SEV_INFO, json_pack ("{s:s}", "template", req->name), "template deleted");
  Sandbox__V1__DeleteTemplateResponse resp = SANDBOX__V1__DELETE_TEMPLATE_RESPONSE__INIT;
  return rpc_call_reply (call, &resp.base, err);
}
