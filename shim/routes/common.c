/* routes/common: what the REST routes share — unary gateway calls with the
 * shim's credentials, base64, boolean query parameters. No state. */
#include <openssl/evp.h>
#include <stdlib.h>

#include "shim/routes/routes.h"

int
route_unary (const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
             ProtobufCMessage **resp, rpc_status_t *st, int64_t timeout_ms)
{
  err_t err = ERR_INIT;
  int rc = rpc_client_unary (shim.channel, method, timeout_ms, shim.md, shim.n_md, req, desc, resp, st, &err);
  err_release (&err);
  return rc;
}

char *
route_base64 (const uint8_t *data, size_t len)
{
  char *out = malloc (4 * ((len + 2) / 3) + 1);
  if (out != NULL)
    EVP_EncodeBlock ((unsigned char *) out, data, (int) len);
  return out;
}

/* Reads the boolean query parameter `name` into *out (unchanged when
 * absent). NULL when fine; otherwise the 422 body (the caller owns it). */
json_t *
route_query_bool (shim_req_t *r, const char *name, bool *out)
{
  const char *q = MHD_lookup_connection_value (r->conn, MHD_GET_ARGUMENT_KIND, name);
  if (q == NULL || shim_parse_bool_text (q, out) == 0)
    return NULL;
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "bool_parsing", "query", name, "Input should be a valid boolean");
  return shim_errors_take (&e);
}
