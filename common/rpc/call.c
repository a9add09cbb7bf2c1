/* rpc/call: a server call's operations as its handler sees them — receive,
 * send, reply, finish with a status, metadata, deadline and cancellation
 * (see rpc.h). Every operation is plucked from the call's own completion
 * queue by its handler thread, so handlers are plain blocking code.
 *
 * Threading: a call belongs to its handler thread.
 */
#include "common/rpc/internal.h"

#include <errno.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"

/* At the end of a client's stream: how long a receive waits for the close
 * notice that would say the end was a cancellation (it follows a cancel at
 * once), before taking it as a half-close. */
#define RPC_HALF_CLOSE_WINDOW_MS 5

grpc_call_error
rpc_call_start_batch (rpc_call_t *c, const grpc_op *ops, size_t n, void *tag)
{
  return grpc_call_start_batch (c->call, ops, n, tag, NULL);
}

/* Runs one batch on the call and waits for it. Returns its success flag. */
bool
rpc_call_run_batch (rpc_call_t *c, const grpc_op *ops, size_t n)
{
  if (rpc_call_start_batch (c, ops, n, &c->batch_tag) != GRPC_CALL_OK)
    return false;
  grpc_event ev = grpc_completion_queue_pluck (c->cq, &c->batch_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void
add_initial_md (rpc_call_t *c, grpc_op *ops, size_t *n)
{
  if (c->md_sent)
    return;
  memset (&ops[*n], 0, sizeof ops[*n]);
  ops[*n].op = GRPC_OP_SEND_INITIAL_METADATA;
  (*n)++;
  c->md_sent = true;
}

int
rpc_call_finish (rpc_call_t *c, grpc_status_code code, const char *details)
{
  return rpc_call_finish_reason (c, code, details, NULL);
}

int
rpc_call_finish_err (rpc_call_t *c, int rc, const err_t *err)
{
  if (rc == 0)
    return rpc_call_finish (c, GRPC_STATUS_OK, NULL);
  return rpc_call_finish_reason (c, rpc_status_from_errno (err->status), err_msg (err),
                                 err->status != 0 ? err->reason : NULL);
}

int
rpc_call_finish_reason (rpc_call_t *c, grpc_status_code code, const char *details, const char *reason)
{
  if (c->finished)
    return 0;
  cleanup_err err_t ignored = ERR_INIT;
  rpc_call_send_wait (c, &ignored); /* a status follows the messages */
  c->finished = true;
  grpc_op ops[3];
  size_t n = 0;
  add_initial_md (c, ops, &n);
  if (code == GRPC_STATUS_OK && c->reply != NULL)
    {
      memset (&ops[n], 0, sizeof ops[n]);
      ops[n].op = GRPC_OP_SEND_MESSAGE;
      ops[n].data.send_message.send_message = c->reply;
      n++;
    }
  grpc_slice det = grpc_slice_from_copied_string (details != NULL ? details : "");
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n].data.send_status_from_server.status_details = &det;
  grpc_metadata trailers[2] = {{.key = grpc_slice_from_static_string (RPC_ORIGIN_KEY),
                                .value = grpc_slice_from_static_string (RPC_ORIGIN_HANDLER)}};
  size_t n_trailers = 1;
  if (code != GRPC_STATUS_OK && reason != NULL && reason[0] != '\0' && strlen (reason) <= RPC_REASON_MAX)
    trailers[n_trailers++] = (grpc_metadata){.key = grpc_slice_from_static_string (RPC_REASON_KEY),
                                             .value = grpc_slice_from_copied_string (reason)};
  ops[n].data.send_status_from_server.trailing_metadata_count = n_trailers;
  ops[n].data.send_status_from_server.trailing_metadata = trailers;
  n++;
  /* A client that stopped reading does not keep the thread: past
   * RPC_FINISH_MS the call is cancelled, which completes the batch. */
  bool ok = false;
  if (rpc_call_start_batch (c, ops, n, &c->batch_tag) == GRPC_CALL_OK)
    {
      grpc_event ev = grpc_completion_queue_pluck (c->cq, &c->batch_tag, rpc_deadline_in_ms (RPC_FINISH_MS), NULL);
      if (ev.type != GRPC_OP_COMPLETE)
        {
          log_msg (SEV_WARNING, "%s: the client took no status for %d ms: cancelled", c->path, RPC_FINISH_MS);
          grpc_call_cancel (c->call, NULL);
          ev = grpc_completion_queue_pluck (c->cq, &c->batch_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
        }
      ok = ev.type == GRPC_OP_COMPLETE && ev.success;
    }
  grpc_slice_unref (det);
  if (n_trailers > 1)
    grpc_slice_unref (trailers[1].value);
  return ok ? 0 : -1;
}

int
rpc_call_recv (rpc_call_t *c, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err)
{
  *out = NULL;
  grpc_byte_buffer *bb = NULL;
  int got = rpc_call_recv_raw (c, &bb, err);
  if (got <= 0)
    return got;
  int rc = rpc_unpack (bb, desc, c->server->max_message, out, err);
  grpc_byte_buffer_destroy (bb);
  return rc < 0 ? -1 : 1;
}

void
rpc_call_quick_half_close (rpc_call_t *c)
{
  c->quick_half_close = true;
}

int
rpc_call_recv_raw (rpc_call_t *c, grpc_byte_buffer **out, err_t *err)
{
  *out = NULL;
  if (c->half_closed)
    return 0;
  /* Receives have a tag of their own (the one a receive started ahead
   * uses): a handler may receive on one thread while it sends on another. */
  rpc_call_recv_ahead (c);
  grpc_byte_buffer *bb = NULL;
  bool ok = false;
  if (c->ahead)
    {
      grpc_event ev = grpc_completion_queue_pluck (c->cq, &c->ahead_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
      ok = ev.type == GRPC_OP_COMPLETE && ev.success;
      bb = c->ahead_bb;
      c->ahead_bb = NULL;
      c->ahead = false;
    }
  rpc_call_first_message_done (c);
  if (ok && bb != NULL)
    c->got_message = true;
  if (!ok)
    {
      if (bb != NULL)
        grpc_byte_buffer_destroy (bb);
      c->peer_gone = true;
      return err_make (err, ECANCELED, "%s: the call was cancelled while receiving", c->path);
    }
  if (bb == NULL)
    {
      /* The end of the client's stream: a half-close — or a cancellation,
       * whose close notice follows at once. Tell them apart, so that a
       * client that gave up never has its partial stream taken as whole. */
      if (!c->closed && !c->quick_half_close)
        {
          gpr_timespec soon = rpc_deadline_in_ms (RPC_HALF_CLOSE_WINDOW_MS);
          if (grpc_completion_queue_pluck (c->cq, &c->close_tag, soon, NULL).type == GRPC_OP_COMPLETE)
            c->closed = true;
          else if (log_enabled (SEV_DEBUG))
            log_msg (SEV_DEBUG, "%s: no close notice within RPC_HALF_CLOSE_WINDOW_MS (%d ms): a half-close", c->path,
                     RPC_HALF_CLOSE_WINDOW_MS);
        }
      if (c->closed && c->cancelled)
        {
          c->peer_gone = true;
          return err_make (err, ECANCELED, "%s: the client cancelled the call", c->path);
        }
      c->half_closed = true;
      return 0;
    }
  if (grpc_byte_buffer_length (bb) > c->server->max_message)
    {
      size_t len = grpc_byte_buffer_length (bb);
      grpc_byte_buffer_destroy (bb);
      return err_make (err, EMSGSIZE, "%s: a message of %zu bytes exceeds the %zu-byte limit", c->path, len,
                       c->server->max_message);
    }
  *out = bb;
  return 1;
}

void
rpc_call_recv_ahead (rpc_call_t *c)
{
  if (c->ahead || c->half_closed || c->finished || c->peer_gone)
    return;
  grpc_op op;
  memset (&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->ahead_bb;
  c->ahead = rpc_call_start_batch (c, &op, 1, &c->ahead_tag) == GRPC_CALL_OK;
}

void
rpc_call_drain_ahead (rpc_call_t *c)
{
  if (!c->ahead)
    return;
  grpc_completion_queue_pluck (c->cq, &c->ahead_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
  if (c->ahead_bb != NULL)
    grpc_byte_buffer_destroy (c->ahead_bb);
  c->ahead_bb = NULL;
  c->ahead = false;
}

size_t
rpc_call_max_message (const rpc_call_t *c)
{
  return c->server->max_message;
}

/* The send in flight has completed with `ev`: its buffer goes; a failed
 * one means the client is gone. */
static int
send_done (rpc_call_t *c, grpc_event ev, err_t *err)
{
  c->sending = false;
  grpc_byte_buffer_destroy (c->send_bb);
  c->send_bb = NULL;
  if (ev.type != GRPC_OP_COMPLETE || !ev.success)
    {
      c->peer_gone = true;
      return err_make (err, ECANCELED, "%s: the client has gone", c->path);
    }
  return 0;
}

int
rpc_call_send_wait (rpc_call_t *c, err_t *err)
{
  if (!c->sending)
    return 0;
  return send_done (c, grpc_completion_queue_pluck (c->cq, &c->send_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL),
                    err);
}

int
rpc_call_send_wait_for (rpc_call_t *c, int64_t wait_ms, err_t *err)
{
  if (!c->sending)
    return 1;
  grpc_event ev = grpc_completion_queue_pluck (c->cq, &c->send_tag, rpc_deadline_in_ms (wait_ms), NULL);
  if (ev.type == GRPC_QUEUE_TIMEOUT)
    return 0;
  return send_done (c, ev, err) < 0 ? -1 : 1;
}

/* The operations that send `bb` (the initial metadata first, if still
 * due) into ops[0..1]; their count. */
static size_t
message_ops (rpc_call_t *c, grpc_byte_buffer *bb, grpc_op ops[2])
{
  size_t n = 0;
  add_initial_md (c, ops, &n);
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n].data.send_message.send_message = bb;
  return n + 1;
}

/* Sends `bb` (always destroyed) and waits until the transport has it. */
static int
send_buffer (rpc_call_t *c, grpc_byte_buffer *bb, err_t *err)
{
  if (rpc_call_send_wait (c, err) < 0)
    {
      grpc_byte_buffer_destroy (bb);
      return -1;
    }
  grpc_op ops[2];
  size_t n = message_ops (c, bb, ops);
  bool ok = rpc_call_run_batch (c, ops, n);
  grpc_byte_buffer_destroy (bb);
  if (!ok)
    {
      c->peer_gone = true;
      return err_make (err, ECANCELED, "%s: the client has gone", c->path);
    }
  return 0;
}

int
rpc_call_send (rpc_call_t *c, const ProtobufCMessage *msg, err_t *err)
{
  rpc_call_first_message_done (c); /* a handler that answers without reading is past it too */
  if (c->finished || c->peer_gone)
    return err_make (err, ECANCELED, "%s: the call has ended", c->path);
  grpc_byte_buffer *bb = NULL;
  if (rpc_pack (msg, c->server->max_message, &bb, err) < 0)
    return -1;
  return send_buffer (c, bb, err);
}

/* The slices of a raw send as a byte buffer (their references taken
 * over), or NULL with *err when they cannot go. */
static grpc_byte_buffer *
raw_buffer (rpc_call_t *c, grpc_slice *slices, size_t n, err_t *err)
{
  rpc_call_first_message_done (c);
  size_t len = 0;
  for (size_t i = 0; i < n; i++)
    len += GRPC_SLICE_LENGTH (slices[i]);
  grpc_byte_buffer *bb = NULL;
  if (c->finished || c->peer_gone)
    err_make (err, ECANCELED, "%s: the call has ended", c->path);
  else if (len > c->server->max_message)
    err_make (err, EMSGSIZE, "%s: a message of %zu bytes exceeds the %zu-byte limit", c->path, len,
              c->server->max_message);
  else
    bb = grpc_raw_byte_buffer_create (slices, n);
  for (size_t i = 0; i < n; i++)
    grpc_slice_unref (slices[i]);
  return bb;
}

int
rpc_call_send_raw (rpc_call_t *c, grpc_slice *slices, size_t n, err_t *err)
{
  grpc_byte_buffer *bb = raw_buffer (c, slices, n, err);
  return bb == NULL ? -1 : send_buffer (c, bb, err);
}

/* Starts sending `bb` (always taken over) once the previous send is done. */
static int
start_buffer (rpc_call_t *c, grpc_byte_buffer *bb, err_t *err)
{
  if (rpc_call_send_wait (c, err) < 0)
    {
      grpc_byte_buffer_destroy (bb);
      return -1;
    }
  grpc_op ops[2];
  size_t k = message_ops (c, bb, ops);
  if (rpc_call_start_batch (c, ops, k, &c->send_tag) != GRPC_CALL_OK)
    {
      grpc_byte_buffer_destroy (bb);
      c->peer_gone = true;
      return err_make (err, ECANCELED, "%s: the call has ended", c->path);
    }
  c->send_bb = bb;
  c->sending = true;
  return 0;
}

int
rpc_call_send_raw_start (rpc_call_t *c, grpc_slice *slices, size_t n, err_t *err)
{
  grpc_byte_buffer *bb = raw_buffer (c, slices, n, err);
  return bb == NULL ? -1 : start_buffer (c, bb, err);
}

int
rpc_call_send_start (rpc_call_t *c, const ProtobufCMessage *msg, err_t *err)
{
  rpc_call_first_message_done (c);
  if (c->finished || c->peer_gone)
    return err_make (err, ECANCELED, "%s: the call has ended", c->path);
  grpc_byte_buffer *bb = NULL;
  if (rpc_pack (msg, c->server->max_message, &bb, err) < 0)
    return -1;
  return start_buffer (c, bb, err);
}

int
rpc_call_reply (rpc_call_t *c, const ProtobufCMessage *msg, err_t *err)
{
  grpc_byte_buffer *bb = NULL;
  if (rpc_pack (msg, c->server->max_message, &bb, err) < 0)
    return -1;
  if (c->reply != NULL)
    grpc_byte_buffer_destroy (c->reply);
  c->reply = bb;
  return 0;
}

bool
rpc_call_cancelled (rpc_call_t *c)
{
  if (c->peer_gone)
    return true;
  if (!c->closed)
    {
      grpc_event ev = grpc_completion_queue_pluck (c->cq, &c->close_tag, gpr_inf_past (GPR_CLOCK_MONOTONIC), NULL);
      if (ev.type == GRPC_OP_COMPLETE)
        c->closed = true;
    }
  return c->closed && c->cancelled != 0;
}

bool
rpc_call_wait_closed (rpc_call_t *c)
{
  if (!c->closed)
    {
      grpc_completion_queue_pluck (c->cq, &c->close_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
      c->closed = true;
    }
  return c->cancelled != 0;
}

const char *
rpc_call_method (const rpc_call_t *c)
{
  return c->path;
}

rpc_server_t *
rpc_call_server (const rpc_call_t *c)
{
  return c->server;
}

char *
rpc_call_metadata (const rpc_call_t *c, const char *key)
{
  size_t klen = strlen (key);
  for (size_t i = 0; i < c->md.count; i++)
    {
      const grpc_slice *k = &c->md.metadata[i].key;
      if (GRPC_SLICE_LENGTH (*k) == klen && memcmp (GRPC_SLICE_START_PTR (*k), key, klen) == 0)
        {
          const grpc_slice *v = &c->md.metadata[i].value;
          return strndup ((const char *) GRPC_SLICE_START_PTR (*v), GRPC_SLICE_LENGTH (*v));
        }
    }
  return NULL;
}

int64_t
rpc_call_deadline_ms_left (const rpc_call_t *c)
{
  if (gpr_time_cmp (c->deadline, gpr_inf_future (c->deadline.clock_type)) == 0)
    return INT64_MAX;
  gpr_timespec d = gpr_convert_clock_type (c->deadline, GPR_CLOCK_MONOTONIC);
  gpr_timespec left = gpr_time_sub (d, gpr_now (GPR_CLOCK_MONOTONIC));
  return gpr_time_to_millis (left);
}

void
rpc_call_cancel (rpc_call_t *c, grpc_status_code code, const char *why)
{
  grpc_call_cancel_with_status (c->call, code, why, NULL);
}
