/* bench_common: see bench_common.h. */
#include "bench/bench_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/v1/sandbox.pb-c.h"

long
bc_proc_status_kib (pid_t pid, const char *field)
{
  char path[64], line[256];
  snprintf (path, sizeof path, "/proc/%d/status", (int) pid);
  FILE *f = fopen (path, "re");
  if (f == NULL)
    return -1;
  long v = -1;
  size_t n = strlen (field);
  while (fgets (line, sizeof line, f) != NULL)
    if (strncmp (line, field, n) == 0 && line[n] == ':')
      v = strtol (line + n + 1, NULL, 10);
  fclose (f);
  return v;
}

static void *
rss_sampler_main (void *arg)
{
  bc_rss_sampler_t *s = arg;
  while (!s->stop)
    {
      long v = bc_proc_status_kib (s->pid, "VmRSS");
      if (v > s->peak_kib)
        s->peak_kib = v;
      usleep (5 * 1000);
    }
  return NULL;
}

void
bc_rss_start (bc_rss_sampler_t *s, pid_t pid)
{
  memset (s, 0, sizeof *s);
  s->pid = pid;
  s->start_kib = s->peak_kib = pid > 0 ? bc_proc_status_kib (pid, "VmRSS") : -1;
  s->running = s->start_kib >= 0 && pthread_create (&s->thread, NULL, rss_sampler_main, s) == 0;
}

long
bc_rss_stop (bc_rss_sampler_t *s)
{
  if (!s->running)
    return -1;
  s->stop = true;
  pthread_join (s->thread, NULL);
  long v = bc_proc_status_kib (s->pid, "VmRSS");
  if (v > s->peak_kib)
    s->peak_kib = v;
  return s->peak_kib - s->start_kib;
}

extern char **environ;

double
bc_now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

double
bc_mbps (uint64_t bytes, double ms)
{
  return (double) bytes / 1e6 / (ms / 1e3);
}

void
bc_die (const char *prog, const char *what, err_t *err)
{
  fprintf (stderr, "%s: %s: %s\n", prog, what, err_msg (err));
  exit (1);
}

/* ---- series -------------------------------------------------------------- */

void
bc_series_add (bc_series_t *s, double x)
{
  if (s->n == s->cap)
    {
      s->cap = s->cap ? s->cap * 2 : 64;
      s->v = realloc (s->v, (size_t) s->cap * sizeof *s->v);
      if (s->v == NULL)
        {
          perror ("realloc");
          exit (1);
        }
    }
  s->v[s->n++] = x;
}

void
bc_series_na (bc_series_t *s, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  if (!s->na)
    vsnprintf (s->why, sizeof s->why, fmt, ap);
  va_end (ap);
  s->na = true;
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

double
bc_pct (bc_series_t *s, double p)
{
  if (s->na || s->n == 0)
    return NAN;
  qsort (s->v, (size_t) s->n, sizeof *s->v, cmp_double);
  if (p == 50)
    return s->n % 2 ? s->v[s->n / 2] : (s->v[s->n / 2 - 1] + s->v[s->n / 2]) / 2;
  int rank = (int) ceil (p / 100.0 * s->n);
  if (rank < 1)
    rank = 1;
  return s->v[rank - 1];
}

/* ---- the table ----------------------------------------------------------- */

typedef struct row_s
{
  char what[72];
  char unit[16];
  double ours_med, ours_tail;
  char base_name[48];
  double base_med, base_tail;
} row_t;

static row_t ROWS[32];
static int NROWS;
static int WHAT_W = 50, BASE_W = 26;

void
bc_table_widths (int what, int base_name)
{
  WHAT_W = what;
  BASE_W = base_name;
}

void
bc_row_add_values (const char *what, const char *unit, double ours_med, double ours_tail, const char *base_name,
                   double base_med, double base_tail)
{
  if (NROWS == (int) (sizeof ROWS / sizeof ROWS[0]))
    return;
  row_t *r = &ROWS[NROWS++];
  snprintf (r->what, sizeof r->what, "%s", what);
  snprintf (r->unit, sizeof r->unit, "%s", unit);
  r->ours_med = ours_med;
  r->ours_tail = ours_tail;
  snprintf (r->base_name, sizeof r->base_name, "%s", base_name ? base_name : "-");
  r->base_med = base_med;
  r->base_tail = base_tail;
}

void
bc_row_add (const char *what, const char *unit, bc_series_t *ours, double p_tail, const char *base_name,
            bc_series_t *base)
{
  bc_row_add_values (what, unit, bc_pct (ours, 50), bc_pct (ours, p_tail), base_name, base ? bc_pct (base, 50) : NAN,
                     base ? bc_pct (base, p_tail) : NAN);
}

static void
fmt_num (char *buf, size_t n, double v)
{
  if (isnan (v))
    snprintf (buf, n, "n/a");
  else if (fabs (v) >= 100)
    snprintf (buf, n, "%.0f", v);
  else if (fabs (v) >= 10)
    snprintf (buf, n, "%.1f", v);
  else
    snprintf (buf, n, "%.3f", v);
}

static void
fmt_ratio (char *buf, size_t n, const row_t *r)
{
  /* Counts (errors) are compared, not divided. */
  if (strcmp (r->unit, "count") == 0)
    snprintf (buf, n, "-");
  else if (isnan (r->ours_med) || isnan (r->base_med) || r->base_med == 0)
    snprintf (buf, n, "%s", strcmp (r->base_name, "-") != 0 ? "n/a" : "-");
  else
    snprintf (buf, n, "%.2fx", r->ours_med / r->base_med);
}

void
bc_print_table (FILE *f, bool markdown)
{
  static const char *hdr[] = {"measurement",  "ours median",          "ours p99", "baseline", "baseline median",
                              "baseline p99", "ratio (ours/baseline)"};
  if (markdown)
    {
      fprintf (f, "|");
      for (int i = 0; i < 7; i++)
        fprintf (f, " %s |", hdr[i]);
      fprintf (f, "\n|---|--:|--:|---|--:|--:|--:|\n");
    }
  else
    fprintf (f, "%-*s %11s %10s  %-*s %15s %13s %8s\n", WHAT_W, hdr[0], hdr[1], hdr[2], BASE_W, hdr[3], hdr[4],
             hdr[5], "ratio");
  for (int i = 0; i < NROWS; i++)
    {
      const row_t *r = &ROWS[i];
      char what[128], a[32], b[32], c[32], d[32], e[32];
      snprintf (what, sizeof what, "%s (%s)", r->what, r->unit);
      fmt_num (a, sizeof a, r->ours_med);
      fmt_num (b, sizeof b, r->ours_tail);
      bool count = strcmp (r->unit, "count") == 0;
      if (count && !isnan (r->ours_med))
        snprintf (a, sizeof a, "%.0f", r->ours_med);
      /* A single figure (a rate over a whole run) has no tail. */
      if (isnan (r->ours_tail) && !isnan (r->ours_med))
        snprintf (b, sizeof b, "-");
      if (strcmp (r->base_name, "-") == 0)
        {
          snprintf (c, sizeof c, "-");
          snprintf (d, sizeof d, "-");
        }
      else
        {
          fmt_num (c, sizeof c, r->base_med);
          fmt_num (d, sizeof d, r->base_tail);
          if (count && !isnan (r->base_med))
            snprintf (c, sizeof c, "%.0f", r->base_med);
          if (isnan (r->base_tail) && !isnan (r->base_med))
            snprintf (d, sizeof d, "-");
        }
      fmt_ratio (e, sizeof e, r);
      if (markdown)
        {
          /* A '|' in a cell would end it. */
          char base[112];
          size_t k = 0;
          for (const char *p = r->base_name; *p != '\0' && k + 2 < sizeof base; p++)
            {
              if (*p == '|')
                base[k++] = '\\';
              base[k++] = *p;
            }
          base[k] = '\0';
          fprintf (f, "| %s | %s | %s | %s | %s | %s | %s |\n", what, a, b, base, c, d, e);
        }
      else
        fprintf (f, "%-*s %11s %10s  %-*s %15s %13s %8s\n", WHAT_W, what, a, b, BASE_W, r->base_name, c, d, e);
    }
}

int
bc_print_tables (const char *markdown)
{
  printf ("\n");
  bc_print_table (stdout, false);
  fflush (stdout);
  if (markdown == NULL)
    return 0;
  FILE *f = fopen (markdown, "we");
  if (f == NULL)
    {
      perror (markdown);
      return -1;
    }
  bc_print_table (f, true);
  return fclose (f) == 0 ? 0 : -1;
}

/* ---- processes ----------------------------------------------------------- */

pid_t
bc_spawn (char *const argv[], int outfd, int errfd)
{
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_addopen (&fa, 0, "/dev/null", O_RDONLY, 0);
  if (outfd >= 0)
    posix_spawn_file_actions_adddup2 (&fa, outfd, 1);
  else
    posix_spawn_file_actions_addopen (&fa, 1, "/dev/null", O_WRONLY, 0);
  if (errfd >= 0)
    posix_spawn_file_actions_adddup2 (&fa, errfd, 2);
  else
    posix_spawn_file_actions_addopen (&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawnp (&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy (&fa);
  if (rc != 0)
    {
      errno = rc;
      return -1;
    }
  return pid;
}

int
bc_wait (pid_t pid)
{
  int status;
  while (waitpid (pid, &status, 0) < 0)
    if (errno != EINTR)
      return -1;
  return status;
}

int
bc_run (char *const argv[], int errfd)
{
  pid_t pid = bc_spawn (argv, -1, errfd);
  return pid < 0 ? -1 : bc_wait (pid);
}

/* ---- the gateway --------------------------------------------------------- */

rpc_metadata_t BC_MD[1];
static char AUTH[512];

void
bc_auth_from_env (const char *prog)
{
  const char *secret = getenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET");
  if (secret == NULL || secret[0] == '\0')
    {
      fprintf (stderr, "%s: CLOUD_RUN_SANDBOX_GATEWAY_SECRET is required\n", prog);
      exit (2);
    }
  snprintf (AUTH, sizeof AUTH, "Bearer %s", secret);
  BC_MD[0] = (rpc_metadata_t){"authorization", AUTH};
}

rpc_channel_t *
bc_channel (const char *prog, const char *target)
{
  err_t err = ERR_INIT;
  rpc_opts_t ropts = {0};
  ropts.max_message_bytes = 64u * 1024u * 1024u;
  rpc_channel_t *ch = NULL;
  if (rpc_channel_new (target, &ropts, &ch, &err) < 0)
    {
      fprintf (stderr, "%s: channel to %s: %s\n", prog, target, err_msg (&err));
      exit (1);
    }
  return ch;
}

/* A unary call with the authorization metadata whose reply is dropped. */
static int
unary (rpc_channel_t *ch, const char *method, const ProtobufCMessage *req,
       const ProtobufCMessageDescriptor *resp_desc, err_t *err)
{
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = rpc_client_unary (ch, method, 60000, BC_MD, 1, req, resp_desc, &resp, &st, err);
  rpc_status_release (&st);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  return rc;
}

int
bc_launch (rpc_channel_t *ch, const char *id, err_t *err)
{
  Sandbox__V1__LaunchRequest req = SANDBOX__V1__LAUNCH_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  return unary (ch, "/sandbox.v1.Sandbox/Launch", &req.base, &sandbox__v1__sandbox_info__descriptor, err);
}

int
bc_launch_with (rpc_channel_t *ch, const char *id, const Sandbox__V1__Resources *res, err_t *err)
{
  Sandbox__V1__LaunchRequest req = SANDBOX__V1__LAUNCH_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  req.resources = (Sandbox__V1__Resources *) res;
  return unary (ch, "/sandbox.v1.Sandbox/Launch", &req.base, &sandbox__v1__sandbox_info__descriptor, err);
}

int
bc_pooled (rpc_channel_t *ch, long *out, err_t *err)
{
  Sandbox__V1__StatusRequest req = SANDBOX__V1__STATUS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = rpc_client_unary (ch, "/sandbox.v1.Sandbox/Status", 60000, BC_MD, 1, &req.base,
                             &sandbox__v1__status_response__descriptor, &resp, &st, err);
  rpc_status_release (&st);
  if (rc == 0 && resp != NULL)
    *out = (long) ((Sandbox__V1__StatusResponse *) resp)->pooled;
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  return rc;
}

int
bc_delete (rpc_channel_t *ch, const char *id, err_t *err)
{
  Sandbox__V1__DeleteRequest req = SANDBOX__V1__DELETE_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  return unary (ch, "/sandbox.v1.Sandbox/Delete", &req.base, &sandbox__v1__delete_response__descriptor, err);
}

int
bc_get (rpc_channel_t *ch, const char *id, err_t *err)
{
  Sandbox__V1__GetRequest req = SANDBOX__V1__GET_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  return unary (ch, "/sandbox.v1.Sandbox/Get", &req.base, &sandbox__v1__sandbox_info__descriptor, err);
}

int
bc_list (rpc_channel_t *ch, err_t *err)
{
  Sandbox__V1__ListRequest req = SANDBOX__V1__LIST_REQUEST__INIT;
  return unary (ch, "/sandbox.v1.Sandbox/List", &req.base, &sandbox__v1__list_response__descriptor, err);
}

int
bc_call_start (rpc_channel_t *ch, const char *method, int64_t timeout_ms, const ProtobufCMessage *req,
               rpc_client_call_t **out, err_t *err)
{
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (ch, method, timeout_ms, BC_MD, 1, &c, err) < 0)
    return -1;
  if (rpc_client_send (c, req, err) < 0 || rpc_client_close_send (c, err) < 0)
    {
      rpc_client_destroy (c);
      return -1;
    }
  *out = c;
  return 0;
}

int
bc_call_finish (rpc_client_call_t *c, const char *what, err_t *err)
{
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (c, &st);
  rpc_client_destroy (c);
  int rc = 0;
  if (code != GRPC_STATUS_OK && err != NULL)
    rc = err_make (err, rpc_errno_from_status (code), "%s: %s: %s", what, rpc_status_name (code),
                   st.details ? st.details : "");
  rpc_status_release (&st);
  return rc;
}

int
bc_exec (rpc_channel_t *ch, const char *id, char **argv, size_t argc, uint32_t timeout_s, uint64_t *out_bytes,
         err_t *err)
{
  return bc_exec_capture (ch, id, argv, argc, timeout_s, out_bytes, NULL, 0, err);
}

int
bc_exec_capture (rpc_channel_t *ch, const char *id, char **argv, size_t argc, uint32_t timeout_s, uint64_t *out_bytes,
                 char *out, size_t out_size, err_t *err)
{
  if (out_size == 0)
    out = NULL;
  if (out != NULL)
    out[0] = '\0';
  Sandbox__V1__ExecRequest req = SANDBOX__V1__EXEC_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  req.argv = argv;
  req.n_argv = argc;
  req.timeout_seconds = timeout_s;
  rpc_client_call_t *c = NULL;
  if (bc_call_start (ch, "/sandbox.v1.Sandbox/Exec", (int64_t) (timeout_s ? timeout_s : 300) * 1000 + 60000,
                     &req.base, &c, err)
      < 0)
    return -1;
  uint64_t bytes = 0;
  int exit_code = -2, sig = 0;
  char stderr_head[200] = "";
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__exec_event__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__ExecEvent *ev = (Sandbox__V1__ExecEvent *) m;
      if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT)
        {
          if (out != NULL && bytes < out_size)
            {
              size_t room = out_size - 1 - (size_t) bytes;
              size_t n = ev->stdout.len < room ? ev->stdout.len : room;
              memcpy (out + bytes, ev->stdout.data, n);
              out[bytes + n] = '\0';
            }
          bytes += ev->stdout.len;
        }
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR && stderr_head[0] == '\0')
        snprintf (stderr_head, sizeof stderr_head, "%.*s", (int) (ev->stderr.len < 199 ? ev->stderr.len : 199),
                  (const char *) ev->stderr.data);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && ev->exit != NULL)
        {
          exit_code = ev->exit->exit_code;
          sig = ev->exit->signal;
        }
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "exec", err) < 0)
    return -1;
  if (exit_code != 0)
    return err_make (err, EIO, "exec `%s`: exit %d, signal %d; stderr: %s", argv[0], exit_code, sig, stderr_head);
  if (out != NULL && bytes >= out_size)
    return err_make (err, EMSGSIZE, "exec `%s`: %llu bytes of output, more than the %zu expected", argv[0],
                     (unsigned long long) bytes, out_size - 1);
  if (out_bytes != NULL)
    *out_bytes = bytes;
  return 0;
}
