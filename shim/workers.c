/* workers: a bounded set of running jobs over an idle_pool, and a FIFO of
 * those waiting (see workers.h). State: the counters and the queue, under
 * `mu`. */
#include "shim/workers.h"

#include <pthread.h>
#include <time.h>

#include "common/idle_pool.h"
#include "shim/shim.h"

/* The stack of a worker: routes keep no large buffers on it. */
#define WORKERS_STACK (512 * 1024)
/* Threads kept waiting for a job between bursts. */
#define WORKERS_IDLE 16

static idle_pool_t pool = IDLE_POOL_INIT (WORKERS_IDLE, WORKERS_STACK);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ended = PTHREAD_COND_INITIALIZER;
static size_t cap = 64;
static size_t running, waiting;
static bool stopping;
static worker_job_t *head, *tail;

void
workers_init (size_t max_running)
{
  pthread_mutex_lock (&mu);
  cap = max_running > 0 ? max_running : 1;
  pthread_mutex_unlock (&mu);
}

/* Under mu: the oldest waiting job, unlinked, or NULL. */
static worker_job_t *
pop_locked (void)
{
  worker_job_t *j = head;
  if (j == NULL)
    return NULL;
  head = j->next;
  if (head == NULL)
    tail = NULL;
  waiting--;
  return j;
}

/* A worker thread's life: its job, then those waiting, while there are. */
static void
worker_main (void *arg)
{
  worker_job_t *j = arg;
  for (;;)
    {
      j->run (j->arg); /* may free j */
      pthread_mutex_lock (&mu);
      j = stopping ? NULL : pop_locked ();
      if (j == NULL)
        {
          running--;
          pthread_cond_broadcast (&ended);
          pthread_mutex_unlock (&mu);
          return;
        }
      pthread_mutex_unlock (&mu);
    }
}

int
workers_submit (worker_job_t *job)
{
  job->next = NULL;
  job->queued_ns = shim_mono_ns ();
  pthread_mutex_lock (&mu);
  if (stopping)
    {
      pthread_mutex_unlock (&mu);
      return -1;
    }
  if (running < cap)
    {
      running++;
      pthread_mutex_unlock (&mu);
      if (idle_pool_run (&pool, worker_main, job) == 0)
        return 0;
      pthread_mutex_lock (&mu);
      running--;
      pthread_cond_broadcast (&ended);
      if (running == 0)
        {
          /* No thread can be made and none would take it later. */
          pthread_mutex_unlock (&mu);
          return -1;
        }
    }
  if (tail != NULL)
    tail->next = job;
  else
    head = job;
  tail = job;
  waiting++;
  pthread_mutex_unlock (&mu);
  return 0;
}

/* Unlinks the waiting jobs older than `before_ns` (all with INT64_MAX) and
 * expires them, outside the lock. */
static void
expire_older (int64_t before_ns)
{
  for (;;)
    {
      pthread_mutex_lock (&mu);
      worker_job_t *j = head != NULL && head->queued_ns < before_ns ? pop_locked () : NULL;
      pthread_mutex_unlock (&mu);
      if (j == NULL)
        return;
      j->expire (j->arg);
    }
}

void
workers_expire (int64_t now_ns)
{
  expire_older (now_ns - (int64_t) WORKERS_QUEUE_MS * 1000000);
}

bool
workers_stop (int64_t wait_ms)
{
  pthread_mutex_lock (&mu);
  stopping = true;
  pthread_mutex_unlock (&mu);
  expire_older (INT64_MAX);
  struct timespec until;
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += wait_ms / 1000;
  until.tv_nsec += (wait_ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000)
    {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
  pthread_mutex_lock (&mu);
  int rc = 0;
  while (running > 0 && rc == 0)
    rc = pthread_cond_timedwait (&ended, &mu, &until);
  bool idle = running == 0;
  pthread_mutex_unlock (&mu);
  return idle;
}

size_t
workers_running (void)
{
  pthread_mutex_lock (&mu);
  size_t n = running;
  pthread_mutex_unlock (&mu);
  return n;
}

size_t
workers_waiting (void)
{
  pthread_mutex_lock (&mu);
  size_t n = waiting;
  pthread_mutex_unlock (&mu);
  return n;
}
