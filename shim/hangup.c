/* hangup: the hang-up watcher (see hangup.h). State: one epoll set and a
 * table of slots, both guarded by `hangup_mu`. Events name a slot and its
 * generation, so an event that races with hangup_remove finds a freed or
 * reused slot and is ignored: the watcher never touches a call that is no
 * longer registered. */
#include "shim/hangup.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

typedef struct slot_s
{
  int fd;
  rpc_client_call_t *call;
  uint32_t gen;
  bool used;
  bool hung_up;
} slot_t;

/* The most hang-ups taken from epoll at once (more wait for the next
 * round: a batch, not a cap). */
#define HANGUP_EVENT_BATCH 64

struct hangup_s
{
  uint32_t index;
  uint32_t gen;
};

static int hangup_epfd = -1;
static pthread_mutex_t hangup_mu = PTHREAD_MUTEX_INITIALIZER;
static slot_t *slots;
static uint32_t n_slots;

static void *
hangup_main (void *arg)
{
  (void) arg;
  struct epoll_event evs[HANGUP_EVENT_BATCH];
  for (;;)
    {
      int n = epoll_wait (hangup_epfd, evs, HANGUP_EVENT_BATCH, -1);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return NULL;
      pthread_mutex_lock (&hangup_mu);
      for (int i = 0; i < n; i++)
        {
          uint32_t index = (uint32_t) (evs[i].data.u64 >> 32), gen = (uint32_t) evs[i].data.u64;
          if (index >= n_slots)
            continue;
          slot_t *s = &slots[index];
          if (s->used && s->gen == gen && !s->hung_up)
            {
              s->hung_up = true;
              rpc_client_cancel (s->call);
              epoll_ctl (hangup_epfd, EPOLL_CTL_DEL, s->fd, NULL);
            }
        }
      pthread_mutex_unlock (&hangup_mu);
    }
}

int
hangup_start (err_t *err)
{
  hangup_epfd = epoll_create1 (EPOLL_CLOEXEC);
  if (hangup_epfd < 0)
    return err_make_sys (err, errno, "epoll_create1");
  pthread_t th;
  int rc = pthread_create (&th, NULL, hangup_main, NULL);
  if (rc != 0)
    return err_make_sys (err, rc, "start the hang-up watcher");
  pthread_detach (th);
  return 0;
}

hangup_t *
hangup_add (int fd, rpc_client_call_t *call)
{
  if (hangup_epfd < 0 || fd < 0)
    return NULL;
  hangup_t *w = calloc (1, sizeof *w);
  if (w == NULL)
    return NULL;
  pthread_mutex_lock (&hangup_mu);
  uint32_t i = 0;
  while (i < n_slots && slots[i].used)
    i++;
  if (i == n_slots)
    {
      uint32_t cap = n_slots ? n_slots * 2 : 64;
      slot_t *g = realloc (slots, cap * sizeof *g);
      if (g == NULL)
        {
          pthread_mutex_unlock (&hangup_mu);
          free (w);
          return NULL;
        }
      for (uint32_t k = n_slots; k < cap; k++)
        g[k] = (slot_t){.fd = -1};
      slots = g;
      n_slots = cap;
    }
  slot_t *s = &slots[i];
  s->gen++;
  s->fd = fd;
  s->call = call;
  s->used = true;
  s->hung_up = false;
  struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR, .data.u64 = ((uint64_t) i << 32) | s->gen};
  if (epoll_ctl (hangup_epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
    {
      s->used = false;
      pthread_mutex_unlock (&hangup_mu);
      free (w);
      return NULL;
    }
  w->index = i;
  w->gen = s->gen;
  pthread_mutex_unlock (&hangup_mu);
  return w;
}

bool
hangup_remove (hangup_t *w)
{
  if (w == NULL)
    return false;
  pthread_mutex_lock (&hangup_mu);
  slot_t *s = &slots[w->index];
  bool hung_up = s->hung_up;
  if (!hung_up)
    epoll_ctl (hangup_epfd, EPOLL_CTL_DEL, s->fd, NULL);
  s->used = false;
  s->call = NULL;
  pthread_mutex_unlock (&hangup_mu);
  free (w);
  return hung_up;
}
