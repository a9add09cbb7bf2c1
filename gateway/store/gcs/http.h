/* gcs http: one HTTP exchange with libcurl and the retry policy around it,
 * for the GCS store (request.c, upload.c, download.c) and its token sources
 * (auth.c). Internal to gateway/store/gcs.
 *
 * A gcs_net_t holds what every request of one store shares: the curl share
 * handle (DNS cache, TLS sessions; locked with mutexes, so any thread may
 * use it), the timeouts and the retry budget. A request runs on an easy
 * handle that belongs to the calling thread; its gcs_resp_t collects the
 * status, a bounded body and the headers the client uses, parsed as they
 * arrive (parse.h).
 *
 * Thread safety: gcs_net_t may be shared once initialised; a CURL handle,
 * a gcs_resp_t and a gcs_retry_t belong to one thread.
 */
#ifndef SBX_GATEWAY_GCS_HTTP_H
#define SBX_GATEWAY_GCS_HTTP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "common/err.h"

typedef struct gcs_net_s
{
  CURLSH *share;
  pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
  long connect_timeout_s;   /* TCP + TLS connect */
  long stall_timeout_s;     /* abort a transfer below 1 byte/s for this long */
  unsigned retry_budget_ms; /* time allowed for retries after a failure */
  unsigned backoff_initial_ms;
  unsigned backoff_max_ms;
  /* The storage endpoint itself is plain http (an emulator or a test server
   * the operator chose): only then may an upload session or a token
   * endpoint be plain http too. Otherwise a bearer token never leaves over
   * plain HTTP. */
  bool plain_http_ok;
  /* Set once (gcs_net_cancel, any thread): transfers under way abort and
   * retries stop; every later request fails at once. */
  atomic_bool cancelled;
} gcs_net_t;

/* Initialises `net` (fields other than share and locks set by the caller
 * before or after). 0 ok, -1 with *err. */
int gcs_net_init (gcs_net_t *net, err_t *err);
void gcs_net_fini (gcs_net_t *net);

/* Makes every exchange on `net` under way fail within about a second (curl
 * looks at it several times a second while it transfers, at least once a
 * second while it waits) and every later one fail at once, and ends retry
 * waits: the gateway is shutting down. Any thread. */
void gcs_net_cancel (gcs_net_t *net);

/* Milliseconds on the monotonic clock. */
uint64_t gcs_now_ms (void);

typedef struct gcs_req_s
{
  const char *method; /* GET, POST, PUT, DELETE */
  const char *url;
  const struct curl_slist *headers; /* extra request headers; not owned */
  const char *auth_header;          /* "Authorization: Bearer …" or NULL */
  const void *body;                 /* sent for POST and PUT (may be NULL with body_len 0) */
  size_t body_len;
  long timeout_s;  /* whole exchange; 0: only stall detection bounds it */
  size_t body_max; /* response bytes kept (default 64 KiB); more sets body_truncated */
} gcs_req_t;

typedef struct gcs_resp_s
{
  long status;                  /* final HTTP status; 0 when none arrived */
  CURLcode rc;                  /* CURLE_OK when the exchange completed */
  char errbuf[CURL_ERROR_SIZE]; /* curl's detail for rc */
  char *body;                   /* NUL-terminated, owned; may be NULL */
  size_t body_len;
  size_t body_max;
  bool body_truncated;
  bool headers_done;  /* the final response's headers have all arrived */
  char *location;     /* Location header, owned; NULL when absent or over-long */
  bool has_range;     /* Range: bytes=0-N seen */
  bool range_bad;     /* a Range header that did not parse */
  uint64_t committed; /* N + 1 */
  bool has_crc;       /* x-goog-hash crc32c seen */
  bool crc_bad;       /* malformed or contradictory crc32c */
  uint32_t crc;
} gcs_resp_t;

/* Releases what *resp owns and zeroes it (safe on a zeroed resp). */
void gcs_resp_clear (gcs_resp_t *resp);

/* Feeds one raw header line (as curl's header callback gets it) to *resp:
 * a status line starts a new response, the known headers are parsed. */
void gcs_resp_header_line (gcs_resp_t *resp, const char *line, size_t len);

/* Appends response body bytes to *resp up to resp->body_max (beyond it sets
 * body_truncated and drops them). 0 ok, -1 out of memory. */
int gcs_resp_body_append (gcs_resp_t *resp, const char *data, size_t len);

/* Sets up `h` (reset first) for `req`, collecting into `resp` (cleared
 * first). Callers that drive the transfer themselves (the reader, with
 * curl_multi) may replace CURLOPT_WRITEFUNCTION/WRITEDATA afterwards.
 * `req` and its strings must outlive the transfer. *hdrs receives the
 * request's header list, which the caller frees with curl_slist_free_all
 * after the transfer. 0 ok, -1 with *err (out of memory). */
int gcs_http_setup (CURL *h, const gcs_net_t *net, const gcs_req_t *req, gcs_resp_t *resp, struct curl_slist **hdrs,
                    err_t *err);

/* One exchange: sets up and performs it. Returns 0 when it could be tried
 * (look at resp->rc and resp->status), -1 with *err only when it could not
 * be set up. */
int gcs_http_do (CURL *h, const gcs_net_t *net, const gcs_req_t *req, gcs_resp_t *resp, err_t *err);

/* True when the failure in *resp may go away by trying again: a connection
 * failure or timeout, 408, 429 or 5xx. */
bool gcs_resp_retryable (const gcs_resp_t *resp);

/* A one-line description of what the server said or what failed
 * ("HTTP 503: backend error", "connection failed: Couldn't connect…"),
 * sanitised and bounded for messages. Caller frees; never NULL except when
 * out of memory. */
char *gcs_resp_describe (const gcs_resp_t *resp);

/* Retry policy: exponential backoff with jitter, within net->retry_budget_ms
 * counted from the first failure. */
typedef struct gcs_retry_s
{
  const gcs_net_t *net;
  uint64_t started_ms; /* 0: no failure yet */
  unsigned delay_ms;
  unsigned attempts;
} gcs_retry_t;

void gcs_retry_init (gcs_retry_t *r, const gcs_net_t *net);
/* Forgets past failures (after progress). */
void gcs_retry_reset (gcs_retry_t *r);
/* After a retryable failure: sleeps the next backoff and returns 0, or
 * returns -1 at once when the budget is spent or the net was cancelled
 * (also during the sleep). */
int gcs_retry_wait (gcs_retry_t *r);
/* Seconds since the first failure, for messages. */
double gcs_retry_elapsed_s (const gcs_retry_t *r);

#endif
