/* idle_pool: detached threads that run a job each and, once done, wait for
 * the next job instead of exiting — a few of them, so that a job is
 * usually a wake-up rather than a thread's start.
 *
 * A job goes to a waiting thread when there is one, else to a new thread;
 * at most `max_idle` (≤ IDLE_POOL_MAX_IDLE) threads wait at once, the rest
 * exit when their job ends. The pool bounds what waits, not what runs: a
 * caller that must bound its jobs does so itself (the gRPC server's call
 * cap bounds Forward's readers). Waiting threads live until the process
 * ends. Thread-safe; a pool is a static object (IDLE_POOL_INIT).
 */
#ifndef SBX_COMMON_IDLE_POOL_H
#define SBX_COMMON_IDLE_POOL_H

#include <pthread.h>
#include <stddef.h>

/* The most threads a pool keeps waiting. */
#define IDLE_POOL_MAX_IDLE 16

typedef void (*idle_pool_fn) (void *arg);

typedef struct idle_pool_s
{
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t max_idle;   /* threads kept waiting (capped at IDLE_POOL_MAX_IDLE) */
  size_t stack_size; /* of each thread; 0: the default */
  /* Under mu: */
  size_t idle;   /* threads waiting, not yet given a job */
  size_t queued; /* jobs given to waiting threads, not yet taken */
  size_t head;   /* the oldest of them in `jobs` */
  size_t alive;  /* threads of the pool, running or waiting */
  struct
  {
    idle_pool_fn fn;
    void *arg;
  } jobs[IDLE_POOL_MAX_IDLE];
} idle_pool_t;

/* clang-format off */
#define IDLE_POOL_INIT(max_idle, stack_size) \
  {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, (max_idle), (stack_size), 0, 0, 0, 0, {{0, 0}}}
/* clang-format on */

/* Runs fn(arg) on a waiting thread of the pool, else on a new one. 0, or
 * pthread_create's error (then fn is not run). */
int idle_pool_run (idle_pool_t *p, idle_pool_fn fn, void *arg);

/* Threads of the pool waiting for a job, and alive in all (for tests and
 * metrics). */
size_t idle_pool_idle (idle_pool_t *p);
size_t idle_pool_alive (idle_pool_t *p);

#endif
