/* rpc_client: the client half of the call layer (see rpc.h).
 *
 * Each call has a private "pluck" completion queue: its operations are
 * started and waited for by the thread that owns the call, one batch at a
 * time, and RECV_STATUS_ON_CLIENT is started with the call so that its end
 * is noticed whatever the caller is doing. Request metadata goes out with the
 * first batch; a unary call is a single batch.
 *
 * Threading: a call belongs to one thread; rpc_client_cancel() may be called
 * from any thread (grpc_call_cancel is thread-safe). Once the first send
 * and the first receive have returned (request metadata is out and the
 * response metadata is in, so neither path writes shared state again),
 * one thread may send while another receives: the two paths start their
 * batches under different tags and pluck only their own. Channels are
 * shared.
 */
#include "common/rpc/internal.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"

struct rpc_channel_s
{
  grpc_channel *channel;
  size_t max_message;
};

struct rpc_client_call_s
{
  rpc_channel_t *ch;
  char *method;
  grpc_call *call;
  grpc_completion_queue *cq;
  grpc_metadata *md;
  size_t n_md;
  bool md_sent;
  bool md_received;
  bool send_closed;
  bool status_done;
  grpc_metadata_array initial_md;
  grpc_metadata_array trailing_md;
  grpc_status_code status;
  grpc_slice status_details;
  int status_tag;
  int send_tag; /* its address tags sends and the half-close */
  int recv_tag; /* its address tags receives */
};

int
rpc_channel_new (const char *target, const rpc_opts_t *opts, rpc_channel_t **out, err_t *err)
{
  *out = NULL;
  rpc_channel_args_t args;
  rpc_channel_args_init (&args, opts, false);
  grpc_channel_credentials *creds = NULL;
  if (opts != NULL && opts->tls)
    {
      cleanup_free char *ca = NULL;
      cleanup_free char *cert = NULL;
      cleanup_free char *key = NULL;
      if (opts->tls_ca_file != NULL && rpc_read_pem (opts->tls_ca_file, &ca, err) < 0)
        return err_wrap (err, "TLS CA");
      if ((opts->tls_cert_file != NULL) != (opts->tls_key_file != NULL))
        return err_make (err, EINVAL, "a TLS client certificate needs both a certificate and a key file");
      if (opts->tls_cert_file != NULL
          && (rpc_read_pem (opts->tls_cert_file, &cert, err) < 0 || rpc_read_pem (opts->tls_key_file, &key, err) < 0))
        return err_wrap (err, "TLS client certificate");
      grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
      creds = grpc_ssl_credentials_create (ca, cert != NULL ? &pair : NULL, NULL, NULL);
    }
  else
    creds = grpc_insecure_credentials_create ();
  if (creds == NULL)
    return err_make (err, EINVAL, "channel to `%s`: cannot create credentials", target);

  rpc_channel_t *ch = calloc (1, sizeof *ch);
  if (ch == NULL)
    {
      grpc_channel_credentials_release (creds);
      return err_make (err, ENOMEM, "channel to `%s`: out of memory", target);
    }
  ch->channel = grpc_channel_create (target, creds, &args.channel_args);
  grpc_channel_credentials_release (creds);
  ch->max_message = args.max_message;
  *out = ch;
  return 0;
}

void
rpc_channel_destroy (rpc_channel_t *ch)
{
  if (ch == NULL)
    return;
  grpc_channel_destroy (ch->channel);
  free (ch);
}

size_t
rpc_channel_max_message (const rpc_channel_t *ch)
{
  return ch->max_message;
}

/* Adds SEND_INITIAL_METADATA (with the call's metadata) if not yet sent. */
static void
add_initial_md (rpc_client_call_t *c, grpc_op *ops, size_t *n)
{
  if (c->md_sent)
    return;
  memset (&ops[*n], 0, sizeof ops[*n]);
  ops[*n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[*n].data.send_initial_metadata.count = c->n_md;
  ops[*n].data.send_initial_metadata.metadata = c->md;
  (*n)++;
  c->md_sent = true;
}

static void
add_recv_initial_md (rpc_client_call_t *c, grpc_op *ops, size_t *n)
{
  if (c->md_received)
    return;
  memset (&ops[*n], 0, sizeof ops[*n]);
  ops[*n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[*n].data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
  (*n)++;
  c->md_received = true;
}

/* Starts a batch tagged `tag` and waits for it. Sends and receives use two
 * tags, so a sending thread and a receiving thread each pluck only their
 * own completion (the core allows one batch of each kind in flight). */
static bool
run_batch (rpc_client_call_t *c, const grpc_op *ops, size_t n, int *tag)
{
  if (grpc_call_start_batch (c->call, ops, n, tag, NULL) != GRPC_CALL_OK)
    return false;
  grpc_event ev = grpc_completion_queue_pluck (c->cq, tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int
rpc_client_start (rpc_channel_t *ch, const char *method, int64_t timeout_ms, const rpc_metadata_t *md, size_t n_md,
                  rpc_client_call_t **out, err_t *err)
{
  *out = NULL;
  rpc_client_call_t *c = calloc (1, sizeof *c);
  if (c == NULL)
    return err_make (err, ENOMEM, "call `%s`: out of memory", method);
  c->ch = ch;
  c->method = strdup (method);
  c->md = n_md > 0 ? calloc (n_md, sizeof *c->md) : NULL;
  if (c->method == NULL || (n_md > 0 && c->md == NULL))
    {
      free (c->method);
      free (c->md);
      free (c);
      return err_make (err, ENOMEM, "call `%s`: out of memory", method);
    }
  for (size_t i = 0; i < n_md; i++)
    {
      c->md[i].key = grpc_slice_from_copied_string (md[i].key);
      c->md[i].value = grpc_slice_from_copied_string (md[i].value);
    }
  c->n_md = n_md;
  grpc_metadata_array_init (&c->initial_md);
  grpc_metadata_array_init (&c->trailing_md);
  c->status_details = grpc_empty_slice ();
  c->cq = grpc_completion_queue_create_for_pluck (NULL);

  gpr_timespec deadline = timeout_ms > 0 ? rpc_deadline_in_ms (timeout_ms) : gpr_inf_future (GPR_CLOCK_REALTIME);
  grpc_slice path = grpc_slice_from_copied_string (method);
  c->call = grpc_channel_create_call (ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, path, NULL, deadline, NULL);
  grpc_slice_unref (path);

  grpc_op op;
  memset (&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &c->trailing_md;
  op.data.recv_status_on_client.status = &c->status;
  op.data.recv_status_on_client.status_details = &c->status_details;
  if (c->call == NULL || grpc_call_start_batch (c->call, &op, 1, &c->status_tag, NULL) != GRPC_CALL_OK)
    {
      c->status_done = true;
      rpc_client_destroy (c);
      return err_make (err, EIO, "call `%s`: cannot start", method);
    }
  *out = c;
  return 0;
}

int
rpc_client_send (rpc_client_call_t *c, const ProtobufCMessage *msg, err_t *err)
{
  if (c->send_closed)
    return err_make (err, EINVAL, "%s: send after close", c->method);
  grpc_byte_buffer *bb = NULL;
  if (rpc_pack (msg, c->ch->max_message, &bb, err) < 0)
    return -1;
  grpc_op ops[2];
  size_t n = 0;
  add_initial_md (c, ops, &n);
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n].data.send_message.send_message = bb;
  n++;
  bool ok = run_batch (c, ops, n, &c->send_tag);
  grpc_byte_buffer_destroy (bb);
  if (!ok)
    return err_make (err, ECANCELED, "%s: the call has ended", c->method);
  return 0;
}

int
rpc_client_close_send (rpc_client_call_t *c, err_t *err)
{
  if (c->send_closed)
    return 0;
  c->send_closed = true;
  grpc_op ops[2];
  size_t n = 0;
  add_initial_md (c, ops, &n);
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  n++;
  if (!run_batch (c, ops, n, &c->send_tag))
    return err_make (err, ECANCELED, "%s: the call has ended", c->method);
  return 0;
}

int
rpc_client_recv_raw (rpc_client_call_t *c, grpc_byte_buffer **out, err_t *err)
{
  *out = NULL;
  grpc_byte_buffer *bb = NULL;
  grpc_op ops[3];
  size_t n = 0;
  add_initial_md (c, ops, &n);
  add_recv_initial_md (c, ops, &n);
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n].data.recv_message.recv_message = &bb;
  n++;
  bool ok = run_batch (c, ops, n, &c->recv_tag);
  if (!ok || bb == NULL)
    {
      if (bb != NULL)
        grpc_byte_buffer_destroy (bb);
      return 0; /* the stream has ended; rpc_client_finish says how */
    }
  size_t len = grpc_byte_buffer_length (bb);
  if (len > c->ch->max_message)
    {
      grpc_byte_buffer_destroy (bb);
      rpc_client_cancel (c);
      return err_make (err, EMSGSIZE, "%s: a message of %zu bytes exceeds the %zu-byte limit", c->method, len,
                       c->ch->max_message);
    }
  *out = bb;
  return 1;
}

int
rpc_client_recv (rpc_client_call_t *c, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err)
{
  *out = NULL;
  grpc_byte_buffer *bb = NULL;
  int got = rpc_client_recv_raw (c, &bb, err);
  if (got <= 0)
    return got;
  int rc = rpc_unpack (bb, desc, c->ch->max_message, out, err);
  grpc_byte_buffer_destroy (bb);
  if (rc < 0)
    {
      rpc_client_cancel (c);
      return -1;
    }
  return 1;
}

/* A status-reason trailer: kept when it is a short word of [a-z0-9-]
 * (anything else from a peer is taken as no reason). */
static void
take_reason (rpc_status_t *st, grpc_slice v)
{
  size_t n = GRPC_SLICE_LENGTH (v);
  const char *p = (const char *) GRPC_SLICE_START_PTR (v);
  if (n == 0 || n > RPC_REASON_MAX)
    return;
  for (size_t i = 0; i < n; i++)
    if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '-'))
      return;
  memcpy (st->reason, p, n);
  st->reason[n] = '\0';
}

grpc_status_code
rpc_client_finish (rpc_client_call_t *c, rpc_status_t *st)
{
  if (!c->status_done)
    {
      grpc_completion_queue_pluck (c->cq, &c->status_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
      c->status_done = true;
    }
  if (st != NULL)
    {
      rpc_status_release (st);
      st->code = c->status;
      st->details
          = strndup ((const char *) GRPC_SLICE_START_PTR (c->status_details), GRPC_SLICE_LENGTH (c->status_details));
      st->from_handler = false;
      st->reason[0] = '\0';
      for (size_t i = 0; i < c->trailing_md.count; i++)
        {
          const grpc_metadata *md = &c->trailing_md.metadata[i];
          if (grpc_slice_str_cmp (md->key, RPC_ORIGIN_KEY) == 0
              && grpc_slice_str_cmp (md->value, RPC_ORIGIN_HANDLER) == 0)
            st->from_handler = true;
          else if (grpc_slice_str_cmp (md->key, RPC_REASON_KEY) == 0)
            take_reason (st, md->value);
        }
    }
  return c->status;
}

void
rpc_client_cancel (rpc_client_call_t *c)
{
  if (c != NULL && c->call != NULL)
    grpc_call_cancel (c->call, NULL);
}

void
rpc_client_destroy (rpc_client_call_t *c)
{
  if (c == NULL)
    return;
  if (c->call != NULL)
    {
      if (!c->status_done)
        {
          grpc_call_cancel (c->call, NULL);
          grpc_completion_queue_pluck (c->cq, &c->status_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
        }
      grpc_call_unref (c->call);
    }
  rpc_cq_destroy (c->cq);
  for (size_t i = 0; i < c->n_md; i++)
    {
      grpc_slice_unref (c->md[i].key);
      grpc_slice_unref (c->md[i].value);
    }
  free (c->md);
  grpc_metadata_array_destroy (&c->initial_md);
  grpc_metadata_array_destroy (&c->trailing_md);
  grpc_slice_unref (c->status_details);
  free (c->method);
  free (c);
}

int
rpc_client_unary (rpc_channel_t *ch, const char *method, int64_t timeout_ms, const rpc_metadata_t *md, size_t n_md,
                  const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                  rpc_status_t *st, err_t *err)
{
  *resp = NULL;
  grpc_byte_buffer *out = NULL;
  if (rpc_pack (req, ch->max_message, &out, err) < 0)
    return -1;
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (ch, method, timeout_ms, md, n_md, &c, err) < 0)
    {
      grpc_byte_buffer_destroy (out);
      return -1;
    }
  /* The whole exchange in one batch. */
  grpc_byte_buffer *in = NULL;
  grpc_op ops[5];
  size_t n = 0;
  add_initial_md (c, ops, &n);
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n].data.send_message.send_message = out;
  n++;
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  n++;
  c->send_closed = true;
  add_recv_initial_md (c, ops, &n);
  memset (&ops[n], 0, sizeof ops[n]);
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n].data.recv_message.recv_message = &in;
  n++;
  run_batch (c, ops, n, &c->send_tag);
  grpc_byte_buffer_destroy (out);

  rpc_status_t local = RPC_STATUS_INIT;
  rpc_status_t *status = st != NULL ? st : &local;
  grpc_status_code code = rpc_client_finish (c, status);
  int rc = 0;
  if (code != GRPC_STATUS_OK)
    rc = err_make (err, rpc_errno_from_status (code), "%s: %s: %s", method, rpc_status_name (code),
                   status->details != NULL ? status->details : "");
  else if (in == NULL)
    rc = err_make (err, EIO, "%s: OK without a response message", method);
  else if (rpc_unpack (in, resp_desc, ch->max_message, resp, err) < 0)
    rc = err_wrap (err, "%s", method);
  if (in != NULL)
    grpc_byte_buffer_destroy (in);
  rpc_status_release (&local);
  if (rc == 0 && st != NULL)
    rpc_status_release (st); /* an OK status holds nothing the caller frees (it used to leak its details) */
  rpc_client_destroy (c);
  return rc;
}
