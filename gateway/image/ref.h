/* image/ref: OCI image references, parsed and checked: `[host[:port]/]repo
 * [:tag][@sha256:<64 hex>]`. A first component without a dot or a colon
 * (and not `localhost`) is a Docker Hub repository (`library/` added to a
 * single name). Pure functions. */
#ifndef SBX_GATEWAY_IMAGE_REF_H
#define SBX_GATEWAY_IMAGE_REF_H

#include "common/err.h"

#define IMG_HOST_MAX 253
#define IMG_REPO_MAX 255
#define IMG_TAG_MAX 128

typedef struct img_ref_s
{
  char host[IMG_HOST_MAX + 1]; /* as contacted: registry-1.docker.io for Docker Hub */
  char repo[IMG_REPO_MAX + 1];
  char tag[IMG_TAG_MAX + 1]; /* "latest" when neither tag nor digest is given */
  char digest[72];           /* "sha256:<hex>" or "" */
} img_ref_t;

/* EINVAL naming what is wrong with `ref`. */
int img_ref_parse (const char *ref, img_ref_t *out, err_t *err);

/* True for "sha256:" followed by 64 lower-case hex digits. */
int img_digest_valid (const char *d);

#endif
