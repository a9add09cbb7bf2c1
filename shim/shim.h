/* shim: what the HTTP server (server.c) and the REST routes (routes/)
 * share: the configuration, the gateway channel, the request state and the
 * response helpers.
 *
 * Threading: `shim` is filled at start-up and read-only after; a request's
 * state is used by one thread at a time: its connection's event thread, or
 * the worker its suspended connection waits for (server.c).
 */
#ifndef SBX_SHIM_SHIM_H
#define SBX_SHIM_SHIM_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/rpc/rpc.h"
#include "shim/validate.h"
#include "shim/hangup.h"
#include "shim/workers.h"

typedef struct shim_config_s
{
  char *host;
  long port;
  char *secret; /* CLOUD_RUN_SANDBOX_GATEWAY_SECRET: clients must present it */
  char *gateway_target;
  char *gateways;        /* SHIM_GATEWAYS, or NULL */
  long gateways_refresh; /* SHIM_GATEWAYS_REFRESH_SECONDS */
  long gateways_health;  /* SHIM_GATEWAYS_HEALTH_SECONDS */
  bool restore_on_miss;  /* SHIM_RESTORE_ON_MISS */
  char *gateway_secret;  /* sent to the gateway */
  long max_exec_output;
  long max_buffered_output; /* base64 text all buffered exec answers may hold */
  long long max_restore_bytes;
  long max_connections;
  long max_connections_per_client; /* SHIM_MAX_CONNECTIONS_PER_CLIENT, 0: no cap */
  long max_terminals;
  long max_workers; /* SHIM_MAX_WORKERS */
  long connection_timeout;
  long header_timeout;
  long body_timeout;
  long min_upload_rate;
  bool gateway_tls;
  char *gateway_tls_ca;
  char *gateway_tls_cert;
  char *gateway_tls_key;
  char *gateway_tls_server_name;
  char *log_level;
  long max_forwards;               /* SHIM_MAX_FORWARDS */
  long max_forwards_per_sandbox;   /* SHIM_MAX_FORWARDS_PER_SANDBOX */
  long forward_idle_seconds;       /* SHIM_FORWARD_IDLE_SECONDS */
  long preview_max_ttl;            /* SHIM_PREVIEW_MAX_TTL_SECONDS */
  char *public_url;                /* SHIM_PUBLIC_URL, or NULL */
  long long max_file_upload_bytes; /* SHIM_MAX_FILE_UPLOAD_BYTES */
  long long max_proxy_body_bytes;  /* SHIM_MAX_PROXY_BODY_BYTES */
} shim_config_t;

typedef struct shim_s
{
  shim_config_t cfg;
  rpc_metadata_t md[1];
  size_t n_md;
  char *auth_header; /* "Bearer <gateway secret>" */
} shim_t;

extern shim_t shim;

typedef struct shim_req_s shim_req_t;

/* A connection's work on a worker (shim_suspend). */
typedef struct shim_work_s
{
  atomic_bool working; /* the job runs: its state is the worker's */
} shim_work_t;

/* How a route takes its request body. */
typedef enum shim_body_e
{
  SHIM_BODY_NONE,   /* ignored */
  SHIM_BODY_JSON,   /* buffered (at most SHIM_MAX_JSON_BODY), then the handler runs */
  SHIM_BODY_RAW,    /* the same, for bytes that are not JSON (a process's stdin) */
  SHIM_BODY_STREAM, /* handed to route->upload piece by piece as it arrives */
} shim_body_t;

/* The cap of a buffered body (JSON or raw): beyond, 413. */
#define SHIM_MAX_JSON_BODY (1024 * 1024)

typedef struct shim_route_s
{
  const char *method;
  const char *path; /* template, e.g. "/sandboxes/{id}/exec"; also the metrics label */
  shim_body_t body;
  bool auth;
  /* Answers the request: returns the response and sets *status. */
  struct MHD_Response *(*handle) (shim_req_t *r, unsigned *status);
  /* SHIM_BODY_STREAM: takes the next piece of the body. On failure it
   * stores the answer with shim_req_fail and returns -1; the rest of the
   * body is then discarded. */
  int (*upload) (shim_req_t *r, const char *data, size_t len);
  /* Frees route state on every path (may be NULL). */
  void (*cleanup) (shim_req_t *r);
  /* A WebSocket route: the bearer secret may also come as an offered
   * subprotocol "bearer.<secret>" (browsers cannot set headers there). */
  bool bearer_in_subprotocol;
  /* Runs once the head is in, before any of the body is read: may refuse
   * the request with shim_req_fail, which then answers at once (may be
   * NULL). */
  void (*admit) (shim_req_t *r);
} shim_route_t;

struct shim_req_s
{
  struct MHD_Connection *conn;
  const shim_route_t *route;
  char id[SHIM_ID_MAX + 1];
  char pid[SHIM_ID_MAX + 1]; /* a "{pid}" or "{port}" path component, or "" */
  char *uri;                 /* the request target as sent (path and query, not decoded), or NULL */
  char *body;
  size_t len, cap;
  uint64_t body_bytes;
  /* an answer decided before the handler (auth, validation, limits) */
  struct MHD_Response *early;
  unsigned early_status;
  bool discard;
  /* route state */
  void *state;
  /* access log */
  const char *method;
  const char *version; /* "HTTP/1.1" (MHD's string) */
  int64_t start_ns;
  unsigned status;
  /* The status is not the shim's but a sandbox server's (the port proxy):
   * counted by its class (2xx…) in the metrics, never by its value. */
  bool status_foreign;
  /* the worker side (server.c, stream.c) */
  worker_job_t job;
  struct MHD_Response *answer; /* the handler's, once `answered` */
  unsigned answer_status;
  bool answered;
  shim_work_t work;
  char *piece; /* a streamed body's piece, for the worker */
  size_t piece_len;
  struct shim_stream_s *stream; /* the streamed answer the handler made (stream.h) */
};

/* Responses. All return a new response (never NULL) and set *status. */
struct MHD_Response *shim_json (json_t *body, unsigned code, unsigned *status); /* takes body */
struct MHD_Response *shim_detail (unsigned code, const char *detail, unsigned *status);
struct MHD_Response *shim_empty (unsigned code, unsigned *status);

/* Stores an early answer (a detail message) that ends the request. */
void shim_req_fail (shim_req_t *r, unsigned code, const char *detail);
void shim_req_fail_json (shim_req_t *r, unsigned code, json_t *body);

/* The HTTP answer for a failed gateway call (status mapping table). */
struct MHD_Response *shim_gateway_error (grpc_status_code code, const rpc_status_t *st, unsigned *status);
/* shim_gateway_error, except that a 404 or 409 for a missing or taken
 * thing carries the gateway's detail, which names it: for routes about
 * more than a sandbox (a process), where the contract's "Sandbox not
 * found" would be wrong. */
struct MHD_Response *shim_gateway_error_named (grpc_status_code code, const rpc_status_t *st, unsigned *status);
/* Whether the last gateway error answered on this thread (through the two
 * functions above) was its owner saying it does not hold the sandbox the
 * call named (the status's reason, ERR_REASON_SANDBOX_NOT_FOUND);
 * shim_missed_reset forgets it. */
bool shim_missed (void);
void shim_missed_reset (void);
/* The HTTP status for a failed gateway call: `from_handler` tells the
 * gateway's own UNAVAILABLE (503) from no gateway at all (502). */
unsigned shim_http_status (grpc_status_code code, bool from_handler);

/* The client connection's socket (for hangup_add), or -1. */
int shim_req_fd (shim_req_t *r);

/* Suspends `conn` for a worker's job, which ends with shim_work_done
 * (resuming it). Until then the job owns the state; MHD may still call once
 * in the pass that suspended, and shim_called_back says false then (the
 * callback must do nothing). What is suspended is counted until its resume
 * is asked for: MHD must not be stopped with a connection suspended, and
 * takes the resumes asked for when it stops (a resumed connection that
 * waits for its client, a half-sent upload, does not hold a stop up). */
void shim_suspend (struct MHD_Connection *conn, shim_work_t *w);
void shim_work_done (struct MHD_Connection *conn, shim_work_t *w);
bool shim_called_back (shim_work_t *w);
/* Waits, at most `wait_ms`, until no connection is suspended. */
bool shim_none_suspended (int64_t wait_ms);

/* Monotonic nanoseconds. */
int64_t shim_mono_ns (void);

/* Ends every open WebSocket terminal (close 1001) and waits, boundedly,
 * for them to let go of their sockets: before the HTTP daemon stops
 * (routes/terminal.c). New terminals are refused from then on. */
void terminal_stop_all (void);

/* The route table (routes/table.c). */
extern const shim_route_t shim_routes[];
extern const size_t shim_n_routes;

#endif
