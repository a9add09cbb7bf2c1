/* routes/files: the REST face of the file API — GET/PUT/DELETE
 * /sandboxes/{id}/files?path=… (raw bytes both ways, streamed; Range on
 * GET), GET …/files/stat and …/files/list, POST …/files/rename and
 * …/files/mkdir (JSON), GET …/files/watch (NDJSON events). Paths go to the
 * gateway as given: it is the sandbox that resolves them. State: per
 * request. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/files.h"

/* ---- shared ------------------------------------------------------------------- */

static void
cleanup_json_fn (json_t **j)
{
  json_decref (*j);
}
#define cleanup_json __attribute__ ((cleanup (cleanup_json_fn)))

/* The answer for a failed file call: the gateway's detail with 404, 409
 * (exists, is / is not a directory, not empty), 422, 403 (the sandbox's
 * own permissions), and for a write over the sandbox's disk quota 507. */
struct MHD_Response *
file_error (grpc_status_code code, const rpc_status_t *st, bool write, unsigned *status)
{
  const char *d = st != NULL && st->details != NULL && st->details[0] != '\0' ? st->details : rpc_status_name (code);
  if (code == GRPC_STATUS_PERMISSION_DENIED && st != NULL && st->from_handler)
    return shim_detail (403, d, status);
  if (code == GRPC_STATUS_RESOURCE_EXHAUSTED && write)
    return shim_detail (507, d, status);
  return shim_gateway_error_named (code, st, status);
}

static struct MHD_Response *
read_error (grpc_status_code code, const rpc_status_t *st, unsigned *status)
{
  return file_error (code, st, false, status);
}

/* The query parameter `name` (a path): NULL with a 422 body in *bad when
 * it is missing, empty or holds a NUL byte. */
const char *
query_path (shim_req_t *r, const char *name, json_t **bad)
{
  const char *v = NULL;
  size_t len = 0;
  *bad = NULL;
  if (MHD_lookup_connection_value_n (r->conn, MHD_GET_ARGUMENT_KIND, name, strlen (name), &v, &len) == MHD_YES
      && v != NULL && len > 0 && strlen (v) == len)
    return v;
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, v == NULL ? "missing" : "value_error", "query", name,
                   v == NULL ? "Field required" : "a non-empty path without NUL bytes is required");
  *bad = shim_errors_take (&e);
  return NULL;
}

/* `path` and the optional boolean `recursive` of the query: NULL with a
 * 422 body in *bad when either is wrong. */
static const char *
query_path_recursive (shim_req_t *r, bool *recursive, json_t **bad)
{
  *recursive = false;
  const char *path = query_path (r, "path", bad);
  if (path != NULL && (*bad = route_query_bool (r, "recursive", recursive)) != NULL)
    return NULL;
  return path;
}

/* An unsigned query parameter (octal for `mode`); 0 when absent. */
json_t *
query_uint (shim_req_t *r, const char *name, int base, unsigned long max, unsigned long *out)
{
  const char *q = MHD_lookup_connection_value (r->conn, MHD_GET_ARGUMENT_KIND, name);
  *out = 0;
  if (q == NULL)
    return NULL;
  char *end = NULL;
  errno = 0;
  unsigned long v = strtoul (q, &end, base);
  if (q[0] != '\0' && q[0] != '-' && *end == '\0' && errno == 0 && v <= max)
    {
      *out = v;
      return NULL;
    }
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "value_error", "query", name, "not a valid number in range");
  return shim_errors_take (&e);
}

static const char *
type_name (Sandbox__V1__FileType t)
{
  switch (t)
    {
    case SANDBOX__V1__FILE_TYPE__FILE_TYPE_FILE: return "file";
    case SANDBOX__V1__FILE_TYPE__FILE_TYPE_DIRECTORY: return "directory";
    case SANDBOX__V1__FILE_TYPE__FILE_TYPE_SYMLINK: return "symlink";
    default: return "other";
    }
}

/* A string from the sandbox as JSON (names need not be UTF-8). */
static json_t *
text_json (const char *s)
{
  json_t *j = json_string (s != NULL ? s : "");
  return j != NULL ? j : json_string ("(not valid UTF-8)");
}

json_t *
info_json (const Sandbox__V1__FileInfo *i)
{
  return json_pack ("{s:o, s:o, s:s, s:I, s:i, s:I, s:I, s:I, s:o}", "path", text_json (i->path), "name",
                    text_json (i->name), "type", type_name (i->type), "size", (json_int_t) i->size, "mode",
                    (int) i->mode, "uid", (json_int_t) i->uid, "gid", (json_int_t) i->gid, "mtime_ms",
                    (json_int_t) i->mtime_ms, "symlink_target", text_json (i->symlink_target));
}

/* A unary file call answered with its FileInfo as JSON. */
static struct MHD_Response *
unary_info (const char *id, const char *method, const ProtobufCMessage *req, unsigned code, unsigned *status)
{
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  if (route_unary (id, method, req, &sandbox__v1__file_info__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS) < 0)
    {
      struct MHD_Response *out = file_error (st.code, &st, false, status);
      rpc_status_release (&st);
      return out;
    }
  json_t *j = info_json ((Sandbox__V1__FileInfo *) resp);
  protobuf_c_message_free_unpacked (resp, NULL);
  return shim_json (j, code, status);
}

/* ---- GET /sandboxes/{id}/files/stat, /files/list ------------------------------------ */

struct MHD_Response *
route_file_stat (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  const char *path = query_path (r, "path", &bad);
  if (path == NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__StatRequest req = SANDBOX__V1__STAT_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.path = (char *) path;
  return unary_info (r->id, "/sandbox.v1.Sandbox/Stat", &req.base, 200, status);
}

/* The most a REST listing holds (the shim builds its JSON whole): the
 * limits one ListDir answer had before the gateway paged, kept so that
 * what worked still works and what failed still fails the same way. */
#define SHIM_LIST_MAX_ENTRIES 100000
#define SHIM_LIST_MAX_BYTES (16 * 1024 * 1024)
/* Entries the shim asks for per page (the gateway also ends a page at its
 * own byte cap). */
#define SHIM_LIST_PAGE_ENTRIES 16384

/* One page of a listing, appended to `entries`; *token becomes the next
 * page's token ("" at the end), *bytes and *count grow. NULL, or the error
 * answer. */
static struct MHD_Response *
list_page (shim_req_t *r, Sandbox__V1__ListDirRequest *req, json_t *entries, char **token, size_t *bytes,
           size_t *count, unsigned *status)
{
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  if (route_unary (r->id, "/sandbox.v1.Sandbox/ListDir", &req->base, &sandbox__v1__list_dir_response__descriptor,
                   &resp, &st, ROUTE_SHORT_CALL_MS)
      < 0)
    {
      struct MHD_Response *out = read_error (st.code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  Sandbox__V1__ListDirResponse *l = (Sandbox__V1__ListDirResponse *) resp;
  *bytes += protobuf_c_message_get_packed_size (resp);
  *count += l->n_entries;
  free (*token);
  *token = strdup (l->next_page_token != NULL ? l->next_page_token : "");
  if (*token == NULL || *bytes > SHIM_LIST_MAX_BYTES || *count > SHIM_LIST_MAX_ENTRIES)
    {
      protobuf_c_message_free_unpacked (resp, NULL);
      if (*token == NULL)
        return shim_detail (500, "out of memory", status);
      char d[160];
      snprintf (d, sizeof d, "the listing has more than %d entries or %d bytes; list with a smaller depth",
                SHIM_LIST_MAX_ENTRIES, SHIM_LIST_MAX_BYTES);
      return shim_detail (shim_http_status (GRPC_STATUS_RESOURCE_EXHAUSTED, true), d, status);
    }
  for (size_t i = 0; i < l->n_entries; i++)
    json_array_append_new (entries, info_json (l->entries[i]));
  protobuf_c_message_free_unpacked (resp, NULL);
  return NULL;
}

struct MHD_Response *
route_file_list (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  unsigned long depth = 1;
  const char *path = query_path (r, "path", &bad);
  if (path == NULL || (bad = query_uint (r, "depth", 10, 64, &depth)) != NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__ListDirRequest req = SANDBOX__V1__LIST_DIR_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.path = (char *) path;
  req.depth = (uint32_t) depth;
  req.page_size = SHIM_LIST_PAGE_ENTRIES;
  cleanup_json json_t *entries = json_array ();
  cleanup_free char *token = NULL;
  size_t bytes = 0, count = 0;
  /* Page after page: the gateway holds one page at a time; the shim holds
   * the JSON up to its caps. */
  do
    {
      req.page_token = token != NULL ? token : (char *) "";
      struct MHD_Response *failed = list_page (r, &req, entries, &token, &bytes, &count, status);
      if (failed != NULL)
        return failed;
    }
  while (token[0] != '\0');
  return shim_json (json_pack ("{s:O}", "entries", entries), 200, status);
}

/* ---- DELETE /sandboxes/{id}/files, POST …/rename, …/mkdir ----------------------------- */

struct MHD_Response *
route_file_delete (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  bool recursive;
  const char *path = query_path_recursive (r, &recursive, &bad);
  if (path == NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__RemoveRequest req = SANDBOX__V1__REMOVE_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.path = (char *) path;
  req.recursive = recursive;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  if (route_unary (r->id, "/sandbox.v1.Sandbox/Remove", &req.base, &sandbox__v1__remove_response__descriptor, &resp,
                   &st, ROUTE_SHORT_CALL_MS)
      < 0)
    {
      struct MHD_Response *out = read_error (st.code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  protobuf_c_message_free_unpacked (resp, NULL);
  return shim_empty (204, status);
}

/* The JSON body as an object, or NULL with a 422 answer in *bad. */
static json_t *
body_object (shim_req_t *r, json_t **bad)
{
  json_error_t jerr;
  json_t *j = r->len > 0 ? json_loadb (r->body, r->len, 0, &jerr) : NULL;
  *bad = NULL;
  if (json_is_object (j))
    return j;
  json_decref (j);
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "json_invalid", "body", NULL, "a JSON object is required");
  *bad = shim_errors_take (&e);
  return NULL;
}

/* A string field (required and non-empty) or a boolean / integer one
 * (optional); adds to `e` when wrong. */
static const char *
body_path (json_t *o, const char *name, shim_errors_t *e)
{
  json_t *v = json_object_get (o, name);
  if (json_is_string (v) && json_string_length (v) > 0 && strlen (json_string_value (v)) == json_string_length (v))
    return json_string_value (v);
  shim_errors_add (e, v == NULL ? "missing" : "string_type", "body", name, "a non-empty path is required");
  return NULL;
}

static bool
body_bool (json_t *o, const char *name, shim_errors_t *e)
{
  json_t *v = json_object_get (o, name);
  if (v != NULL && !json_is_boolean (v))
    shim_errors_add (e, "bool_type", "body", name, "Input should be a valid boolean");
  return json_is_true (v);
}

struct MHD_Response *
route_file_rename (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  cleanup_json json_t *o = body_object (r, &bad);
  if (o == NULL)
    return shim_json (bad, 422, status);
  shim_errors_t e;
  shim_errors_init (&e);
  Sandbox__V1__RenameRequest req = SANDBOX__V1__RENAME_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.from = (char *) body_path (o, "from", &e);
  req.to = (char *) body_path (o, "to", &e);
  req.overwrite = body_bool (o, "overwrite", &e);
  if (shim_errors_any (&e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  return unary_info (r->id, "/sandbox.v1.Sandbox/Rename", &req.base, 200, status);
}

struct MHD_Response *
route_file_mkdir (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  cleanup_json json_t *o = body_object (r, &bad);
  if (o == NULL)
    return shim_json (bad, 422, status);
  shim_errors_t e;
  shim_errors_init (&e);
  Sandbox__V1__MakeDirRequest req = SANDBOX__V1__MAKE_DIR_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.path = (char *) body_path (o, "path", &e);
  req.parents = body_bool (o, "parents", &e);
  json_t *mode = json_object_get (o, "mode");
  if (mode != NULL && (!json_is_integer (mode) || json_integer_value (mode) < 0 || json_integer_value (mode) > 07777))
    shim_errors_add (&e, "int_type", "body", "mode", "mode must be an integer from 0 to 4095 (0o7777)");
  else if (mode != NULL)
    req.mode = (uint32_t) json_integer_value (mode);
  if (shim_errors_any (&e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  return unary_info (r->id, "/sandbox.v1.Sandbox/MakeDir", &req.base, 201, status);
}

/* ---- GET /sandboxes/{id}/files/watch ------------------------------------------------- */

static const char *
event_name (Sandbox__V1__FileEvent__Kind k)
{
  switch (k)
    {
    case SANDBOX__V1__FILE_EVENT__KIND__KIND_WATCHING: return "watching";
    case SANDBOX__V1__FILE_EVENT__KIND__KIND_CREATED: return "created";
    case SANDBOX__V1__FILE_EVENT__KIND__KIND_MODIFIED: return "modified";
    case SANDBOX__V1__FILE_EVENT__KIND__KIND_REMOVED: return "removed";
    case SANDBOX__V1__FILE_EVENT__KIND__KIND_RENAMED: return "renamed";
    case SANDBOX__V1__FILE_EVENT__KIND__KIND_OVERFLOW: return "overflow";
    default: return "unknown";
    }
}

static json_t *
file_event_json (const ProtobufCMessage *m, void *ctx)
{
  (void) ctx;
  const Sandbox__V1__FileEvent *ev = (const Sandbox__V1__FileEvent *) m;
  json_t *j = json_pack ("{s:s, s:o, s:b}", "event", event_name (ev->kind), "path", text_json (ev->path), "is_dir",
                         ev->is_dir);
  if (j != NULL && ev->old_path != NULL && ev->old_path[0] != '\0')
    json_object_set_new (j, "old_path", text_json (ev->old_path));
  return j;
}

struct MHD_Response *
route_file_watch (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  bool recursive;
  const char *path = query_path_recursive (r, &recursive, &bad);
  if (path == NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__WatchRequest req = SANDBOX__V1__WATCH_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.path = (char *) path;
  req.recursive = recursive;
  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_call_t *c = route_call_open (r->id, "/sandbox.v1.Sandbox/Watch", 0, &req.base, NULL, 0, true, &st);
  if (c == NULL)
    {
      struct MHD_Response *out = read_error (st.code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  return route_ndjson (r, c, &sandbox__v1__file_event__descriptor, file_event_json, NULL, read_error, status);
}
