/* routes/images: the image routes — GET /images, POST /images/pull (the
 * pull's progress as NDJSON lines), DELETE /images/{ref} — and nothing of
 * the sandboxes (POST /sandboxes takes "image" in sandboxes.c). Every
 * gateway of the set has its own layer cache: a pull and a removal go to
 * each serving gateway, a listing comes from the first. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/members.h"
#include "shim/routes/routes.h"

/* Most gateways one image route reaches. */
#define IMAGE_MAX_GATEWAYS 64
/* Longest an image pull may take through the shim. */
#define IMAGE_PULL_CALL_MS (30 * 60 * 1000)
/* Longest image reference. */
#define IMAGE_REF_MAX 255

static size_t
serving (rpc_channel_t **chs, const char **names)
{
  return members_serving (chs, names, IMAGE_MAX_GATEWAYS);
}

struct MHD_Response *
route_images_list (shim_req_t *r, unsigned *status)
{
  (void) r;
  rpc_channel_t *chs[IMAGE_MAX_GATEWAYS];
  const char *names[IMAGE_MAX_GATEWAYS];
  if (serving (chs, names) == 0)
    return shim_detail (503, "No gateway is serving", status);
  Sandbox__V1__ListImagesRequest req = SANDBOX__V1__LIST_IMAGES_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary_on (chs[0], "/sandbox.v1.Sandbox/ListImages", &req.base,
                      &sandbox__v1__list_images_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
      == 0)
    {
      const Sandbox__V1__ListImagesResponse *l = (const Sandbox__V1__ListImagesResponse *) resp;
      json_t *arr = json_array ();
      for (size_t i = 0; i < l->n_images; i++)
        {
          const Sandbox__V1__ImageInfo *im = l->images[i];
          json_array_append_new (arr, json_pack ("{s:s, s:s, s:i, s:I, s:i}", "image", im->image, "image_digest",
                                                 im->image_digest, "layers", (int) im->layers, "size_bytes",
                                                 (json_int_t) im->size_bytes, "sandboxes", (int) im->sandboxes));
        }
      out = shim_json (json_pack ("{s:o}", "images", arr), 200, status);
    }
  else
    out = shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

/* One gateway's pull, its progress appended to `lines` as JSON objects. */
static grpc_status_code
pull_on (rpc_channel_t *ch, const char *image, json_t *lines, rpc_status_t *st)
{
  Sandbox__V1__PullImageRequest req = SANDBOX__V1__PULL_IMAGE_REQUEST__INIT;
  req.image = (char *) image;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (ch, "/sandbox.v1.Sandbox/PullImage", IMAGE_PULL_CALL_MS, shim.md, shim.n_md, &c, &err) == 0
      && rpc_client_send (c, &req.base, &err) == 0 && rpc_client_close_send (c, &err) == 0)
    for (;;)
      {
        ProtobufCMessage *m = NULL;
        if (rpc_client_recv (c, &sandbox__v1__pull_progress__descriptor, &m, &err) <= 0)
          break;
        const Sandbox__V1__PullProgress *p = (const Sandbox__V1__PullProgress *) m;
        json_array_append_new (
            lines, json_pack ("{s:i, s:i, s:I, s:I, s:b, s:s}", "layers_done", (int) p->layers_done, "layers_total",
                              (int) p->layers_total, "bytes_done", (json_int_t) p->bytes_done, "bytes_total",
                              (json_int_t) p->bytes_total, "done", p->done, "image_digest", p->image_digest));
        protobuf_c_message_free_unpacked (m, NULL);
      }
  err_release (&err);
  grpc_status_code code = c != NULL ? rpc_client_finish (c, st) : GRPC_STATUS_UNAVAILABLE;
  rpc_client_destroy (c);
  return code;
}

/* The "image" of a JSON body, checked; NULL with the 422 in *bad. */
static const char *
image_of (json_t *root, json_t **bad)
{
  json_t *im = json_object_get (root, "image");
  const char *s = json_string_value (im);
  if (s == NULL || s[0] == '\0' || strlen (s) > IMAGE_REF_MAX)
    {
      *bad = json_pack ("{s:[{s:s, s:[s, s], s:s}]}", "detail", "type", "string_type", "loc", "body", "image", "msg",
                        "image must be a reference of 1 to 255 characters");
      return NULL;
    }
  return s;
}

struct MHD_Response *
route_image_pull (shim_req_t *r, unsigned *status)
{
  json_error_t jerr;
  json_t *root = json_loadb (r->body != NULL ? r->body : "", r->len, 0, &jerr), *bad = NULL;
  const char *image = json_is_object (root) ? image_of (root, &bad) : NULL;
  if (image == NULL)
    {
      json_decref (root);
      return bad != NULL ? shim_json (bad, 422, status) : shim_detail (422, "the body must be a JSON object", status);
    }
  rpc_channel_t *chs[IMAGE_MAX_GATEWAYS];
  const char *names[IMAGE_MAX_GATEWAYS];
  size_t n = serving (chs, names);
  json_t *lines = json_array ();
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = n == 0 ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_OK;
  for (size_t i = 0; i < n && code == GRPC_STATUS_OK; i++)
    {
      rpc_status_release (&st);
      code = pull_on (chs[i], image, lines, &st);
    }
  json_decref (root);
  struct MHD_Response *out;
  if (code != GRPC_STATUS_OK)
    {
      json_decref (lines);
      out = shim_gateway_error (code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  rpc_status_release (&st);
  /* The progress, one JSON object a line (at most a few per layer, and an
   * image has at most 128 layers per gateway). */
  size_t cap = 0, len = 0;
  char *text = NULL;
  FILE *f = open_memstream (&text, &cap);
  for (size_t i = 0; f != NULL && i < json_array_size (lines); i++)
    {
      char *line = json_dumps (json_array_get (lines, i), JSON_COMPACT);
      if (line != NULL)
        fprintf (f, "%s\n", line);
      free (line);
    }
  if (f != NULL)
    fclose (f);
  json_decref (lines);
  len = text != NULL ? strlen (text) : 0;
  out = MHD_create_response_from_buffer (len, text != NULL ? text : (char *) "",
                                         text != NULL ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header (out, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-ndjson");
  *status = 200;
  return out;
}

/* The reference after "/images/" in the request target, %-decoded, into
 * dst; false when there is none or it is too long. */
static bool
ref_of (const shim_req_t *r, char *dst, size_t cap)
{
  const char *p = r->uri != NULL ? strstr (r->uri, "/images/") : NULL;
  if (p == NULL)
    return false;
  p += strlen ("/images/");
  size_t n = 0;
  for (; *p && *p != '?'; p++)
    {
      char c = *p;
      if (c == '%' && p[1] && p[2])
        {
          char hex[3] = {p[1], p[2], 0};
          c = (char) strtol (hex, NULL, 16);
          p += 2;
        }
      if (n + 1 >= cap || c == '\0')
        return false;
      dst[n++] = c;
    }
  dst[n] = '\0';
  return n > 0;
}

struct MHD_Response *
route_image_delete (shim_req_t *r, unsigned *status)
{
  char ref[IMAGE_REF_MAX + 1];
  if (!ref_of (r, ref, sizeof ref))
    return shim_detail (422, "DELETE /images/{ref}: a reference of 1 to 255 characters", status);
  rpc_channel_t *chs[IMAGE_MAX_GATEWAYS];
  const char *names[IMAGE_MAX_GATEWAYS];
  size_t n = serving (chs, names), removed = 0;
  Sandbox__V1__RemoveImageRequest req = SANDBOX__V1__REMOVE_IMAGE_REQUEST__INIT;
  req.image = ref;
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code worst = n == 0 ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_NOT_FOUND;
  for (size_t i = 0; i < n; i++)
    {
      ProtobufCMessage *resp = NULL;
      rpc_status_t one = RPC_STATUS_INIT;
      if (route_unary_on (chs[i], "/sandbox.v1.Sandbox/RemoveImage", &req.base,
                          &sandbox__v1__remove_image_response__descriptor, &resp, &one, ROUTE_SHORT_CALL_MS)
          == 0)
        removed++;
      else if (one.code != GRPC_STATUS_NOT_FOUND)
        {
          worst = one.code; /* in use somewhere, or a gateway failed: say so */
          rpc_status_release (&st);
          st = one;
          one = (rpc_status_t) RPC_STATUS_INIT;
        }
      rpc_status_release (&one);
      if (resp != NULL)
        protobuf_c_message_free_unpacked (resp, NULL);
    }
  struct MHD_Response *out;
  if (worst == GRPC_STATUS_NOT_FOUND && removed > 0)
    out = shim_empty (204, status);
  else if (worst == GRPC_STATUS_NOT_FOUND)
    out = shim_detail (404, "Image not found", status);
  else
    out = shim_gateway_error (worst, &st, status);
  rpc_status_release (&st);
  return out;
}
