/* rpc/server_stop: the end of a server (see rpc.h): the drain that waits
 * for calls in flight within a grace, the shutdown that cancels what is
 * left and drains the queues, and the release. The other half, from
 * rpc_server_new to the threads that run calls, is server.c.
 *
 * Threading: as server.c — the server's mutable fields under `mu`.
 */
#include "common/rpc/internal.h"

#include <errno.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

bool
rpc_server_shutting_down (const rpc_server_t *s)
{
  return atomic_load (&((rpc_server_t *) s)->shutting_down);
}

size_t
rpc_server_inflight (rpc_server_t *s)
{
  pthread_mutex_lock (&s->mu);
  size_t n = s->inflight;
  pthread_mutex_unlock (&s->mu);
  return n;
}

/* CLOCK_MONOTONIC `ms` from now. */
static struct timespec
mono_in (int64_t ms)
{
  struct timespec until;
  clock_gettime (CLOCK_MONOTONIC, &until);
  if (ms < 0)
    ms = 0;
  int64_t ns = (int64_t) until.tv_nsec + ms % 1000 * 1000000;
  until.tv_sec += ms / 1000 + ns / 1000000000;
  until.tv_nsec = ns % 1000000000;
  return until;
}

int64_t
rpc_server_drain (rpc_server_t *s, int64_t grace_ms)
{
  int64_t start = rpc_mono_ms ();
  atomic_store (&s->draining, true);
  struct timespec until = mono_in (grace_ms);
  pthread_mutex_lock (&s->mu);
  size_t left = s->inflight - s->inflight_open;
  if (left > 0)
    log_msg (SEV_INFO, "rpc: draining: %zu call(s) in flight may finish; new calls are refused", left);
  while (s->inflight - s->inflight_open > 0)
    if (pthread_cond_timedwait (&s->cv, &s->mu, &until) == ETIMEDOUT)
      break;
  left = s->inflight - s->inflight_open;
  pthread_mutex_unlock (&s->mu);
  int64_t rest = grace_ms - (rpc_mono_ms () - start);
  if (left > 0)
    return 0;
  return rest > 0 ? rest : 0;
}

void
rpc_server_shutdown (rpc_server_t *s, int64_t grace_ms)
{
  pthread_mutex_lock (&s->mu);
  if (s->shutdown_called)
    {
      pthread_mutex_unlock (&s->mu);
      return;
    }
  s->shutdown_called = true;
  pthread_mutex_unlock (&s->mu);
  atomic_store (&s->shutting_down, true);

  if (!s->started)
    {
      /* No thread: wait for the shutdown tag here. */
      grpc_server_shutdown_and_notify (s->server, s->cq, &s->shutdown_tag);
      for (;;)
        {
          grpc_event ev = grpc_completion_queue_next (s->cq, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
          if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->shutdown_tag)
            break;
        }
      grpc_server_destroy (s->server);
      grpc_completion_queue_shutdown (s->cq);
      while (grpc_completion_queue_next (s->cq, gpr_inf_future (GPR_CLOCK_REALTIME), NULL).type
             != GRPC_QUEUE_SHUTDOWN)
        ;
      s->destroyed_grpc = true;
      return;
    }

  rpc_listener_stop (s->listener); /* no new connections */
  grpc_server_shutdown_and_notify (s->server, s->cq, &s->shutdown_tag);
  struct timespec until = mono_in (grace_ms);

  pthread_mutex_lock (&s->mu);
  while (!s->shutdown_done)
    if (pthread_cond_timedwait (&s->cv, &s->mu, &until) == ETIMEDOUT)
      break;
  bool done = s->shutdown_done;
  size_t left = s->inflight;
  pthread_mutex_unlock (&s->mu);
  if (!done)
    {
      log_msg (SEV_WARNING, "rpc: grace period over; cancelling %zu call(s) still in flight", left);
      grpc_server_cancel_all_calls (s->server);
    }
  pthread_mutex_lock (&s->mu);
  while (!s->shutdown_done || s->inflight > 0)
    pthread_cond_wait (&s->cv, &s->mu);
  pthread_mutex_unlock (&s->mu);
  /* Refusals still under way are cancelled; their batches then complete. */
  for (;;)
    {
      rpc_sweep_refusing (s, true);
      pthread_mutex_lock (&s->mu);
      size_t refusing = s->n_refusing;
      pthread_mutex_unlock (&s->mu);
      if (refusing == 0)
        break;
      struct timespec pause = {0, 5 * 1000 * 1000};
      nanosleep (&pause, NULL);
    }

  grpc_server_destroy (s->server);
  grpc_completion_queue_shutdown (s->cq);
  /* No call comes any more: the threads see the queue's end and go. */
  pthread_mutex_lock (&s->mu);
  while (s->threads > 0)
    pthread_cond_wait (&s->cv, &s->mu);
  pthread_mutex_unlock (&s->mu);
  s->destroyed_grpc = true;
}

void
rpc_server_destroy (rpc_server_t *s)
{
  if (s == NULL)
    return;
  rpc_server_shutdown (s, 0);
  rpc_listener_free (s->listener);
  if (s->quota != NULL)
    grpc_resource_quota_unref (s->quota);
  grpc_completion_queue_destroy (s->cq);
  for (size_t i = 0; i < s->n_methods; i++)
    free (s->methods[i].path);
  free (s->methods);
  free (s->tls_cert_file);
  free (s->tls_key_file);
  free (s->tls_ca_file);
  pthread_cond_destroy (&s->cv);
  pthread_mutex_destroy (&s->mu);
  free (s);
}
