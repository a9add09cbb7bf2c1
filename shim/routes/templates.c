/* routes/templates: POST /templates {"sandbox_id", "name"} (CreateTemplate,
 * on the gateway the sandbox's id routes to), GET /templates
 * (ListTemplates: the store is shared, so one gateway answers for all) and
 * DELETE /templates/{name}. A launch from one is POST /sandboxes with
 * "image": "template:<name>" (sandboxes.c). */
#include <stdio.h>
#include <string.h>

#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/members.h"
#include "shim/routes/routes.h"

/* A template's creation copies the sandbox's layer into the store. */
#define TEMPLATE_CALL_MS (30 * 60 * 1000)
/* Longest name the gateway takes (it checks the syntax). */
#define TEMPLATE_NAME_MAX 63
#define TEMPLATE_ID_MAX 64

static json_t *
template_json (const Sandbox__V1__TemplateInfo *t)
{
  return json_pack ("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:i}", "name", t->name, "image_digest", t->image_digest,
                    "base_image", t->base_image, "base_image_digest", t->base_image_digest, "sandbox_id",
                    t->sandbox_id, "created_at_unix_ms", (json_int_t) t->created_at_unix_ms, "size_bytes",
                    (json_int_t) t->size_bytes, "layers", (int) t->layers);
}

/* Body field `name` as a string of 1..max characters, or a 422 into *e. */
static const char *
field (json_t *root, const char *name, size_t max, shim_errors_t *e)
{
  const char *s = json_string_value (json_object_get (root, name));
  if (s == NULL || s[0] == '\0' || strlen (s) > max)
    {
      char msg[96];
      snprintf (msg, sizeof msg, "%s must be a string of 1 to %zu characters", name, max);
      shim_errors_add (e, "string_type", "body", name, msg);
      return NULL;
    }
  return s;
}

struct MHD_Response *
route_template_create (shim_req_t *r, unsigned *status)
{
  json_error_t jerr;
  json_t *root = json_loadb (r->body != NULL ? r->body : "", r->len, 0, &jerr);
  if (!json_is_object (root))
    {
      json_decref (root);
      return shim_detail (422, "the body must be a JSON object", status);
    }
  shim_errors_t e;
  shim_errors_init (&e);
  const char *sid = field (root, "sandbox_id", TEMPLATE_ID_MAX, &e);
  const char *name = field (root, "name", TEMPLATE_NAME_MAX, &e);
  if (sid == NULL || name == NULL)
    {
      json_decref (root);
      return shim_json (shim_errors_take (&e), 422, status);
    }
  shim_errors_release (&e);
  Sandbox__V1__CreateTemplateRequest req = SANDBOX__V1__CREATE_TEMPLATE_REQUEST__INIT;
  req.sandbox_id = (char *) sid;
  req.name = (char *) name;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary (sid, "/sandbox.v1.Sandbox/CreateTemplate", &req.base, &sandbox__v1__template_info__descriptor,
                   &resp, &st, TEMPLATE_CALL_MS)
      == 0)
    out = shim_json (template_json ((const Sandbox__V1__TemplateInfo *) resp), 201, status);
  else
    out = shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  json_decref (root);
  return out;
}

/* The first serving gateway (the store is shared by the set). */
static rpc_channel_t *
any_gateway (void)
{
  rpc_channel_t *chs[1];
  const char *names[1];
  return members_serving (chs, names, 1) == 1 ? chs[0] : NULL;
}

struct MHD_Response *
route_templates_list (shim_req_t *r, unsigned *status)
{
  (void) r;
  rpc_channel_t *ch = any_gateway ();
  if (ch == NULL)
    return shim_detail (503, "No gateway is serving", status);
  Sandbox__V1__ListTemplatesRequest req = SANDBOX__V1__LIST_TEMPLATES_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary_on (ch, "/sandbox.v1.Sandbox/ListTemplates", &req.base,
                      &sandbox__v1__list_templates_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
      == 0)
    {
      const Sandbox__V1__ListTemplatesResponse *l = (const Sandbox__V1__ListTemplatesResponse *) resp;
      json_t *arr = json_array ();
      for (size_t i = 0; i < l->n_templates; i++)
        json_array_append_new (arr, template_json (l->templates[i]));
      out = shim_json (json_pack ("{s:o}", "templates", arr), 200, status);
    }
  else
    out = shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

struct MHD_Response *
route_template_delete (shim_req_t *r, unsigned *status)
{
  const char *p = r->uri != NULL ? strstr (r->uri, "/templates/") : NULL;
  char name[TEMPLATE_NAME_MAX + 1];
  size_t n = p != NULL ? strcspn (p + strlen ("/templates/"), "?") : 0;
  if (n == 0 || n > TEMPLATE_NAME_MAX)
    return shim_detail (422, "DELETE /templates/{name}: a name of 1 to 63 characters", status);
  memcpy (name, p + strlen ("/templates/"), n);
  name[n] = '\0';
  rpc_channel_t *ch = any_gateway ();
  if (ch == NULL)
    return shim_detail (503, "No gateway is serving", status);
  Sandbox__V1__DeleteTemplateRequest req = SANDBOX__V1__DELETE_TEMPLATE_REQUEST__INIT;
  req.name = name;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary_on (ch, "/sandbox.v1.Sandbox/DeleteTemplate", &req.base,
                      &sandbox__v1__delete_template_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
      == 0)
    out = shim_empty (204, status);
  else if (st.code == GRPC_STATUS_NOT_FOUND)
    out = shim_detail (404, "Template not found", status);
  else
    out = shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}
