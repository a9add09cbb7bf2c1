/* workers: where the shim's blocking work runs — a route's gateway calls,
 * the next piece of a streamed answer, a streamed body's next piece — off
 * libmicrohttpd's event threads, which must never block.
 *
 * At most SHIM_MAX_WORKERS jobs run at once, on the threads of an
 * idle_pool (a finished thread waits for the next job rather than exit);
 * beyond, jobs wait in arrival order. A connection has at most one job at
 * a time (it is suspended while the job runs), so what waits is bounded by
 * SHIM_MAX_CONNECTIONS. A job that waited WORKERS_QUEUE_MS without a
 * thread is expired instead of run: its `expire` answers 503 (the watchdog
 * calls workers_expire four times a second). So threads are bounded by a
 * named maximum whatever clients do, and no client waits for one without
 * a deadline.
 *
 * Threading: every function may be called from any thread. A job's `run`
 * and `expire` are called without the pool's lock; either may free the job
 * (it is never touched again once one of them started).
 */
#ifndef SBX_SHIM_WORKERS_H
#define SBX_SHIM_WORKERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest a job waits for a thread before it is expired. */
#define WORKERS_QUEUE_MS 10000

typedef struct worker_job_s
{
  void (*run) (void *arg);
  void (*expire) (void *arg); /* instead of run, when it waited too long or the pool stops */
  void *arg;
  /* the pool's */
  int64_t queued_ns;
  struct worker_job_s *next;
} worker_job_t;

/* Sets the cap of running jobs (before the first submit). */
void workers_init (size_t max_running);

/* Runs `job` on a worker, now or once one is free. -1 when the pool stops
 * (or no thread can be made and none runs): the job is not taken. */
int workers_submit (worker_job_t *job);

/* Expires the jobs that waited longer than WORKERS_QUEUE_MS. */
void workers_expire (int64_t now_ns);

/* Takes no more jobs, expires those waiting, and waits until the running
 * ones end or `wait_ms` passes: true when none runs any more. */
bool workers_stop (int64_t wait_ms);

/* Jobs running and waiting now (metrics and tests). */
size_t workers_running (void);
size_t workers_waiting (void);

#endif
