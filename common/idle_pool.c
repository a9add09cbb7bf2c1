/* idle_pool: a job per thread, finished threads kept waiting (see
 * idle_pool.h). State: the pool's, under its mutex. */
#include "common/idle_pool.h"

#include <errno.h>
#include <stdlib.h>

typedef struct start_s
{
  idle_pool_t *pool;
  idle_pool_fn fn;
  void *arg;
} start_t;

static size_t
max_idle (const idle_pool_t *p)
{
  return p->max_idle < IDLE_POOL_MAX_IDLE ? p->max_idle : IDLE_POOL_MAX_IDLE;
}

static void *
pool_thread (void *v)
{
  start_t s = *(start_t *) v;
  free (v);
  idle_pool_t *p = s.pool;
  for (;;)
    {
      s.fn (s.arg);
      pthread_mutex_lock (&p->mu);
      if (p->idle >= max_idle (p))
        break;
      p->idle++;
      while (p->queued == 0)
        pthread_cond_wait (&p->cv, &p->mu);
      /* idle was counted down by idle_pool_run when it queued the job */
      s.fn = p->jobs[p->head].fn;
      s.arg = p->jobs[p->head].arg;
      p->head = (p->head + 1) % IDLE_POOL_MAX_IDLE;
      p->queued--;
      pthread_mutex_unlock (&p->mu);
    }
  p->alive--;
  pthread_mutex_unlock (&p->mu);
  return NULL;
}

int
idle_pool_run (idle_pool_t *p, idle_pool_fn fn, void *arg)
{
  pthread_mutex_lock (&p->mu);
  if (p->idle > 0)
    {
      /* queued <= the threads that were idle <= IDLE_POOL_MAX_IDLE */
      p->idle--;
      size_t at = (p->head + p->queued) % IDLE_POOL_MAX_IDLE;
      p->jobs[at].fn = fn;
      p->jobs[at].arg = arg;
      p->queued++;
      pthread_cond_signal (&p->cv);
      pthread_mutex_unlock (&p->mu);
      return 0;
    }
  p->alive++;
  pthread_mutex_unlock (&p->mu);
  start_t *s = malloc (sizeof *s);
  int rc = s == NULL ? ENOMEM : 0;
  if (s != NULL)
    {
      *s = (start_t){p, fn, arg};
      pthread_attr_t attr;
      pthread_attr_init (&attr);
      pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
      if (p->stack_size > 0)
        pthread_attr_setstacksize (&attr, p->stack_size);
      pthread_t t;
      rc = pthread_create (&t, &attr, pool_thread, s);
      pthread_attr_destroy (&attr);
      if (rc != 0)
        free (s);
    }
  if (rc != 0)
    {
      pthread_mutex_lock (&p->mu);
      p->alive--;
      pthread_mutex_unlock (&p->mu);
    }
  return rc;
}

size_t
idle_pool_idle (idle_pool_t *p)
{
  pthread_mutex_lock (&p->mu);
  size_t n = p->idle;
  pthread_mutex_unlock (&p->mu);
  return n;
}

size_t
idle_pool_alive (idle_pool_t *p)
{
  pthread_mutex_lock (&p->mu);
  size_t n = p->alive;
  pthread_mutex_unlock (&p->mu);
  return n;
}
