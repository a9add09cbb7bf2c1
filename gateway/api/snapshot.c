/* api/snapshot: the handlers of the snapshot methods — Restore,
 * ExportSnapshot, PersistSnapshot, Connect (see internal.h). They turn
 * messages into calls of the snapshot layer (snapshot/session.h) and its
 * results back into messages; streams pass through in bounded pieces. No
 * state. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/api/internal.h"
#include "gateway/snapshot/session.h"

/* ---- Restore ------------------------------------------------------------------ */

/* The tar pieces of a Restore call, one message at a time. A message that
 * is nothing but its tar_chunk (field 2) is read in place: its slices go to
 * the unpacker's pipe as gRPC received them, without protobuf-c's copy of
 * the field. Anything else is decoded as usual. */
typedef struct restore_src_s
{
  rpc_call_t *call;
  ProtobufCMessage *msg; /* a decoded message, or NULL */
  grpc_byte_buffer *raw; /* a message read in place, or NULL */
  size_t slice, skip;    /* the next slice of `raw`, and bytes of it to skip */
} restore_src_t;

/* The chunk field's framing: tag 0x12 (field 2, length-delimited), then a
 * varint length. Its size, when the message is exactly that field, else 0. */
static size_t
chunk_framing (grpc_byte_buffer *bb)
{
  if (bb->type != GRPC_BB_RAW || bb->data.raw.compression != GRPC_COMPRESS_NONE)
    return 0;
  uint8_t head[11];
  size_t have = 0;
  const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
  for (size_t i = 0; i < sb->count && have < sizeof head; i++)
    {
      size_t n = GRPC_SLICE_LENGTH (sb->slices[i]);
      n = n < sizeof head - have ? n : sizeof head - have;
      memcpy (head + have, GRPC_SLICE_START_PTR (sb->slices[i]), n);
      have += n;
    }
  if (have < 2 || head[0] != 0x12)
    return 0;
  uint64_t len = 0;
  size_t k = 1;
  for (int shift = 0; k < have && shift < 64; shift += 7, k++)
    {
      len |= (uint64_t) (head[k] & 0x7f) << shift;
      if ((head[k] & 0x80) == 0)
        return k + 1 + len == grpc_byte_buffer_length (bb) ? k + 1 : 0;
    }
  return 0;
}

static void
restore_src_clear (restore_src_t *s)
{
  cleanup_message_fn (&s->msg);
  s->msg = NULL;
  if (s->raw != NULL)
    grpc_byte_buffer_destroy (s->raw);
  s->raw = NULL;
}

static int
restore_next (void *ctx, struct iovec *iov, int *n, err_t *err)
{
  restore_src_t *s = ctx;
  int max = *n;
  for (;;)
    {
      /* The rest of a message read in place, as many slices as fit. */
      int k = 0;
      while (s->raw != NULL && s->slice < s->raw->data.raw.slice_buffer.count && k < max)
        {
          const grpc_slice *sl = &s->raw->data.raw.slice_buffer.slices[s->slice++];
          size_t len = GRPC_SLICE_LENGTH (*sl), skip = s->skip < len ? s->skip : len;
          s->skip -= skip;
          if (len > skip)
            iov[k++] = (struct iovec){(void *) (GRPC_SLICE_START_PTR (*sl) + skip), len - skip};
        }
      if (k > 0)
        {
          *n = k;
          return 1;
        }
      restore_src_clear (s);
      grpc_byte_buffer *bb = NULL;
      int rc = rpc_call_recv_raw (s->call, &bb, err);
      if (rc <= 0)
        return rc;
      /* The next message arrives while this one goes to the unpacker. */
      rpc_call_recv_ahead (s->call);
      size_t framing = chunk_framing (bb);
      if (framing > 0)
        {
          s->raw = bb;
          s->slice = 0;
          s->skip = framing;
          continue;
        }
      rc = rpc_unpack (bb, &sandbox__v1__restore_request__descriptor, rpc_call_max_message (s->call), &s->msg, err);
      grpc_byte_buffer_destroy (bb);
      if (rc < 0)
        return -1;
      Sandbox__V1__RestoreRequest *m = (Sandbox__V1__RestoreRequest *) s->msg;
      if (m->payload_case != SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_TAR_CHUNK)
        return err_make (err, EINVAL, "only the first Restore message may carry a header");
      if (m->tar_chunk.len == 0)
        continue;
      iov[0] = (struct iovec){m->tar_chunk.data, m->tar_chunk.len};
      *n = 1;
      return 1;
    }
}

int
api_restore (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *first = NULL;
  if (api_recv_request (call, &sandbox__v1__restore_request__descriptor, &first, err) < 0)
    return -1;
  Sandbox__V1__RestoreRequest *req = (Sandbox__V1__RestoreRequest *) first;
  if (req->payload_case != SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_HEADER || req->header == NULL)
    return err_make (err, EINVAL, "the first Restore message must carry the header");
  const char *id = req->header->sandbox_id;
  restore_src_t src = {.call = call};
  sbx_info_t info;
  const char *image = req->header->image;
  int rc = image != NULL && image[0] != '\0'
               ? api_restore_on_image (call, ctx, id, &(sbx_spec_t){.allow_egress = req->header->allow_egress}, image,
                                       restore_next, &src, &info, err)
               : sbx_restore (ctx->rt, id, req->header->allow_egress, restore_next, &src, &info, err);
  restore_src_clear (&src);
  if (rc < 0 || api_undo_if_gone (call, ctx->rt, id, err) < 0)
    return -1;
  return api_reply_info (call, &info, err);
}

/* ---- ExportSnapshot ----------------------------------------------------------- */

static void
release_piece (void *data)
{
  snap_export_release (data);
}

/* Sends one piece as a SnapshotChunk without copying it: the message is its
 * field header (tag and length, built here) followed by the export's own
 * buffer, which gRPC holds until it has written the bytes. */
static int
export_sink (void *ctx, const uint8_t *data, size_t len, err_t *err)
{
  uint8_t head[API_FIELD_HEADER_MAX];
  size_t n = api_field_header (head, API_FIELD_SNAPSHOT_CHUNK_DATA, len);
  snap_export_hold (data);
  grpc_slice slices[2] = {grpc_slice_from_copied_buffer ((const char *) head, n),
                          grpc_slice_new_with_user_data ((void *) data, len, release_piece, (void *) data)};
  return rpc_call_send_raw ((rpc_call_t *) ctx, slices, 2, err);
}

/* Stops an export or persist streaming to `call` (sbx_with_layer). */
static void
cancel_call (void *ctx, int status, const char *why)
{
  rpc_call_cancel ((rpc_call_t *) ctx, rpc_status_from_errno (status), why);
}

snap_canceller_t
api_call_canceller (rpc_call_t *call)
{
  /* The client's going (or its deadline) is asked by the export's walk,
   * also while it sends nothing. */
  return (snap_canceller_t){cancel_call, call, api_call_gone};
}

int
api_export (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__export_snapshot_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ExportSnapshotRequest *req = (Sandbox__V1__ExportSnapshotRequest *) m;
  snap_export_opts_t opts = {.skip_digest = req->skip_sha256};
  snap_export_result_t res;
  snap_canceller_t stop = api_call_canceller (call);
  if (api_compression_from_proto (req->compression, &opts.compression, err) < 0
      || snap_export_stoppable (ctx->rt, req->sandbox_id, &opts, export_sink, call, &stop, &res, err) < 0)
    return -1;
  Sandbox__V1__SnapshotChunk last = SANDBOX__V1__SNAPSHOT_CHUNK__INIT;
  last.last = true;
  last.total_bytes = res.total_bytes;
  last.sha256 = res.sha256;
  return rpc_call_send (call, &last.base, err);
}

/* ---- PersistSnapshot ---------------------------------------------------------- */

static int
persist_progress (void *ctx, uint64_t written, err_t *err)
{
  Sandbox__V1__PersistProgress ev = SANDBOX__V1__PERSIST_PROGRESS__INIT;
  ev.bytes_written = written;
  return rpc_call_send ((rpc_call_t *) ctx, &ev.base, err);
}

int
api_persist (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__persist_snapshot_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__PersistSnapshotRequest *req = (Sandbox__V1__PersistSnapshotRequest *) m;
  snap_persisted_t done;
  snap_canceller_t stop = api_call_canceller (call);
  if (snap_persist (ctx->rt, ctx->store, req->sandbox_id, persist_progress, call, &stop, NULL, &done, err) < 0)
    return -1;
  cleanup_free char *object = done.object;
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:I}", "sandbox_id", req->sandbox_id, "store", ctx->store->kind, "object",
                         object, "bytes", (json_int_t) done.bytes),
              "snapshot persisted");
  Sandbox__V1__PersistProgress ev = SANDBOX__V1__PERSIST_PROGRESS__INIT;
  ev.bytes_written = done.bytes;
  ev.done = true;
  ev.object_name = object;
  ev.store = (char *) ctx->store->kind;
  ev.sha256 = done.export.sha256;
  return rpc_call_send (call, &ev.base, err);
}

/* ---- Connect ------------------------------------------------------------------ */

typedef struct connect_job_s
{
  rpc_call_t *call;
  const api_ctx_t *ctx;
} connect_job_t;

static int
connect_on_image (void *ctx, const char *id, bool egress, const char *ref, const char *digest, sbx_source_fn src,
                  void *src_ctx, sbx_info_t *info, err_t *err)
{
  connect_job_t *j = ctx;
  return api_restore_recorded (j->call, j->ctx, id, egress, ref, digest, src, src_ctx, info, err);
}

static int
connect_made (void *ctx, const char *id, err_t *err)
{
  connect_job_t *j = ctx;
  return api_undo_if_gone (j->call, j->ctx->rt, id, err);
}

static Sandbox__V1__ConnectResponse__Outcome
outcome_to_proto (snap_outcome_t o)
{
  switch (o)
    {
    case SNAP_OUTCOME_LIVE: return SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_LIVE;
    case SNAP_OUTCOME_RESTORED: return SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_RESTORED;
    case SNAP_OUTCOME_CREATED: return SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_CREATED;
    }
  return SANDBOX__V1__CONNECT_RESPONSE__OUTCOME__OUTCOME_UNSPECIFIED;
}

int
api_connect (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__connect_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ConnectRequest *req = (Sandbox__V1__ConnectRequest *) m;
  connect_job_t job = {.call = call, .ctx = ctx};
  snap_images_t images = {.restore = connect_on_image, .ctx = &job};
  sbx_info_t info;
  snap_outcome_t outcome;
  if (snap_connect (ctx->rt, ctx->store, &images, req->sandbox_id, req->allow_egress, !req->restore_only,
                    connect_made, &job, &info, &outcome, err)
      < 0)
    return -1;
  Sandbox__V1__SandboxInfo pb;
  api_info_to_proto (&info, &pb);
  Sandbox__V1__ConnectResponse resp = SANDBOX__V1__CONNECT_RESPONSE__INIT;
  resp.outcome = outcome_to_proto (outcome);
  resp.sandbox = &pb;
  return rpc_call_reply (call, &resp.base, err);
}
