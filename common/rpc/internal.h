/* rpc/internal: what server.c, call.c, client.c and common.c share, and nothing outside rpc/ sees. */
#ifndef SBX_COMMON_RPC_INTERNAL_H
#define SBX_COMMON_RPC_INTERNAL_H

#include "common/rpc/rpc.h"

/* Channel arguments built from rpc_opts_t: message limits and keepalive
 * (and, for clients, the TLS name override). Lives on the caller's stack
 * for the duration of the create call. */
typedef struct rpc_channel_args_s
{
  grpc_arg args[24];
  grpc_channel_args channel_args;
  size_t max_message;
} rpc_channel_args_t;

int rpc_channel_args_init (rpc_channel_args_t *a, const rpc_opts_t *opts, bool server);

/* Reads a whole PEM file (at most 1 MiB) into a NUL-terminated string that
 * the caller frees. */
int rpc_read_pem (const char *path, char **out, err_t *err);

/* Shuts down a pluck completion queue, drains it and destroys it. */
void rpc_cq_destroy (grpc_completion_queue *cq);

/* A monotonic deadline `ms` milliseconds from now; ms < 0 is in the past. */
gpr_timespec rpc_deadline_in_ms (int64_t ms);

/* ---- the server's state, shared by server.c and call.c ---- */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* listen.c: a server's own listening sockets and the table of its
 * connections (caps, rapid-reset budget). */
typedef struct rpc_listener_s rpc_listener_t;

/* The channel argument (and address) of the "external" listener that TLS
 * servers hand their accepted connections to (external.cc). */
#define RPC_EXTERNAL_LISTENER "external:rpc-tls"

/* external.cc: hands accepted socket `fd` to gRPC core's connection
 * handler `handler` (filled in through RPC_EXTERNAL_LISTENER). */
#ifdef __cplusplus
extern "C"
#endif
    void
    rpc_external_handle (void *handler, int listener_fd, int fd);

/* Listens on `addr` ("host:port") and hands every connection under the
 * caps to `server`: plaintext through grpc_server_add_channel_from_fd,
 * or, with `external` (the handler of an RPC_EXTERNAL_LISTENER listener,
 * which carries the credentials), through it. *port is the port bound.
 * *out is set also on failure (free it with rpc_listener_free). */
int rpc_listener_start (grpc_server *server, void *external, const char *addr, size_t max_total, size_t max_per_peer,
                        rpc_listener_t **out, int *port, err_t *err);
/* Stops accepting (joins the accept thread, closes the listening sockets). */
void rpc_listener_stop (rpc_listener_t *l);
void rpc_listener_free (rpc_listener_t *l);
/* Counts a call refused or reset before its request against its
 * connection's budget; a connection past it is shut down. NULL l: no-op. */
void rpc_listener_charge (rpc_listener_t *l, grpc_call *call);
/* The call came on a connection shut down for its resets. */
bool rpc_listener_cut (rpc_listener_t *l, grpc_call *call);
/* Connections open now (the table swept first). */
size_t rpc_listener_connections (rpc_listener_t *l);

typedef struct rpc_method_s
{
  char *path;
  void *handle;       /* from grpc_server_register_method */
  rpc_admit_fn admit; /* NULL: an open method */
  rpc_handler_fn fn;
  void *user;
} rpc_method_t;

/* One outstanding request for a new call. */
typedef struct rpc_slot_s
{
  rpc_server_t *server;
  long method; /* index into methods, or -1: any unregistered method */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_call_details details;
  grpc_completion_queue *cq;
} rpc_slot_t;

/* call.c: waits for a receive started ahead and drops its message (the
 * handler has returned; the call has finished, so it completes). */
void rpc_call_drain_ahead (rpc_call_t *c);

struct rpc_call_s
{
  rpc_server_t *server;
  rpc_method_t *method; /* NULL: unregistered */
  char *path;
  grpc_call *call;
  grpc_completion_queue *cq;
  gpr_timespec deadline;
  grpc_metadata_array md;
  int close_tag; /* its address tags RECV_CLOSE_ON_SERVER */
  int batch_tag; /* its address tags every other batch */
  int ahead_tag; /* its address tags every receive (started ahead or not) */
  int send_tag;  /* its address tags a send started by rpc_call_send_raw_start */
  bool sending;  /* such a send is in flight; send_bb is its message */
  grpc_byte_buffer *send_bb;
  bool ahead; /* such a receive is in flight; its message lands in ahead_bb */
  grpc_byte_buffer *ahead_bb;
  int cancelled; /* written by RECV_CLOSE_ON_SERVER */
  /* RECV_CLOSE_ON_SERVER has completed. Atomic, as peer_gone: a walk that
   * sends nothing asks rpc_call_cancelled from its own thread while the
   * stream's thread sends. */
  _Atomic bool closed;
  bool md_sent;  /* initial metadata has gone out */
  bool finished; /* the status has gone out */
  bool half_closed;
  bool quick_half_close; /* rpc_call_quick_half_close */
  _Atomic bool peer_gone;
  grpc_byte_buffer *reply;
  /* Admission (server.c; `server->mu` guards the list and `waiting`). */
  bool open;           /* counts against max_open_calls */
  bool waiting;        /* on the server's list of calls awaiting their first message */
  int64_t accepted_ms; /* monotonic */
  struct rpc_call_s *wait_prev, *wait_next;
  bool got_message; /* a request message arrived */
  /* Refusal under way (server.c; `server->mu` guards the list). */
  int64_t refuse_until_ms;
  bool refuse_cancelled;
  bool status_done; /* the status batch (batch_tag) has completed */
  struct rpc_call_s *refusing_next;
};

struct rpc_server_s
{
  grpc_server *server;
  grpc_completion_queue *cq;
  rpc_method_t *methods;
  size_t n_methods;
  size_t max_message;
  rpc_opts_t opts;
  char *tls_cert_file, *tls_key_file, *tls_ca_file;

  bool started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t inflight;
  size_t inflight_open;
  size_t max_calls, max_open_calls;
  int64_t first_message_ms;
  rpc_call_t *waiting;  /* calls awaiting their first message, oldest last */
  rpc_call_t *refusing; /* refused calls whose answer is under way */
  size_t n_refusing;
  int64_t last_refusal_sweep_ms;
  size_t max_threads;
  grpc_resource_quota *quota;
  rpc_listener_t *listener; /* NULL: gRPC listens (a unix socket) */
  /* A TLS server's connection handler, filled in by gRPC core when the
   * RPC_EXTERNAL_LISTENER listener is added (external.cc). */
  void *external_handler;
  int64_t last_sweep_ms;
  /* The server's threads (server.c; `mu`): each waits on `cq` and runs
   * the calls it takes. */
  size_t threads;   /* alive */
  size_t listening; /* of them, waiting on `cq` (or about to) */
  atomic_bool shutting_down;
  atomic_bool draining; /* rpc_server_drain: new admitted calls are refused */
  bool shutdown_called;
  bool shutdown_done;
  bool destroyed_grpc;
  int shutdown_tag;
};

/* The call's first message has arrived (or will not): it leaves the list
 * of calls the first-message deadline applies to. */
void rpc_call_first_message_done (rpc_call_t *c);

/* Runs a batch on the call's own queue and waits for it: false when the
 * batch failed (the peer is gone). */
bool rpc_call_run_batch (rpc_call_t *c, const grpc_op *ops, size_t n);
/* Starts a batch tagged `tag` without waiting. */
grpc_call_error rpc_call_start_batch (rpc_call_t *c, const grpc_op *ops, size_t n, void *tag);

/* Outstanding accept slots per method: enough to take a burst of calls
 * without waiting for a thread to re-arm. */
#define RPC_ACCEPT_DEPTH 8

/* server.c, for server_stop.c: CLOCK_MONOTONIC in milliseconds; frees
 * refusals whose answer went out (all: cancels every one, at shutdown). */
int64_t rpc_mono_ms (void);
void rpc_sweep_refusing (rpc_server_t *s, bool all);
/* server.c, for server_setup.c: arms an accept slot for method index
 * `method`; starts a server thread (false when it could not). */
void rpc_slot_request (rpc_server_t *s, long method);
bool rpc_spawn_thread (rpc_server_t *s);

#endif
