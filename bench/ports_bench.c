/* ports_bench: the cost of reaching a server in a sandbox from outside —
 * through sandbox-shim's port proxy and through the gateway's Forward —
 * against the same requests made inside the sandbox over its own loopback,
 * measured in the same run, interleaved:
 *
 *   1. throughput: a static file (100 MiB of random bytes) served by
 *      `python3 -m http.server` in the sandbox, fetched (a) through the
 *      shim's proxy by `curl -o /dev/null` spawned from here, (b) through a
 *      raw Forward call from this program (`GET /file HTTP/1.0`, read to
 *      the end, body bytes counted), (c) by an Exec of
 *      `curl -o /dev/null http://127.0.0.1:8000/file` in the sandbox (the
 *      whole Exec timed). MB/s, against (c).
 *   2. latency of a small GET (a 64-byte file), in batches: curl through
 *      the proxy (one curl per batch, its connection to the shim kept
 *      alive; each transfer's time_total) against curl in the sandbox over
 *      loopback (one Exec per batch; each transfer's time_total), and one
 *      Forward call per request from this program (timed to the server's
 *      close_write frame and to the call's final status) against the same
 *      in-sandbox figure.
 *   3. load: wrk, 64 connections, for a fixed time, on the small GET
 *      through the proxy and, as the baseline, wrk run in the sandbox
 *      against its loopback (one Exec). Requests per second, latency median
 *      and p99, errors (answers >= 400, socket errors, timeouts).
 *
 * The bearer secret (the shim's and the gateway's) comes from
 * CLOUD_RUN_SANDBOX_GATEWAY_SECRET; curl reads it from a private header
 * file, never from its argv. bench/ports builds everything, starts a
 * gateway and a shim and runs this program.
 *
 * Threading: one thread; curl and wrk are child processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "common/err.h"
#include "common/rpc/rpc.h"
#include "sandbox/v1/sandbox.pb-c.h"

#define PROG "ports_bench"
#define SANDBOX_ID "portsbench"
#define PORT 8000
#define SERVE_DIR "/tmp/www"
#define SMALL_BYTES 64
/* The most bytes of a response head this program accepts (Forward). */
#define MAX_HEAD 8192
/* Captured output of one curl batch or one wrk run. */
#define MAX_CAPTURE (256 * 1024)

typedef struct opts_s
{
  const char *shim;   /* HOST:PORT */
  const char *target; /* the gateway, HOST:PORT */
  const char *curl;
  const char *wrk;
  const char *wrk_script;
  const char *markdown;
  const char *verdict;
  int size_mib;
  int fetches;
  int small_n;
  int batch;
  int clients;
  int load_seconds;
} opts_t;

static opts_t O = {
    .curl = "curl",
    .wrk = "wrk",
    .wrk_script = "bench/shim_wrk.lua",
    .size_mib = 100,
    .fetches = 5,
    .small_n = 300,
    .batch = 50,
    .clients = 64,
    .load_seconds = 10,
};

static rpc_channel_t *CH;
static char SECRET[256];
static char HEADER_FILE[64]; /* "Authorization: Bearer ..." for curl -H @FILE */
static char PROXY_BASE[256]; /* http://SHIM/sandboxes/ID/ports/PORT */

/* ---- spawning curl and wrk ------------------------------------------------ */

/* Runs argv with stdout into `out` (NUL-terminated, at most out_size - 1
 * bytes kept); fails unless it exits 0. */
static int
run_capture (char *const argv[], char *out, size_t out_size, err_t *err)
{
  FILE *f = tmpfile ();
  if (f == NULL)
    return err_make_sys (err, errno, "tmpfile");
  pid_t pid = bc_spawn (argv, fileno (f), 2);
  if (pid < 0)
    {
      int e = errno;
      fclose (f);
      return err_make_sys (err, e, "spawn `%s`", argv[0]);
    }
  int st = bc_wait (pid);
  rewind (f);
  size_t n = fread (out, 1, out_size - 1, f);
  out[n] = '\0';
  fclose (f);
  if (st != 0)
    return err_make (err, EIO, "`%s` failed (wait status %d): %.200s", argv[0], st, out);
  return 0;
}

/* ---- the sandbox's server ------------------------------------------------- */

static void
exec_or_die (char **argv, size_t argc, const char *what)
{
  err_t err = ERR_INIT;
  if (bc_exec (CH, SANDBOX_ID, argv, argc, 120, NULL, &err) < 0)
    bc_die (PROG, what, &err);
}

/* Starts argv detached in the sandbox (Run with start.detach) and leaves
 * the call; the process runs on. */
static void
start_detached (char **argv, size_t argc)
{
  Sandbox__V1__ProcessStart start = SANDBOX__V1__PROCESS_START__INIT;
  start.sandbox_id = SANDBOX_ID;
  start.argv = argv;
  start.n_argv = argc;
  start.detach = true;
  Sandbox__V1__ProcessInput in = SANDBOX__V1__PROCESS_INPUT__INIT;
  in.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_START;
  in.start = &start;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (CH, "/sandbox.v1.Sandbox/Run", 60000, BC_MD, 1, &c, &err) < 0
      || rpc_client_send (c, &in.base, &err) < 0)
    bc_die (PROG, "Run", &err);
  ProtobufCMessage *m = NULL;
  if (rpc_client_recv (c, &sandbox__v1__process_event__descriptor, &m, &err) <= 0)
    bc_die (PROG, "Run: no started event", &err);
  bool started = ((Sandbox__V1__ProcessEvent *) m)->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STARTED;
  protobuf_c_message_free_unpacked (m, NULL);
  if (!started)
    {
      fprintf (stderr, PROG ": Run: the first event is not `started`\n");
      exit (1);
    }
  rpc_client_cancel (c);
  rpc_client_destroy (c);
}

/* ---- one GET over a raw Forward call -------------------------------------- */

/* GET `path` over a Forward call to PORT: the status must be 200; the body's
 * length (everything after the head, to the end of the connection) goes to
 * *body, and when the server's close_write frame came (bc_now_ms) to
 * *end_ms (may be NULL). The client half-closes once that frame is in, as
 * the server is done. */
static int
forward_get (const char *path, uint64_t *body, double *end_ms, err_t *err)
{
  char req[256];
  int len = snprintf (req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
  Sandbox__V1__ForwardFrame first = SANDBOX__V1__FORWARD_FRAME__INIT;
  first.sandbox_id = SANDBOX_ID;
  first.port = PORT;
  first.data = (ProtobufCBinaryData){.len = (size_t) len, .data = (uint8_t *) req};
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (CH, "/sandbox.v1.Sandbox/Forward", 600000, BC_MD, 1, &c, err) < 0)
    return -1;
  if (rpc_client_send (c, &first.base, err) < 0)
    {
      rpc_client_destroy (c);
      return -1;
    }
  bool sent_close = false;
  char head[MAX_HEAD];
  size_t hlen = 0;
  bool in_body = false;
  uint64_t n = 0;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__forward_frame__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__ForwardFrame *f = (Sandbox__V1__ForwardFrame *) m;
      if (f->close_write && !sent_close)
        {
          if (end_ms != NULL)
            *end_ms = bc_now_ms ();
          sent_close = true;
          if (rpc_client_close_send (c, err) < 0)
            {
              protobuf_c_message_free_unpacked (m, NULL);
              rpc_client_destroy (c);
              return -1;
            }
        }
      size_t dlen = f->data.len;
      const uint8_t *d = f->data.data;
      if (!in_body && dlen > 0)
        {
          size_t take = dlen < sizeof head - 1 - hlen ? dlen : sizeof head - 1 - hlen;
          memcpy (head + hlen, d, take);
          hlen += take;
          head[hlen] = '\0';
          char *end = strstr (head, "\r\n\r\n");
          if (end != NULL)
            {
              in_body = true;
              /* Bytes of this frame past the head are body. */
              size_t head_total = (size_t) (end + 4 - head);
              n += dlen - (head_total - (hlen - take));
            }
          else if (hlen == sizeof head - 1)
            {
              protobuf_c_message_free_unpacked (m, NULL);
              rpc_client_destroy (c);
              return err_make (err, EMSGSIZE, "GET %s: response head over %d bytes", path, MAX_HEAD);
            }
        }
      else
        n += dlen;
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "Forward", err) < 0)
    return -1;
  if (!in_body || strncmp (head, "HTTP/1.0 200 ", 13) != 0)
    return err_make (err, EIO, "GET %s over Forward: %.60s", path, head);
  *body = n;
  return 0;
}

/* Waits until the server answers GET /small over Forward. */
static void
wait_serving (void)
{
  double deadline = bc_now_ms () + 30000;
  for (;;)
    {
      err_t err = ERR_INIT;
      uint64_t n = 0;
      if (forward_get ("/small", &n, NULL, &err) == 0 && n == SMALL_BYTES)
        return;
      if (bc_now_ms () > deadline)
        bc_die (PROG, "the sandbox's http.server does not answer", &err);
      err_release (&err);
      usleep (100 * 1000);
    }
}

static void
setup_sandbox (void)
{
  err_t err = ERR_INIT;
  if (bc_launch (CH, SANDBOX_ID, &err) < 0)
    bc_die (PROG, "launch", &err);
  char make[512];
  snprintf (make, sizeof make,
            "mkdir -p " SERVE_DIR " && head -c %lld /dev/urandom > " SERVE_DIR "/file && "
            "head -c %d /dev/zero | tr '\\0' x > " SERVE_DIR "/small",
            (long long) O.size_mib * 1024 * 1024, SMALL_BYTES);
  char *sh[] = {"sh", "-c", make};
  exec_or_die (sh, 3, "make the files");
  char port[16];
  snprintf (port, sizeof port, "%d", PORT);
  char *server[] = {"python3", "-m", "http.server", port, "--bind", "0.0.0.0", "--directory", SERVE_DIR};
  start_detached (server, sizeof server / sizeof server[0]);
  wait_serving ();
}

/* ---- 1. throughput ---------------------------------------------------------- */

static uint64_t
file_bytes (void)
{
  return (uint64_t) O.size_mib * 1024 * 1024;
}

/* (a) curl through the shim's proxy. */
static int
fetch_proxy (err_t *err)
{
  char url[512], out[256];
  snprintf (url, sizeof url, "%s/file", PROXY_BASE);
  char hdr[80];
  snprintf (hdr, sizeof hdr, "@%s", HEADER_FILE);
  char *argv[]
      = {(char *) O.curl, "-s", "-o", "/dev/null", "-H", hdr, "-w", "%{http_code} %{size_download}", url, NULL};
  if (run_capture (argv, out, sizeof out, err) < 0)
    return -1;
  int code = 0;
  unsigned long long got = 0;
  if (sscanf (out, "%d %llu", &code, &got) != 2 || code != 200 || got != file_bytes ())
    return err_make (err, EIO, "curl through the proxy: `%s`, expected 200 and %llu bytes", out,
                     (unsigned long long) file_bytes ());
  return 0;
}

/* (b) a raw Forward call. */
static int
fetch_forward (err_t *err)
{
  uint64_t n = 0;
  if (forward_get ("/file", &n, NULL, err) < 0)
    return -1;
  if (n != file_bytes ())
    return err_make (err, EIO, "Forward: %llu bytes of body, expected %llu", (unsigned long long) n,
                     (unsigned long long) file_bytes ());
  return 0;
}

/* (c) curl in the sandbox over its loopback, one Exec. */
static int
fetch_inside (err_t *err)
{
  char url[128], out[256];
  snprintf (url, sizeof url, "http://127.0.0.1:%d/file", PORT);
  char *argv[] = {"curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", url};
  if (bc_exec_capture (CH, SANDBOX_ID, argv, 7, 300, NULL, out, sizeof out, err) < 0)
    return -1;
  int code = 0;
  unsigned long long got = 0;
  if (sscanf (out, "%d %llu", &code, &got) != 2 || code != 200 || got != file_bytes ())
    return err_make (err, EIO, "curl in the sandbox: `%s`, expected 200 and %llu bytes", out,
                     (unsigned long long) file_bytes ());
  return 0;
}

/* The figures the targets are about (NAN: not measured). */
static double TPUT_RATIO = NAN; /* proxy MB/s median / in-sandbox median */
static double ADDED_MS = NAN;   /* proxy small GET median - in-sandbox median */

static void
bench_throughput (void)
{
  bc_series_t px = {0}, fw = {0}, in = {0};
  int (*fetch[3]) (err_t *) = {fetch_proxy, fetch_forward, fetch_inside};
  bc_series_t *into[3] = {&px, &fw, &in};
  const char *name[3] = {"fetch through the proxy", "fetch over Forward", "fetch in the sandbox"};
  fprintf (stderr, PROG ": throughput: 1 warm-up + %d fetches of %d MiB each way\n", O.fetches, O.size_mib);
  for (int i = 0; i < O.fetches + 1; i++)
    for (int k = 0; k < 3; k++)
      {
        err_t err = ERR_INIT;
        double t0 = bc_now_ms ();
        if (fetch[k](&err) < 0)
          bc_die (PROG, name[k], &err);
        if (i > 0)
          bc_series_add (into[k], bc_mbps (file_bytes (), bc_now_ms () - t0));
      }
  char what[96];
  snprintf (what, sizeof what, "GET %d MiB via shim proxy (curl)", O.size_mib);
  bc_row_add (what, "MB/s", &px, 1, "in sandbox, loopback (curl)", &in);
  snprintf (what, sizeof what, "GET %d MiB via raw Forward (C client)", O.size_mib);
  bc_row_add (what, "MB/s", &fw, 1, "in sandbox, loopback (curl)", &in);
  TPUT_RATIO = bc_pct (&px, 50) / bc_pct (&in, 50);
  free (px.v);
  free (fw.v);
  free (in.v);
}

/* ---- 2. small requests -------------------------------------------------------- */

/* Adds the time_total (in ms) of every "200 SECONDS" line of curl's output
 * to `s`; fails unless there are `want` of them, all 200. */
static int
add_curl_times (const char *out, int want, bc_series_t *s, const char *who, err_t *err)
{
  int got = 0;
  const char *p = out;
  while (*p != '\0')
    {
      int code = 0;
      double secs = 0;
      if (sscanf (p, "%d %lf", &code, &secs) != 2 || code != 200)
        return err_make (err, EIO, "%s: unexpected line `%.60s`", who, p);
      bc_series_add (s, secs * 1e3);
      got++;
      const char *nl = strchr (p, '\n');
      if (nl == NULL)
        break;
      p = nl + 1;
    }
  if (got != want)
    return err_make (err, EIO, "%s: %d transfers reported, expected %d", who, got, want);
  return 0;
}

/* A batch of `k` small GETs by one curl: argv[0..fixed) then
 * `-o /dev/null URL` k times (curl pairs each -o with one URL), into `argv`
 * (room for fixed + 3k + 1). */
static void
batch_argv (char **argv, int fixed, int k, char *url)
{
  for (int i = 0; i < k; i++)
    {
      argv[fixed + 3 * i] = "-o";
      argv[fixed + 3 * i + 1] = "/dev/null";
      argv[fixed + 3 * i + 2] = url;
    }
  argv[fixed + 3 * k] = NULL;
}

static void
small_batch (int k, bc_series_t *px, bc_series_t *fe, bc_series_t *fw, bc_series_t *in)
{
  err_t err = ERR_INIT;
  static char out[MAX_CAPTURE];
  char **argv = calloc (3 * (size_t) k + 16, sizeof *argv);
  char url[512], hdr[80];

  snprintf (url, sizeof url, "%s/small", PROXY_BASE);
  snprintf (hdr, sizeof hdr, "@%s", HEADER_FILE);
  char *head[] = {(char *) O.curl, "-s", "-H", hdr, "-w", "%{http_code} %{time_total}\\n"};
  memcpy (argv, head, sizeof head);
  batch_argv (argv, 6, k, url);
  if (run_capture (argv, out, sizeof out, &err) < 0 || add_curl_times (out, k, px, "curl via proxy", &err) < 0)
    bc_die (PROG, "small GETs through the proxy", &err);

  for (int i = 0; i < k; i++)
    {
      uint64_t n = 0;
      double t0 = bc_now_ms (), t_end = NAN;
      if (forward_get ("/small", &n, &t_end, &err) < 0)
        bc_die (PROG, "small GET over Forward", &err);
      bc_series_add (fw, bc_now_ms () - t0);
      bc_series_add (fe, t_end - t0);
      if (n != SMALL_BYTES)
        {
          fprintf (stderr, PROG ": small GET over Forward: %llu bytes\n", (unsigned long long) n);
          exit (1);
        }
    }

  snprintf (url, sizeof url, "http://127.0.0.1:%d/small", PORT);
  char *ihead[] = {"curl", "-s", "-w", "%{http_code} %{time_total}\\n"};
  memcpy (argv, ihead, sizeof ihead);
  batch_argv (argv, 4, k, url);
  if (bc_exec_capture (CH, SANDBOX_ID, argv, (size_t) (4 + 3 * k), 120, NULL, out, sizeof out, &err) < 0
      || add_curl_times (out, k, in, "curl in the sandbox", &err) < 0)
    bc_die (PROG, "small GETs in the sandbox", &err);
  free (argv);
}

static void
bench_small (void)
{
  bc_series_t px = {0}, fe = {0}, fw = {0}, in = {0}, warm[4] = {{0}};
  int batches = (O.small_n + O.batch - 1) / O.batch;
  fprintf (stderr, PROG ": small GETs: 1 warm-up batch + %d batches of %d each way\n", batches, O.batch);
  small_batch (O.batch, &warm[0], &warm[1], &warm[2], &warm[3]);
  for (int b = 0; b < batches; b++)
    small_batch (O.batch, &px, &fe, &fw, &in);
  char what[96];
  const char *base = "in sandbox, loopback (curl)";
  snprintf (what, sizeof what, "GET %d B via shim proxy (curl time_total)", SMALL_BYTES);
  bc_row_add (what, "ms", &px, 99, base, &in);
  snprintf (what, sizeof what, "GET %d B via raw Forward, to the answer's end", SMALL_BYTES);
  bc_row_add (what, "ms", &fe, 99, base, &in);
  snprintf (what, sizeof what, "GET %d B via raw Forward, whole call", SMALL_BYTES);
  bc_row_add (what, "ms", &fw, 99, base, &in);
  ADDED_MS = bc_pct (&px, 50) - bc_pct (&in, 50);
  bc_row_add_values ("added latency via proxy (median - median)", "ms", ADDED_MS, NAN, NULL, NAN, NAN);
  free (px.v), free (fe.v), free (fw.v), free (in.v);
  for (int i = 0; i < 4; i++)
    free (warm[i].v);
}

/* ---- 3. load with wrk --------------------------------------------------------- */

typedef struct load_result_s
{
  double rps, p50_ms, p99_ms;
  long errors;
  bool na;
} load_result_t;

/* The summary line of bench/shim_wrk.lua in `out`. */
static load_result_t
parse_wrk (const char *name, const char *out)
{
  load_result_t r = {.na = true};
  long req = 0, dur_us = 0, p50 = 0, p99 = 0, es = 0, ec = 0, er = 0, ew = 0, et = 0;
  const char *line = strstr (out, "WRK requests=");
  if (line == NULL
      || sscanf (line,
                 "WRK requests=%ld duration_us=%ld p50_us=%ld p99_us=%ld status=%ld connect=%ld read=%ld "
                 "write=%ld timeout=%ld",
                 &req, &dur_us, &p50, &p99, &es, &ec, &er, &ew, &et)
             != 9
      || dur_us <= 0)
    {
      fprintf (stderr, PROG ": wrk %s: no summary line; its rows are n/a\n", name);
      return r;
    }
  r.na = false;
  r.errors = es + ec + er + ew + et;
  r.rps = (double) (req - es) / ((double) dur_us / 1e6);
  r.p50_ms = (double) p50 / 1e3;
  r.p99_ms = (double) p99 / 1e3;
  fprintf (stderr,
           PROG ": load %s: %ld requests in %.1f s; errors: %ld status >= 400, %ld connect, %ld read, %ld write, "
                "%ld timeout\n",
           name, req, (double) dur_us / 1e6, es, ec, er, ew, et);
  return r;
}

static load_result_t
wrk_proxy (void)
{
  static char out[MAX_CAPTURE];
  setenv ("SHIM_BENCH_METHOD", "GET", 1);
  setenv ("SHIM_BENCH_BODY", "", 1);
  setenv ("SHIM_BENCH_SECRET", SECRET, 1);
  char url[512], dur[32], conns[32];
  snprintf (url, sizeof url, "%s/small", PROXY_BASE);
  snprintf (dur, sizeof dur, "%ds", O.load_seconds);
  snprintf (conns, sizeof conns, "%d", O.clients);
  char *argv[]
      = {(char *) O.wrk, "-t1", "-c", conns, "-d", dur, "--timeout", "10s", "-s", (char *) O.wrk_script, url, NULL};
  err_t err = ERR_INIT;
  if (run_capture (argv, out, sizeof out, &err) < 0)
    {
      fprintf (stderr, PROG ": wrk through the proxy: %s; its rows are n/a\n", err_msg (&err));
      err_release (&err);
      return (load_result_t){.na = true};
    }
  return parse_wrk ("via proxy", out);
}

/* wrk in the sandbox (the host's binary, seen through its read-only root),
 * with the same Lua script copied in. */
static load_result_t
wrk_inside (void)
{
  static char out[MAX_CAPTURE];
  static char script[16384];
  err_t err = ERR_INIT;
  FILE *f = fopen (O.wrk_script, "re");
  size_t n = f ? fread (script, 1, sizeof script - 1, f) : 0;
  if (f != NULL)
    fclose (f);
  if (n == 0)
    {
      fprintf (stderr, PROG ": cannot read %s; the in-sandbox load rows are n/a\n", O.wrk_script);
      return (load_result_t){.na = true};
    }
  script[n] = '\0';
  char *put[] = {"sh", "-c", "printf '%s' \"$1\" > /tmp/wrk.lua", "sh", script};
  exec_or_die (put, 5, "copy the wrk script in");
  char url[128], dur[32], conns[32];
  snprintf (url, sizeof url, "http://127.0.0.1:%d/small", PORT);
  snprintf (dur, sizeof dur, "%ds", O.load_seconds);
  snprintf (conns, sizeof conns, "%d", O.clients);
  char *argv[] = {"env", "SHIM_BENCH_METHOD=GET", "wrk", "-t1", "-c", conns, "-d", dur, "--timeout", "10s",
                  "-s",  "/tmp/wrk.lua",          url};
  if (bc_exec_capture (CH, SANDBOX_ID, argv, sizeof argv / sizeof argv[0], (uint32_t) O.load_seconds + 60, NULL, out,
                       sizeof out, &err)
      < 0)
    {
      fprintf (stderr, PROG ": wrk in the sandbox: %s; its rows are n/a\n", err_msg (&err));
      err_release (&err);
      return (load_result_t){.na = true};
    }
  return parse_wrk ("in the sandbox", out);
}

static long LOAD_ERRORS;

static void
bench_load (void)
{
  fprintf (stderr, PROG ": load: %d connections, %d s each way\n", O.clients, O.load_seconds);
  load_result_t p = wrk_proxy ();
  load_result_t i = wrk_inside ();
  double nan = NAN;
  const char *base = "wrk in sandbox, loopback";
  char w[96];
  snprintf (w, sizeof w, "GET %d B via proxy, %d clients (wrk): throughput", SMALL_BYTES, O.clients);
  bc_row_add_values (w, "req/s", p.na ? nan : p.rps, nan, base, i.na ? nan : i.rps, nan);
  snprintf (w, sizeof w, "GET %d B via proxy, %d clients (wrk): latency", SMALL_BYTES, O.clients);
  bc_row_add_values (w, "ms", p.na ? nan : p.p50_ms, p.na ? nan : p.p99_ms, base, i.na ? nan : i.p50_ms,
                     i.na ? nan : i.p99_ms);
  snprintf (w, sizeof w, "GET %d B via proxy, %d clients (wrk): errors", SMALL_BYTES, O.clients);
  bc_row_add_values (w, "count", p.na ? nan : (double) p.errors, nan, base, i.na ? nan : (double) i.errors, nan);
  LOAD_ERRORS = (p.na ? 0 : p.errors) + (i.na ? 0 : i.errors);
}

/* ---- main ----------------------------------------------------------------- */

/* The targets, met or missed, as Markdown sentences to `f`. */
static void
print_verdict (FILE *f)
{
  const double tput_target = 0.5, added_target_ms = 0.5;
  if (isnan (TPUT_RATIO))
    fprintf (f, "- Throughput through the proxy: not measured.\n");
  else
    fprintf (f, "- Throughput through the proxy: %.2f× the in-sandbox loopback fetch (target ≥ %.1f×): **%s**.\n",
             TPUT_RATIO, tput_target, TPUT_RATIO >= tput_target ? "met" : "missed");
  if (isnan (ADDED_MS))
    fprintf (f, "- Added latency of a small GET through the proxy: not measured.\n");
  else
    fprintf (f, "- Added latency of a small GET through the proxy: %.3f ms median (target ≤ %.1f ms): **%s**.\n",
             ADDED_MS, added_target_ms, ADDED_MS <= added_target_ms ? "met" : "missed");
}

static int
write_verdict (const char *path)
{
  FILE *f = fopen (path, "we");
  if (f == NULL)
    return -1;
  print_verdict (f);
  return fclose (f) == 0 ? 0 : -1;
}

/* Writes the bearer header for curl to a private file (HEADER_FILE). */
static void
write_header_file (void)
{
  snprintf (HEADER_FILE, sizeof HEADER_FILE, "%s/ports_bench.XXXXXX", getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp");
  int fd = mkostemp (HEADER_FILE, O_CLOEXEC);
  if (fd < 0)
    {
      fprintf (stderr, PROG ": mkstemp: %s\n", strerror (errno));
      exit (1);
    }
  dprintf (fd, "Authorization: Bearer %s\n", SECRET);
  close (fd);
}

static void
usage (FILE *f)
{
  fprintf (f, "Usage: " PROG " --shim HOST:PORT --target HOST:PORT [options]\n"
              "A server in a sandbox reached through sandbox-shim's proxy and the gateway's Forward,\n"
              "against the same requests inside the sandbox; the secret in\n"
              "CLOUD_RUN_SANDBOX_GATEWAY_SECRET.\n"
              "  --shim HOST:PORT        the shim\n"
              "  --target HOST:PORT      the gateway behind it\n"
              "  --size-mib N            the large file (default 100), --fetches N of it each way (5)\n"
              "  --small N               small GETs each way (default 300), --batch N per curl (50)\n"
              "  --clients N             wrk connections (default 64), --load-seconds N (10)\n"
              "  --curl PATH, --wrk PATH, --wrk-script FILE (default bench/shim_wrk.lua)\n"
              "  --only LIST             comma-separated subset of throughput,small,load\n"
              "  --markdown FILE         also write the table to FILE in Markdown\n"
              "  --verdict FILE          also write the targets, met or missed, to FILE in Markdown\n");
}

int
main (int argc, char **argv)
{
  static const struct option lo[] = {
      {"shim", required_argument, 0, 's'},
      {"target", required_argument, 0, 't'},
      {"size-mib", required_argument, 0, 'z'},
      {"fetches", required_argument, 0, 'f'},
      {"small", required_argument, 0, 'n'},
      {"batch", required_argument, 0, 'b'},
      {"clients", required_argument, 0, 'c'},
      {"load-seconds", required_argument, 0, 'd'},
      {"curl", required_argument, 0, 'C'},
      {"wrk", required_argument, 0, 'W'},
      {"wrk-script", required_argument, 0, 'S'},
      {"only", required_argument, 0, 'o'},
      {"markdown", required_argument, 0, 'm'},
      {"verdict", required_argument, 0, 'V'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *only = "throughput,small,load";
  int ch;
  while ((ch = getopt_long (argc, argv, "h", lo, NULL)) != -1)
    switch (ch)
      {
      case 's': O.shim = optarg; break;
      case 't': O.target = optarg; break;
      case 'z': O.size_mib = atoi (optarg); break;
      case 'f': O.fetches = atoi (optarg); break;
      case 'n': O.small_n = atoi (optarg); break;
      case 'b': O.batch = atoi (optarg); break;
      case 'c': O.clients = atoi (optarg); break;
      case 'd': O.load_seconds = atoi (optarg); break;
      case 'C': O.curl = optarg; break;
      case 'W': O.wrk = optarg; break;
      case 'S': O.wrk_script = optarg; break;
      case 'o': only = optarg; break;
      case 'm': O.markdown = optarg; break;
      case 'V': O.verdict = optarg; break;
      case 'h': usage (stdout); return 0;
      default: usage (stderr); return 2;
      }
  if (O.shim == NULL || O.target == NULL || O.size_mib < 1 || O.fetches < 1 || O.small_n < 1 || O.batch < 1
      || O.batch > 1000 || O.clients < 1 || O.load_seconds < 1)
    {
      usage (stderr);
      return 2;
    }
  bc_auth_from_env (PROG);
  snprintf (SECRET, sizeof SECRET, "%s", getenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET"));
  snprintf (PROXY_BASE, sizeof PROXY_BASE, "http://%s/sandboxes/" SANDBOX_ID "/ports/%d", O.shim, PORT);
  signal (SIGPIPE, SIG_IGN);
  write_header_file ();

  bc_table_widths (58, 28);
  rpc_init ();
  CH = bc_channel (PROG, O.target);
  setup_sandbox ();

  char list[64];
  snprintf (list, sizeof list, ",%s,", only);
  static const struct
  {
    const char *name;
    void (*run) (void);
  } stages[] = {{"throughput", bench_throughput}, {"small", bench_small}, {"load", bench_load}};
  for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++)
    {
      char key[32];
      snprintf (key, sizeof key, ",%s,", stages[i].name);
      if (strstr (list, key) == NULL)
        continue;
      double t0 = bc_now_ms ();
      stages[i].run ();
      fprintf (stderr, PROG ": %s: done in %.1f s\n", stages[i].name, (bc_now_ms () - t0) / 1e3);
    }

  err_t err = ERR_INIT;
  unlink (HEADER_FILE);
  if (bc_delete (CH, SANDBOX_ID, &err) < 0)
    bc_die (PROG, "delete", &err);
  int rc = bc_print_tables (O.markdown) < 0 ? 1 : 0;
  if (O.verdict != NULL && write_verdict (O.verdict) < 0)
    {
      fprintf (stderr, PROG ": cannot write %s: %s\n", O.verdict, strerror (errno));
      rc = 1;
    }
  if (LOAD_ERRORS > 0)
    {
      fprintf (stderr, PROG ": %ld errors under load\n", LOAD_ERRORS);
      rc = 1;
    }
  rpc_channel_destroy (CH);
  rpc_shutdown ();
  return rc;
}
