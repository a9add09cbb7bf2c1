/* bench_common: what the benchmark programs (runtime, snapshots, shim, ports) share: a
 * clock, series of samples with their median and tail, the results table
 * (plain and Markdown), spawning a baseline tool, and calls to the gateway.
 *
 * The table has the columns of bench/runtime: measurement, ours median, ours
 * p99 (or another tail), baseline, baseline median and tail, and the ratio of
 * the medians (ours / baseline).
 *
 * Threading: series and the table are not locked (the main thread's); the
 * gateway helpers may be called from any thread once bc_auth_from_env has
 * run.
 */
#ifndef SBX_BENCH_BENCH_COMMON_H
#define SBX_BENCH_BENCH_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/rpc/rpc.h"
#include "proto/sandbox/v1/sandbox.pb-c.h"

/* CLOCK_MONOTONIC in milliseconds. */
double bc_now_ms (void);

/* `bytes` in `ms` milliseconds as MB/s (10^6 bytes a second). */
double bc_mbps (uint64_t bytes, double ms);

/* A field of /proc/<pid>/status in KiB (VmRSS, VmHWM, ...), or -1. */
long bc_proc_status_kib (pid_t pid, const char *field);

/* A process's VmRSS sampled every 5 ms by a thread of its own while an
 * operation runs: bc_rss_start before it, bc_rss_stop after, which returns
 * the peak's growth over the start in KiB (-1 when it could not be read). */
typedef struct bc_rss_sampler_s
{
  pid_t pid;
  long start_kib, peak_kib;
  volatile bool stop;
  bool running;
  pthread_t thread;
} bc_rss_sampler_t;
void bc_rss_start (bc_rss_sampler_t *s, pid_t pid);
long bc_rss_stop (bc_rss_sampler_t *s);

/* Prints "PROG: what: <err's message>" to stderr and exits 1. */
void bc_die (const char *prog, const char *what, err_t *err) __attribute__ ((noreturn));

typedef struct bc_series_s
{
  double *v;
  int n, cap;
  bool na;       /* the tool is missing or failed: printed as n/a */
  char why[160]; /* why it is n/a */
} bc_series_t;

void bc_series_add (bc_series_t *s, double x);
void bc_series_na (bc_series_t *s, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

/* Percentile `p` (0..100) by nearest rank; the median interpolates. NAN when
 * the series is n/a or empty. */
double bc_pct (bc_series_t *s, double p);

/* Adds a row. `p_tail` is the tail percentile shown in the p99 columns (99
 * for latencies, 1 for rates, whose bad tail is the low end). base_name NULL:
 * no baseline. */
void bc_row_add (const char *what, const char *unit, bc_series_t *ours, double p_tail, const char *base_name,
                 bc_series_t *base);

/* A row from figures already computed (NAN: n/a). */
void bc_row_add_values (const char *what, const char *unit, double ours_med, double ours_tail, const char *base_name,
                        double base_med, double base_tail);

/* The widths of the plain table's measurement and baseline columns (the
 * Markdown form has none); 50 and 26 unless set. */
void bc_table_widths (int what, int base_name);

void bc_print_table (FILE *f, bool markdown);

/* Prints the table to stdout and, when `markdown` is not NULL, to that file
 * in Markdown. -1 when the file cannot be written. */
int bc_print_tables (const char *markdown);

/* Spawns argv with stdin from /dev/null, stdout to `outfd` (-1: /dev/null)
 * and stderr to `errfd` (-1: /dev/null). Returns the pid or -1 (errno). */
pid_t bc_spawn (char *const argv[], int outfd, int errfd);

/* Waits for `pid`; returns its wait status or -1. */
int bc_wait (pid_t pid);

/* Runs argv to completion (stdout and stderr to /dev/null, or stderr to
 * `errfd`); its wait status, or -1. */
int bc_run (char *const argv[], int errfd);

/* ---- the gateway --------------------------------------------------------- */

/* The secret from CLOUD_RUN_SANDBOX_GATEWAY_SECRET as authorization
 * metadata; exits when it is unset. */
extern rpc_metadata_t BC_MD[1];
void bc_auth_from_env (const char *prog);

/* A channel to `target` with large messages allowed; exits on failure. */
rpc_channel_t *bc_channel (const char *prog, const char *target);

/* Launch, Delete and Get of sandbox `id` (60 s deadline, reply dropped). */
int bc_launch (rpc_channel_t *ch, const char *id, err_t *err);
/* A Launch with per-request resources (borrowed). */
int bc_launch_with (rpc_channel_t *ch, const char *id, const Sandbox__V1__Resources *res, err_t *err);
/* Status.pooled: the gateway's warm pool's ready sandboxes. */
int bc_pooled (rpc_channel_t *ch, long *out, err_t *err);
int bc_delete (rpc_channel_t *ch, const char *id, err_t *err);
int bc_get (rpc_channel_t *ch, const char *id, err_t *err);
/* List of every live sandbox (60 s deadline, reply dropped). */
int bc_list (rpc_channel_t *ch, err_t *err);

/* Starts a call of `method` with the authorization metadata that sends the
 * single request `req` and half-closes, for calls whose server streams the
 * replies; read them with rpc_client_recv, then bc_call_finish. */
int bc_call_start (rpc_channel_t *ch, const char *method, int64_t timeout_ms, const ProtobufCMessage *req,
                   rpc_client_call_t **out, err_t *err);

/* Waits for the call's status and destroys it; -1 with "what: STATUS:
 * details" in *err unless the status is OK. err NULL: the status is only
 * awaited (an error already in hand stands). */
int bc_call_finish (rpc_client_call_t *c, const char *what, err_t *err);

/* Exec of argv in `id`, stdout bytes counted into *out_bytes (may be NULL);
 * fails unless the command exits 0. timeout_s 0: no limit on the command,
 * and the call's deadline is 360 s. */
int bc_exec (rpc_channel_t *ch, const char *id, char **argv, size_t argc, uint32_t timeout_s, uint64_t *out_bytes,
             err_t *err);

/* The same, with stdout kept as text in `out` (out_size > 0, always
 * NUL-terminated); more than out_size - 1 bytes fail with EMSGSIZE. */
int bc_exec_capture (rpc_channel_t *ch, const char *id, char **argv, size_t argc, uint32_t timeout_s,
                     uint64_t *out_bytes, char *out, size_t out_size, err_t *err);

#endif
