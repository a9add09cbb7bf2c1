/* image/gate: shared pulls, claimed keys, exclusive removals (see
 * gate.h). State: the gate's, under its mutex. */
#include "gateway/image/gate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t
img_gate_now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
img_gate_init (img_gate_t *g)
{
  memset (g, 0, sizeof *g);
  pthread_mutex_init (&g->mu, NULL);
  pthread_cond_init (&g->cv, NULL);
}

void
img_gate_destroy (img_gate_t *g)
{
  for (size_t i = 0; i < g->n_keys; i++)
    free (g->keys[i]);
  free (g->keys);
  pthread_cond_destroy (&g->cv);
  pthread_mutex_destroy (&g->mu);
}

/* Under mu: waits for a change until `deadline_ms`; ETIMEDOUT past it. */
static int
wait_locked (img_gate_t *g, int64_t deadline_ms)
{
  if (img_gate_now_ms () >= deadline_ms)
    return ETIMEDOUT;
  struct timespec until = {.tv_sec = deadline_ms / 1000, .tv_nsec = (deadline_ms % 1000) * 1000000};
  int rc = pthread_cond_clockwait (&g->cv, &g->mu, CLOCK_MONOTONIC, &until);
  return rc == ETIMEDOUT && img_gate_now_ms () >= deadline_ms ? ETIMEDOUT : 0;
}

int
img_gate_enter (img_gate_t *g, int64_t deadline_ms)
{
  pthread_mutex_lock (&g->mu);
  int rc = 0;
  while (rc == 0 && (g->exclusive || g->want_exclusive > 0))
    rc = wait_locked (g, deadline_ms);
  if (rc == 0)
    g->shared++;
  pthread_mutex_unlock (&g->mu);
  return rc;
}

bool
img_gate_leave_last (img_gate_t *g)
{
  pthread_mutex_lock (&g->mu);
  g->shared--;
  bool last = g->shared == 0 && !g->exclusive;
  if (last)
    g->exclusive = true;
  pthread_cond_broadcast (&g->cv);
  pthread_mutex_unlock (&g->mu);
  return last;
}

static ssize_t
find_locked (const img_gate_t *g, const char *key)
{
  for (size_t i = 0; i < g->n_keys; i++)
    if (strcmp (g->keys[i], key) == 0)
      return (ssize_t) i;
  return -1;
}

int
img_gate_claim (img_gate_t *g, const char *key, int64_t deadline_ms)
{
  char *copy = strdup (key);
  if (copy == NULL)
    return ENOMEM;
  pthread_mutex_lock (&g->mu);
  int rc = 0;
  while (rc == 0 && find_locked (g, key) >= 0)
    rc = wait_locked (g, deadline_ms);
  if (rc == 0 && g->n_keys == g->cap_keys)
    {
      size_t cap = g->cap_keys ? g->cap_keys * 2 : 8;
      char **keys = realloc (g->keys, cap * sizeof *keys);
      if (keys == NULL)
        rc = ENOMEM;
      else
        {
          g->keys = keys;
          g->cap_keys = cap;
        }
    }
  if (rc == 0)
    g->keys[g->n_keys++] = copy;
  else
    free (copy);
  pthread_mutex_unlock (&g->mu);
  return rc;
}

void
img_gate_release (img_gate_t *g, const char *key)
{
  pthread_mutex_lock (&g->mu);
  ssize_t i = find_locked (g, key);
  if (i >= 0)
    {
      free (g->keys[i]);
      g->keys[i] = g->keys[--g->n_keys];
    }
  pthread_cond_broadcast (&g->cv);
  pthread_mutex_unlock (&g->mu);
}

int
img_gate_exclusive (img_gate_t *g, int64_t deadline_ms)
{
  pthread_mutex_lock (&g->mu);
  g->want_exclusive++;
  int rc = 0;
  while (rc == 0 && (g->exclusive || g->shared > 0))
    rc = wait_locked (g, deadline_ms);
  g->want_exclusive--;
  if (rc == 0)
    g->exclusive = true;
  pthread_cond_broadcast (&g->cv);
  pthread_mutex_unlock (&g->mu);
  return rc;
}

void
img_gate_end (img_gate_t *g)
{
  pthread_mutex_lock (&g->mu);
  g->exclusive = false;
  pthread_cond_broadcast (&g->cv);
  pthread_mutex_unlock (&g->mu);
}
