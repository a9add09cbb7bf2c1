/* image/registry: the client side of the OCI distribution API over
 * libcurl, for one repository of one registry at a time: GET of
 * manifests and blobs with the registry's auth (anonymous; HTTP Basic; the
 * bearer-token flow of `WWW-Authenticate: Bearer realm=…,service=…,scope=…`
 * with optional Basic credentials from a Docker config.json), TLS verified
 * (plain HTTP only for registries named insecure), redirects followed by
 * hand so that a blob redirect to another host never carries the
 * registry's Authorization. Every request has a deadline, a low-speed
 * timeout and a byte cap; the caller's sink gets the body of a 200 only.
 * One img_reg_t per pull, used by one thread. */
#ifndef SBX_GATEWAY_IMAGE_REGISTRY_H
#define SBX_GATEWAY_IMAGE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Longest WWW-Authenticate, Location or Content-Type header kept. */
#define IMG_HEADER_MAX 2048
/* Most redirects one blob request follows. */
#define IMG_MAX_REDIRECTS 4
/* Longest a registry may take to accept a connection, in seconds. */
#define IMG_CONNECT_SECONDS 10
/* A transfer slower than IMG_LOW_SPEED_BYTES a second for
 * IMG_LOW_SPEED_SECONDS is given up (a registry that trickles). */
#define IMG_LOW_SPEED_BYTES 1024
#define IMG_LOW_SPEED_SECONDS 20
/* Most bytes of a token answer or an error body read. */
#define IMG_SMALL_BODY_MAX (64 * 1024)

typedef struct img_reg_s img_reg_t;

/* Where a 200's body goes: 0 ok, -1 stop (the request then fails EINVAL
 * unless the sink set its own error). */
typedef int (*img_sink_fn) (void *ctx, const uint8_t *data, size_t len);
/* Polled during transfers: true stops them (ECANCELED). */
typedef bool (*img_cancelled_fn) (void *ctx);

typedef struct img_reg_opts_s
{
  const char *host; /* registry host[:port] */
  const char *repo; /* repository path */
  bool insecure;    /* plain HTTP */
  /* SANDBOX_INSECURE_REGISTRIES (or NULL): the only hosts a plain-HTTP
   * redirect or token realm may lead to (an https one goes anywhere, its
   * certificate verified) */
  const char *plain_hosts;
  const char *basic_b64;    /* base64 of user:password, or NULL */
  const char *ca_file;      /* SANDBOX_REGISTRY_CA: PEM roots TLS is verified against, or NULL: the system's */
  int64_t deadline_mono_ms; /* no request runs past it */
  img_cancelled_fn cancelled;
  void *cancel_ctx;
  const char *image; /* the reference, for messages */
} img_reg_opts_t;

/* Whether `host` (host[:port]) is in the comma-separated `list`. */
bool img_reg_host_listed (const char *list, const char *host);

/* Strings in `o` are copied. */
int img_reg_new (const img_reg_opts_t *o, img_reg_t **out, err_t *err);
void img_reg_free (img_reg_t *r);

/* GETs /v2/<repo>/<kind>/<ref> ("manifests" or "blobs") with `accept`
 * (may be NULL), giving at most `max` body bytes to `sink`; a longer body
 * fails EINVAL naming the cap. *content_type gets the answer's
 * media type (IMG_HEADER_MAX). Errors: EINVAL bad answer, EREMOTEIO the
 * registry refused (not found, unauthorized), ETIMEDOUT its deadline,
 * ECANCELED. */
int img_reg_get (img_reg_t *r, const char *kind, const char *ref, const char *accept, uint64_t max, img_sink_fn sink,
                 void *ctx, char *content_type, err_t *err);

#endif
