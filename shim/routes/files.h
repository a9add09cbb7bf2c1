/* routes/files: what the file routes' two files share (files.c: metadata,
 * watch and the helpers; files_data.c: contents, GET and PUT). */
#ifndef SBX_SHIM_ROUTES_FILES_H
#define SBX_SHIM_ROUTES_FILES_H

#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/routes/routes.h"

/* The answer for a failed file call (`write`: RESOURCE_EXHAUSTED is the
 * sandbox's disk quota, 507). */
struct MHD_Response *file_error (grpc_status_code code, const rpc_status_t *st, bool write, unsigned *status);
/* The query parameter `name` as a path: NULL with a 422 body in *bad when
 * missing, empty or holding a NUL byte. */
const char *query_path (shim_req_t *r, const char *name, json_t **bad);
/* An unsigned query parameter in `base`, at most `max` (0 when absent):
 * NULL, or a 422 body. */
json_t *query_uint (shim_req_t *r, const char *name, int base, unsigned long max, unsigned long *out);
/* A FileInfo as JSON. */
json_t *info_json (const Sandbox__V1__FileInfo *i);

#endif
