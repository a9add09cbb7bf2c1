/* api/image: the handlers of the image methods — PullImage, ListImages,
 * RemoveImage — and what Launch, Exec and Run take from an image: its
 * layers, and its config's Env and WorkingDir as defaults. No state: the
 * cache is the service context's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/api/internal.h"
#include "gateway/image/image.h"
#include "gateway/image/ref.h"

/* A pull ends this long before its call's deadline, so that the caller
 * learns which image timed out and why (at most a quarter of the call's
 * time). */
#define PULL_DEADLINE_MARGIN_MS 1000

static int64_t
deadline_of (rpc_call_t *call)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  int64_t left = rpc_call_deadline_ms_left (call);
  if (left > IMG_PULL_MAX_MS)
    left = IMG_PULL_MAX_MS;
  left -= left / 4 < PULL_DEADLINE_MARGIN_MS ? left / 4 : PULL_DEADLINE_MARGIN_MS;
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + left;
}

static bool
call_cancelled (void *ctx)
{
  return rpc_call_cancelled ((rpc_call_t *) ctx);
}

static int
no_images (const api_ctx_t *ctx, err_t *err)
{
  return ctx->images == NULL ? err_make (err, ENOSYS, "this gateway has no image cache") : 0;
}

/* A template's layer as a restore's source: the file, piece by piece. */
typedef struct layer_src_s
{
  int fd;
  uint8_t *buf;
} layer_src_t;

#define LAYER_PIECE (1024 * 1024)

static int
layer_next (void *ctx, struct iovec *iov, int *n, err_t *err)
{
  layer_src_t *l = ctx;
  ssize_t got = TEMP_FAILURE_RETRY (read (l->fd, l->buf, LAYER_PIECE));
  if (got < 0)
    return err_make_sys (err, errno, "read the template's layer");
  if (got == 0)
    return 0;
  iov[0] = (struct iovec){.iov_base = l->buf, .iov_len = (size_t) got};
  *n = 1;
  return 1;
}

/* Launches `id` on `img` (with the writable layer from `src` when given).
 * A template made on the default image runs over it, its one layer
 * unpacked as the writable layer unless `src` (a snapshot of a sandbox on
 * it, which holds that layer's files already) is. */
static int
launch_on (const api_ctx_t *ctx, const char *id, const sbx_spec_t *spec, const img_t *img, const char *ref,
           sbx_source_fn src, void *src_ctx, sbx_info_t *info, err_t *err)
{
  sbx_image_t si = {.ref = ref, .digest = img->digest, .layers = img->on_rootfs ? NULL : img->layers};
  if (!img->on_rootfs || src != NULL)
    return sbx_launch_spec (ctx->rt, id, spec, &si, src, src_ctx, info, err);
  layer_src_t l = {.fd = -1, .buf = malloc (LAYER_PIECE)};
  int rc = l.buf == NULL ? err_make (err, ENOMEM, "out of memory") : img_top_layer (ctx->images, img, &l.fd, err);
  if (rc == 0)
    rc = sbx_launch_spec (ctx->rt, id, spec, &si, layer_next, &l, info, err);
  if (l.fd >= 0)
    close (l.fd);
  free (l.buf);
  return rc;
}

int
api_launch_on_image (rpc_call_t *call, const api_ctx_t *ctx, const char *id, const sbx_spec_t *spec, const char *ref,
                     sbx_info_t *info, err_t *err)
{
  return api_restore_on_image (call, ctx, id, spec, ref, NULL, NULL, info, err);
}

int
api_restore_on_image (rpc_call_t *call, const api_ctx_t *ctx, const char *id, const sbx_spec_t *spec, const char *ref,
                      sbx_source_fn src, void *src_ctx, sbx_info_t *info, err_t *err)
{
  if (no_images (ctx, err) < 0)
    return -1;
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id: ids match ^[A-Za-z0-9][A-Za-z0-9_-]*$, at most 64 characters");
  img_t img;
  img_pull_opts_t po = {.deadline_mono_ms = deadline_of (call), .cancelled = call_cancelled, .cancel_ctx = call};
  if (img_pull (ctx->images, ref, &po, &img, err) < 0)
    return -1;
  int rc = launch_on (ctx, id, spec, &img, img.ref, src, src_ctx, info, err);
  img_release (&img);
  return rc;
}

int
api_restore_recorded (rpc_call_t *call, const api_ctx_t *ctx, const char *id, bool egress, const char *ref,
                      const char *digest, sbx_source_fn src, void *src_ctx, sbx_info_t *info, err_t *err)
{
  if (no_images (ctx, err) < 0)
    return err_wrap (err, "restore `%s` on its image `%s`", id, ref);
  img_t img;
  if (img_get (ctx->images, digest, &img, err) < 0)
    {
      if (err->status != ENOENT)
        return -1;
      err_release (err);
      /* Not cached here (another gateway took the snapshot, or the image
       * was removed): pulled again, pinned to the digest recorded (a
       * template as the store has it, checked below). */
      img_ref_t r;
      char pinned[IMG_HOST_MAX + IMG_REPO_MAX + 80];
      if (img_template_of (ref) != NULL)
        snprintf (pinned, sizeof pinned, "%s", ref);
      else if (img_ref_parse (ref, &r, err) < 0)
        return err_wrap (err, "restore `%s`: its recorded image", id);
      else
        snprintf (pinned, sizeof pinned, "%s/%s@%s", r.host, r.repo, digest);
      img_pull_opts_t po = {.deadline_mono_ms = deadline_of (call), .cancelled = call_cancelled, .cancel_ctx = call};
      if (img_pull (ctx->images, pinned, &po, &img, err) < 0)
        return err_wrap (err, "restore `%s` on its image `%s`", id, ref);
    }
  sbx_spec_t spec = {.allow_egress = egress, .persist_on_expiry = -1};
  int rc = strcmp (img.digest, digest) != 0
               ? err_make (err, EIO, "restore `%s`: image `%s` is %s, not the %s its snapshot was taken on", id, ref,
                           img.digest, digest)
               : launch_on (ctx, id, &spec, &img, ref, src, src_ctx, info, err);
  img_release (&img);
  return rc;
}

int
api_image_user (const api_ctx_t *ctx, const char *id, bool *as_user, uint32_t *uid, uint32_t *gid, err_t *err)
{
  *as_user = false;
  sbx_info_t info;
  err_t ignored = ERR_INIT;
  if (ctx->images == NULL || sbx_get (ctx->rt, id, &info, &ignored) < 0 || info.image_digest[0] == '\0')
    {
      err_release (&ignored); /* the call itself reports an unknown sandbox */
      return 0;
    }
  img_t img;
  if (img_get (ctx->images, info.image_digest, &img, err) < 0)
    return err_wrap (err, "sandbox `%s`: its image", id);
  int rc = img_user_ids (&img, as_user, uid, gid, err);
  img_release (&img);
  return rc;
}

int
api_image_defaults (const api_ctx_t *ctx, const char *id, char *const *env, char ***env_out, char **cwd_out,
                    sbx_exec_req_t *user_out, err_t *err)
{
  *env_out = NULL;
  *cwd_out = NULL;
  sbx_info_t info;
  err_t ignored = ERR_INIT;
  if (ctx->images == NULL || sbx_get (ctx->rt, id, &info, &ignored) < 0 || info.image_digest[0] == '\0')
    {
      err_release (&ignored); /* the call itself reports an unknown sandbox */
      return 0;
    }
  /* The image's Env lies beneath the launch environment, which lies
   * beneath the call's own. */
  cleanup_free char **launch_env = NULL;
  if (sbx_env_overlay (ctx->rt, id, env, &launch_env, err) < 0)
    return -1;
  img_t img;
  if (img_get (ctx->images, info.image_digest, &img, err) < 0)
    return err_wrap (err, "sandbox `%s`: its image", id);
  int rc = img_env_merge (&img, launch_env != NULL ? launch_env : env, env_out, err);
  if (rc == 0 && img.workdir != NULL)
    *cwd_out = take_ptr (&img.workdir);
  if (rc == 0)
    rc = img_user_ids (&img, &user_out->as_user, &user_out->uid, &user_out->gid, err);
  img_release (&img);
  return rc;
}

/* ---- PullImage -------------------------------------------------------------- */

typedef struct pull_call_s
{
  rpc_call_t *call;
  bool gone;
} pull_call_t;

static void
pull_progress (void *ctx, const img_progress_t *p)
{
  pull_call_t *pc = ctx;
  if (pc->gone)
    return;
  Sandbox__V1__PullProgress ev = SANDBOX__V1__PULL_PROGRESS__INIT;
  ev.layers_done = p->layers_done;
  ev.layers_total = p->layers_total;
  ev.bytes_done = p->bytes_done;
  ev.bytes_total = p->bytes_total;
  err_t err = ERR_INIT;
  if (rpc_call_send (pc->call, &ev.base, &err) < 0)
    pc->gone = true; /* the pull stops at its next check */
  err_release (&err);
}

static bool
pull_cancelled (void *ctx)
{
  pull_call_t *pc = ctx;
  return pc->gone || rpc_call_cancelled (pc->call);
}

int
api_pull_image (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (no_images (ctx, err) < 0 || api_recv_request (call, &sandbox__v1__pull_image_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__PullImageRequest *req = (Sandbox__V1__PullImageRequest *) m;
  pull_call_t pc = {.call = call};
  img_pull_opts_t po = {.deadline_mono_ms = deadline_of (call),
                        .cancelled = pull_cancelled,
                        .cancel_ctx = &pc,
                        .progress = pull_progress,
                        .progress_ctx = &pc,
                        .refresh = true};
  img_t img;
  if (img_pull (ctx->images, req->image, &po, &img, err) < 0)
    return -1;
  log_fields (SEV_INFO, json_pack ("{s:s, s:s, s:i}", "image", img.ref, "digest", img.digest, "layers", img.n_layers),
              "image pulled");
  Sandbox__V1__PullProgress ev = SANDBOX__V1__PULL_PROGRESS__INIT;
  ev.layers_done = ev.layers_total = img.n_layers;
  ev.bytes_done = ev.bytes_total = img.bytes;
  ev.done = true;
  ev.image_digest = img.digest;
  int rc = rpc_call_send (call, &ev.base, err);
  img_release (&img);
  return rc;
}

/* ---- ListImages, RemoveImage ------------------------------------------------ */

int
api_list_images (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (no_images (ctx, err) < 0 || api_recv_request (call, &sandbox__v1__list_images_request__descriptor, &m, err) < 0)
    return -1;
  img_t *imgs = NULL;
  size_t n = 0;
  cleanup_free sbx_info_t *infos = NULL;
  size_t ns = 0;
  if (img_list (ctx->images, &imgs, &n, err) < 0 || sbx_list (ctx->rt, &infos, &ns, err) < 0)
    {
      for (size_t i = 0; i < n; i++)
        img_release (&imgs[i]);
      free (imgs);
      return -1;
    }
  cleanup_free Sandbox__V1__ImageInfo *pbs = calloc (n + 1, sizeof *pbs);
  cleanup_free Sandbox__V1__ImageInfo **ptrs = calloc (n + 1, sizeof *ptrs);
  int rc = pbs == NULL || ptrs == NULL ? err_make (err, ENOMEM, "ListImages: out of memory") : 0;
  for (size_t i = 0; rc == 0 && i < n; i++)
    {
      sandbox__v1__image_info__init (&pbs[i]);
      pbs[i].image = imgs[i].ref;
      pbs[i].image_digest = imgs[i].digest;
      pbs[i].layers = imgs[i].n_layers;
      pbs[i].size_bytes = imgs[i].bytes;
      for (size_t j = 0; j < ns; j++)
        pbs[i].sandboxes += strcmp (infos[j].image_digest, imgs[i].digest) == 0;
      ptrs[i] = &pbs[i];
    }
  if (rc == 0)
    {
      Sandbox__V1__ListImagesResponse resp = SANDBOX__V1__LIST_IMAGES_RESPONSE__INIT;
      resp.n_images = n;
      resp.images = ptrs;
      rc = rpc_call_reply (call, &resp.base, err);
    }
  for (size_t i = 0; i < n; i++)
    img_release (&imgs[i]);
  free (imgs);
  return rc;
}

int
api_remove_image (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (no_images (ctx, err) < 0
      || api_recv_request (call, &sandbox__v1__remove_image_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__RemoveImageRequest *req = (Sandbox__V1__RemoveImageRequest *) m;
  if (img_remove (ctx->images, req->image, err) < 0)
    return -1;
  Sandbox__V1__RemoveImageResponse resp = SANDBOX__V1__REMOVE_IMAGE_RESPONSE__INIT;
  return rpc_call_reply (call, &resp.base, err);
}
