/* snap_rpc: the snapshot methods of sandbox.v1.Sandbox — Restore,
 * ExportSnapshot, PersistSnapshot, Connect — and the store side of Delete.
 *
 * They join three pieces: the runtime (sbx_restore, sbx_with_layer), the
 * tar writer (snap_export) and the store (snap_store). Every stream is
 * passed through in bounded pieces; nothing holds a whole snapshot.
 *
 * Threading: handlers run on the call layer's threads; the runtime and the
 * store are set once by snap_rpc_init.
 */
#include "gateway/snap_rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/service.h"
#include "gateway/snap_export.h"
#include "sandbox/v1/sandbox.pb-c.h"

/* Size of the pieces a snapshot stream is cut into. */
#define SNAP_CHUNK (1024 * 1024)
/* How often PersistSnapshot reports progress. */
#define PERSIST_PROGRESS_EVERY (8ull * 1024 * 1024)

static sbx_runtime_t *snap_rt;
static snap_store_t *snap_store;

void
snap_rpc_init (sbx_runtime_t *rt, snap_store_t *store)
{
  snap_rt = rt;
  snap_store = store;
}

const char *
snap_rpc_store_kind (void)
{
  return snap_store != NULL ? snap_store->kind : "";
}

/* ---- Restore ------------------------------------------------------------------ */

typedef struct restore_src_s
{
  rpc_call_t *call;
  ProtobufCMessage *msg;
} restore_src_t;

static ssize_t
restore_next (void *ctx, const uint8_t **data, err_t *err)
{
  restore_src_t *s = ctx;
  for (;;)
    {
      if (s->msg != NULL)
        protobuf_c_message_free_unpacked (s->msg, NULL);
      s->msg = NULL;
      int rc = rpc_call_recv (s->call, &sandbox__v1__restore_request__descriptor, &s->msg, err);
      if (rc <= 0)
        return rc;
      Sandbox__V1__RestoreRequest *m = (Sandbox__V1__RestoreRequest *) s->msg;
      if (m->payload_case != SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_TAR_CHUNK)
        return err_make (err, EINVAL, "only the first Restore message may carry a header");
      if (m->tar_chunk.len == 0)
        continue;
      *data = m->tar_chunk.data;
      return (ssize_t) m->tar_chunk.len;
    }
}

int
snap_rpc_restore (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *first = NULL;
  if (service_recv_request (call, &sandbox__v1__restore_request__descriptor, &first, err) < 0)
    return -1;
  Sandbox__V1__RestoreRequest *req = (Sandbox__V1__RestoreRequest *) first;
  int rc;
  if (req->payload_case != SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_HEADER || req->header == NULL)
    rc = err_make (err, EINVAL, "the first Restore message must carry the header");
  else
    {
      restore_src_t src = {.call = call};
      sbx_info_t info;
      rc = sbx_restore (snap_rt, req->header->sandbox_id, req->header->allow_egress, restore_next, &src, &info, err);
      if (src.msg != NULL)
        protobuf_c_message_free_unpacked (src.msg, NULL);
      if (rc == 0)
        rc = service_undo_if_gone (call, req->header->sandbox_id, err);
      if (rc == 0)
        {
          Sandbox__V1__SandboxInfo pb;
          service_info_to_proto (&info, &pb);
          rc = rpc_call_reply (call, &pb.base, err);
        }
    }
  protobuf_c_message_free_unpacked (first, NULL);
  return rc;
}

/* ---- ExportSnapshot ----------------------------------------------------------- */

typedef struct export_ctx_s
{
  rpc_call_t *call;
  snap_compression_t compression;
  snap_export_result_t res;
} export_ctx_t;

static int
export_sink (void *ctx, const uint8_t *data, size_t len, err_t *err)
{
  export_ctx_t *x = ctx;
  Sandbox__V1__SnapshotChunk chunk = SANDBOX__V1__SNAPSHOT_CHUNK__INIT;
  chunk.data.data = (uint8_t *) data;
  chunk.data.len = len;
  return rpc_call_send (x->call, &chunk.base, err);
}

static int
export_layer (const char *upper, void *ctx, err_t *err)
{
  export_ctx_t *x = ctx;
  return snap_export (upper, x->compression, SNAP_CHUNK, export_sink, x, &x->res, err);
}

static int
compression_of (Sandbox__V1__Compression c, snap_compression_t *out, err_t *err)
{
  switch (c)
    {
    case SANDBOX__V1__COMPRESSION__COMPRESSION_NONE: *out = SNAP_COMPRESSION_NONE; return 0;
    case SANDBOX__V1__COMPRESSION__COMPRESSION_GZIP: *out = SNAP_COMPRESSION_GZIP; return 0;
    case SANDBOX__V1__COMPRESSION__COMPRESSION_ZSTD: *out = SNAP_COMPRESSION_ZSTD; return 0;
    default: return err_make (err, EINVAL, "unknown compression %d", (int) c);
    }
}

int
snap_rpc_export (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  if (service_recv_request (call, &sandbox__v1__export_snapshot_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ExportSnapshotRequest *req = (Sandbox__V1__ExportSnapshotRequest *) m;
  export_ctx_t x = {.call = call};
  int rc = compression_of (req->compression, &x.compression, err);
  if (rc == 0)
    rc = sbx_with_layer (snap_rt, req->sandbox_id, true, export_layer, &x, err);
  if (rc == 0)
    {
      Sandbox__V1__SnapshotChunk last = SANDBOX__V1__SNAPSHOT_CHUNK__INIT;
      last.last = true;
      last.total_bytes = x.res.total_bytes;
      last.sha256 = x.res.sha256;
      rc = rpc_call_send (call, &last.base, err);
    }
  protobuf_c_message_free_unpacked (m, NULL);
  return rc;
}

/* ---- PersistSnapshot ---------------------------------------------------------- */

typedef struct persist_ctx_s
{
  rpc_call_t *call;
  snap_writer_t *w;
  uint64_t written;
  uint64_t reported;
  snap_export_result_t res;
} persist_ctx_t;

static int
persist_sink (void *ctx, const uint8_t *data, size_t len, err_t *err)
{
  persist_ctx_t *p = ctx;
  if (snap_store->ops->writer_write (p->w, data, len, err) < 0)
    return -1;
  p->written += len;
  if (p->written - p->reported >= PERSIST_PROGRESS_EVERY)
    {
      p->reported = p->written;
      Sandbox__V1__PersistProgress ev = SANDBOX__V1__PERSIST_PROGRESS__INIT;
      ev.bytes_written = p->written;
      if (rpc_call_send (p->call, &ev.base, err) < 0)
        return -1; /* the client went away: do not finish its upload */
    }
  return 0;
}

static int
persist_layer (const char *upper, void *ctx, err_t *err)
{
  persist_ctx_t *p = ctx;
  return snap_export (upper, SNAP_COMPRESSION_NONE, SNAP_CHUNK, persist_sink, p, &p->res, err);
}

int
snap_rpc_persist (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  if (service_recv_request (call, &sandbox__v1__persist_snapshot_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__PersistSnapshotRequest *req = (Sandbox__V1__PersistSnapshotRequest *) m;
  int rc = -1;
  cleanup_free char *object = NULL;
  persist_ctx_t p = {.call = call};
  if (!sbx_id_valid (req->sandbox_id))
    {
      err_make (err, EINVAL, "invalid sandbox id");
      goto out;
    }
  object = snap_object_name (snap_store, req->sandbox_id);
  if (object == NULL)
    {
      err_make (err, ENOMEM, "out of memory");
      goto out;
    }
  if (snap_store->ops->writer_open (snap_store, object, &p.w, err) < 0)
    goto out;
  if (sbx_with_layer (snap_rt, req->sandbox_id, true, persist_layer, &p, err) < 0)
    {
      snap_store->ops->writer_abort (p.w);
      goto out;
    }
  if (snap_store->ops->writer_commit (p.w, err) < 0)
    goto out;
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:I}", "sandbox_id", req->sandbox_id, "store", snap_store->kind, "object",
                         object, "bytes", (json_int_t) p.written),
              "snapshot persisted");
  Sandbox__V1__PersistProgress done = SANDBOX__V1__PERSIST_PROGRESS__INIT;
  done.bytes_written = p.written;
  done.done = true;
  done.object_name = object;
  done.store = (char *) snap_store->kind;
  done.sha256 = p.res.sha256;
  rc = rpc_call_send (call, &done.base, err);
out:
  protobuf_c_message_free_unpacked (m, NULL);
  return rc;
}

/* ---- Connect ------------------------------------------------------------------ */

typedef struct store_src_s
{
  snap_reader_t *r;
  uint8_t *buf;
} store_src_t;

static ssize_t
store_next (void *ctx, const uint8_t **data, err_t *err)
{
  store_src_t *s = ctx;
  ssize_t n = snap_store->ops->reader_read (s->r, s->buf, SNAP_CHUNK, err);
  *data = s->buf;
  return n;
}

/* Restores `id` from the store. ENOENT when there is no snapshot. */
static int
restore_from_store (const char *id, bool egress, sbx_info_t *info, err_t *err)
{
  cleanup_free char *object = snap_object_name (snap_store, id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  store_src_t src = {0};
  if (snap_store->ops->reader_open (snap_store, object, &src.r, err) < 0)
    return -1;
  src.buf = malloc (SNAP_CHUNK);
  int rc = src.buf == NULL ? err_make (err, ENOMEM, "out of memory")
                           : sbx_restore (snap_rt, id, egress, store_next, &src, info, err);
  free (src.buf);
  snap_store->ops->reader_close (src.r);
  if (rc < 0 && err->status == ENOENT)
    err->status = EIO; /* the snapshot was there: any ENOENT now is a failure */
  return rc;
}

int
snap_rpc_connect (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  if (service_recv_request (call, &sandbox__v1__connect_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ConnectRequest *req = (Sandbox__V1__ConnectRequest *) m;
  Sandbox__V1__ConnectResponse__Outcome outcome = SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_UNSPECIFIED;
  sbx_info_t info;
  int rc = -1;
  if (!sbx_id_valid (req->sandbox_id))
    {
      err_make (err, EINVAL, "invalid sandbox id");
      goto out;
    }
  for (int attempt = 0; attempt < 3 && outcome == SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_UNSPECIFIED;
       attempt++)
    {
      err_release (err);
      if (sbx_get (snap_rt, req->sandbox_id, &info, err) == 0)
        {
          outcome = SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_LIVE;
          break;
        }
      err_release (err);
      cleanup_free char *object = snap_object_name (snap_store, req->sandbox_id);
      int exists = object != NULL ? snap_store->ops->exists (snap_store, object, err) : -1;
      if (exists < 0)
        goto out;
      int r = exists ? restore_from_store (req->sandbox_id, req->allow_egress, &info, err)
                     : sbx_launch (snap_rt, req->sandbox_id, req->allow_egress, &info, err);
      if (r == 0 && service_undo_if_gone (call, req->sandbox_id, err) < 0)
        goto out;
      if (r == 0)
        outcome = exists ? SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_RESTORED
                         : SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_CREATED;
      else if (err->status != EEXIST && !(exists && err->status == ENOENT))
        goto out; /* EEXIST: another call made it meanwhile; look again */
    }
  if (outcome == SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_UNSPECIFIED)
    {
      err_make (err, EAGAIN, "connect `%s`: the sandbox keeps changing; try again", req->sandbox_id);
      goto out;
    }
  err_release (err);
  Sandbox__V1__SandboxInfo pb;
  service_info_to_proto (&info, &pb);
  Sandbox__V1__ConnectResponse resp = SANDBOX__V1__CONNECT_RESPONSE__INIT;
  resp.outcome = outcome;
  resp.sandbox = &pb;
  rc = rpc_call_reply (call, &resp.base, err);
out:
  protobuf_c_message_free_unpacked (m, NULL);
  return rc;
}

int
snap_rpc_delete_snapshot (const char *id, bool *deleted, err_t *err)
{
  *deleted = false;
  cleanup_free char *object = snap_object_name (snap_store, id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  if (snap_store->ops->remove (snap_store, object, err) < 0)
    {
      if (err->status != ENOENT)
        return -1;
      err_release (err);
      return 0;
    }
  *deleted = true;
  log_fields (SEV_INFO, json_pack ("{s:s, s:s}", "sandbox_id", id, "object", object), "snapshot deleted");
  return 0;
}
