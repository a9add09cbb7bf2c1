/* routes/files_data: a file's contents over REST, streamed both ways.
 * GET /sandboxes/{id}/files?path=… answers the raw bytes with their
 * Content-Length (one range of `Range: bytes=a-b` or `bytes=a-` gives a
 * 206); PUT …?path=…&mode=0644&make_parents=true&append=false streams the
 * body to WriteFile as it arrives (no size cap but the sandbox's disk
 * quota: 507) and answers 201 with the FileInfo. State: per request. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim/members.h"
#include "shim/stream.h"
#include "shim/metrics.h"
#include "shim/routes/files.h"

/* ---- GET ----------------------------------------------------------------------------- */

typedef struct download_s
{
  rpc_client_call_t *call;
  hangup_t *hangup;
  Sandbox__V1__FileChunk *msg;
  size_t off;
  uint64_t left; /* bytes the answer still owes */
} download_t;

/* The next chunk; 1 got one, 0 end, -1 failure. */
static int
download_next (download_t *d)
{
  if (d->msg != NULL)
    protobuf_c_message_free_unpacked (&d->msg->base, NULL);
  d->msg = NULL;
  d->off = 0;
  ProtobufCMessage *m = NULL;
  err_t err = ERR_INIT;
  int rc = rpc_client_recv (d->call, &sandbox__v1__file_chunk__descriptor, &m, &err);
  err_release (&err);
  if (rc <= 0)
    return rc < 0 ? -1 : 0;
  d->msg = (Sandbox__V1__FileChunk *) m;
  return 1;
}

static ssize_t
download_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  (void) pos;
  download_t *d = cls;
  if (d->left == 0)
    return MHD_CONTENT_READER_END_OF_STREAM;
  while (d->msg == NULL || d->off == d->msg->data.len)
    if (download_next (d) <= 0)
      return MHD_CONTENT_READER_END_WITH_ERROR; /* shorter than announced: cut, not passed off as whole */
  size_t k = d->msg->data.len - d->off < max ? d->msg->data.len - d->off : max;
  if (k > d->left)
    k = (size_t) d->left;
  memcpy (buf, d->msg->data.data + d->off, k);
  d->off += k;
  d->left -= k;
  metrics_bytes (false, k);
  return (ssize_t) k;
}

static void
download_free (void *cls)
{
  download_t *d = cls;
  hangup_remove (d->hangup);
  if (d->msg != NULL)
    protobuf_c_message_free_unpacked (&d->msg->base, NULL);
  rpc_client_destroy (d->call);
  free (d);
}

/* One range `bytes=a-b` or `bytes=a-` (RFC 9110); false for anything else,
 * which is then ignored (the whole file, 200). */
static bool
parse_range (const char *h, uint64_t *first, uint64_t *last, bool *open_end)
{
  if (h == NULL || strncmp (h, "bytes=", 6) != 0 || strchr (h, ',') != NULL)
    return false;
  const char *p = h + 6;
  char *end;
  if (*p < '0' || *p > '9')
    return false;
  errno = 0;
  *first = strtoull (p, &end, 10);
  if (errno != 0 || *end != '-')
    return false;
  p = end + 1;
  *open_end = *p == '\0';
  if (*open_end)
    return true;
  if (*p < '0' || *p > '9')
    return false;
  *last = strtoull (p, &end, 10);
  return errno == 0 && *end == '\0' && *last >= *first;
}

struct MHD_Response *
route_file_get (shim_req_t *r, unsigned *status)
{
  json_t *bad;
  const char *path = query_path (r, "path", &bad);
  if (path == NULL)
    return shim_json (bad, 422, status);
  uint64_t first = 0, last = 0;
  bool open_end = true;
  bool ranged
      = parse_range (MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, "Range"), &first, &last, &open_end);
  Sandbox__V1__ReadFileRequest req = SANDBOX__V1__READ_FILE_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.path = (char *) path;
  req.offset = ranged ? first : 0;
  req.length = ranged && !open_end ? last - first + 1 : 0;
  download_t *d = calloc (1, sizeof *d);
  if (d == NULL)
    return shim_detail (503, "Out of memory", status);
  rpc_status_t st = RPC_STATUS_INIT;
  d->call = route_call_open (r->id, "/sandbox.v1.Sandbox/ReadFile", 0, &req.base, NULL, 0, true, &st);
  if (d->call == NULL || download_next (d) <= 0 || d->msg->info == NULL)
    {
      /* Failed before any byte: a proper status. */
      grpc_status_code code = d->call != NULL ? rpc_client_finish (d->call, &st) : st.code;
      struct MHD_Response *out
          = file_error (code == GRPC_STATUS_OK ? GRPC_STATUS_INTERNAL : code, &st, false, status);
      rpc_status_release (&st);
      download_free (d);
      return out;
    }
  uint64_t size = d->msg->info->size;
  if (ranged && first >= size && !(first == 0 && size == 0))
    {
      download_free (d);
      struct MHD_Response *out = shim_detail (416, "Range Not Satisfiable", status);
      char cr[64];
      snprintf (cr, sizeof cr, "bytes */%" PRIu64, size);
      MHD_add_response_header (out, "Content-Range", cr);
      return out;
    }
  if (ranged && (open_end || last >= size))
    last = size - 1;
  d->left = ranged ? last - first + 1 : size;
  d->hangup = hangup_add (shim_req_fd (r), d->call);
  MHD_set_connection_option (r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
  struct MHD_Response *resp = shim_stream_response (r, d->left, 256 * 1024, download_read, d, download_free);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
  MHD_add_response_header (resp, "Accept-Ranges", "bytes");
  if (ranged)
    {
      char cr[96];
      snprintf (cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first, last, size);
      MHD_add_response_header (resp, "Content-Range", cr);
    }
  *status = ranged ? 206 : 200;
  return resp;
}

/* ---- PUT ----------------------------------------------------------------------------- */

typedef struct upload_s
{
  rpc_client_call_t *call;
  bool failed;
} upload_t;

/* Starts the WriteFile call from the query (first piece of the body, or
 * the handler for an empty body). -1 with the answer stored. */
static int
upload_start (shim_req_t *r)
{
  json_t *bad;
  unsigned long mode = 0;
  bool parents = false, append = false;
  const char *path = query_path (r, "path", &bad);
  if (path == NULL || (bad = query_uint (r, "mode", 8, 07777, &mode)) != NULL
      || (bad = route_query_bool (r, "make_parents", &parents)) != NULL
      || (bad = route_query_bool (r, "append", &append)) != NULL)
    {
      shim_req_fail_json (r, 422, bad);
      return -1;
    }
  upload_t *u = calloc (1, sizeof *u);
  if (u == NULL)
    {
      shim_req_fail (r, 503, "Out of memory");
      return -1;
    }
  r->state = u;
  Sandbox__V1__WriteFileHeader h = SANDBOX__V1__WRITE_FILE_HEADER__INIT;
  h.sandbox_id = r->id;
  h.path = (char *) path;
  h.mode = (uint32_t) mode;
  h.make_parents = parents;
  h.append = append;
  Sandbox__V1__WriteFileRequest m = SANDBOX__V1__WRITE_FILE_REQUEST__INIT;
  m.payload_case = SANDBOX__V1__WRITE_FILE_REQUEST__PAYLOAD_HEADER;
  m.header = &h;
  err_t err = ERR_INIT;
  if (rpc_client_start (members_route (r->id), "/sandbox.v1.Sandbox/WriteFile", 0, shim.md, shim.n_md, &u->call, &err)
          < 0
      || rpc_client_send (u->call, &m.base, &err) < 0)
    u->failed = true; /* the status says why */
  err_release (&err);
  return 0;
}

int
route_file_put_upload (shim_req_t *r, const char *data, size_t len)
{
  if (r->state == NULL && upload_start (r) < 0)
    return -1;
  upload_t *u = r->state;
  if (u->failed || len == 0)
    return u->failed ? -1 : 0;
  Sandbox__V1__WriteFileRequest m = SANDBOX__V1__WRITE_FILE_REQUEST__INIT;
  m.payload_case = SANDBOX__V1__WRITE_FILE_REQUEST__PAYLOAD_DATA;
  m.data.data = (uint8_t *) data;
  m.data.len = len;
  err_t err = ERR_INIT;
  if (rpc_client_send (u->call, &m.base, &err) < 0)
    u->failed = true; /* the gateway ended the call (the quota…): its status says why */
  err_release (&err);
  metrics_bytes (true, len);
  return u->failed ? -1 : 0;
}

struct MHD_Response *
route_file_put (shim_req_t *r, unsigned *status)
{
  if (r->state == NULL && upload_start (r) < 0)
    {
      /* The answer was stored as the early one: repeat it here. */
      unsigned code = r->early_status;
      struct MHD_Response *early = r->early;
      r->early = NULL;
      *status = code;
      return early;
    }
  upload_t *u = r->state;
  if (u->call == NULL)
    return shim_detail (502, "Gateway unreachable", status);
  err_t err = ERR_INIT;
  rpc_client_close_send (u->call, &err);
  err_release (&err);
  ProtobufCMessage *m = NULL;
  int rc = rpc_client_recv (u->call, &sandbox__v1__file_info__descriptor, &m, &err);
  err_release (&err);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (u->call, &st);
  struct MHD_Response *out = code == GRPC_STATUS_OK && rc == 1
                                 ? shim_json (info_json ((Sandbox__V1__FileInfo *) m), 201, status)
                                 : file_error (code, &st, true, status);
  if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
  rpc_status_release (&st);
  return out;
}

void
route_file_put_cleanup (shim_req_t *r)
{
  upload_t *u = r->state;
  if (u == NULL)
    return;
  rpc_client_destroy (u->call);
  free (u);
  r->state = NULL;
}
