/* runtime_bench: measures a running sandbox-gateway against plain Linux
 * baselines, all timed the same way (CLOCK_MONOTONIC around the whole
 * operation; baselines are spawned with posix_spawn and reaped with waitpid):
 *
 *   1. launch latency: the Launch RPC until its SandboxInfo reply (the Delete
 *      that follows is not timed), against `unshare ... /bin/true` (with and
 *      without a user namespace),
 *      `bwrap ... /bin/true` and `crun run` of a trivial bundle;
 *   2. exec round trip: an Exec of /bin/true on one long-lived sandbox, from
 *      the start of the call to its final status, against fork+exec+wait of
 *      /bin/true timed in a small single-threaded process (fork_exec_timer)
 *      and `crun exec` into a running container;
 *   3. stdout throughput: `head -c <bytes> /dev/zero` through the Exec stream,
 *      against `dd if=/dev/zero bs=1M count=<MiB> | cat >/dev/null`;
 *   4. memory per idle sandbox: Pss and private memory of every sandbox's
 *      processes and the growth of the kernel's slab, kernel stacks, page
 *      tables and per-CPU allocations over N idle sandboxes;
 *   5. the warm pool, on a second gateway that keeps one (--pool-target):
 *      a claim against `bwrap` and against a unary Get on the same channel,
 *      a claim with per-request resources against one without, and the
 *      sustained launch rate of a client launching back to back (with how
 *      many launches fell back to a normal launch, from that gateway's log).
 *
 * Ours and the baselines run interleaved, iteration by iteration, so that a
 * noisy neighbour hurts both sides alike; the ratio is the figure to read.
 *
 * The gateway's bearer secret comes from CLOUD_RUN_SANDBOX_GATEWAY_SECRET.
 * bench/runtime builds everything, starts a gateway and runs this program.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "common/err.h"
#include "common/rpc/rpc.h"
#include "proto/sandbox/v1/sandbox.pb-c.h"

#define PROG "runtime_bench"

/* ---- options ------------------------------------------------------------- */

typedef struct opts_s
{
  const char *target;
  const char *cgroup_group;
  const char *cgroup_root;
  const char *crun_bundle;    /* bundle for `crun run`; NULL: n/a */
  const char *crun_container; /* running container for `crun exec`; NULL: n/a */
  const char *markdown;       /* also write the table here, in Markdown */
  const char *prefix;         /* sandbox id prefix */
  int launch_n;
  int exec_n;
  int exec_warmup;
  int tput_n;
  long tput_mib;
  int mem_n;
  const char *density_levels; /* live sandboxes at which launch is timed */
  int density_n;              /* launches timed at each level */
  int scale_n;                /* the scale run's sandboxes */
  int list_live;              /* live sandboxes while List is called in a loop */
  int list_execs;             /* execs timed with and without the lister */
  const char *pool_target;    /* a gateway with SANDBOX_WARM_POOL; NULL: no pool stage */
  const char *pool_log;       /* its log (JSON lines), for the launches that fell back */
  int pool_size;              /* its SANDBOX_WARM_POOL count */
  int pool_n;                 /* claims timed of each kind */
  int pool_seconds;           /* the sustained run's length */
  pid_t gateway_pid;
  bool hide_cgroup2;
  const char *fork_timer; /* the fork_exec_timer program */
  const char *list_loop;  /* the list_loop program */
} opts_t;

static opts_t O = {
    .cgroup_root = "/sys/fs/cgroup/pids",
    .prefix = "bench",
    .launch_n = 50,
    .exec_n = 300,
    .exec_warmup = 30,
    .tput_n = 3,
    .tput_mib = 1024,
    .mem_n = 200,
    .density_levels = "10,1000,3000",
    .density_n = 60,
    .scale_n = 10000,
    .list_live = 3000,
    .list_execs = 200,
    .pool_size = 8,
    .pool_n = 50,
    .pool_seconds = 30,
    .fork_timer = "bazel-bin/bench/fork_exec_timer",
    .list_loop = "bazel-bin/bench/list_loop",
};

/* ---- processes ----------------------------------------------------------- */

/* Whether `name` is an executable on PATH (or a path that is). */
static bool
have_tool (const char *name)
{
  if (strchr (name, '/') != NULL)
    return access (name, X_OK) == 0;
  const char *path = getenv ("PATH");
  if (path == NULL)
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  char *dup = strdup (path), *save = NULL;
  bool found = false;
  for (char *d = strtok_r (dup, ":", &save); d != NULL && !found; d = strtok_r (NULL, ":", &save))
    {
      char full[4096];
      snprintf (full, sizeof full, "%s/%s", *d ? d : ".", name);
      found = access (full, X_OK) == 0;
    }
  free (dup);
  return found;
}

/* fork + execv + waitpid, the plainest way to run a program, timed by
 * fork_exec_timer (a small single-threaded process, as a user's script is:
 * a fork from this multi-threaded client costs several times more). */
typedef struct fork_timer_s
{
  pid_t pid;
  FILE *to, *from;
} fork_timer_t;

static int
fork_timer_start (fork_timer_t *t, const char *program)
{
  int in[2], out[2];
  if (pipe2 (in, O_CLOEXEC) < 0 || pipe2 (out, O_CLOEXEC) < 0)
    return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_adddup2 (&fa, in[0], 0);
  posix_spawn_file_actions_adddup2 (&fa, out[1], 1);
  char *argv[] = {(char *) O.fork_timer, (char *) program, NULL};
  int rc = posix_spawn (&t->pid, O.fork_timer, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy (&fa);
  close (in[0]);
  close (out[1]);
  if (rc != 0)
    return -1;
  t->to = fdopen (in[1], "w");
  t->from = fdopen (out[0], "r");
  return t->to != NULL && t->from != NULL ? 0 : -1;
}

/* One run: the milliseconds, or -1. */
static double
fork_timer_run (fork_timer_t *t)
{
  char line[64];
  if (fputs ("go\n", t->to) == EOF || fflush (t->to) == EOF || fgets (line, sizeof line, t->from) == NULL)
    return -1;
  return strtod (line, NULL);
}

static void
fork_timer_stop (fork_timer_t *t)
{
  fclose (t->to);
  fclose (t->from);
  bc_wait (t->pid);
}

/* A baseline: an argv (with "%d" in any word replaced by the iteration
 * number) and its series. */
typedef struct baseline_s
{
  const char *name;
  const char *tool;
  const char *words[24];
  bc_series_t s;
} baseline_t;

static void
expand_argv (const baseline_t *b, int iter, char bufs[][256], char **argv)
{
  int i = 0;
  for (; b->words[i] != NULL; i++)
    {
      const char *at = strstr (b->words[i], "%d");
      if (at != NULL)
        {
          snprintf (bufs[i], 256, "%.*s%d%s", (int) (at - b->words[i]), b->words[i], iter, at + 2);
          argv[i] = bufs[i];
        }
      else
        argv[i] = (char *) b->words[i];
    }
  argv[i] = NULL;
}

/* Runs the baseline once and adds its time; marks it n/a (with the first line
 * of its stderr) if it cannot run or fails. */
static void
baseline_run (baseline_t *b, int iter, bool record)
{
  if (b->s.na)
    return;
  char bufs[24][256];
  char *argv[25];
  expand_argv (b, iter, bufs, argv);
  FILE *errf = tmpfile ();
  double t0 = bc_now_ms ();
  int st = bc_run (argv, errf ? fileno (errf) : -1);
  double ms = bc_now_ms () - t0;
  if (st == -1 || !WIFEXITED (st) || WEXITSTATUS (st) != 0)
    {
      char line[160] = "";
      if (errf != NULL)
        {
          rewind (errf);
          if (fgets (line, sizeof line, errf) != NULL)
            line[strcspn (line, "\n")] = '\0';
        }
      bc_series_na (&b->s, "`%s` failed (%s%d)%s%s", b->words[0], st == -1 ? "spawn errno " : "status ",
                    st == -1 ? errno : st, line[0] ? ": " : "", line);
      fprintf (stderr, PROG ": baseline %s: %s; reported as n/a\n", b->name, b->s.why);
    }
  else if (record)
    bc_series_add (&b->s, ms);
  if (errf != NULL)
    fclose (errf);
}

static void
baseline_check_tool (baseline_t *b)
{
  if (b->tool != NULL && !have_tool (b->tool))
    {
      bc_series_na (&b->s, "`%s` is not installed", b->tool);
      fprintf (stderr, PROG ": baseline %s: %s; reported as n/a\n", b->name, b->s.why);
    }
}

/* ---- the gateway --------------------------------------------------------- */

static rpc_channel_t *CH;

/* Deletes run on a pool of threads, so that a slow Delete (the gateway waits
 * for the sandbox's killed processes to be reaped) does not hold up the
 * measurements. Their latency is recorded all the same. */
#define POOL_THREADS 64
#define POOL_QUEUE 1024

static struct
{
  pthread_mutex_t mu;
  pthread_cond_t work, idle;
  char *q[POOL_QUEUE];
  unsigned head, tail; /* q[head % N] .. q[tail % N] */
  int busy;
  bool stop;
  bc_series_t lat;
  int failures;
  rpc_channel_t *ch; /* the gateway deletes go to (CH unless a stage says) */
  pthread_t threads[POOL_THREADS];
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};

static void *
pool_main (void *unused)
{
  pthread_mutex_lock (&P.mu);
  for (;;)
    {
      while (P.head == P.tail && !P.stop)
        pthread_cond_wait (&P.work, &P.mu);
      if (P.head == P.tail)
        break;
      char *id = P.q[P.head++ % POOL_QUEUE];
      rpc_channel_t *ch = P.ch;
      P.busy++;
      pthread_mutex_unlock (&P.mu);
      err_t err = ERR_INIT;
      double t0 = bc_now_ms ();
      int rc = bc_delete (ch, id, &err);
      double ms = bc_now_ms () - t0;
      if (rc < 0)
        fprintf (stderr, PROG ": delete %s: %s\n", id, err_msg (&err));
      err_release (&err);
      free (id);
      pthread_mutex_lock (&P.mu);
      if (rc < 0)
        P.failures++;
      else
        bc_series_add (&P.lat, ms);
      P.busy--;
      pthread_cond_broadcast (&P.idle);
    }
  pthread_mutex_unlock (&P.mu);
  return NULL;
}

static void
pool_start (void)
{
  for (int i = 0; i < POOL_THREADS; i++)
    if (pthread_create (&P.threads[i], NULL, pool_main, NULL) != 0)
      {
        fprintf (stderr, PROG ": pthread_create failed\n");
        exit (1);
      }
}

static void
pool_delete (const char *id)
{
  pthread_mutex_lock (&P.mu);
  while (P.tail - P.head >= POOL_QUEUE)
    pthread_cond_wait (&P.idle, &P.mu);
  P.q[P.tail++ % POOL_QUEUE] = strdup (id);
  pthread_cond_signal (&P.work);
  pthread_mutex_unlock (&P.mu);
}

/* Waits until every queued Delete has finished. */
static void
pool_drain (void)
{
  pthread_mutex_lock (&P.mu);
  while (P.head != P.tail || P.busy > 0)
    pthread_cond_wait (&P.idle, &P.mu);
  pthread_mutex_unlock (&P.mu);
}

/* Waits until fewer than `n` Deletes are queued or running. */
static void
pool_wait_below (unsigned n)
{
  pthread_mutex_lock (&P.mu);
  while (P.tail - P.head + (unsigned) P.busy >= n)
    pthread_cond_wait (&P.idle, &P.mu);
  pthread_mutex_unlock (&P.mu);
}

/* Sends later Deletes to `ch`, once every queued one has finished. */
static void
pool_set_channel (rpc_channel_t *ch)
{
  pool_drain ();
  pthread_mutex_lock (&P.mu);
  P.ch = ch;
  pthread_mutex_unlock (&P.mu);
}

static void
pool_stop (void)
{
  pthread_mutex_lock (&P.mu);
  P.stop = true;
  pthread_cond_broadcast (&P.work);
  pthread_mutex_unlock (&P.mu);
  for (int i = 0; i < POOL_THREADS; i++)
    pthread_join (P.threads[i], NULL);
}

/* ---- reading /proc and cgroups ------------------------------------------- */

/* The number after `key` and `sep` at the start of a line of `path`; -1
 * when absent. */
static long
line_value (const char *path, const char *key, char sep)
{
  FILE *f = fopen (path, "re");
  if (f == NULL)
    return -1;
  char line[512];
  size_t kl = strlen (key);
  long v = -1;
  while (fgets (line, sizeof line, f) != NULL)
    if (strncmp (line, key, kl) == 0 && line[kl] == sep)
      {
        v = strtol (line + kl + 1, NULL, 10);
        break;
      }
  fclose (f);
  return v;
}

/* A "Key: value kB" field of a /proc file, in KiB; -1 when absent. */
static long
proc_kb (const char *path, const char *key)
{
  return line_value (path, key, ':');
}

/* The pids in a cgroup.procs file, up to `max`. */
static int
cgroup_pids (const char *path, pid_t *out, int max)
{
  FILE *f = fopen (path, "re");
  if (f == NULL)
    return -1;
  int n = 0;
  long p;
  while (n < max && fscanf (f, "%ld", &p) == 1)
    out[n++] = (pid_t) p;
  fclose (f);
  return n;
}

/* ---- the measurements ---------------------------------------------------- */

/* Per-request resources of the "with resources" launches: every field
 * set, each below the gateway's default (and so within its maximum). */
static const Sandbox__V1__Resources BENCH_RESOURCES
    = {PROTOBUF_C_MESSAGE_INIT (&sandbox__v1__resources__descriptor), 1024, 0.5, 1024, 256};
/* The same without a CPU limit: on cgroup v1 a sandbox without one has no
 * group in the cpu hierarchy (one cgroup move less). */
static const Sandbox__V1__Resources BENCH_RESOURCES_NO_CPU
    = {PROTOBUF_C_MESSAGE_INIT (&sandbox__v1__resources__descriptor), 1024, 0, 1024, 256};

static void
bench_launch (void)
{
  char bundle_arg[4096] = "";
  if (O.crun_bundle != NULL)
    snprintf (bundle_arg, sizeof bundle_arg, "%s", O.crun_bundle);
  static char crun_name[64];
  snprintf (crun_name, sizeof crun_name, "%s-%d-run-%%d", O.prefix, (int) getpid ());
  baseline_t bl[] = {
      {.name = "unshare",
       .tool = "unshare",
       .words = {"unshare", "-m", "-p", "-n", "-u", "-i", "-f", "--mount-proc", "/bin/true"}},
      /* The same with a user namespace: what one costs on this machine. */
      {.name = "unshare -U",
       .tool = "unshare",
       .words = {"unshare", "-U", "-r", "-m", "-p", "-n", "-u", "-i", "-f", "--mount-proc", "/bin/true"}},
      {.name = "bwrap",
       .tool = "bwrap",
       .words = {"bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "/bin/true"}},
      {.name = "crun run",
       .tool = "crun",
       .words = {"crun", "--cgroup-manager=disabled", "run", "--bundle", bundle_arg, crun_name}},
  };
  const int nb = sizeof bl / sizeof bl[0];
  if (O.crun_bundle == NULL)
    bc_series_na (&bl[3].s, "no crun bundle given");
  for (int b = 0; b < nb; b++)
    baseline_check_tool (&bl[b]);

  bc_series_t ours = {0}, with_res = {0}, with_res_no_cpu = {0};
  err_t err = ERR_INIT;
  const int warm = 3;
  fprintf (stderr, PROG ": launch: %d warm-up + %d runs of each\n", warm, O.launch_n);
  for (int i = 0; i < warm + O.launch_n; i++)
    {
      char id[80];
      snprintf (id, sizeof id, "%s-launch-%d", O.prefix, i);
      double t0 = bc_now_ms ();
      if (bc_launch (CH, id, &err) < 0)
        bc_die (PROG, "launch", &err);
      double ms = bc_now_ms () - t0;
      pool_delete (id);
      /* Each launch with resources starts, as the plain one does (its
       * Delete ran during the baselines), with no Delete running. */
      pool_drain ();
      snprintf (id, sizeof id, "%s-launch-res-%d", O.prefix, i);
      t0 = bc_now_ms ();
      if (bc_launch_with (CH, id, &BENCH_RESOURCES, &err) < 0)
        bc_die (PROG, "launch with resources", &err);
      double res_ms = bc_now_ms () - t0;
      pool_delete (id);
      pool_drain ();
      snprintf (id, sizeof id, "%s-launch-rnc-%d", O.prefix, i);
      t0 = bc_now_ms ();
      if (bc_launch_with (CH, id, &BENCH_RESOURCES_NO_CPU, &err) < 0)
        bc_die (PROG, "launch with resources", &err);
      double res_nc_ms = bc_now_ms () - t0;
      pool_delete (id);
      if (i >= warm)
        {
          bc_series_add (&ours, ms);
          bc_series_add (&with_res, res_ms);
          bc_series_add (&with_res_no_cpu, res_nc_ms);
        }
      for (int b = 0; b < nb; b++)
        baseline_run (&bl[b], i, i >= warm);
    }
  for (int b = 0; b < nb; b++)
    {
      char name[40];
      snprintf (name, sizeof name, "%s", bl[b].name);
      bc_row_add ("launch", "ms", &ours, 99, name, &bl[b].s);
    }
  bc_row_add ("launch, per-request resources", "ms", &with_res, 99, "launch without", &ours);
  bc_row_add ("launch, per-request resources but cpus", "ms", &with_res_no_cpu, 99, "launch without", &ours);
  pool_drain ();
}

static void
bench_exec (void)
{
  char id[80];
  snprintf (id, sizeof id, "%s-exec", O.prefix);
  err_t err = ERR_INIT;
  if (bc_launch (CH, id, &err) < 0)
    bc_die (PROG, "launch", &err);
  baseline_t crun_exec = {
      .name = "crun exec",
      .tool = "crun",
      .words = {"crun", "--cgroup-manager=disabled", "exec", O.crun_container ? O.crun_container : "", "/bin/true"}};
  if (O.crun_container == NULL)
    bc_series_na (&crun_exec.s, "no running crun container given");
  baseline_check_tool (&crun_exec);

  char *argv[] = {"/bin/true"};
  fork_timer_t timer;
  if (fork_timer_start (&timer, "/bin/true") < 0)
    {
      fprintf (stderr, PROG ": cannot start %s\n", O.fork_timer);
      exit (1);
    }
  bc_series_t ours = {0}, fe = {0}, get = {0};
  int exec_failures = 0;
  fprintf (stderr, PROG ": exec: %d warm-up + %d runs of each\n", O.exec_warmup, O.exec_n);
  for (int i = 0; i < O.exec_warmup + O.exec_n; i++)
    {
      bool rec = i >= O.exec_warmup;
      double t0 = bc_now_ms ();
      int xrc = bc_exec (CH, id, argv, 1, 0, NULL, &err);
      double ms = bc_now_ms () - t0;
      if (xrc < 0)
        {
          /* Counted and reported, not fatal: one failure should not cost the
           * whole run; many should. */
          fprintf (stderr, PROG ": exec %d failed after %.1f ms: %s\n", i, ms, err_msg (&err));
          err_release (&err);
          if (++exec_failures > O.exec_n / 10)
            {
              fprintf (stderr, PROG ": too many exec failures\n");
              exit (1);
            }
        }
      else if (rec)
        bc_series_add (&ours, ms);
      ms = fork_timer_run (&timer);
      if (ms < 0)
        {
          fprintf (stderr, PROG ": fork+exec of /bin/true failed\n");
          exit (1);
        }
      if (rec)
        bc_series_add (&fe, ms);
      baseline_run (&crun_exec, i, rec);
      /* The floor under any call: a unary Get on the same channel. */
      t0 = bc_now_ms ();
      if (bc_get (CH, id, &err) < 0)
        bc_die (PROG, "get", &err);
      if (rec)
        bc_series_add (&get, bc_now_ms () - t0);
    }
  if (exec_failures > 0)
    fprintf (stderr, PROG ": exec: %d of %d calls failed (left out of the figures)\n", exec_failures,
             O.exec_warmup + O.exec_n);
  bc_row_add ("exec /bin/true round trip", "ms", &ours, 99, "fork+exec+wait", &fe);
  bc_row_add ("exec /bin/true round trip", "ms", &ours, 99, "crun exec", &crun_exec.s);
  bc_row_add ("for reference: unary Get round trip", "ms", &get, 99, NULL, NULL);
  fork_timer_stop (&timer);
  pool_delete (id);
  pool_drain ();
}

static void
bench_throughput (void)
{
  char id[80];
  snprintf (id, sizeof id, "%s-tput", O.prefix);
  err_t err = ERR_INIT;
  if (bc_launch (CH, id, &err) < 0)
    bc_die (PROG, "launch", &err);
  uint64_t want = (uint64_t) O.tput_mib * 1024 * 1024;
  char bytes_s[32], count_s[48], cmd[256];
  snprintf (bytes_s, sizeof bytes_s, "%llu", (unsigned long long) want);
  snprintf (count_s, sizeof count_s, "count=%ld", O.tput_mib);
  snprintf (cmd, sizeof cmd, "dd if=/dev/zero bs=1M count=%ld 2>/dev/null | cat >/dev/null", O.tput_mib);
  /* Ours with the baseline's own writer (so that only the path from the
   * pipe on differs), and with head's small writes. */
  char *dd_argv[] = {"dd", "if=/dev/zero", "bs=1M", count_s, "status=none"};
  char *head_argv[] = {"head", "-c", bytes_s, "/dev/zero"};
  struct
  {
    char **argv;
    size_t argc;
    bc_series_t mbps;
  } cmds[] = {{dd_argv, 5, {0}}, {head_argv, 4, {0}}};
  baseline_t ddcat = {.name = "dd | cat", .tool = "dd", .words = {"sh", "-c", cmd}};
  baseline_check_tool (&ddcat);
  fprintf (stderr, PROG ": throughput: %d runs of %ld MiB each way\n", O.tput_n, O.tput_mib);
  for (int i = 0; i < O.tput_n; i++)
    {
      for (size_t k = 0; k < 2; k++)
        {
          uint64_t got = 0;
          double t0 = bc_now_ms ();
          if (bc_exec (CH, id, cmds[k].argv, cmds[k].argc, 0, &got, &err) < 0)
            bc_die (PROG, k == 0 ? "exec dd" : "exec head", &err);
          double ms = bc_now_ms () - t0;
          if (got != want)
            {
              fprintf (stderr, PROG ": received %llu bytes, expected %llu\n", (unsigned long long) got,
                       (unsigned long long) want);
              exit (1);
            }
          bc_series_add (&cmds[k].mbps, bc_mbps (want, ms));
        }
      baseline_run (&ddcat, i, true);
    }
  /* The baseline's times become MB/s. */
  for (int i = 0; i < ddcat.s.n; i++)
    ddcat.s.v[i] = bc_mbps (want, ddcat.s.v[i]);
  char what[96];
  /* For a rate the bad tail is the low end: the 1st percentile. */
  snprintf (what, sizeof what, "stdout %ld MiB (dd bs=1M), p99 col = slowest", O.tput_mib);
  bc_row_add (what, "MB/s", &cmds[0].mbps, 1, "dd | cat", &ddcat.s);
  snprintf (what, sizeof what, "stdout %ld MiB (head -c), p99 col = slowest", O.tput_mib);
  bc_row_add (what, "MB/s", &cmds[1].mbps, 1, "dd | cat", &ddcat.s);
  pool_delete (id);
  pool_drain ();
}

/* One Run event; stdout bytes are added to *out_bytes, the exit sets
 * *exited. -1 with *err when the call failed, 0 at its end. */
static int
run_next (rpc_client_call_t *c, uint64_t *out_bytes, bool *exited, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_client_recv (c, &sandbox__v1__process_event__descriptor, &m, err);
  if (rc <= 0)
    return rc;
  Sandbox__V1__ProcessEvent *ev = (Sandbox__V1__ProcessEvent *) m;
  if (ev->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STDOUT)
    *out_bytes += ev->stdout.len;
  else if (ev->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT)
    *exited = true;
  protobuf_c_message_free_unpacked (m, NULL);
  return 1;
}

/* A Run call with `first` as its first message. */
static rpc_client_call_t *
run_open (const Sandbox__V1__ProcessInput *first)
{
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (CH, "/sandbox.v1.Sandbox/Run", 600000, BC_MD, 1, &c, &err) < 0
      || rpc_client_send (c, &first->base, &err) < 0)
    bc_die (PROG, "Run", &err);
  return c;
}

/* Reads a Run call to its end and checks its status. */
static void
run_close (rpc_client_call_t *c, uint64_t *out_bytes)
{
  err_t err = ERR_INIT;
  bool exited = false;
  int rc;
  while ((rc = run_next (c, out_bytes, &exited, &err)) > 0)
    ;
  if (rc < 0 || bc_call_finish (c, "Run", &err) < 0)
    bc_die (PROG, "Run", &err);
}

/* Run: the interactive round trip (one byte to `cat`, no terminal, and back)
 * against a unary Get on the same channel; then an attachment replaying
 * 1 MiB of a detached process's buffered output, against the same MiB
 * through Exec. */
static void
bench_run (void)
{
  char id[80];
  snprintf (id, sizeof id, "%s-run", O.prefix);
  err_t err = ERR_INIT;
  if (bc_launch (CH, id, &err) < 0)
    bc_die (PROG, "launch", &err);

  char *cat[] = {"cat"};
  Sandbox__V1__ProcessStart start = SANDBOX__V1__PROCESS_START__INIT;
  start.sandbox_id = id;
  start.argv = cat;
  start.n_argv = 1;
  Sandbox__V1__ProcessInput in = SANDBOX__V1__PROCESS_INPUT__INIT;
  in.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_START;
  in.start = &start;
  rpc_client_call_t *c = run_open (&in);
  uint64_t got = 0;
  bool exited = false;
  if (run_next (c, &got, &exited, &err) <= 0) /* started */
    bc_die (PROG, "Run start", &err);
  Sandbox__V1__ProcessInput byte = SANDBOX__V1__PROCESS_INPUT__INIT;
  byte.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_STDIN;
  byte.stdin = (ProtobufCBinaryData){.len = 1, .data = (uint8_t *) "x"};
  bc_series_t rtt = {0}, get = {0};
  fprintf (stderr, PROG ": run: %d warm-up + %d round trips of each\n", O.exec_warmup, O.exec_n);
  for (int i = 0; i < O.exec_warmup + O.exec_n; i++)
    {
      bool rec = i >= O.exec_warmup;
      uint64_t want = got + 1;
      double t0 = bc_now_ms ();
      if (rpc_client_send (c, &byte.base, &err) < 0)
        bc_die (PROG, "Run stdin", &err);
      while (got < want)
        if (run_next (c, &got, &exited, &err) <= 0)
          bc_die (PROG, "Run output", &err);
      if (rec)
        bc_series_add (&rtt, bc_now_ms () - t0);
      t0 = bc_now_ms ();
      if (bc_get (CH, id, &err) < 0)
        bc_die (PROG, "get", &err);
      if (rec)
        bc_series_add (&get, bc_now_ms () - t0);
    }
  if (rpc_client_close_send (c, &err) < 0)
    bc_die (PROG, "Run close", &err);
  run_close (c, &got);
  bc_row_add ("Run: 1 byte to cat and back", "ms", &rtt, 99, "unary Get", &get);

  /* A detached process whose 1 MiB of output waits in its buffer. */
  const size_t mib = 1024 * 1024;
  char *spew[] = {"sh", "-c", "head -c 1048576 /dev/zero; exec sleep 100000"};
  Sandbox__V1__ProcessStart dstart = SANDBOX__V1__PROCESS_START__INIT;
  dstart.sandbox_id = id;
  dstart.argv = spew;
  dstart.n_argv = 3;
  dstart.detach = true;
  dstart.process_id = "spew";
  in.start = &dstart;
  c = run_open (&in);
  got = 0;
  while (got < mib)
    if (run_next (c, &got, &exited, &err) <= 0)
      bc_die (PROG, "Run detached", &err);
  rpc_client_cancel (c); /* the process runs on */
  rpc_client_destroy (c);

  Sandbox__V1__ProcessAttach att = SANDBOX__V1__PROCESS_ATTACH__INIT;
  att.sandbox_id = id;
  att.process_id = "spew";
  att.replay = true;
  att.no_follow = true;
  Sandbox__V1__ProcessInput ain = SANDBOX__V1__PROCESS_INPUT__INIT;
  ain.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_ATTACH;
  ain.attach = &att;
  char *head[] = {"head", "-c", "1048576", "/dev/zero"};
  bc_series_t replay = {0}, exec = {0};
  int n = O.exec_n / 3 > 10 ? O.exec_n / 3 : 10;
  for (int i = 0; i < n + 3; i++)
    {
      bool rec = i >= 3;
      double t0 = bc_now_ms ();
      c = run_open (&ain);
      if (rpc_client_close_send (c, &err) < 0)
        bc_die (PROG, "attach", &err);
      got = 0;
      run_close (c, &got);
      if (got != mib)
        {
          fprintf (stderr, PROG ": replay gave %llu bytes, expected %zu\n", (unsigned long long) got, mib);
          exit (1);
        }
      if (rec)
        bc_series_add (&replay, bc_now_ms () - t0);
      t0 = bc_now_ms ();
      if (bc_exec (CH, id, head, 4, 0, &got, &err) < 0)
        bc_die (PROG, "exec head", &err);
      if (rec)
        bc_series_add (&exec, bc_now_ms () - t0);
    }
  bc_row_add ("attach, replay 1 MiB buffered", "ms", &replay, 99, "Exec of head -c 1M", &exec);
  pool_delete (id);
  pool_drain ();
}

/* The kernel's memory outside the slab that sandboxes grow, in KiB: their
 * processes' kernel stacks and page tables, and per-CPU allocations (a
 * memory cgroup's and a network namespace's statistics, one copy per CPU). */
static long
kernel_other_kb (void)
{
  return proc_kb ("/proc/meminfo", "KernelStack") + proc_kb ("/proc/meminfo", "PageTables")
         + proc_kb ("/proc/meminfo", "Percpu");
}

static void
bench_memory (void)
{
  if (O.cgroup_group == NULL)
    {
      fprintf (stderr, PROG ": memory: no --cgroup-group; skipped\n");
      return;
    }
  err_t err = ERR_INIT;
  fprintf (stderr, PROG ": memory: %d idle sandboxes\n", O.mem_n);
  sync ();
  long slab0 = proc_kb ("/proc/meminfo", "Slab");
  long kother0 = kernel_other_kb ();
  char gwstatus[64];
  snprintf (gwstatus, sizeof gwstatus, "/proc/%d/status", (int) O.gateway_pid);
  long gw0 = O.gateway_pid > 0 ? proc_kb (gwstatus, "VmRSS") : -1;
  double t0 = bc_now_ms ();
  int launched = 0;
  for (int i = 0; i < O.mem_n; i++, launched++)
    {
      char id[80];
      snprintf (id, sizeof id, "%s-mem-%03d", O.prefix, i);
      if (bc_launch (CH, id, &err) < 0)
        {
          fprintf (stderr, PROG ": memory: launch %d: %s\n", i, err_msg (&err));
          err_release (&err);
          break;
        }
    }
  double launch_all_ms = bc_now_ms () - t0;
  /* Let deferred frees (RCU) and the holders settle. */
  usleep (500 * 1000);
  long slab1 = proc_kb ("/proc/meminfo", "Slab");
  long kother1 = kernel_other_kb ();
  long gw1 = O.gateway_pid > 0 ? proc_kb (gwstatus, "VmRSS") : -1;

  bc_series_t pss = {0}, priv = {0}, nproc = {0};
  for (int i = 0; i < launched; i++)
    {
      char path[512];
      snprintf (path, sizeof path, "%s/%s/%s-mem-%03d/cgroup.procs", O.cgroup_root, O.cgroup_group, O.prefix, i);
      pid_t pids[64];
      int n = cgroup_pids (path, pids, 64);
      if (n <= 0)
        {
          fprintf (stderr, PROG ": memory: no process in %s\n", path);
          continue;
        }
      long sum_pss = 0, sum_priv = 0;
      for (int k = 0; k < n; k++)
        {
          char sp[64];
          snprintf (sp, sizeof sp, "/proc/%d/smaps_rollup", (int) pids[k]);
          long p = proc_kb (sp, "Pss");
          long pc = proc_kb (sp, "Private_Clean");
          long pd = proc_kb (sp, "Private_Dirty");
          if (p >= 0)
            sum_pss += p;
          if (pc >= 0 && pd >= 0)
            sum_priv += pc + pd;
        }
      bc_series_add (&pss, (double) sum_pss);
      bc_series_add (&priv, (double) sum_priv);
      bc_series_add (&nproc, n);
    }
  fprintf (stderr, PROG ": memory: %d launched in %.0f ms; %.1f processes in each sandbox's own group (median)\n",
           launched, launch_all_ms, bc_pct (&nproc, 50));
  bc_series_t slab = {0}, kother = {0}, gw = {0};
  if (launched > 0)
    {
      bc_series_add (&slab, (double) (slab1 - slab0) / launched);
      bc_series_add (&kother, (double) (kother1 - kother0) / launched);
      if (gw0 >= 0 && gw1 >= 0)
        bc_series_add (&gw, (double) (gw1 - gw0) / launched);
    }
  bc_row_add ("idle sandbox: user memory, Pss", "KiB", &pss, 99, NULL, NULL);
  bc_row_add ("idle sandbox: user memory, private", "KiB", &priv, 99, NULL, NULL);
  bc_row_add ("idle sandbox: kernel slab growth/n", "KiB", &slab, 99, NULL, NULL);
  bc_row_add ("idle sandbox: kstack+pagetables+percpu/n", "KiB", &kother, 99, NULL, NULL);
  if (gw.n > 0)
    bc_row_add ("idle sandbox: gateway RSS growth/n", "KiB", &gw, 99, NULL, NULL);

  for (int i = 0; i < launched; i++)
    {
      char id[80];
      snprintf (id, sizeof id, "%s-mem-%03d", O.prefix, i);
      pool_delete (id);
    }
  pool_drain ();
}

/* ---- density: launch as sandboxes accumulate; memory when many live ------- */

/* Active objects of a slab cache, from /proc/slabinfo; -1 if absent. */
static long
slab_objects (const char *cache)
{
  return line_value ("/proc/slabinfo", cache, ' ');
}

#define SLOT_PROBES 32

/* What a memory cgroup costs the kernel in shrinker slots when it comes
 * online, in KiB: 16 bytes, in 1 KiB pieces (kmalloc-1k), for every
 * shrinker id the machine has used, and every superblock takes one; so
 * every sandbox's group pays for every other sandbox's superblocks, and
 * for the highest count the machine ever had since it started. Measured
 * over SLOT_PROBES empty groups made and removed here; -1 when not
 * measurable (no memory hierarchy, no slabinfo). */
static double
memcg_slot_kib (void)
{
  char root[512];
  size_t len = strlen (O.cgroup_root);
  if (len > 5 && strcmp (O.cgroup_root + len - 5, "/pids") == 0)
    snprintf (root, sizeof root, "%.*s/memory/%s-slots-%d", (int) (len - 5), O.cgroup_root, O.prefix,
              (int) getpid ());
  else
    snprintf (root, sizeof root, "%s/%s-slots-%d", O.cgroup_root, O.prefix, (int) getpid ());
  if (mkdir (root, 0755) < 0)
    return -1;
  char stat[600];
  snprintf (stat, sizeof stat, "%s/memory.stat", root);
  if (access (stat, F_OK) < 0)
    {
      rmdir (root);
      return -1; /* the memory controller is not on here */
    }
  long before = slab_objects ("kmalloc-1k");
  int made = 0;
  for (; made < SLOT_PROBES; made++)
    {
      char dir[600];
      snprintf (dir, sizeof dir, "%s/p%d", root, made);
      if (mkdir (dir, 0755) < 0)
        break;
    }
  long after = slab_objects ("kmalloc-1k");
  for (int i = 0; i < made; i++)
    {
      char dir[600];
      snprintf (dir, sizeof dir, "%s/p%d", root, i);
      rmdir (dir);
    }
  rmdir (root);
  if (before < 0 || after < 0 || made < SLOT_PROBES)
    return -1;
  return (double) (after - before) / made;
}

/* Kernel and user memory per sandbox of `n` live ones named
 * "<prefix>-<tag>-%05d", against the meminfo figures taken before. */
static void
density_memory (const char *tag, int n, long slab0, long kother0, const char *label)
{
  usleep (500 * 1000); /* deferred frees (RCU) settle */
  long slab = proc_kb ("/proc/meminfo", "Slab") - slab0;
  long kother = kernel_other_kb () - kother0;
  bc_series_t pss = {0};
  int sample = n < 200 ? n : 200;
  for (int i = 0; i < sample && O.cgroup_group != NULL; i++)
    {
      char path[512];
      snprintf (path, sizeof path, "%s/%s/%s-%s-%05d/cgroup.procs", O.cgroup_root, O.cgroup_group, O.prefix, tag,
                i * (n / sample));
      pid_t pids[16];
      int k = cgroup_pids (path, pids, 16);
      long sum = 0;
      for (int j = 0; j < k; j++)
        {
          char sp[64];
          snprintf (sp, sizeof sp, "/proc/%d/smaps_rollup", (int) pids[j]);
          long v = proc_kb (sp, "Pss");
          sum += v > 0 ? v : 0;
        }
      if (k > 0)
        bc_series_add (&pss, (double) sum);
    }
  char what[96];
  bc_series_t ks = {0}, ko = {0}, total = {0};
  bc_series_add (&ks, (double) slab / n);
  bc_series_add (&ko, (double) kother / n);
  bc_series_add (&total, (double) (slab + kother) / n + (pss.n > 0 ? bc_pct (&pss, 50) : 0));
  snprintf (what, sizeof what, "%s: kernel slab/n", label);
  bc_row_add (what, "KiB", &ks, 99, NULL, NULL);
  snprintf (what, sizeof what, "%s: kstack+pagetables+percpu/n", label);
  bc_row_add (what, "KiB", &ko, 99, NULL, NULL);
  snprintf (what, sizeof what, "%s: user Pss", label);
  bc_row_add (what, "KiB", &pss, 99, NULL, NULL);
  snprintf (what, sizeof what, "%s: all of it", label);
  bc_row_add (what, "KiB", &total, 99, NULL, NULL);
  double slots = memcg_slot_kib ();
  if (slots >= 0)
    {
      bc_series_t sl = {0};
      bc_series_add (&sl, slots);
      snprintf (what, sizeof what, "%s: of it, a memory cgroup's shrinker slots", label);
      bc_row_add (what, "KiB", &sl, 99, NULL, NULL);
    }
}

/* Launches live sandboxes "<prefix>-<tag>-%05d" from `from` up to `to`.
 * Returns how many live. */
static int
fill (const char *tag, int from, int to)
{
  err_t err = ERR_INIT;
  for (int i = from; i < to; i++)
    {
      char id[80];
      snprintf (id, sizeof id, "%s-%s-%05d", O.prefix, tag, i);
      if (bc_launch (CH, id, &err) < 0)
        {
          fprintf (stderr, PROG ": launch %d: %s\n", i, err_msg (&err));
          err_release (&err);
          return i;
        }
    }
  return to;
}

static void
delete_all (const char *tag, int n)
{
  for (int i = 0; i < n; i++)
    {
      char id[80];
      snprintf (id, sizeof id, "%s-%s-%05d", O.prefix, tag, i);
      pool_delete (id);
    }
  pool_drain ();
}

static void
bench_density (void)
{
  int levels[8], n_levels = 0;
  char buf[128];
  snprintf (buf, sizeof buf, "%s", O.density_levels);
  for (char *save = NULL, *t = strtok_r (buf, ",", &save); t != NULL && n_levels < 8; t = strtok_r (NULL, ",", &save))
    levels[n_levels++] = atoi (t);
  if (n_levels == 0)
    return;
  sync ();
  long slab0 = proc_kb ("/proc/meminfo", "Slab");
  long kother0 = kernel_other_kb ();
  bc_series_t at[8], del[8];
  memset (at, 0, sizeof at);
  memset (del, 0, sizeof del);
  int live = 0;
  err_t err = ERR_INIT;
  const int warm = 3;
  for (int l = 0; l < n_levels; l++)
    {
      double t0 = bc_now_ms ();
      live = fill ("live", live, levels[l]);
      fprintf (stderr, PROG ": density: %d live (filled in %.1f s); %d warm-up + %d launches\n", live,
               (bc_now_ms () - t0) / 1e3, warm, O.density_n);
      if (l == n_levels - 1)
        {
          char label[64];
          snprintf (label, sizeof label, "idle sandbox at %d live", live);
          density_memory ("live", live, slab0, kother0, label);
        }
      /* The kernel's deferred part of the fill (freeing by RCU, its
       * workers) gets its time too: what is timed is a launch with this
       * many sandboxes live, not one in the wake of launching them. */
      usleep (2000 * 1000);
      for (int i = 0; i < warm + O.density_n; i++)
        {
          char id[80];
          snprintf (id, sizeof id, "%s-dens-%d-%d", O.prefix, l, i);
          double s0 = bc_now_ms ();
          if (bc_launch (CH, id, &err) < 0)
            bc_die (PROG, "launch", &err);
          double ms = bc_now_ms () - s0;
          /* Deleted (timed too) before the next launch, and the kernel's
           * deferred part of it (the memory cgroup's offlining, the
           * network namespace's clean-up, run by its workers) given time:
           * what is timed is the launch alone, then the delete alone. */
          double d0 = bc_now_ms ();
          if (bc_delete (CH, id, &err) < 0)
            bc_die (PROG, "delete", &err);
          double dms = bc_now_ms () - d0;
          usleep (50 * 1000);
          if (i >= warm)
            {
              bc_series_add (&at[l], ms);
              bc_series_add (&del[l], dms);
            }
        }
      pool_drain ();
    }
  for (int l = 0; l < n_levels; l++)
    {
      char what[64], base[32];
      snprintf (what, sizeof what, "launch with %d live", levels[l]);
      snprintf (base, sizeof base, "with %d live", levels[0]);
      bc_row_add (what, "ms", &at[l], 99, l > 0 ? base : NULL, l > 0 ? &at[0] : NULL);
    }
  for (int l = 0; l < n_levels; l++)
    {
      char what[64], base[32];
      snprintf (what, sizeof what, "delete with %d live", levels[l]);
      snprintf (base, sizeof base, "with %d live", levels[0]);
      bc_row_add (what, "ms", &del[l], 99, l > 0 ? base : NULL, l > 0 ? &del[0] : NULL);
    }
  double t0 = bc_now_ms ();
  delete_all ("live", live);
  fprintf (stderr, PROG ": density: %d deleted in %.1f s\n", live, (bc_now_ms () - t0) / 1e3);
}

/* The host's mount table, in lines. */
static long
host_mounts (void)
{
  FILE *f = fopen ("/proc/self/mountinfo", "re");
  long n = 0;
  int c;
  while (f != NULL && (c = fgetc (f)) != EOF)
    n += c == '\n';
  if (f != NULL)
    fclose (f);
  return n;
}

/* Directories left under a cgroup group, or of the gateway's state. */
static long
entries_in (const char *dir)
{
  DIR *d = opendir (dir);
  long n = 0;
  struct dirent *e;
  while (d != NULL && (e = readdir (d)) != NULL)
    n += e->d_type == DT_DIR && e->d_name[0] != '.';
  if (d != NULL)
    closedir (d);
  return n;
}

static void
bench_scale (void)
{
  long mounts0 = host_mounts ();
  sync ();
  long slab0 = proc_kb ("/proc/meminfo", "Slab");
  long kother0 = kernel_other_kb ();
  double t0 = bc_now_ms ();
  int live = fill ("scale", 0, O.scale_n);
  double launch_s = (bc_now_ms () - t0) / 1e3;
  fprintf (stderr, PROG ": scale: %d live in %.1f s; host mount table %ld -> %ld lines\n", live, launch_s, mounts0,
           host_mounts ());
  char label[64];
  snprintf (label, sizeof label, "idle sandbox at %d live", live);
  density_memory ("scale", live, slab0, kother0, label);
  char *argv[] = {"/bin/true"};
  err_t err = ERR_INIT;
  int failed = 0, sampled = 0;
  t0 = bc_now_ms ();
  for (int i = 0; i<live; i += live / 100> 0 ? live / 100 : 1, sampled++)
    {
      char id[80];
      snprintf (id, sizeof id, "%s-scale-%05d", O.prefix, i);
      if (bc_exec (CH, id, argv, 1, 0, NULL, &err) < 0)
        {
          failed++;
          err_release (&err);
        }
    }
  double exec_s = (bc_now_ms () - t0) / 1e3;
  t0 = bc_now_ms ();
  delete_all ("scale", live);
  double delete_s = (bc_now_ms () - t0) / 1e3;
  usleep (500 * 1000);
  char dir[512];
  snprintf (dir, sizeof dir, "%s/%s", O.cgroup_root, O.cgroup_group != NULL ? O.cgroup_group : "");
  long cgroups_left = O.cgroup_group != NULL ? entries_in (dir) : -1;
  long mounts_left = host_mounts () - mounts0;
  fprintf (stderr,
           PROG ": scale: %d sandboxes: launched in %.1f s, %d execs (%d failed) in %.1f s, deleted in %.1f s; left: "
                "%ld cgroups, %ld mounts\n",
           live, launch_s, sampled, failed, exec_s, delete_s, cgroups_left, mounts_left);
  char what[96];
  snprintf (what, sizeof what, "%d sandboxes: launch all, one by one", live);
  bc_row_add_values (what, "s", launch_s, launch_s, NULL, 0, 0);
  snprintf (what, sizeof what, "%d sandboxes: exec in %d of them", live, sampled);
  bc_row_add_values (what, "s", exec_s, exec_s, NULL, 0, 0);
  snprintf (what, sizeof what, "%d sandboxes: delete all, 64 at once", live);
  bc_row_add_values (what, "s", delete_s, delete_s, NULL, 0, 0);
  snprintf (what, sizeof what, "%d sandboxes: left behind, cgroups + mounts", live);
  bc_row_add_values (what, "n", (double) (cgroups_left + mounts_left), (double) (cgroups_left + mounts_left), NULL, 0,
                     0);
}

/* ---- list: exec while another client lists every sandbox ----------------- */

/* The lister: list_loop in a process of its own at nice 19 (it stands
 * for a client on another machine; see list_loop.c), told over a pipe
 * when to list. */
static struct
{
  pid_t pid;
  int ctl; /* '1' lists, '0' pauses; closed: it ends */
  int out; /* its count of Lists at the end */
} LISTER = {.pid = -1, .ctl = -1, .out = -1};

static void
lister_start (void)
{
  int in[2], out[2];
  if (pipe2 (in, O_CLOEXEC) < 0 || pipe2 (out, O_CLOEXEC) < 0)
    bc_die (PROG, "list: pipe", NULL);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_adddup2 (&fa, in[0], 0);
  posix_spawn_file_actions_adddup2 (&fa, out[1], 1);
  char *argv[] = {"/usr/bin/nice", "-n", "19", (char *) O.list_loop, (char *) O.target, NULL};
  int rc = posix_spawn (&LISTER.pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy (&fa);
  close (in[0]);
  close (out[1]);
  if (rc != 0)
    bc_die (PROG, "list: spawn list_loop (--list-loop)", NULL);
  LISTER.ctl = in[1];
  LISTER.out = out[0];
}

static void
lister_set (bool on)
{
  if (write (LISTER.ctl, on ? "1" : "0", 1) != 1)
    bc_die (PROG, "list: the lister is gone", NULL);
  usleep (20 * 1000); /* a List in flight ends or one starts */
}

/* Ends the lister: its count of Lists, -1 when one failed. */
static long
lister_stop (void)
{
  close (LISTER.ctl);
  char buf[32] = "";
  ssize_t n = read (LISTER.out, buf, sizeof buf - 1);
  close (LISTER.out);
  int status = 0;
  waitpid (LISTER.pid, &status, 0);
  if (n <= 0 || !WIFEXITED (status) || WEXITSTATUS (status) != 0)
    return -1;
  return strtol (buf, NULL, 10);
}

/* With O.list_live sandboxes live, Exec of /bin/true in one of them is
 * timed in blocks of 10 alternately with and without a second client
 * calling List in a loop, so that noise hits both sides alike. */
static void
bench_list (void)
{
  double t0 = bc_now_ms ();
  int live = fill ("list", 0, O.list_live);
  fprintf (stderr, PROG ": list: %d live (filled in %.1f s); %d execs each way\n", live, (bc_now_ms () - t0) / 1e3,
           O.list_execs);
  if (live == 0)
    bc_die (PROG, "list: no sandbox launched", NULL);
  usleep (2000 * 1000); /* the kernel's deferred part of the fill */
  lister_start ();
  char id[80];
  snprintf (id, sizeof id, "%s-list-%05d", O.prefix, live / 2);
  char *argv[] = {"/bin/true"};
  bc_series_t with = {0}, without = {0};
  err_t err = ERR_INIT;
  const int block = 10, warm = 10;
  for (int i = 0; i < warm + 2 * O.list_execs; i++)
    {
      bool listing = i >= warm && ((i - warm) / block) % 2 == 1;
      if (i >= warm && (i - warm) % block == 0)
        lister_set (listing);
      double s0 = bc_now_ms ();
      if (bc_exec (CH, id, argv, 1, 0, NULL, &err) < 0)
        bc_die (PROG, "list: exec", &err);
      double ms = bc_now_ms () - s0;
      if (i >= warm)
        bc_series_add (listing ? &with : &without, ms);
    }
  long lists = lister_stop ();
  if (lists < 0)
    bc_die (PROG, "list: a List failed (see list_loop's message)", NULL);
  fprintf (stderr, PROG ": list: %ld List calls of %d sandboxes while timed\n", lists, live);
  char what[96];
  snprintf (what, sizeof what, "exec round trip, List in a loop, %d live", live);
  bc_row_add (what, "ms", &with, 99, "without the lister", &without);
  t0 = bc_now_ms ();
  delete_all ("list", live);
  fprintf (stderr, PROG ": list: %d deleted in %.1f s\n", live, (bc_now_ms () - t0) / 1e3);
}

/* ---- the warm pool ------------------------------------------------------- */

/* Waits (untimed) until the pool gateway's pool holds O.pool_size again. */
static void
pool_wait_full (rpc_channel_t *ch)
{
  err_t err = ERR_INIT;
  long n = 0;
  for (double until = bc_now_ms () + 10000; bc_now_ms () < until; usleep (2000))
    {
      if (bc_pooled (ch, &n, &err) < 0)
        bc_die (PROG, "pool: Status", &err);
      if (n >= O.pool_size)
        return;
    }
  fprintf (stderr, PROG ": pool: %ld of %d pooled after 10 s\n", n, O.pool_size);
}

/* Launches of ids starting with `prefix` the pool gateway logged as not
 * served by the pool ("pooled": false on "sandbox launched"); -1 when its
 * log cannot be read. */
static long
pool_fallbacks (const char *prefix)
{
  FILE *f = O.pool_log != NULL ? fopen (O.pool_log, "re") : NULL;
  if (f == NULL)
    return -1;
  char line[2048], key[128];
  snprintf (key, sizeof key, "\"sandbox_id\":\"%s", prefix);
  long n = 0;
  while (fgets (line, sizeof line, f) != NULL)
    if (strstr (line, "\"sandbox launched\"") != NULL && strstr (line, key) != NULL
        && strstr (line, "\"pooled\":false") != NULL)
      n++;
  fclose (f);
  return n;
}

/* One timed Launch on `ch` (with `res`, or none) of `id`, deleted in the
 * background; ms. */
static double
pool_timed_launch (rpc_channel_t *ch, const char *id, const Sandbox__V1__Resources *res)
{
  err_t err = ERR_INIT;
  double t0 = bc_now_ms ();
  if ((res != NULL ? bc_launch_with (ch, id, res, &err) : bc_launch (ch, id, &err)) < 0)
    bc_die (PROG, "pool: launch", &err);
  double ms = bc_now_ms () - t0;
  pool_delete (id);
  return ms;
}

/* Makes the next claim's conditions the same for every kind: the Deletes
 * before it finished, the pool full again, and the refill's helper given
 * 20 ms to be gone (a claim right after a refill ends pays for the
 * kernel's deferred part of it). */
static void
pool_settle (rpc_channel_t *ch)
{
  pool_drain ();
  pool_wait_full (ch);
  usleep (20 * 1000);
}

/* Claims from a full pool (pool_settle), interleaved with their
 * baselines: `bwrap` and a Get on the same channel (after as long a
 * pause as a claim). */
static void
pool_claims (rpc_channel_t *ch)
{
  baseline_t bw
      = {.name = "bwrap",
         .tool = "bwrap",
         .words = {"bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "/bin/true"}};
  baseline_check_tool (&bw);
  char get_id[80], id[80];
  snprintf (get_id, sizeof get_id, "%s-poolget", O.prefix);
  err_t err = ERR_INIT;
  if (bc_launch (ch, get_id, &err) < 0)
    bc_die (PROG, "pool: launch", &err);
  bc_series_t claim = {0}, claim_res = {0}, get = {0};
  const int warm = 3;
  fprintf (stderr, PROG ": pool: %d warm-up + %d claims of each kind\n", warm, O.pool_n);
  for (int i = 0; i < warm + O.pool_n; i++)
    {
      bool rec = i >= warm;
      pool_settle (ch);
      snprintf (id, sizeof id, "%s-poolclaim-%d", O.prefix, i);
      double ms = pool_timed_launch (ch, id, NULL);
      pool_settle (ch);
      snprintf (id, sizeof id, "%s-poolres-%d", O.prefix, i);
      double res_ms = pool_timed_launch (ch, id, &BENCH_RESOURCES);
      usleep (20 * 1000); /* as cold as the claims */
      double g0 = bc_now_ms ();
      if (bc_get (ch, get_id, &err) < 0)
        bc_die (PROG, "pool: get", &err);
      double get_ms = bc_now_ms () - g0;
      if (rec)
        {
          bc_series_add (&claim, ms);
          bc_series_add (&claim_res, res_ms);
          bc_series_add (&get, get_ms);
        }
      baseline_run (&bw, i, rec);
    }
  pool_delete (get_id);
  pool_drain ();
  char what[80];
  snprintf (what, sizeof what, "launch from the pool (%d ready)", O.pool_size);
  bc_row_add (what, "ms", &claim, 99, "bwrap", &bw.s);
  bc_row_add (what, "ms", &claim, 99, "unary Get, same channel", &get);
  bc_row_add ("launch from the pool, per-request resources", "ms", &claim_res, 99, "from the pool without", &claim);
  char pa[64], pb[64];
  snprintf (pa, sizeof pa, "%s-poolclaim-", O.prefix);
  snprintf (pb, sizeof pb, "%s-poolres-", O.prefix);
  fprintf (stderr, PROG ": pool: of the claims, %ld and %ld (with resources) fell back to a normal launch\n",
           pool_fallbacks (pa), pool_fallbacks (pb));
}

/* One client launching back to back for O.pool_seconds, each sandbox
 * deleted in the background (at most 128 Deletes behind). */
static void
pool_sustained (rpc_channel_t *ch)
{
  pool_drain ();
  pool_wait_full (ch);
  char prefix[64], id[96];
  snprintf (prefix, sizeof prefix, "%s-poolrun-", O.prefix);
  bc_series_t lat = {0};
  long n = 0;
  double t0 = bc_now_ms (), end = t0 + O.pool_seconds * 1000.0;
  while (bc_now_ms () < end)
    {
      snprintf (id, sizeof id, "%s%ld", prefix, n++);
      bc_series_add (&lat, pool_timed_launch (ch, id, NULL));
      pool_wait_below (128);
    }
  double secs = (bc_now_ms () - t0) / 1e3;
  pool_drain ();
  usleep (500 * 1000); /* the gateway's log written */
  long fell = pool_fallbacks (prefix);
  fprintf (stderr, PROG ": pool: %ld launches in %.1f s, %ld fell back\n", n, secs, fell);
  char what[96];
  snprintf (what, sizeof what, "sustained launches, pool of %d, %d s", O.pool_size, O.pool_seconds);
  bc_row_add_values (what, "launches/s", n / secs, NAN, NULL, NAN, NAN);
  bc_row_add_values ("of them, fell back to a normal launch", "launches", fell >= 0 ? (double) fell : NAN, NAN, NULL,
                     NAN, NAN);
  snprintf (what, sizeof what, "sustained launches: latency");
  bc_row_add (what, "ms", &lat, 99, NULL, NULL);
}

static void
bench_pool (void)
{
  if (O.pool_target == NULL)
    {
      fprintf (stderr, PROG ": pool: no --pool-target; skipped\n");
      return;
    }
  rpc_channel_t *ch = bc_channel (PROG, O.pool_target);
  pool_set_channel (ch);
  pool_claims (ch);
  pool_sustained (ch);
  pool_set_channel (CH);
  rpc_channel_destroy (ch);
}

/* ---- main ---------------------------------------------------------------- */

static void
usage (FILE *f)
{
  fprintf (f, "Usage: " PROG " --target HOST:PORT [options]\n"
              "Benchmarks a running sandbox-gateway (secret in CLOUD_RUN_SANDBOX_GATEWAY_SECRET).\n"
              "  --target HOST:PORT      the gateway\n"
              "  --cgroup-group NAME     the gateway's SANDBOX_CGROUP_GROUP (memory test)\n"
              "  --cgroup-root DIR       the pids hierarchy (default /sys/fs/cgroup/pids)\n"
              "  --gateway-pid PID       also report the gateway's RSS growth per sandbox\n"
              "  --crun-bundle DIR       bundle for the `crun run` baseline (else n/a)\n"
              "  --crun-container NAME   running container for the `crun exec` baseline (else n/a)\n"
              "  --hide-cgroup2          run in a private mount namespace without the cgroup2 mount at\n"
              "                          /sys/fs/cgroup/unified (crun refuses hybrid layouts)\n"
              "  --launch N              launch runs (default 50)\n"
              "  --exec N                exec runs (default 300), --exec-warmup N (default 30)\n"
              "  --tput N                throughput runs (default 3), --tput-mib N (default 1024)\n"
              "  --sandboxes N           idle sandboxes for the memory test (default 200; 0 skips)\n"
              "  --only LIST             comma-separated subset of launch,exec,run,tput,mem,density,list,pool,\n"
              "                          scale\n"
              "                          (default: all but scale)\n"
              "  --density LIST          live sandboxes at which launch is timed (default 10,1000,3000)\n"
              "  --density-launches N    launches timed at each of them (default 60)\n"
              "  --scale N               the scale run: N sandboxes, exec in 100, delete all (default 10000)\n"
              "  --list-live N           the list run: exec while another client calls List, N live (default 3000)\n"
              "  --list-execs N          execs timed with and without the lister (default 200)\n"
              "  --pool-target HOST:PORT a gateway with SANDBOX_WARM_POOL for the pool stage (else skipped)\n"
              "  --pool-log FILE         its log, for the launches that fell back\n"
              "  --pool-size N           its SANDBOX_WARM_POOL count (default 8)\n"
              "  --pool-launches N       claims timed of each kind (default 50)\n"
              "  --pool-seconds N        the sustained launches' run (default 30)\n"
              "  --fork-timer PATH       the fork_exec_timer program (default bazel-bin/bench/fork_exec_timer)\n"
              "  --list-loop PATH        the list_loop program (default bazel-bin/bench/list_loop)\n"
              "  --markdown FILE         also write the table to FILE in Markdown\n");
}

int
main (int argc, char **argv)
{
  static const struct option lo[] = {
      {"target", required_argument, 0, 't'},
      {"cgroup-group", required_argument, 0, 'g'},
      {"cgroup-root", required_argument, 0, 'r'},
      {"gateway-pid", required_argument, 0, 'p'},
      {"crun-bundle", required_argument, 0, 'b'},
      {"crun-container", required_argument, 0, 'c'},
      {"launch", required_argument, 0, 'L'},
      {"exec", required_argument, 0, 'E'},
      {"exec-warmup", required_argument, 0, 'W'},
      {"tput", required_argument, 0, 'T'},
      {"tput-mib", required_argument, 0, 'B'},
      {"sandboxes", required_argument, 0, 'S'},
      {"density", required_argument, 0, 'D'},
      {"density-launches", required_argument, 0, 'N'},
      {"scale", required_argument, 0, 'X'},
      {"list-live", required_argument, 0, 'V'},
      {"list-execs", required_argument, 0, 'R'},
      {"only", required_argument, 0, 'o'},
      {"markdown", required_argument, 0, 'm'},
      {"fork-timer", required_argument, 0, 'F'},
      {"list-loop", required_argument, 0, 'J'},
      {"pool-target", required_argument, 0, 'P'},
      {"pool-log", required_argument, 0, 'G'},
      {"pool-size", required_argument, 0, 'Z'},
      {"pool-launches", required_argument, 0, 'C'},
      {"pool-seconds", required_argument, 0, 'U'},
      {"hide-cgroup2", no_argument, 0, 'H'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  const char *only = "launch,exec,run,tput,mem,density,list,pool";
  int ch;
  while ((ch = getopt_long (argc, argv, "h", lo, NULL)) != -1)
    switch (ch)
      {
      case 't': O.target = optarg; break;
      case 'g': O.cgroup_group = optarg; break;
      case 'r': O.cgroup_root = optarg; break;
      case 'p': O.gateway_pid = (pid_t) atoi (optarg); break;
      case 'b': O.crun_bundle = optarg; break;
      case 'c': O.crun_container = optarg; break;
      case 'L': O.launch_n = atoi (optarg); break;
      case 'E': O.exec_n = atoi (optarg); break;
      case 'W': O.exec_warmup = atoi (optarg); break;
      case 'T': O.tput_n = atoi (optarg); break;
      case 'B': O.tput_mib = atol (optarg); break;
      case 'S': O.mem_n = atoi (optarg); break;
      case 'D': O.density_levels = optarg; break;
      case 'N': O.density_n = atoi (optarg); break;
      case 'X': O.scale_n = atoi (optarg); break;
      case 'V': O.list_live = atoi (optarg); break;
      case 'R': O.list_execs = atoi (optarg); break;
      case 'o': only = optarg; break;
      case 'm': O.markdown = optarg; break;
      case 'F': O.fork_timer = optarg; break;
      case 'J': O.list_loop = optarg; break;
      case 'P': O.pool_target = optarg; break;
      case 'G': O.pool_log = optarg; break;
      case 'Z': O.pool_size = atoi (optarg); break;
      case 'C': O.pool_n = atoi (optarg); break;
      case 'U': O.pool_seconds = atoi (optarg); break;
      case 'H': O.hide_cgroup2 = true; break;
      case 'h': usage (stdout); return 0;
      default: usage (stderr); return 2;
      }
  const char *secret = getenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET");
  if (O.target == NULL || secret == NULL || secret[0] == '\0')
    {
      usage (stderr);
      fprintf (stderr, PROG ": --target and CLOUD_RUN_SANDBOX_GATEWAY_SECRET are required\n");
      return 2;
    }
  if (O.launch_n < 1 || O.exec_n < 1 || O.tput_n < 1 || O.tput_mib < 1 || O.mem_n < 0)
    {
      fprintf (stderr, PROG ": counts must be positive\n");
      return 2;
    }
  bc_auth_from_env (PROG);
  signal (SIGPIPE, SIG_IGN);

  /* Before any thread exists: the baselines (crun) then see a v1 layout. The
   * gateway, a separate process, is not affected. */
  if (O.hide_cgroup2)
    {
      if (unshare (CLONE_NEWNS) < 0 || mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0
          || umount2 ("/sys/fs/cgroup/unified", MNT_DETACH) < 0)
        {
          perror (PROG ": --hide-cgroup2");
          return 1;
        }
    }

  rpc_init ();
  CH = bc_channel (PROG, O.target);
  P.ch = CH;
  /* This program's table has always had these widths. */
  bc_table_widths (42, 16);

  pool_start ();
  char list[128];
  snprintf (list, sizeof list, ",%s,", only);
  static const struct
  {
    const char *name;
    void (*fn) (void);
  } stages[] = {{"launch", bench_launch}, {"exec", bench_exec},  {"tput", bench_throughput},
                {"run", bench_run},       {"mem", bench_memory}, {"density", bench_density},
                {"list", bench_list},     {"pool", bench_pool},  {"scale", bench_scale}};
  for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++)
    {
      char key[32];
      snprintf (key, sizeof key, ",%s,", stages[i].name);
      if (strstr (list, key) == NULL || (strcmp (stages[i].name, "mem") == 0 && O.mem_n == 0))
        continue;
      double t0 = bc_now_ms ();
      stages[i].fn ();
      fprintf (stderr, PROG ": %s: done in %.1f s\n", stages[i].name, (bc_now_ms () - t0) / 1e3);
    }

  pool_stop ();
  if (P.lat.n > 0)
    bc_row_add ("delete (background, 64 at once)", "ms", &P.lat, 99, NULL, NULL);
  if (P.failures > 0)
    fprintf (stderr, PROG ": %d deletes failed\n", P.failures);
  int rc = bc_print_tables (O.markdown) < 0 ? 1 : 0;
  rpc_channel_destroy (CH);
  rpc_shutdown ();
  return rc;
}
