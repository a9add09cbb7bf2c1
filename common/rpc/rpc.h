/* rpc: a small call layer over the gRPC C core, for servers and clients.
 *
 * It owns the completion-queue plumbing so that handlers and clients are
 * written as straight-line blocking code:
 *
 *   - Server: rpc_server_add_method() registers a handler per method path;
 *     rpc_server_start() listens and accepts calls; every accepted call
 *     runs its handler on a thread of its own (the one that accepted it),
 *     with a private completion queue, so a handler may block (on a pipe, a
 *     child process, the next message) without holding up any other call. Handlers use
 *     rpc_call_recv / rpc_call_send / rpc_call_reply and return; the layer
 *     sends the final status. A handler notices a client that went away when
 *     a send fails or rpc_call_cancelled() says so.
 *   - Client: rpc_channel_new() opens a channel; rpc_client_start() starts a
 *     call of any shape and rpc_client_send / recv / close_send / finish drive
 *     it; rpc_client_unary() does a whole unary call.
 *   - Messages: protobuf-c messages are packed straight into one gRPC slice
 *     and unpacked from the received buffer without an intermediate copy when
 *     it is contiguous. Sizes above the configured limit are refused.
 *   - TLS on both sides from PEM files (rpc_opts_t).
 *
 * Threading: an rpc_server_t is driven from one controlling thread (new, add,
 * start, shutdown, destroy). An rpc_call_t belongs to its handler's thread.
 * An rpc_client_call_t belongs to one thread, with two exceptions: any
 * thread may call rpc_client_cancel(), and a bidirectional stream may be
 * split between a sending and a receiving thread (see rpc_client_recv).
 * rpc_channel_t is shared freely between threads.
 *
 * Call rpc_init() once before anything else and rpc_shutdown() at the end.
 */
#ifndef SBX_COMMON_RPC_H
#define SBX_COMMON_RPC_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Default limit on one message in either direction. */
#define RPC_DEFAULT_MAX_MESSAGE_BYTES (16u * 1024u * 1024u)

/* How often keepalive pings are sent on idle connections (both sides), so a
 * stream that carries nothing for an hour is neither cut by a middlebox nor
 * left dangling when the peer vanished. */
#define RPC_DEFAULT_KEEPALIVE_MS 30000

/* Options shared by servers and channels. Zero-initialise, then set what you
 * need; every pointer is borrowed for the duration of the call it is passed
 * to. */
typedef struct rpc_opts_s
{
  size_t max_message_bytes; /* 0: RPC_DEFAULT_MAX_MESSAGE_BYTES */
  int keepalive_ms;         /* 0: RPC_DEFAULT_KEEPALIVE_MS */
  /* Receive with a fixed 4 MiB window per stream instead of growing it
   * with the measured bandwidth-delay product: for processes that relay
   * streams to slower consumers (the shim; the gateway's restores), so a
   * fast peer cannot fill their memory. Costs some throughput. */
  bool fixed_window;
  /* TLS. Server: cert + key enable TLS; ca additionally requires and
   * verifies client certificates (mTLS). Client: `tls` enables TLS; ca is
   * the root bundle (NULL: the system's); cert + key present a client
   * certificate. */
  bool tls;
  const char *tls_cert_file;
  const char *tls_key_file;
  const char *tls_ca_file;
  /* Client only: the name to verify the server certificate against instead
   * of the target's host (tests, IP targets). */
  const char *tls_server_name;
  /* Server only: every call gets a thread of its own, so calls are capped
   * before they get one. At most `max_calls` calls run at once (0:
   * RPC_DEFAULT_MAX_CALLS), of which at most `max_open_calls` (0:
   * RPC_DEFAULT_MAX_OPEN_CALLS) to methods without an admission check
   * (health, reflection: anyone can call them); beyond, new calls get
   * RESOURCE_EXHAUSTED without a thread. A call whose first message has
   * not arrived `first_message_ms` (0: RPC_DEFAULT_FIRST_MESSAGE_MS) after
   * it was accepted is cancelled, so held-open calls free their slots. */
  size_t max_calls;
  size_t max_open_calls;
  int first_message_ms;
  /* Server only, plaintext only (the layer accepts connections itself;
   * gRPC core 1.51 takes ready sockets only without TLS): at most
   * `max_connections` connections at once (0: RPC_DEFAULT_MAX_CONNECTIONS),
   * `max_connections_per_peer` of them from one address (0:
   * RPC_DEFAULT_MAX_CONNECTIONS_PER_PEER); beyond, a new connection is
   * closed as soon as it is accepted. */
  size_t max_connections;
  size_t max_connections_per_peer;
  /* Server only: a connection without calls for this long is sent GOAWAY
   * and closed (0: RPC_DEFAULT_CONNECTION_IDLE_MS). */
  int connection_idle_ms;
} rpc_opts_t;

#define RPC_DEFAULT_MAX_CALLS 2048
#define RPC_DEFAULT_MAX_OPEN_CALLS 64
#define RPC_DEFAULT_FIRST_MESSAGE_MS 10000
#define RPC_DEFAULT_MAX_CONNECTIONS 1024
/* A server's TLS handshake must end within this, or the connection closes. */
#define RPC_HANDSHAKE_TIMEOUT_MS 10000
#define RPC_DEFAULT_MAX_CONNECTIONS_PER_PEER 64
#define RPC_DEFAULT_CONNECTION_IDLE_MS (5 * 60 * 1000)

/* A connection older than this is sent GOAWAY (with gRPC's own jitter):
 * its client reconnects for new calls, and the calls it still carries run
 * on, without a grace limit (an interactive stream may last for hours). */
#define RPC_CONNECTION_AGE_MS (60 * 60 * 1000)

/* A server's threads: one per call in progress (at most max_calls), plus
 * those waiting for the next call; refused calls get none. Past this many
 * a new call is refused RESOURCE_EXHAUSTED "no thread for the call",
 * whatever clients do. */
#define RPC_SPARE_THREADS 16
#define RPC_MAX_THREADS(max_calls) ((max_calls) + RPC_SPARE_THREADS)

/* The memory gRPC core may use for its transports (read buffers, frames in
 * flight); near it, the core sends GOAWAY to connections without calls
 * first, then cancels streams. */
#define RPC_MEMORY_QUOTA_BYTES (1024u * 1024u * 1024u)

/* A refused call is answered without a thread: its status is sent
 * asynchronously; if it is not out RPC_REFUSE_MS later (a client that does
 * not read), the call is cancelled. At most RPC_MAX_REFUSING such answers
 * are under way; beyond, refusals are cancellations that carry the status
 * but not the `status-origin` trailer. */
#define RPC_REFUSE_MS 2000
#define RPC_MAX_REFUSING 1024

/* A handler's final status that the client does not take within this long
 * (it stopped reading) is given up: the call is cancelled. */
#define RPC_FINISH_MS 30000

/* A connection whose calls are refused or reset before their request, more
 * than RPC_CONN_RESETS_PER_SECOND on average past a burst of
 * RPC_CONN_RESETS_BURST (HTTP/2 "rapid reset": HEADERS then RST_STREAM), is
 * closed (plaintext servers, whose connections the layer accepts). */
#define RPC_CONN_RESETS_PER_SECOND 200
#define RPC_CONN_RESETS_BURST 400

/* The longest reason a status carries (RPC_REASON_KEY). */
#define RPC_REASON_MAX 31

/* A finished call's status. `details` is owned (free with rpc_status_release). */
typedef struct rpc_status_s
{
  grpc_status_code code;
  char *details;
  /* The status came from the server's handler layer (it carries the
   * RPC_ORIGIN_KEY trailer), not from the transport: "the server said
   * unavailable" rather than "there is no server". */
  bool from_handler;
  /* The handler's reason (its err_t's `reason`, sent as the RPC_REASON_KEY
   * trailer), "" for none; a longer or malformed value is taken as none. */
  char reason[RPC_REASON_MAX + 1];
} rpc_status_t;

/* clang-format off */
#define RPC_STATUS_INIT {GRPC_STATUS_OK, NULL, false, ""}
/* clang-format on */

/* Trailing metadata the server layer adds to every status it sends. */
#define RPC_ORIGIN_KEY "status-origin"
#define RPC_ORIGIN_HANDLER "handler"

/* Trailing metadata the server layer adds to a failed status whose error
 * has a reason: what the failure means to a program, in a word that does
 * not change when the message is reworded. */
#define RPC_REASON_KEY "status-reason"

void rpc_status_release (rpc_status_t *st);

/* Initialises and tears down the gRPC library (reference counted). */
void rpc_init (void);
void rpc_shutdown (void);

/* The gRPC status for an errno value: the single mapping table used at the
 * edge of every handler (EINVAL → INVALID_ARGUMENT, ENOENT → NOT_FOUND,
 * EEXIST → ALREADY_EXISTS, ENOSPC/EAGAIN/EMSGSIZE → RESOURCE_EXHAUSTED,
 * ETIMEDOUT → DEADLINE_EXCEEDED, ECANCELED → CANCELLED, ENOSYS →
 * UNIMPLEMENTED, EKEYREJECTED → UNAUTHENTICATED, ESHUTDOWN/ECONNREFUSED/
 * ECONNRESET → UNAVAILABLE, EPERM/EACCES/EROFS → PERMISSION_DENIED,
 * EBUSY/EFBIG/ENOTCONN and the file API's EISDIR/ENOTDIR/ENOTEMPTY/ELOOP/
 * EXDEV → FAILED_PRECONDITION, others → INTERNAL). */
grpc_status_code rpc_status_from_errno (int status);

/* The reverse, for clients that want an err_t from a failed call. */
int rpc_errno_from_status (grpc_status_code code);

/* The canonical upper-case name of a status code ("NOT_FOUND"). */
const char *rpc_status_name (grpc_status_code code);

/* ---- messages ---------------------------------------------------------- */

/* Packs `msg` into a new byte buffer (*out, owned by the caller). Fails with
 * EMSGSIZE when the packed size exceeds `max`. */
int rpc_pack (const ProtobufCMessage *msg, size_t max, grpc_byte_buffer **out, err_t *err);

/* Unpacks `bb` as a `desc` message into *out (free with
 * protobuf_c_message_free_unpacked). EMSGSIZE above `max`, EINVAL for bytes
 * that do not decode. */
int rpc_unpack (grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc, size_t max, ProtobufCMessage **out,
                err_t *err);

/* ---- server ------------------------------------------------------------ */

typedef struct rpc_server_s rpc_server_t;
typedef struct rpc_call_s rpc_call_t;

/* A method handler. It runs on the call's own thread. It returns 0 when it
 * has sent everything it wanted (the layer then sends status OK, together
 * with the message given to rpc_call_reply, if any), or -1 with *err filled:
 * the layer sends the status rpc_status_from_errno(err->status) with the
 * message as details. A handler that already called rpc_call_finish may
 * return either. */
typedef int (*rpc_handler_fn) (rpc_call_t *call, void *user, err_t *err);

/* Creates a server (not yet listening). *out is owned by the caller. */
int rpc_server_new (const rpc_opts_t *opts, rpc_server_t **out, err_t *err);

/* Decides, on the thread that accepts calls and before the call gets a
 * thread, whether a call may run (from its metadata: authentication).
 * Returns GRPC_STATUS_OK, or the status to refuse it with (*message: a
 * static text). Must not block. */
typedef grpc_status_code (*rpc_admit_fn) (rpc_call_t *call, void *user, const char **message);

/* Registers `fn` for the full method path ("/pkg.Service/Method"). `path` is
 * copied; `user` is passed to every invocation. Only before rpc_server_start.
 * Calls to unregistered methods are answered UNIMPLEMENTED. A method
 * registered without `admit` counts against max_open_calls. */
int rpc_server_add_method (rpc_server_t *s, const char *path, rpc_handler_fn fn, void *user, err_t *err);
int rpc_server_add_admitted_method (rpc_server_t *s, const char *path, rpc_admit_fn admit, rpc_handler_fn fn,
                                    void *user, err_t *err);

/* Listens on `addr` ("host:port"; port 0 picks a free one, returned in
 * *bound_port when not NULL) and starts accepting calls. */
int rpc_server_start (rpc_server_t *s, const char *addr, int *bound_port, err_t *err);

/* The first step of a graceful shutdown: the server keeps accepting calls,
 * but those to methods with an admission check (the service's own, not
 * health or reflection) are answered UNAVAILABLE "shutting down" from the
 * handler layer, while the calls already admitted run on. Returns when
 * none of those is left, or after `grace_ms`: the milliseconds of the grace
 * still unused (0 when calls were still running). Call rpc_server_shutdown
 * next. */
int64_t rpc_server_drain (rpc_server_t *s, int64_t grace_ms);

/* Graceful shutdown: stops accepting calls, lets in-flight calls finish for
 * up to `grace_ms`, then cancels the rest and waits for their handlers to
 * return. Idempotent. */
void rpc_server_shutdown (rpc_server_t *s, int64_t grace_ms);

/* True once rpc_server_shutdown has begun: long-running handlers (streams
 * that would otherwise wait for the client) should wind down. */
bool rpc_server_shutting_down (const rpc_server_t *s);

/* Shuts down (grace 0) if needed and frees the server. NULL is ignored. */
void rpc_server_destroy (rpc_server_t *s);

/* Number of calls whose handlers are running. */
size_t rpc_server_inflight (rpc_server_t *s);

/* In a handler: receives the next client message. Returns 1 with *out set
 * (free with protobuf_c_message_free_unpacked), 0 when the client has
 * half-closed (no more messages), -1 with *err on cancellation (ECANCELED)
 * or a message that does not decode (EINVAL) or is too large (EMSGSIZE). */
int rpc_call_recv (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err);

/* The same, without decoding: *out is the message's bytes as gRPC holds
 * them (free with grpc_byte_buffer_destroy), for a handler that reads a
 * large field in place. Messages over the limit are refused (EMSGSIZE). */
int rpc_call_recv_raw (rpc_call_t *call, grpc_byte_buffer **out, err_t *err);

/* Receiving and sending use separate tags: one thread may receive while
 * another sends on the same call (one of each at a time).
 *
 * Starts receiving the next message now, so that it arrives (and gRPC
 * opens its flow-control window for the one after) while the handler is
 * busy with the last one; the next rpc_call_recv or rpc_call_recv_raw takes
 * it. A no-op when one is already under way or the stream has ended. */
void rpc_call_recv_ahead (rpc_call_t *call);

/* The largest message a call accepts. */
size_t rpc_call_max_message (const rpc_call_t *call);

/* In a handler: sends one message and waits until the transport has taken it
 * (one send in flight per call: flow control holds a fast producer back to
 * the client's pace). -1 with ECANCELED when the client has gone. */
int rpc_call_send (rpc_call_t *call, const ProtobufCMessage *msg, err_t *err);

/* The same for a message already encoded as `slices` (their references are
 * taken over, also on failure), for a handler that frames a large field
 * itself and lends gRPC its bytes instead of copying them. */
int rpc_call_send_raw (rpc_call_t *call, grpc_slice *slices, size_t n, err_t *err);

/* The same, without waiting: the message is under way when it returns, so
 * the handler can prepare the next one meanwhile. One such send is in
 * flight at a time: this call, like every other send or the final status,
 * first waits until the transport has taken the previous one (its failure
 * is this call's). */
int rpc_call_send_raw_start (rpc_call_t *call, grpc_slice *slices, size_t n, err_t *err);
/* rpc_call_send without waiting, as rpc_call_send_raw_start: `msg` is
 * packed (copied) before it returns. */
int rpc_call_send_start (rpc_call_t *call, const ProtobufCMessage *msg, err_t *err);

/* Waits until the transport has taken the message of the last
 * rpc_call_send_raw_start: 0, or -1 with ECANCELED when the client has
 * gone. 0 when there is none in flight. */
int rpc_call_send_wait (rpc_call_t *call, err_t *err);

/* As rpc_call_send_wait, for at most `wait_ms`: 1 taken (or none in
 * flight), 0 still in flight (a client that does not read), -1 with
 * ECANCELED when the client has gone. */
int rpc_call_send_wait_for (rpc_call_t *call, int64_t wait_ms, err_t *err);

/* In a handler: sets the final message of a call (of a streaming one, its
 * last); it is sent with the OK status in one batch when the handler
 * returns 0 or calls rpc_call_finish. */
int rpc_call_reply (rpc_call_t *call, const ProtobufCMessage *msg, err_t *err);

/* In a handler: sends the final status now (and the rpc_call_reply message
 * when code is OK). Later sends fail. Returns 0, or -1 when it could not be
 * sent (the client has gone). */
int rpc_call_finish (rpc_call_t *call, grpc_status_code code, const char *details);
/* As rpc_call_finish, with `reason` (may be NULL; at most RPC_REASON_MAX
 * bytes of [a-z0-9-]) in the RPC_REASON_KEY trailer. */
int rpc_call_finish_reason (rpc_call_t *call, grpc_status_code code, const char *details, const char *reason);
/* rpc_call_finish with a handler's result: OK for rc 0, else the status,
 * message and reason of *err. */
int rpc_call_finish_err (rpc_call_t *call, int rc, const err_t *err);

/* True when the client cancelled the call, its deadline passed, or the
 * server is cancelling calls at shutdown. Cheap; does not block. */
bool rpc_call_cancelled (rpc_call_t *call);

/* From now on the end of the client's stream is taken as its half-close at
 * once, without the short wait (a few ms) that tells a half-close from a
 * cancellation: for a handler that watches for cancellation itself (e.g.
 * with rpc_call_wait_closed) and answers a half-close promptly. */
void rpc_call_quick_half_close (rpc_call_t *call);

/* Waits until the call is over (finished by the handler, or cancelled);
 * true when it was cancelled. For a handler's second thread that watches a
 * stream whose input has ended: it must be the only one looking (no
 * rpc_call_cancelled meanwhile). */
bool rpc_call_wait_closed (rpc_call_t *call);

/* The full method path of the call. Owned by the call. */
const char *rpc_call_method (const rpc_call_t *call);

/* Ends the call now with `code` and `why`, from any thread: what the
 * handler sends or receives afterwards fails. */
void rpc_call_cancel (rpc_call_t *call, grpc_status_code code, const char *why);

/* A copy of the first value of request metadata `key` (lower case), or NULL.
 * The caller frees it. */
char *rpc_call_metadata (const rpc_call_t *call, const char *key);

/* Milliseconds until the call's deadline (INT64_MAX when it has none;
 * negative when passed). */
int64_t rpc_call_deadline_ms_left (const rpc_call_t *call);

/* The server the call arrived on. */
rpc_server_t *rpc_call_server (const rpc_call_t *call);

/* ---- client ------------------------------------------------------------ */

typedef struct rpc_channel_s rpc_channel_t;
typedef struct rpc_client_call_s rpc_client_call_t;

/* One request metadata entry (borrowed strings; keys lower case). */
typedef struct rpc_metadata_s
{
  const char *key;
  const char *value;
} rpc_metadata_t;

/* Opens a channel to `target` ("host:port" or any gRPC target URI). The
 * connection is made lazily. *out is owned by the caller. */
int rpc_channel_new (const char *target, const rpc_opts_t *opts, rpc_channel_t **out, err_t *err);
void rpc_channel_destroy (rpc_channel_t *ch);

/* The channel's message size limit. */
size_t rpc_channel_max_message (const rpc_channel_t *ch);

/* Starts a call to `method` with a deadline `timeout_ms` from now (<= 0: no
 * deadline) and the given metadata. *out is owned by the caller (free with
 * rpc_client_destroy, which cancels the call if it is still running). */
int rpc_client_start (rpc_channel_t *ch, const char *method, int64_t timeout_ms, const rpc_metadata_t *md,
                      size_t n_md, rpc_client_call_t **out, err_t *err);

/* Sends one message. -1 with ECANCELED when the call has already ended (the
 * status from rpc_client_finish says why). */
int rpc_client_send (rpc_client_call_t *c, const ProtobufCMessage *msg, err_t *err);

/* Half-closes: tells the server no more messages follow. */
int rpc_client_close_send (rpc_client_call_t *c, err_t *err);

/* Receives the next server message: 1 with *out set, 0 at the end of the
 * server's stream (call rpc_client_finish for the status), -1 with *err.
 *
 * Sending and receiving use separate tags: once one rpc_client_send (or
 * rpc_client_close_send) and one rpc_client_recv have returned, one thread
 * may go on sending (rpc_client_send, rpc_client_close_send) while another
 * receives (rpc_client_recv), one call of each at a time. Both must have
 * returned before rpc_client_finish or rpc_client_destroy; cancelling
 * (from any thread) makes both return. */
int rpc_client_recv (rpc_client_call_t *c, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out,
                     err_t *err);

/* The same, without decoding: 1 with *out the message's bytes as gRPC
 * holds them (free with grpc_byte_buffer_destroy), for a caller that reads
 * a large field in place; 0 at the end of the server's stream; -1 with
 * EMSGSIZE for a message over the limit (the call is cancelled). */
int rpc_client_recv_raw (rpc_client_call_t *c, grpc_byte_buffer **out, err_t *err);

/* Waits for the call's final status into *st (caller releases it) and
 * returns its code. */
grpc_status_code rpc_client_finish (rpc_client_call_t *c, rpc_status_t *st);

/* Cancels the call. Safe from any thread, at any time before destroy. */
void rpc_client_cancel (rpc_client_call_t *c);

/* Frees the call (cancelling it first if it has not finished). */
void rpc_client_destroy (rpc_client_call_t *c);

/* A whole unary call: sends `req`, receives one `resp_desc` message into
 * *resp (NULL on error), fills *st (on success, released: OK, nothing to
 * free). Returns 0 when the status is OK; -1 with
 * *err otherwise (err->status from rpc_errno_from_status, the message naming
 * the method, the status and its details). */
int rpc_client_unary (rpc_channel_t *ch, const char *method, int64_t timeout_ms, const rpc_metadata_t *md,
                      size_t n_md, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                      ProtobufCMessage **resp, rpc_status_t *st, err_t *err);

/* A received protobuf-c message, freed when the scope ends:
 *     cleanup_message ProtobufCMessage *m = NULL; */
static inline void
cleanup_message_fn (void *p)
{
  ProtobufCMessage *m = *(ProtobufCMessage **) p;
  if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
}
#define cleanup_message __attribute__ ((cleanup (cleanup_message_fn)))

#endif
