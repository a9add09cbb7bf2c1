/* rpc_common: what the server and client halves of the call layer share:
 * library init, the errno ↔ gRPC status tables, message packing, channel
 * arguments and reading PEM files. No state beyond gRPC's own refcount. */
#include "common/rpc/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"

/* gRPC core's own log lines go through our JSON logger, so stderr stays one
 * JSON object per line. */
static void
core_log (gpr_log_func_args *args)
{
  log_level_t level = args->severity == GPR_LOG_SEVERITY_ERROR  ? SEV_ERROR
                      : args->severity == GPR_LOG_SEVERITY_INFO ? SEV_INFO
                                                                : SEV_DEBUG;
  log_fields (level, json_pack ("{s:s, s:s, s:i}", "component", "grpc", "file", args->file, "line", args->line), "%s",
              args->message);
}

void
rpc_init (void)
{
  gpr_set_log_function (core_log);
  grpc_init ();
}

void
rpc_shutdown (void)
{
  grpc_shutdown ();
}

void
rpc_status_release (rpc_status_t *st)
{
  if (st == NULL)
    return;
  free (st->details);
  st->details = NULL;
  st->code = GRPC_STATUS_OK;
  st->from_handler = false;
  st->reason[0] = '\0';
}

static const struct
{
  int errnum;
  grpc_status_code code;
} errno_table[] = {
    {EINVAL, GRPC_STATUS_INVALID_ARGUMENT},
    {ENAMETOOLONG, GRPC_STATUS_INVALID_ARGUMENT},
    {E2BIG, GRPC_STATUS_INVALID_ARGUMENT},
    {EBADMSG, GRPC_STATUS_INVALID_ARGUMENT},
    {ENOENT, GRPC_STATUS_NOT_FOUND},
    {ESRCH, GRPC_STATUS_NOT_FOUND},
    {EEXIST, GRPC_STATUS_ALREADY_EXISTS},
    {ENOSPC, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EDQUOT, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EAGAIN, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EMFILE, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {ENFILE, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {ENOMEM, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EMSGSIZE, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EUSERS, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {ETIMEDOUT, GRPC_STATUS_DEADLINE_EXCEEDED},
    {ECANCELED, GRPC_STATUS_CANCELLED},
    {ENOSYS, GRPC_STATUS_UNIMPLEMENTED},
    {EKEYREJECTED, GRPC_STATUS_UNAUTHENTICATED},
    {ESHUTDOWN, GRPC_STATUS_UNAVAILABLE},
    {ECONNREFUSED, GRPC_STATUS_UNAVAILABLE},
    {EPERM, GRPC_STATUS_PERMISSION_DENIED},
    {EACCES, GRPC_STATUS_PERMISSION_DENIED},
    {EBUSY, GRPC_STATUS_FAILED_PRECONDITION},
    {EFBIG, GRPC_STATUS_FAILED_PRECONDITION}, /* the sandbox holds something a snapshot cannot carry */
    /* The file API: the path is not of the kind the operation needs. */
    {EISDIR, GRPC_STATUS_FAILED_PRECONDITION},
    {ENOTDIR, GRPC_STATUS_FAILED_PRECONDITION},
    {ENOTEMPTY, GRPC_STATUS_FAILED_PRECONDITION},
    {ELOOP, GRPC_STATUS_FAILED_PRECONDITION},
    {EXDEV, GRPC_STATUS_FAILED_PRECONDITION},
    {ETXTBSY, GRPC_STATUS_FAILED_PRECONDITION},
    {EROFS, GRPC_STATUS_PERMISSION_DENIED},
    {ENOTCONN, GRPC_STATUS_FAILED_PRECONDITION},  /* nothing listens on a sandbox's port */
    {ECONNRESET, GRPC_STATUS_UNAVAILABLE},        /* a sandbox's server reset a forwarded connection */
    {EREMOTEIO, GRPC_STATUS_FAILED_PRECONDITION}, /* a registry refused an image */
};

grpc_status_code
rpc_status_from_errno (int status)
{
  for (size_t i = 0; i < sizeof errno_table / sizeof errno_table[0]; i++)
    if (errno_table[i].errnum == status)
      return errno_table[i].code;
  return GRPC_STATUS_INTERNAL;
}

int
rpc_errno_from_status (grpc_status_code code)
{
  if (code == GRPC_STATUS_OK)
    return 0;
  if (code == GRPC_STATUS_UNKNOWN || code == GRPC_STATUS_INTERNAL || code == GRPC_STATUS_DATA_LOSS)
    return EIO;
  for (size_t i = 0; i < sizeof errno_table / sizeof errno_table[0]; i++)
    if (errno_table[i].code == code)
      return errno_table[i].errnum; /* the first entry is the canonical errno */
  return EIO;
}

const char *
rpc_status_name (grpc_status_code code)
{
  static const char *const names[] = {
      "OK",        "CANCELLED",       "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS",  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",    "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED",
  };
  if ((unsigned) code < sizeof names / sizeof names[0])
    return names[code];
  return "UNKNOWN";
}

int
rpc_pack (const ProtobufCMessage *msg, size_t max, grpc_byte_buffer **out, err_t *err)
{
  size_t len = protobuf_c_message_get_packed_size (msg);
  if (len > max)
    return err_make (err, EMSGSIZE, "%s of %zu bytes exceeds the %zu-byte message limit", msg->descriptor->name, len,
                     max);
  grpc_slice slice = grpc_slice_malloc (len);
  protobuf_c_message_pack (msg, GRPC_SLICE_START_PTR (slice));
  *out = grpc_raw_byte_buffer_create (&slice, 1);
  grpc_slice_unref (slice);
  return 0;
}

int
rpc_unpack (grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc, size_t max, ProtobufCMessage **out,
            err_t *err)
{
  *out = NULL;
  size_t len = grpc_byte_buffer_length (bb);
  if (len > max)
    return err_make (err, EMSGSIZE, "%s of %zu bytes exceeds the %zu-byte message limit", desc->name, len, max);

  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init (&reader, bb))
    return err_make (err, EINVAL, "%s: cannot read the message bytes", desc->name);

  grpc_slice slice;
  bool single = bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE
                && bb->data.raw.slice_buffer.count == 1;
  if (single)
    slice = grpc_slice_ref (bb->data.raw.slice_buffer.slices[0]); /* no copy */
  else
    slice = grpc_byte_buffer_reader_readall (&reader);
  grpc_byte_buffer_reader_destroy (&reader);

  *out = protobuf_c_message_unpack (desc, NULL, GRPC_SLICE_LENGTH (slice), GRPC_SLICE_START_PTR (slice));
  grpc_slice_unref (slice);
  if (*out == NULL)
    return err_make (err, EINVAL, "%s: the message does not decode", desc->name);
  return 0;
}

int
rpc_channel_args_init (rpc_channel_args_t *a, const rpc_opts_t *opts, bool server)
{
  size_t max = opts != NULL && opts->max_message_bytes > 0 ? opts->max_message_bytes : RPC_DEFAULT_MAX_MESSAGE_BYTES;
  int keepalive = opts != NULL && opts->keepalive_ms > 0 ? opts->keepalive_ms : RPC_DEFAULT_KEEPALIVE_MS;
  if (max > INT32_MAX)
    max = INT32_MAX;
  a->max_message = max;
  size_t n = 0;
#define ARG_INT(k, v)                                                                                                \
  do                                                                                                                 \
    {                                                                                                                \
      a->args[n].type = GRPC_ARG_INTEGER;                                                                            \
      a->args[n].key = (char *) (k);                                                                                 \
      a->args[n].value.integer = (v);                                                                                \
      n++;                                                                                                           \
    }                                                                                                                \
  while (0)
  ARG_INT (GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int) max);
  ARG_INT (GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int) max);
  ARG_INT (GRPC_ARG_KEEPALIVE_TIME_MS, keepalive);
  ARG_INT (GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  ARG_INT (GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  ARG_INT (GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (opts != NULL && opts->fixed_window)
    {
      /* A fixed receive window: with automatic growth (BDP probing) a fast
       * sender can park tens of MiB in this process when it relays to a
       * slower consumer. 4 MiB per stream keeps memory bounded. */
      ARG_INT (GRPC_ARG_HTTP2_BDP_PROBE, 0);
      ARG_INT (GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4 * 1024 * 1024);
    }
  if (server)
    {
      /* Never share a port with another process (SO_REUSEPORT would let a
       * second server silently take half the calls). */
      ARG_INT (GRPC_ARG_ALLOW_REUSEPORT, 0);
      /* Accept the peer's keepalive pings at our own interval; a peer that
       * pings more often than half of it while no data flows gets two
       * strikes, then GOAWAY "too_many_pings" (gRPC's own enforcement). */
      ARG_INT (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, keepalive / 2);
      ARG_INT (GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
      /* Streams per connection: no more than the server's calls in all (a
       * client such as the shim multiplexes all its calls on one
       * connection). Refused and reset streams are freed without a thread
       * (server.c); gRPC core 1.51 stops counting a reset stream at once,
       * so this bounds streams held open, not a rapid reset. */
      size_t max_calls = opts != NULL && opts->max_calls > 0 ? opts->max_calls : RPC_DEFAULT_MAX_CALLS;
      ARG_INT (GRPC_ARG_MAX_CONCURRENT_STREAMS, (int) (max_calls > INT32_MAX ? INT32_MAX : max_calls));
      /* A connection without calls is closed (GOAWAY) after a while; every
       * connection is sent GOAWAY after RPC_CONNECTION_AGE_MS so clients
       * reconnect (and rebalance), its calls running on without limit. */
      int idle
          = opts != NULL && opts->connection_idle_ms > 0 ? opts->connection_idle_ms : RPC_DEFAULT_CONNECTION_IDLE_MS;
      ARG_INT (GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle);
      ARG_INT (GRPC_ARG_MAX_CONNECTION_AGE_MS, RPC_CONNECTION_AGE_MS);
      ARG_INT (GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, INT32_MAX);
      /* A TLS handshake not done within this is dropped (gRPC's default
       * is 120 s: a client could hold its connection slots that long). */
      ARG_INT (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, RPC_HANDSHAKE_TIMEOUT_MS);
    }
#undef ARG_INT
  if (!server && opts != NULL && opts->tls && opts->tls_server_name != NULL)
    {
      a->args[n].type = GRPC_ARG_STRING;
      a->args[n].key = (char *) GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
      a->args[n].value.string = (char *) opts->tls_server_name;
      n++;
    }
  a->channel_args.num_args = n;
  a->channel_args.args = a->args;
  return 0;
}

void
rpc_cq_destroy (grpc_completion_queue *cq)
{
  grpc_completion_queue_shutdown (cq);
  while (grpc_completion_queue_pluck (cq, NULL, gpr_inf_future (GPR_CLOCK_REALTIME), NULL).type
         != GRPC_QUEUE_SHUTDOWN)
    continue;
  grpc_completion_queue_destroy (cq);
}

int
rpc_read_pem (const char *path, char **out, err_t *err)
{
  *out = NULL;
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  struct stat st;
  if (fstat (fd, &st) < 0)
    return err_make_sys (err, errno, "stat `%s`", path);
  if (st.st_size > 1024 * 1024)
    return err_make (err, EFBIG, "`%s` is larger than 1 MiB: not a PEM file", path);
  cleanup_free char *buf = malloc ((size_t) st.st_size + 1);
  if (buf == NULL)
    return err_make (err, ENOMEM, "read `%s`: out of memory", path);
  size_t off = 0;
  while (off < (size_t) st.st_size)
    {
      ssize_t r = TEMP_FAILURE_RETRY (read (fd, buf + off, (size_t) st.st_size - off));
      if (r < 0)
        return err_make_sys (err, errno, "read `%s`", path);
      if (r == 0)
        break;
      off += (size_t) r;
    }
  buf[off] = '\0';
  *out = take_ptr (&buf);
  return 0;
}
