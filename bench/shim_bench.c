/* shim_bench: the cost of sandbox-shim's REST layer over the gateway's gRPC
 * API, measured next to the direct gRPC calls in the same run:
 *
 *   1. round trip, one client: POST /sandboxes/{id}/exec of /bin/true
 *      through the shim (HTTP/1.1 keep-alive, the whole JSON answer read)
 *      against the Exec of /bin/true straight to the gateway; GET /health
 *      against the two calls the shim makes for it (Health/Check and
 *      Status). Interleaved, iteration by iteration.
 *   2. under load, 64 concurrent clients for a fixed time: `wrk` (one
 *      thread, 64 keep-alive connections, bench/shim_wrk.lua) against
 *      GET /health and POST .../exec, and the same calls straight to the
 *      gateway from 64 threads of this program on one channel. Requests per
 *      second, latency median and p99, and errors (answers >= 400, socket
 *      errors and timeouts for wrk; failed calls for gRPC), which must be 0.
 *   3. memory of buffered execs: 64 clients each ask a fresh shim (one that
 *      has served nothing else) for an exec printing 16 MiB and read their
 *      answers only once every answer's head has come (so all 64 are held
 *      at once); the shim's peak resident memory (VmHWM) against the output
 *      in flight (64 x 16 MiB).
 *   4. routing (with --routed-shim): the exec round trip through a shim
 *      that routes by sandbox id over three gateways (SHIM_GATEWAYS)
 *      against the same through the shim with one gateway, interleaved.
 *
 * The bearer secret (the shim's and the gateway's) comes from
 * CLOUD_RUN_SANDBOX_GATEWAY_SECRET. bench/shim builds everything, starts a
 * gateway and a shim and runs this program.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "common/err.h"
#include "common/rpc/rpc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "sandbox/v1/sandbox.pb-c.h"

#define PROG "shim_bench"
#define SANDBOX_ID "shimbench"
#define ROUTED_ID "shimbench-routed"
#define EXEC_BODY "{\"argv\":[\"/bin/true\"]}"

typedef struct opts_s
{
  const char *shim;   /* HOST:PORT */
  const char *target; /* the gateway, HOST:PORT */
  const char *wrk;
  const char *wrk_script;
  const char *markdown;
  int rtt_n;
  int rtt_warmup;
  int clients;
  int load_seconds;
  const char *mem_shim; /* a fresh shim for the memory stage, HOST:PORT */
  int mem_shim_pid;
  int mem_clients;
  int mem_mib;
  const char *routed_shim; /* a shim over three gateways, HOST:PORT */
} opts_t;

static opts_t O = {
    .wrk = "wrk",
    .wrk_script = "bench/shim_wrk.lua",
    .rtt_n = 300,
    .rtt_warmup = 30,
    .clients = 64,
    .load_seconds = 10,
    .mem_clients = 64,
    .mem_mib = 16,
};

static rpc_channel_t *CH;
static char SECRET[256];
static struct sockaddr_in SHIM_ADDR;
static struct sockaddr_in MEM_ADDR;
static struct sockaddr_in ROUTED_ADDR;

/* ---- a minimal HTTP/1.1 client (keep-alive) ------------------------------- */

typedef struct http_s
{
  int fd;
  const struct sockaddr_in *addr; /* NULL: the shim of --shim */
  char buf[65536];
  size_t have; /* bytes in buf not yet consumed */
} http_t;

static int
http_connect (http_t *h, err_t *err)
{
  h->have = 0;
  h->fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (h->fd < 0)
    return err_make_sys (err, errno, "socket");
  int one = 1;
  setsockopt (h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const struct sockaddr_in *addr = h->addr != NULL ? h->addr : &SHIM_ADDR;
  if (connect (h->fd, (const struct sockaddr *) addr, sizeof *addr) < 0)
    {
      int e = errno;
      close (h->fd);
      h->fd = -1;
      return err_make_sys (err, e, "connect to the shim");
    }
  return 0;
}

static void
http_close (http_t *h)
{
  if (h->fd >= 0)
    close (h->fd);
  h->fd = -1;
}

static int
write_all (int fd, const char *p, size_t n)
{
  while (n > 0)
    {
      ssize_t w = write (fd, p, n);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        return -1;
      p += w;
      n -= (size_t) w;
    }
  return 0;
}

/* The request's text into `req`; its length, or -1 with *err. */
static int
http_format (char *req, size_t size, const char *method, const char *path, const char *json, err_t *err)
{
  int n;
  if (json != NULL)
    n = snprintf (req, size,
                  "%s %s HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                  method, path, SECRET, strlen (json), json);
  else
    n = snprintf (req, size, "%s %s HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %s\r\n\r\n", method, path,
                  SECRET);
  if (n < 0 || (size_t) n >= size)
    return err_make (err, EMSGSIZE, "request too large");
  return n;
}

typedef struct http_head_s
{
  int status;
  long clen;  /* Content-Length */
  size_t len; /* bytes of the head in the buffer */
  bool close_after;
} http_head_t;

/* Reads a response's head into h->buf. 1 with *hd filled; 0 when the
 * connection closed before any byte; -1 with *err. Responses must carry
 * Content-Length. */
static int
http_read_head (http_t *h, http_head_t *hd, err_t *err)
{
  char *end = NULL;
  for (;;)
    {
      h->buf[h->have] = '\0';
      end = strstr (h->buf, "\r\n\r\n");
      if (end != NULL)
        break;
      if (h->have + 1 >= sizeof h->buf)
        return err_make (err, EMSGSIZE, "response head too large");
      ssize_t r = read (h->fd, h->buf + h->have, sizeof h->buf - 1 - h->have);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0)
        break;
      h->have += (size_t) r;
    }
  if (end == NULL)
    return h->have == 0 ? 0 : err_make (err, EPROTO, "connection closed mid-response");
  *hd = (http_head_t){.len = (size_t) (end - h->buf) + 4, .clen = -1};
  if (sscanf (h->buf, "HTTP/1.%*d %d", &hd->status) != 1)
    return err_make (err, EPROTO, "bad status line");
  for (char *line = strstr (h->buf, "\r\n"); line != NULL && line < end; line = strstr (line + 2, "\r\n"))
    {
      if (strncasecmp (line + 2, "Content-Length:", 15) == 0)
        hd->clen = strtol (line + 2 + 15, NULL, 10);
      else if (strncasecmp (line + 2, "Connection: close", 17) == 0)
        hd->close_after = true;
    }
  if (hd->clen < 0 && (hd->status == 204 || hd->status == 304))
    hd->clen = 0; /* no body, by definition */
  if (hd->clen < 0)
    return err_make (err, EPROTO, "response without Content-Length");
  return 1;
}

/* One request on the connection (reconnecting when the shim closed it);
 * the status goes to *status and the body (NUL-terminated, cut to `blen`)
 * to `body`. */
static int
http_do (http_t *h, const char *method, const char *path, const char *json, int *status, char *body, size_t blen,
         err_t *err)
{
  char req[1024];
  int n = http_format (req, sizeof req, method, path, json, err);
  if (n < 0)
    return -1;
  for (int attempt = 0; attempt < 2; attempt++)
    {
      if (h->fd < 0 && http_connect (h, err) < 0)
        return -1;
      if (write_all (h->fd, req, (size_t) n) < 0)
        {
          http_close (h);
          continue;
        }
      http_head_t hd;
      int got = http_read_head (h, &hd, err);
      if (got <= 0)
        {
          /* Closed before any answer: a kept-alive connection the shim
           * dropped; once more on a new one. */
          http_close (h);
          if (got == 0 && attempt == 0)
            continue;
          return got < 0 ? -1 : err_make (err, EPROTO, "connection closed mid-response");
        }
      *status = hd.status;
      size_t clen = (size_t) hd.clen;
      if (hd.len + clen >= sizeof h->buf)
        return err_make (err, EMSGSIZE, "response too large");
      while (h->have < hd.len + clen)
        {
          ssize_t r = read (h->fd, h->buf + h->have, sizeof h->buf - 1 - h->have);
          if (r < 0 && errno == EINTR)
            continue;
          if (r <= 0)
            return err_make (err, EPROTO, "connection closed mid-body");
          h->have += (size_t) r;
        }
      if (body != NULL && blen > 0)
        snprintf (body, blen, "%.*s", (int) clen, h->buf + hd.len);
      size_t used = hd.len + clen;
      memmove (h->buf, h->buf + used, h->have - used);
      h->have -= used;
      if (hd.close_after)
        http_close (h);
      return 0;
    }
  return err_make (err, EPIPE, "could not send the request");
}

/* ---- the calls ------------------------------------------------------------ */

static int
rest_exec_in (http_t *h, const char *id, err_t *err)
{
  int status = 0;
  char body[1024], path[128];
  snprintf (path, sizeof path, "/sandboxes/%s/exec", id);
  if (http_do (h, "POST", path, EXEC_BODY, &status, body, sizeof body, err) < 0)
    return -1;
  if (status != 200 || (strstr (body, "\"exit_code\": 0") == NULL && strstr (body, "\"exit_code\":0") == NULL))
    return err_make (err, EIO, "exec through the shim: HTTP %d: %.200s", status, body);
  return 0;
}

static int
rest_exec (http_t *h, err_t *err)
{
  return rest_exec_in (h, SANDBOX_ID, err);
}

static int
rest_health (http_t *h, err_t *err)
{
  int status = 0;
  char body[1024];
  if (http_do (h, "GET", "/health", NULL, &status, body, sizeof body, err) < 0)
    return -1;
  if (status != 200
      || (strstr (body, "\"cli_mounted\": true") == NULL && strstr (body, "\"cli_mounted\":true") == NULL))
    return err_make (err, EIO, "GET /health: HTTP %d: %.200s", status, body);
  return 0;
}

static int
grpc_exec (err_t *err)
{
  char *argv[] = {"/bin/true"};
  return bc_exec (CH, SANDBOX_ID, argv, 1, 0, NULL, err);
}

/* What the shim asks the gateway for GET /health: Health/Check (no
 * credentials) and Status. */
static int
grpc_health (err_t *err)
{
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hreq.service = "sandbox.v1.Sandbox";
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = rpc_client_unary (CH, "/grpc.health.v1.Health/Check", 3000, NULL, 0, &hreq.base,
                             &grpc__health__v1__health_check_response__descriptor, &resp, &st, err);
  rpc_status_release (&st);
  if (rc == 0
      && ((Grpc__Health__V1__HealthCheckResponse *) resp)->status
             != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
    rc = err_make (err, EIO, "the gateway is not serving");
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  resp = NULL;
  if (rc < 0)
    return -1;
  Sandbox__V1__StatusRequest sreq = SANDBOX__V1__STATUS_REQUEST__INIT;
  rc = rpc_client_unary (CH, "/sandbox.v1.Sandbox/Status", 3000, BC_MD, 1, &sreq.base,
                         &sandbox__v1__status_response__descriptor, &resp, &st, err);
  rpc_status_release (&st);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  return rc;
}

/* ---- 1. round trips --------------------------------------------------------- */

static void
bench_rtt (void)
{
  http_t h = {.fd = -1};
  err_t err = ERR_INIT;
  bc_series_t rx = {0}, gx = {0}, rh = {0}, gh = {0};
  fprintf (stderr, PROG ": round trips: %d warm-up + %d runs of each\n", O.rtt_warmup, O.rtt_n);
  for (int i = 0; i < O.rtt_warmup + O.rtt_n; i++)
    {
      bool rec = i >= O.rtt_warmup;
      double t0 = bc_now_ms ();
      if (rest_exec (&h, &err) < 0)
        bc_die (PROG, "exec through the shim", &err);
      double t1 = bc_now_ms ();
      if (grpc_exec (&err) < 0)
        bc_die (PROG, "exec", &err);
      double t2 = bc_now_ms ();
      if (rest_health (&h, &err) < 0)
        bc_die (PROG, "GET /health", &err);
      double t3 = bc_now_ms ();
      if (grpc_health (&err) < 0)
        bc_die (PROG, "health", &err);
      double t4 = bc_now_ms ();
      if (rec)
        {
          bc_series_add (&rx, t1 - t0);
          bc_series_add (&gx, t2 - t1);
          bc_series_add (&rh, t3 - t2);
          bc_series_add (&gh, t4 - t3);
        }
    }
  http_close (&h);
  bc_row_add ("exec /bin/true round trip, REST via shim", "ms", &rx, 99, "gRPC Exec direct", &gx);
  bc_row_add ("GET /health round trip", "ms", &rh, 99, "gRPC Health/Check + Status", &gh);
}

/* ---- 4. routing ---------------------------------------------------------------- */

/* POST `path` (a JSON body or none) on a new connection: 0 when the answer
 * is `want`. */
static int
http_once (const struct sockaddr_in *addr, const char *method, const char *path, const char *json, int want,
           err_t *err)
{
  http_t h = {.fd = -1, .addr = addr};
  int status = 0;
  char body[1024];
  int rc = http_do (&h, method, path, json, &status, body, sizeof body, err);
  http_close (&h);
  if (rc == 0 && status != want)
    rc = err_make (err, EIO, "%s %s: HTTP %d: %.200s", method, path, status, body);
  return rc;
}

static void
bench_routed (void)
{
  err_t err = ERR_INIT;
  if (http_once (&ROUTED_ADDR, "POST", "/sandboxes", "{\"sandbox_id\":\"" ROUTED_ID "\"}", 201, &err) < 0)
    bc_die (PROG, "routed shim", &err);
  http_t one = {.fd = -1}, routed = {.fd = -1, .addr = &ROUTED_ADDR};
  bc_series_t ro = {0}, on = {0};
  fprintf (stderr, PROG ": routing: %d warm-up + %d runs of each\n", O.rtt_warmup, O.rtt_n);
  for (int i = 0; i < O.rtt_warmup + O.rtt_n; i++)
    {
      double t0 = bc_now_ms ();
      if (rest_exec_in (&routed, ROUTED_ID, &err) < 0)
        bc_die (PROG, "exec through the routing shim", &err);
      double t1 = bc_now_ms ();
      if (rest_exec (&one, &err) < 0)
        bc_die (PROG, "exec through the shim", &err);
      double t2 = bc_now_ms ();
      if (i >= O.rtt_warmup)
        {
          bc_series_add (&ro, t1 - t0);
          bc_series_add (&on, t2 - t1);
        }
    }
  http_close (&one);
  http_close (&routed);
  if (http_once (&ROUTED_ADDR, "DELETE", "/sandboxes/" ROUTED_ID, NULL, 204, &err) < 0)
    bc_die (PROG, "routed shim", &err);
  bc_row_add ("exec /bin/true round trip, shim routing over 3 gateways", "ms", &ro, 99, "shim with one gateway", &on);
}

/* ---- 2. under load: the gRPC side --------------------------------------------- */

typedef struct load_s
{
  int (*call) (err_t *err);
  double deadline_ms;
  pthread_mutex_t mu;
  bc_series_t lat;
  long ok, failed;
  char first_error[256];
} load_t;

static void *
load_main (void *arg)
{
  load_t *L = arg;
  bc_series_t lat = {0};
  long ok = 0, failed = 0;
  char first[256] = "";
  while (bc_now_ms () < L->deadline_ms)
    {
      err_t err = ERR_INIT;
      double t0 = bc_now_ms ();
      if (L->call (&err) < 0)
        {
          failed++;
          if (first[0] == '\0')
            snprintf (first, sizeof first, "%s", err_msg (&err));
          err_release (&err);
        }
      else
        {
          ok++;
          bc_series_add (&lat, bc_now_ms () - t0);
        }
    }
  pthread_mutex_lock (&L->mu);
  for (int i = 0; i < lat.n; i++)
    bc_series_add (&L->lat, lat.v[i]);
  L->ok += ok;
  L->failed += failed;
  if (L->first_error[0] == '\0' && first[0] != '\0')
    snprintf (L->first_error, sizeof L->first_error, "%s", first);
  pthread_mutex_unlock (&L->mu);
  free (lat.v);
  return NULL;
}

typedef struct load_result_s
{
  double rps, p50_ms, p99_ms;
  long errors;
  bool na;
} load_result_t;

static load_result_t
grpc_load (const char *name, int (*call) (err_t *err))
{
  load_t L = {.call = call, .mu = PTHREAD_MUTEX_INITIALIZER};
  pthread_t *t = calloc ((size_t) O.clients, sizeof *t);
  double t0 = bc_now_ms ();
  L.deadline_ms = t0 + O.load_seconds * 1000.0;
  for (int i = 0; i < O.clients; i++)
    if (pthread_create (&t[i], NULL, load_main, &L) != 0)
      {
        fprintf (stderr, PROG ": pthread_create failed\n");
        exit (1);
      }
  for (int i = 0; i < O.clients; i++)
    pthread_join (t[i], NULL);
  double secs = (bc_now_ms () - t0) / 1e3;
  free (t);
  load_result_t r = {
      .rps = (double) L.ok / secs, .p50_ms = bc_pct (&L.lat, 50), .p99_ms = bc_pct (&L.lat, 99), .errors = L.failed};
  fprintf (stderr, PROG ": load %s: %ld ok, %ld failed in %.1f s%s%s\n", name, L.ok, L.failed, secs,
           L.failed ? "; first error: " : "", L.first_error);
  free (L.lat.v);
  return r;
}

/* ---- 2. under load: the shim, through wrk ------------------------------------- */

static load_result_t
wrk_load (const char *name, const char *method, const char *path, const char *body)
{
  load_result_t r = {.na = true};
  setenv ("SHIM_BENCH_METHOD", method, 1);
  setenv ("SHIM_BENCH_BODY", body ? body : "", 1);
  setenv ("SHIM_BENCH_SECRET", SECRET, 1);
  char url[512], dur[32], conns[32];
  snprintf (url, sizeof url, "http://%s%s", O.shim, path);
  snprintf (dur, sizeof dur, "%ds", O.load_seconds);
  snprintf (conns, sizeof conns, "%d", O.clients);
  char *argv[]
      = {(char *) O.wrk, "-t1", "-c", conns, "-d", dur, "--timeout", "10s", "-s", (char *) O.wrk_script, url, NULL};
  FILE *out = tmpfile ();
  if (out == NULL)
    return r;
  pid_t pid = bc_spawn (argv, fileno (out), 2);
  if (pid < 0)
    {
      fprintf (stderr, PROG ": cannot run %s: %s; load rows of the shim are n/a\n", O.wrk, strerror (errno));
      fclose (out);
      return r;
    }
  int st = bc_wait (pid);
  rewind (out);
  char line[512];
  long req = 0, dur_us = 0, p50 = 0, p99 = 0, es = 0, ec = 0, er = 0, ew = 0, et = 0;
  bool found = false;
  while (fgets (line, sizeof line, out) != NULL)
    if (sscanf (line,
                "WRK requests=%ld duration_us=%ld p50_us=%ld p99_us=%ld status=%ld connect=%ld read=%ld "
                "write=%ld timeout=%ld",
                &req, &dur_us, &p50, &p99, &es, &ec, &er, &ew, &et)
        == 9)
      found = true;
  fclose (out);
  if (st != 0 || !found || dur_us <= 0)
    {
      fprintf (stderr, PROG ": wrk %s failed (status %d); its load rows are n/a\n", name, st);
      return r;
    }
  r.na = false;
  r.errors = es + ec + er + ew + et;
  /* Requests that ended in an error are not throughput. */
  r.rps = (double) (req - es) / ((double) dur_us / 1e6);
  r.p50_ms = (double) p50 / 1e3;
  r.p99_ms = (double) p99 / 1e3;
  fprintf (stderr,
           PROG ": load %s: %ld requests in %.1f s; errors: %ld status >= 400, %ld connect, %ld read, %ld write, "
                "%ld timeout\n",
           name, req, (double) dur_us / 1e6, es, ec, er, ew, et);
  return r;
}

static void
load_rows (const char *what, load_result_t shim, load_result_t direct, const char *base_name)
{
  char w[96];
  double nan = NAN;
  snprintf (w, sizeof w, "%s, %d clients: throughput", what, O.clients);
  bc_row_add_values (w, "req/s", shim.na ? nan : shim.rps, nan, base_name, direct.rps, nan);
  snprintf (w, sizeof w, "%s, %d clients: latency", what, O.clients);
  bc_row_add_values (w, "ms", shim.na ? nan : shim.p50_ms, shim.na ? nan : shim.p99_ms, base_name, direct.p50_ms,
                     direct.p99_ms);
  snprintf (w, sizeof w, "%s, %d clients: errors", what, O.clients);
  bc_row_add_values (w, "count", shim.na ? nan : (double) shim.errors, nan, base_name, (double) direct.errors, nan);
}

static long LOAD_ERRORS;

static void
bench_load (void)
{
  fprintf (stderr, PROG ": load: %d clients, %d s per phase\n", O.clients, O.load_seconds);
  load_result_t sh = wrk_load ("GET /health via shim", "GET", "/health", NULL);
  load_result_t gh = grpc_load ("gRPC Health/Check + Status", grpc_health);
  load_rows ("GET /health", sh, gh, "gRPC Health/Check + Status");
  load_result_t sx = wrk_load ("exec via shim", "POST", "/sandboxes/" SANDBOX_ID "/exec", EXEC_BODY);
  load_result_t gx = grpc_load ("gRPC Exec", grpc_exec);
  load_rows ("exec /bin/true", sx, gx, "gRPC Exec direct");
  LOAD_ERRORS = (sh.na ? 0 : sh.errors) + gh.errors + (sx.na ? 0 : sx.errors) + gx.errors;
}

/* ---- 3. memory of buffered execs -------------------------------------------- */

/* Each client's exec prints O.mem_mib MiB of zeros; its answer: the exit
 * status, the base64 of that and an empty stderr. */
#define MEM_EXEC_FMT "{\"argv\":[\"head\",\"-c\",\"%llu\",\"/dev/zero\"],\"timeout\":600}"
#define MEM_EMPTY_ANSWER "{\"exit_code\":0,\"timed_out\":false,\"stdout_b64\":\"\",\"stderr_b64\":\"\"}"

typedef struct mem_s
{
  pthread_barrier_t heads; /* every answer's head has come: all are held */
  pthread_mutex_t mu;
  long failed;
  char first_error[256];
  volatile bool done;
  long peak_rss_kib; /* sampled VmRSS */
} mem_t;

/* One client: sends the exec, reads the answer's head, waits until every
 * client has its head, then reads and discards the body. */
static int
mem_client (mem_t *M, err_t *err)
{
  http_t *h = calloc (1, sizeof *h);
  if (h == NULL)
    return err_make (err, ENOMEM, "out of memory");
  h->fd = -1;
  h->addr = &MEM_ADDR;
  char json[128], req[1024];
  uint64_t bytes = (uint64_t) O.mem_mib * 1024 * 1024;
  snprintf (json, sizeof json, MEM_EXEC_FMT, (unsigned long long) bytes);
  int n = http_format (req, sizeof req, "POST", "/sandboxes/" SANDBOX_ID "/exec", json, err);
  http_head_t hd = {0};
  int rc = n < 0 || http_connect (h, err) < 0 ? -1 : 0;
  if (rc == 0 && write_all (h->fd, req, (size_t) n) < 0)
    rc = err_make_sys (err, errno, "send the exec");
  int got = rc == 0 ? http_read_head (h, &hd, err) : -1;
  if (rc == 0 && got <= 0)
    rc = got < 0 ? -1 : err_make (err, EPROTO, "connection closed before the answer");
  pthread_barrier_wait (&M->heads);
  long want = (long) (strlen (MEM_EMPTY_ANSWER) + 4 * ((bytes + 2) / 3));
  if (rc == 0 && (hd.status != 200 || hd.clen != want))
    rc = err_make (err, EIO, "exec through the shim: HTTP %d, %ld bytes (want 200, %ld)", hd.status, hd.clen, want);
  uint64_t left = rc == 0 ? (uint64_t) hd.clen - (h->have - hd.len) : 0;
  while (rc == 0 && left > 0)
    {
      ssize_t r = read (h->fd, h->buf, sizeof h->buf < left ? sizeof h->buf : left);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0)
        rc = err_make (err, EPROTO, "connection closed mid-body");
      else
        left -= (uint64_t) r;
    }
  http_close (h);
  free (h);
  return rc;
}

static void *
mem_main (void *arg)
{
  mem_t *M = arg;
  err_t err = ERR_INIT;
  if (mem_client (M, &err) < 0)
    {
      pthread_mutex_lock (&M->mu);
      if (M->failed++ == 0)
        snprintf (M->first_error, sizeof M->first_error, "%s", err_msg (&err));
      pthread_mutex_unlock (&M->mu);
      err_release (&err);
    }
  return NULL;
}

static void *
mem_sampler (void *arg)
{
  mem_t *M = arg;
  while (!M->done)
    {
      long v = bc_proc_status_kib (O.mem_shim_pid, "VmRSS");
      if (v > M->peak_rss_kib)
        M->peak_rss_kib = v;
      usleep (10 * 1000);
    }
  return NULL;
}

static long MEM_ERRORS;

/* O.mem_clients buffered execs at once through the fresh shim of
 * --mem-shim: its peak resident memory (VmHWM: it has served nothing else)
 * against the output in flight. */
static void
bench_mem (void)
{
  mem_t M = {.mu = PTHREAD_MUTEX_INITIALIZER};
  long idle = bc_proc_status_kib (O.mem_shim_pid, "VmRSS");
  fprintf (stderr, PROG ": buffered: %d execs of %d MiB at once; shim RSS before: %ld KiB\n", O.mem_clients,
           O.mem_mib, idle);
  pthread_barrier_init (&M.heads, NULL, (unsigned) O.mem_clients);
  pthread_t *t = calloc ((size_t) O.mem_clients, sizeof *t);
  pthread_t sampler;
  if (t == NULL || pthread_create (&sampler, NULL, mem_sampler, &M) != 0)
    {
      fprintf (stderr, PROG ": cannot start threads\n");
      exit (1);
    }
  for (int i = 0; i < O.mem_clients; i++)
    if (pthread_create (&t[i], NULL, mem_main, &M) != 0)
      {
        fprintf (stderr, PROG ": pthread_create failed\n");
        exit (1);
      }
  for (int i = 0; i < O.mem_clients; i++)
    pthread_join (t[i], NULL);
  M.done = true;
  pthread_join (sampler, NULL);
  free (t);
  pthread_barrier_destroy (&M.heads);
  long hwm = bc_proc_status_kib (O.mem_shim_pid, "VmHWM");
  /* The shim frees an answer just after its last byte is sent: wait
   * (up to 3 s) until its memory has stopped falling. */
  long after = bc_proc_status_kib (O.mem_shim_pid, "VmRSS");
  for (int i = 0; i < 30; i++)
    {
      usleep (100 * 1000);
      long now = bc_proc_status_kib (O.mem_shim_pid, "VmRSS");
      if (now == after)
        break;
      after = now;
    }
  fprintf (stderr,
           PROG ": buffered: %ld failed%s%s; shim VmHWM %ld KiB (sampled VmRSS peak %ld KiB), after %ld KiB\n",
           M.failed, M.failed ? "; first error: " : "", M.first_error, hwm, M.peak_rss_kib, after);
  MEM_ERRORS = M.failed;
  double in_flight = (double) O.mem_clients * O.mem_mib;
  char what[128], base[64];
  snprintf (what, sizeof what, "buffered exec, %d x %d MiB at once: shim peak RSS", O.mem_clients, O.mem_mib);
  snprintf (base, sizeof base, "output in flight (%d x %d MiB)", O.mem_clients, O.mem_mib);
  bc_row_add_values (what, "MiB", M.failed ? NAN : (double) hwm / 1024, NAN, base, in_flight, NAN);
  bc_row_add_values ("buffered exec: shim RSS before (idle)", "MiB", (double) idle / 1024, NAN, NULL, NAN, NAN);
  bc_row_add_values ("buffered exec: shim RSS after (answers read)", "MiB", (double) after / 1024, NAN, NULL, NAN,
                     NAN);
}

/* ---- main ----------------------------------------------------------------- */

/* "IPV4:PORT" into *out; -1 when it is not one. */
static int
parse_addr (const char *text, struct sockaddr_in *out)
{
  char host[64];
  int port = 0;
  if (sscanf (text, "%63[^:]:%d", host, &port) != 2 || port < 1 || port > 65535
      || inet_pton (AF_INET, host, &out->sin_addr) != 1)
    return -1;
  out->sin_family = AF_INET;
  out->sin_port = htons ((uint16_t) port);
  return 0;
}

static void
usage (FILE *f)
{
  fprintf (f, "Usage: " PROG " --shim HOST:PORT --target HOST:PORT [options]\n"
              "REST (sandbox-shim) against direct gRPC (sandbox-gateway); the secret, the shim's\n"
              "and the gateway's, in CLOUD_RUN_SANDBOX_GATEWAY_SECRET.\n"
              "  --shim HOST:PORT        the shim (an IPv4 address)\n"
              "  --target HOST:PORT      the gateway behind it\n"
              "  --rtt N                 round trips of each (default 300), --rtt-warmup N (default 30)\n"
              "  --clients N             concurrent clients under load (default 64)\n"
              "  --load-seconds N        length of each load phase (default 10)\n"
              "  --wrk PATH              wrk (default: wrk on PATH), --wrk-script FILE\n"
              "                          (default bench/shim_wrk.lua)\n"
              "  --mem-shim HOST:PORT    a fresh shim (nothing else sent to it) for the memory of\n"
              "                          buffered execs, --mem-shim-pid PID its process\n"
              "  --mem-clients N         buffered execs at once (default 64), --mem-mib N the\n"
              "                          output of each in MiB (default 16)\n"
              "  --routed-shim HOST:PORT a shim routing over three gateways (SHIM_GATEWAYS), one of\n"
              "                          them --target\n"
              "  --only LIST             comma-separated subset of rtt,load,buffered,routed\n"
              "  --markdown FILE         also write the table to FILE in Markdown\n");
}

int
main (int argc, char **argv)
{
  static const struct option lo[] = {
      {"shim", required_argument, 0, 's'},
      {"target", required_argument, 0, 't'},
      {"rtt", required_argument, 0, 'n'},
      {"rtt-warmup", required_argument, 0, 'w'},
      {"clients", required_argument, 0, 'c'},
      {"load-seconds", required_argument, 0, 'd'},
      {"wrk", required_argument, 0, 'W'},
      {"wrk-script", required_argument, 0, 'S'},
      {"only", required_argument, 0, 'o'},
      {"markdown", required_argument, 0, 'm'},
      {"mem-shim", required_argument, 0, 'M'},
      {"mem-shim-pid", required_argument, 0, 'P'},
      {"mem-clients", required_argument, 0, 'C'},
      {"mem-mib", required_argument, 0, 'B'},
      {"routed-shim", required_argument, 0, 'R'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *only = "rtt,load,buffered,routed";
  int ch;
  while ((ch = getopt_long (argc, argv, "h", lo, NULL)) != -1)
    switch (ch)
      {
      case 's': O.shim = optarg; break;
      case 't': O.target = optarg; break;
      case 'n': O.rtt_n = atoi (optarg); break;
      case 'w': O.rtt_warmup = atoi (optarg); break;
      case 'c': O.clients = atoi (optarg); break;
      case 'd': O.load_seconds = atoi (optarg); break;
      case 'W': O.wrk = optarg; break;
      case 'S': O.wrk_script = optarg; break;
      case 'o': only = optarg; break;
      case 'm': O.markdown = optarg; break;
      case 'M': O.mem_shim = optarg; break;
      case 'P': O.mem_shim_pid = atoi (optarg); break;
      case 'C': O.mem_clients = atoi (optarg); break;
      case 'B': O.mem_mib = atoi (optarg); break;
      case 'R': O.routed_shim = optarg; break;
      case 'h': usage (stdout); return 0;
      default: usage (stderr); return 2;
      }
  if (O.shim == NULL || O.target == NULL || O.rtt_n < 1 || O.rtt_warmup < 0 || O.clients < 1 || O.load_seconds < 1
      || O.mem_clients < 1 || O.mem_mib < 1 || (O.mem_shim != NULL && O.mem_shim_pid <= 0))
    {
      usage (stderr);
      return 2;
    }
  bc_auth_from_env (PROG);
  snprintf (SECRET, sizeof SECRET, "%s", getenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET"));
  if (parse_addr (O.shim, &SHIM_ADDR) < 0 || (O.mem_shim != NULL && parse_addr (O.mem_shim, &MEM_ADDR) < 0)
      || (O.routed_shim != NULL && parse_addr (O.routed_shim, &ROUTED_ADDR) < 0))
    {
      fprintf (stderr, PROG ": --shim, --mem-shim and --routed-shim must be IPV4:PORT\n");
      return 2;
    }
  signal (SIGPIPE, SIG_IGN);

  rpc_init ();
  CH = bc_channel (PROG, O.target);

  /* The sandbox, made through the shim. */
  http_t h = {.fd = -1};
  err_t err = ERR_INIT;
  int status = 0;
  char body[1024];
  if (http_do (&h, "POST", "/sandboxes", "{\"sandbox_id\":\"" SANDBOX_ID "\"}", &status, body, sizeof body, &err) < 0)
    bc_die (PROG, "POST /sandboxes", &err);
  if (status != 201)
    {
      fprintf (stderr, PROG ": POST /sandboxes: HTTP %d: %s\n", status, body);
      return 1;
    }
  http_close (&h);

  char list[64];
  snprintf (list, sizeof list, ",%s,", only);
  if (strstr (list, ",rtt,") != NULL)
    {
      double t0 = bc_now_ms ();
      bench_rtt ();
      fprintf (stderr, PROG ": rtt: done in %.1f s\n", (bc_now_ms () - t0) / 1e3);
    }
  if (strstr (list, ",load,") != NULL)
    {
      double t0 = bc_now_ms ();
      bench_load ();
      fprintf (stderr, PROG ": load: done in %.1f s\n", (bc_now_ms () - t0) / 1e3);
    }

  if (strstr (list, ",buffered,") != NULL && O.mem_shim == NULL)
    fprintf (stderr, PROG ": buffered: skipped (no --mem-shim)\n");
  else if (strstr (list, ",buffered,") != NULL)
    {
      double t0 = bc_now_ms ();
      bench_mem ();
      fprintf (stderr, PROG ": buffered: done in %.1f s\n", (bc_now_ms () - t0) / 1e3);
    }

  if (strstr (list, ",routed,") != NULL && O.routed_shim == NULL)
    fprintf (stderr, PROG ": routed: skipped (no --routed-shim)\n");
  else if (strstr (list, ",routed,") != NULL)
    {
      double t0 = bc_now_ms ();
      bench_routed ();
      fprintf (stderr, PROG ": routed: done in %.1f s\n", (bc_now_ms () - t0) / 1e3);
    }

  if (bc_delete (CH, SANDBOX_ID, &err) < 0)
    bc_die (PROG, "delete", &err);
  int rc = bc_print_tables (O.markdown) < 0 ? 1 : 0;
  if (LOAD_ERRORS > 0)
    {
      fprintf (stderr, PROG ": %ld errors under load (must be 0)\n", LOAD_ERRORS);
      rc = 1;
    }
  if (MEM_ERRORS > 0)
    {
      fprintf (stderr, PROG ": %ld buffered execs failed (must be 0)\n", MEM_ERRORS);
      rc = 1;
    }
  rpc_channel_destroy (CH);
  rpc_shutdown ();
  return rc;
}
