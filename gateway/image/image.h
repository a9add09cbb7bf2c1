/* image: the gateway's OCI images — pulled over the distribution API
 * (registry.c), every blob verified against its SHA-256 digest before it
 * is used, each layer unpacked once, unprivileged (runtime/layer.c), into
 * a content-addressed directory of the state directory, and shared by
 * every sandbox on an image that has it as an overlay lower layer.
 *
 * On disk, under <state>/images:
 *   layers/<hex>      a layer, unpacked (named for its blob's digest)
 *   manifests/<hex>   what a pulled image is: a JSON record of its
 *                     reference, layers and config defaults (Env,
 *                     WorkingDir, User), written last, atomically
 *   refs/<hex>        reference -> manifest digest (hex of the ref's SHA-256)
 *   tmp/              blobs being fetched, layers being unpacked; emptied
 *                     at start: nothing half-made is ever used
 *
 * Threading: any thread. Pulls of different images run side by side; one
 * reference, and one layer, is pulled by one pull at a time (the others
 * wait, until their own deadlines, and then find it cached); removals and
 * evictions run alone (image/gate.h). Concurrent launches of one uncached
 * image pull it once. */
#ifndef SBX_GATEWAY_IMAGE_H
#define SBX_GATEWAY_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "gateway/runtime/runtime.h"
#include "gateway/store/store.h"

/* Caps on what a registry chooses (named in errors). */
#define IMG_MANIFEST_MAX (4 * 1024 * 1024) /* a manifest or an index */
#define IMG_CONFIG_MAX (4 * 1024 * 1024)   /* an image config */
#define IMG_MAX_LAYERS 128                 /* layers of one image */
#define IMG_LAYER_MAX (8ULL << 30)         /* one compressed layer */
#define IMG_TOTAL_MAX (32ULL << 30)        /* all compressed layers of an image */
#define IMG_MAX_ENV 1024                   /* Env entries of a config */
#define IMG_UNPACK_MS (30 * 60 * 1000)     /* unpacking one layer */
#define IMG_PULL_MAX_MS (60 * 60 * 1000)   /* one pull, whatever its call's deadline */
#define IMG_REMOVE_WAIT_S 30               /* a removal waiting for a pull */

typedef struct img_cache_s img_cache_t;

typedef struct img_cache_opts_s
{
  const char *state_dir;           /* SANDBOX_STATE_DIR */
  const char *auth_file;           /* SANDBOX_REGISTRY_AUTH_FILE, or NULL */
  const char *insecure_registries; /* SANDBOX_INSECURE_REGISTRIES, or NULL */
  const char *ca_file;             /* SANDBOX_REGISTRY_CA, or NULL: the system's roots */
  sbx_runtime_t *rt;               /* unpacks layers; lists users */
  long cache_mb;                   /* SANDBOX_IMAGE_CACHE_MB: the layers' budget on disk (evict.c); 0: none */
  snap_store_t *store;             /* where templates live (template.c); NULL: no templates */
  /* SANDBOX_REGISTRY_GOOGLE_HOSTS: registries (fnmatch patterns, comma
   * separated) that SANDBOX_REGISTRY_AUTH_FILE has no entry for and that
   * get Google credentials instead — user `oauth2accesstoken`, an access
   * token from `google_token` as the password (Artifact Registry's login). */
  const char *google_hosts;
  int (*google_token) (void *ctx, char **token, err_t *err); /* NULL: none */
  void (*google_token_put) (char *token);
  void *google_ctx;
} img_cache_opts_t;

/* Strings are copied. */
int img_cache_new (const img_cache_opts_t *o, img_cache_t **out, err_t *err);
void img_cache_free (img_cache_t *c);

/* A pulled image, as a launch uses it. */
typedef struct img_s
{
  char ref[SBX_IMAGE_REF_MAX + 1];
  char digest[SBX_IMAGE_DIGEST_MAX + 1]; /* sha256:<hex> of its manifest */
  char *layers;                          /* layer directories, top first, ':'-separated */
  unsigned n_layers;
  uint64_t bytes; /* compressed bytes of its layers */
  char **env;     /* config Env, "K=V", NULL-terminated */
  char *workdir;  /* config WorkingDir, or NULL */
  char *user;     /* config User, or NULL */
  char gen[48];   /* a template's: the version of its layout in the store; "" for an image */
  /* A template made on the default image: its one layer is unpacked as
   * the sandbox's writable layer over SANDBOX_ROOTFS (img_top_layer). */
  bool on_rootfs;
} img_t;

void img_release (img_t *img);

typedef struct img_progress_s
{
  unsigned layers_done, layers_total;
  uint64_t bytes_done, bytes_total;
} img_progress_t;

/* Told after every layer (may be NULL). */
typedef void (*img_progress_fn) (void *ctx, const img_progress_t *p);

typedef struct img_pull_opts_s
{
  int64_t deadline_mono_ms;
  bool (*cancelled) (void *ctx); /* may be NULL */
  void *cancel_ctx;
  img_progress_fn progress;
  void *progress_ctx;
  /* A reference by tag is resolved at the registry again even when it
   * was pulled before (PullImage); else the cached one is used. */
  bool refresh;
} img_pull_opts_t;

/* Makes `ref` (an OCI reference, or `template:<name>`) available and
 * describes it into *out.
 * EINVAL bad reference or hostile image (named), EREMOTEIO the registry
 * refused, ETIMEDOUT, ECANCELED. */
int img_pull (img_cache_t *c, const char *ref, const img_pull_opts_t *o, img_t *out, err_t *err);

/* The cached image whose manifest digest is `digest` ("sha256:<hex>").
 * ENOENT not cached. */
int img_get (img_cache_t *c, const char *digest, img_t *out, err_t *err);

/* Every cached image (release each, free the array). */
int img_list (img_cache_t *c, img_t **out, size_t *n, err_t *err);

/* Removes image `ref` (a reference as pulled, or its digest) and the
 * layers no other image has. ENOENT not cached, EBUSY a live sandbox
 * runs on it. */
int img_remove (img_cache_t *c, const char *ref, err_t *err);

/* The ids a command on `img` runs as, from its config User (`uid`,
 * `uid:gid`, `name`, `name:group`, names looked up in the image's own
 * /etc/passwd and /etc/group; a name without a group takes its primary
 * group): *set false when it has none or it is root. EINVAL naming a name
 * the image does not have. */
int img_user_ids (const img_t *img, bool *set, uint32_t *uid, uint32_t *gid, err_t *err);

/* A command's environment on image `img`: the image's Env, then `req`
 * ("K=V", NULL-terminated, may be NULL) — a request's own value of a
 * variable wins. Caller frees (img_env_free). */
int img_env_merge (const img_t *img, char *const *req, char ***out, err_t *err);
void img_env_free (char **env);

/* ---- templates (template.c) ----------------------------------------------
 *
 * A template is a sandbox's writable layer made a read-only layer on top of
 * the image the sandbox ran on, stored through the snapshot store as an OCI
 * image layout under <prefix>templates/<name>/ (oci-layout, index.json,
 * blobs/sha256/<hex>: the image's own blobs as pulled, the new layer as an
 * uncompressed tar, a config and a manifest), so that every gateway sharing
 * the store launches from it (`template:<name>`: pulled from the store like
 * an image from a registry, every blob verified) and `skopeo copy
 * oci:<dir>:<name>` takes it anywhere. index.json is written last: a
 * template is there whole or not at all. A template made on the default
 * image (SANDBOX_ROOTFS) holds only its own layer, marked
 * IMG_ANNOTATION_BASE=rootfs, and runs over the default image of the
 * gateway that launches it: that layer is unpacked as each sandbox's
 * writable layer, as a restore is (overlayfs refuses a lower layer inside
 * another, and the cache usually lies inside the default image's tree).
 * A template of such a sandbox is again one layer over the default
 * image. */

#define IMG_TEMPLATE_NAME_MAX 63
#define IMG_MAX_TEMPLATES 1000 /* listed at most */
#define IMG_TEMPLATE_PREFIX "template:"
#define IMG_ANNOTATION_BASE "io.sandbox-gateway.base"

typedef struct img_template_s
{
  char name[IMG_TEMPLATE_NAME_MAX + 1];
  char digest[SBX_IMAGE_DIGEST_MAX + 1];      /* its manifest */
  char base[SBX_IMAGE_REF_MAX + 1];           /* the image it was made on; "" the default */
  char base_digest[SBX_IMAGE_DIGEST_MAX + 1]; /* that image's manifest; "" the default */
  char sandbox_id[72];                        /* the sandbox it was made from */
  int64_t created_ms;
  uint64_t bytes; /* its layers, as stored */
  unsigned n_layers;
} img_template_t;

/* The name of `template:<name>` (NULL when `ref` is not one). */
const char *img_template_of (const char *ref);
/* `^[a-z0-9][a-z0-9._-]*$`, at most IMG_TEMPLATE_NAME_MAX. */
bool img_template_name_valid (const char *name);

/* A file for a template's new layer (an uncompressed tar), under the
 * cache's tmp/, into path (PATH_MAX): open for writing, -1 with *err. */
int img_template_tmp (img_cache_t *c, char *path, err_t *err);

/* Makes template `name` from the layer written to `layer_path` (see
 * img_template_tmp; taken over: gone after the call), `bytes` long, SHA-256
 * `hex`, on image `base_digest` ("": the default image): stored, then
 * recorded in the cache with its layer unpacked. EEXIST the name is taken,
 * ENOENT the base is not cached, EINVAL a bad name. */
int img_template_create (img_cache_t *c, const char *name, const char *base_digest, const char *layer_path,
                         uint64_t bytes, const char *hex, const char *sandbox_id, img_template_t *out, err_t *err);

/* Opens the blob of `img`'s top layer (for an on_rootfs template). */
int img_top_layer (img_cache_t *c, const img_t *img, int *fd, err_t *err);

/* The templates in the store (free the array). */
int img_template_list (img_cache_t *c, img_template_t **out, size_t *n, err_t *err);

/* Deletes template `name` from the store (index.json first), and its record
 * from the cache when no live sandbox runs on it. ENOENT none. */
int img_template_delete (img_cache_t *c, const char *name, err_t *err);

#endif
