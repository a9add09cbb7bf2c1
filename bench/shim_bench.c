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
} opts_t;

static opts_t O = {
    .wrk = "wrk",
    .wrk_script = "bench/shim_wrk.lua",
    .rtt_n = 300,
    .rtt_warmup = 30,
    .clients = 64,
    .load_seconds = 10,
};

static rpc_channel_t *CH;
static char SECRET[256];
static struct sockaddr_in SHIM_ADDR;

/* ---- a minimal HTTP/1.1 client (keep-alive) ------------------------------- */

typedef struct http_s
{
  int fd;
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
  if (connect (h->fd, (struct sockaddr *) &SHIM_ADDR, sizeof SHIM_ADDR) < 0)
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

/* One request on the connection (reconnecting when the shim closed it);
 * the status goes to *status and the body (NUL-terminated, cut to `blen`)
 * to `body`. Responses must carry Content-Length. */
static int
http_do (http_t *h, const char *method, const char *path, const char *json, int *status, char *body, size_t blen,
         err_t *err)
{
  char req[1024];
  int n;
  if (json != NULL)
    n = snprintf (req, sizeof req,
                  "%s %s HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                  method, path, SECRET, strlen (json), json);
  else
    n = snprintf (req, sizeof req, "%s %s HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %s\r\n\r\n", method, path,
                  SECRET);
  if (n < 0 || (size_t) n >= sizeof req)
    return err_make (err, EMSGSIZE, "request too large");
  for (int attempt = 0; attempt < 2; attempt++)
    {
      if (h->fd < 0 && http_connect (h, err) < 0)
        return -1;
      if (write_all (h->fd, req, (size_t) n) < 0)
        {
          http_close (h);
          continue;
        }
      /* The head. */
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
        {
          /* Closed before any answer: a kept-alive connection the shim
           * dropped; once more on a new one. */
          bool fresh = h->have == 0;
          http_close (h);
          if (fresh && attempt == 0)
            continue;
          return err_make (err, EPROTO, "connection closed mid-response");
        }
      size_t head_len = (size_t) (end - h->buf) + 4;
      if (sscanf (h->buf, "HTTP/1.%*d %d", status) != 1)
        return err_make (err, EPROTO, "bad status line");
      long clen = -1;
      bool close_after = false;
      for (char *line = strstr (h->buf, "\r\n"); line != NULL && line < end; line = strstr (line + 2, "\r\n"))
        {
          if (strncasecmp (line + 2, "Content-Length:", 15) == 0)
            clen = strtol (line + 2 + 15, NULL, 10);
          else if (strncasecmp (line + 2, "Connection: close", 17) == 0)
            close_after = true;
        }
      if (clen < 0)
        return err_make (err, EPROTO, "response without Content-Length");
      if (head_len + (size_t) clen >= sizeof h->buf)
        return err_make (err, EMSGSIZE, "response too large");
      while (h->have < head_len + (size_t) clen)
        {
          ssize_t r = read (h->fd, h->buf + h->have, sizeof h->buf - 1 - h->have);
          if (r < 0 && errno == EINTR)
            continue;
          if (r <= 0)
            return err_make (err, EPROTO, "connection closed mid-body");
          h->have += (size_t) r;
        }
      if (body != NULL && blen > 0)
        snprintf (body, blen, "%.*s", (int) clen, h->buf + head_len);
      size_t used = head_len + (size_t) clen;
      memmove (h->buf, h->buf + used, h->have - used);
      h->have -= used;
      if (close_after)
        http_close (h);
      return 0;
    }
  return err_make (err, EPIPE, "could not send the request");
}

/* ---- the calls ------------------------------------------------------------ */

static int
rest_exec (http_t *h, err_t *err)
{
  int status = 0;
  char body[1024];
  if (http_do (h, "POST", "/sandboxes/" SANDBOX_ID "/exec", EXEC_BODY, &status, body, sizeof body, err) < 0)
    return -1;
  if (status != 200 || (strstr (body, "\"exit_code\": 0") == NULL && strstr (body, "\"exit_code\":0") == NULL))
    return err_make (err, EIO, "exec through the shim: HTTP %d: %.200s", status, body);
  return 0;
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

/* ---- main ----------------------------------------------------------------- */

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
              "  --only LIST             comma-separated subset of rtt,load\n"
              "  --markdown FILE         also write the table to FILE in Markdown\n");
}

int
main (int argc, char **argv)
{
  static const struct option lo[] = {
      {"shim", required_argument, 0, 's'},    {"target", required_argument, 0, 't'},
      {"rtt", required_argument, 0, 'n'},     {"rtt-warmup", required_argument, 0, 'w'},
      {"clients", required_argument, 0, 'c'}, {"load-seconds", required_argument, 0, 'd'},
      {"wrk", required_argument, 0, 'W'},     {"wrk-script", required_argument, 0, 'S'},
      {"only", required_argument, 0, 'o'},    {"markdown", required_argument, 0, 'm'},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
  };
  const char *only = "rtt,load";
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
      case 'h': usage (stdout); return 0;
      default: usage (stderr); return 2;
      }
  if (O.shim == NULL || O.target == NULL || O.rtt_n < 1 || O.rtt_warmup < 0 || O.clients < 1 || O.load_seconds < 1)
    {
      usage (stderr);
      return 2;
    }
  bc_auth_from_env (PROG);
  snprintf (SECRET, sizeof SECRET, "%s", getenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET"));
  char host[64];
  int port = 0;
  if (sscanf (O.shim, "%63[^:]:%d", host, &port) != 2 || inet_pton (AF_INET, host, &SHIM_ADDR.sin_addr) != 1)
    {
      fprintf (stderr, PROG ": --shim must be IPV4:PORT\n");
      return 2;
    }
  SHIM_ADDR.sin_family = AF_INET;
  SHIM_ADDR.sin_port = htons ((uint16_t) port);
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

  if (bc_delete (CH, SANDBOX_ID, &err) < 0)
    bc_die (PROG, "delete", &err);
  int rc = bc_print_tables (O.markdown) < 0 ? 1 : 0;
  if (LOAD_ERRORS > 0)
    {
      fprintf (stderr, PROG ": %ld errors under load (must be 0)\n", LOAD_ERRORS);
      rc = 1;
    }
  rpc_channel_destroy (CH);
  rpc_shutdown ();
  return rc;
}
