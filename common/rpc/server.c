/* rpc/server: the server half of the call layer (see rpc.h); a call's own
 * operations are in call.c.
 *
 * Shape: one "next" completion queue, registered with the gRPC server, on
 * which the server's threads learn of new calls. For every method (and for
 * unregistered ones, answered UNIMPLEMENTED) a few accept slots are kept
 * outstanding; each slot brings its own "pluck" completion queue, which
 * becomes the call's private queue. The thread that takes a new call from
 * the queue runs its handler itself — no hand-off to another thread on a
 * call's way in — while the others wait for the next; one that takes a
 * call when none other is waiting starts another first, and a few stay
 * waiting when their calls are done, sparing the next calls a thread's
 * start. All operations of a call are plucked from its queue by that
 * thread, so handlers are plain blocking code and a slow call never holds
 * up another. (This is why these threads are not common/idle_pool's: a
 * pool hands a job to a waiting thread, while here the waiting is on the
 * completion queue itself, and the thread that wakes is the one that runs
 * the call — a hand-off would add a wake-up to every call.)
 *
 * Every call starts RECV_CLOSE_ON_SERVER at once; rpc_call_cancelled()
 * peeks at it without blocking.
 *
 * Threading: the server struct's mutable fields (inflight, shutdown state)
 * are guarded by `mu`; a call's fields belong to its handler thread.
 */
#include "common/rpc/internal.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cleanup.h"
#include "common/log.h"

/* Stack of a server thread (it runs handlers). */
#define RPC_HANDLER_STACK (2u * 1024u * 1024u)
/* Threads kept waiting for the next call once theirs is done. */
#define RPC_IDLE_THREADS 4
/* Threads that take new calls (admission, refusals) besides those running
 * admitted calls: past it, a call waits in the queue for one of them. */
#define RPC_ACCEPT_THREADS 8

gpr_timespec
rpc_deadline_in_ms (int64_t ms)
{
  return gpr_time_add (gpr_now (GPR_CLOCK_MONOTONIC), gpr_time_from_millis (ms, GPR_TIMESPAN));
}

static void
slot_free (rpc_slot_t *slot)
{
  grpc_metadata_array_destroy (&slot->md);
  grpc_call_details_destroy (&slot->details);
  if (slot->cq != NULL)
    rpc_cq_destroy (slot->cq);
  free (slot);
}

/* Arms one accept slot for `method` (-1: unregistered methods). */
void
rpc_slot_request (rpc_server_t *s, long method)
{
  rpc_slot_t *slot = calloc (1, sizeof *slot);
  if (slot == NULL)
    {
      log_msg (SEV_ERROR, "rpc: out of memory arming an accept slot");
      return;
    }
  slot->server = s;
  slot->method = method;
  grpc_metadata_array_init (&slot->md);
  grpc_call_details_init (&slot->details);
  slot->cq = grpc_completion_queue_create_for_pluck (NULL);
  grpc_call_error e;
  if (method >= 0)
    e = grpc_server_request_registered_call (s->server, s->methods[method].handle, &slot->call, &slot->deadline,
                                             &slot->md, NULL, slot->cq, s->cq, slot);
  else
    e = grpc_server_request_call (s->server, &slot->call, &slot->details, &slot->md, slot->cq, s->cq, slot);
  if (e != GRPC_CALL_OK)
    {
      log_msg (SEV_ERROR, "rpc: cannot request a call: error %d", (int) e);
      slot_free (slot);
    }
}

static void
call_free (rpc_call_t *c)
{
  if (c->reply != NULL)
    grpc_byte_buffer_destroy (c->reply);
  if (c->call != NULL)
    grpc_call_unref (c->call);
  grpc_metadata_array_destroy (&c->md);
  if (c->cq != NULL)
    rpc_cq_destroy (c->cq);
  free (c->path);
  free (c);
}

static void
call_run (rpc_call_t *c)
{
  grpc_op op;
  memset (&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  if (rpc_call_start_batch (c, &op, 1, &c->close_tag) != GRPC_CALL_OK)
    c->closed = true; /* nothing to wait for */

  cleanup_err err_t err = ERR_INIT;
  int rc = c->method->fn (c, c->method->user, &err);
  if (!c->finished)
    rpc_call_finish_err (c, rc < 0 ? -1 : 0, &err);
  rpc_call_drain_ahead (c);
  if (!c->closed)
    {
      /* The close comes once the status is out; a client that stopped
       * reading does not get to keep the thread. */
      if (grpc_completion_queue_pluck (c->cq, &c->close_tag, rpc_deadline_in_ms (RPC_FINISH_MS), NULL).type
          != GRPC_OP_COMPLETE)
        {
          grpc_call_cancel (c->call, NULL);
          grpc_completion_queue_pluck (c->cq, &c->close_tag, gpr_inf_future (GPR_CLOCK_REALTIME), NULL);
        }
      c->closed = true;
    }
}

int64_t
rpc_mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
unwait_locked (rpc_server_t *s, rpc_call_t *c)
{
  if (!c->waiting)
    return;
  if (c->wait_prev != NULL)
    c->wait_prev->wait_next = c->wait_next;
  else
    s->waiting = c->wait_next;
  if (c->wait_next != NULL)
    c->wait_next->wait_prev = c->wait_prev;
  c->waiting = false;
}

void
rpc_call_first_message_done (rpc_call_t *c)
{
  if (!c->waiting) /* only this call's thread clears it */
    return;
  rpc_server_t *s = c->server;
  pthread_mutex_lock (&s->mu);
  unwait_locked (s, c);
  pthread_mutex_unlock (&s->mu);
}

static void
call_done (rpc_server_t *s, rpc_call_t *c)
{
  if (c->cancelled && !c->got_message)
    rpc_listener_charge (s->listener, c->call); /* reset (or held) before its request */
  pthread_mutex_lock (&s->mu);
  unwait_locked (s, c);
  s->inflight--;
  if (c->open)
    s->inflight_open--;
  pthread_cond_broadcast (&s->cv);
  pthread_mutex_unlock (&s->mu);
  call_free (c);
}

/* Starts a refused call's answer — its status, with the `status-origin`
 * trailer — and its close, without waiting for either. */
static bool
start_refusal (rpc_call_t *c, grpc_status_code code, const char *message)
{
  c->finished = true;
  grpc_op ops[2];
  memset (ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  grpc_slice det = grpc_slice_from_copied_string (message != NULL ? message : "");
  grpc_metadata origin = {.key = grpc_slice_from_static_string (RPC_ORIGIN_KEY),
                          .value = grpc_slice_from_static_string (RPC_ORIGIN_HANDLER)};
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status = code;
  ops[1].data.send_status_from_server.status_details = &det;
  ops[1].data.send_status_from_server.trailing_metadata_count = 1;
  ops[1].data.send_status_from_server.trailing_metadata = &origin;
  bool ok = rpc_call_start_batch (c, ops, 2, &c->batch_tag) == GRPC_CALL_OK; /* the core keeps its own copies */
  grpc_slice_unref (det);
  if (!ok)
    return false;
  grpc_op close;
  memset (&close, 0, sizeof close);
  close.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  close.data.recv_close_on_server.cancelled = &c->cancelled;
  if (rpc_call_start_batch (c, &close, 1, &c->close_tag) != GRPC_CALL_OK)
    c->closed = true;
  return true;
}

/* Answers a call on the accepting thread, without giving it a thread of
 * its own or waiting for the answer to go out: the call joins the
 * server's list of refusals, which rpc_sweep_refusing frees once the answer
 * is out, cancelling it at RPC_REFUSE_MS. Past RPC_MAX_REFUSING answers
 * under way, the call is cancelled with the status (no `status-origin`
 * trailer) and freed at once. Either way it counts against its
 * connection's budget of refused calls. */
static void
refuse (rpc_call_t *c, grpc_status_code code, const char *message)
{
  rpc_server_t *s = c->server;
  rpc_listener_charge (s->listener, c->call);
  pthread_mutex_lock (&s->mu);
  bool room = s->n_refusing < RPC_MAX_REFUSING;
  if (room)
    s->n_refusing++;
  pthread_mutex_unlock (&s->mu);
  if (room && start_refusal (c, code, message))
    {
      c->refuse_until_ms = rpc_mono_ms () + RPC_REFUSE_MS;
      pthread_mutex_lock (&s->mu);
      c->refusing_next = s->refusing;
      s->refusing = c;
      pthread_mutex_unlock (&s->mu);
      return;
    }
  if (room)
    {
      pthread_mutex_lock (&s->mu);
      s->n_refusing--;
      pthread_mutex_unlock (&s->mu);
    }
  grpc_call_cancel_with_status (c->call, code, message != NULL ? message : "", NULL);
  call_free (c); /* no batch was started: nothing to wait for */
}

/* Frees the refused calls whose answer is out, and cancels those past
 * their time (they are freed at a later sweep: a cancelled call's batches
 * complete at once). `all`: cancel every one now (shutdown). At most one
 * thread sweeps at a time; the others skip. */
void
rpc_sweep_refusing (rpc_server_t *s, bool all)
{
  int64_t now = rpc_mono_ms ();
  pthread_mutex_lock (&s->mu);
  if (!all && now - s->last_refusal_sweep_ms < 25)
    {
      pthread_mutex_unlock (&s->mu);
      return;
    }
  s->last_refusal_sweep_ms = now;
  rpc_call_t *list = s->refusing;
  s->refusing = NULL;
  pthread_mutex_unlock (&s->mu);
  rpc_call_t *keep = NULL;
  size_t freed = 0;
  while (list != NULL)
    {
      rpc_call_t *c = list;
      list = c->refusing_next;
      gpr_timespec past = gpr_inf_past (GPR_CLOCK_MONOTONIC);
      if (!c->status_done && grpc_completion_queue_pluck (c->cq, &c->batch_tag, past, NULL).type == GRPC_OP_COMPLETE)
        c->status_done = true;
      if (!c->closed && grpc_completion_queue_pluck (c->cq, &c->close_tag, past, NULL).type == GRPC_OP_COMPLETE)
        c->closed = true;
      if (c->status_done && c->closed)
        {
          call_free (c);
          freed++;
          continue;
        }
      if (!c->refuse_cancelled && (all || now >= c->refuse_until_ms))
        {
          grpc_call_cancel (c->call, NULL);
          c->refuse_cancelled = true;
        }
      c->refusing_next = keep;
      keep = c;
    }
  pthread_mutex_lock (&s->mu);
  while (keep != NULL)
    {
      rpc_call_t *c = keep;
      keep = c->refusing_next;
      c->refusing_next = s->refusing;
      s->refusing = c;
    }
  s->n_refusing -= freed;
  pthread_cond_broadcast (&s->cv);
  pthread_mutex_unlock (&s->mu);
}

/* Admission: unregistered methods, the method's own check, the caps. On
 * refusal the call is answered and freed; otherwise it is counted in and
 * waits for its first message. */
static bool
admit (rpc_server_t *s, rpc_call_t *c)
{
  if (rpc_listener_cut (s->listener, c->call))
    {
      /* What a connection shut down for its resets left queued. */
      grpc_call_cancel (c->call, NULL);
      call_free (c);
      return false;
    }
  if (c->method == NULL)
    {
      char msg[512];
      snprintf (msg, sizeof msg, "method `%.400s` is not implemented", c->path);
      refuse (c, GRPC_STATUS_UNIMPLEMENTED, msg);
      return false;
    }
  const char *why = NULL;
  grpc_status_code code = c->method->admit != NULL ? c->method->admit (c, c->method->user, &why) : GRPC_STATUS_OK;
  if (code != GRPC_STATUS_OK)
    {
      refuse (c, code, why);
      return false;
    }
  c->open = c->method->admit == NULL;
  /* Draining: the service's own calls are refused from the handler layer,
   * so a client sees "the server said unavailable", not "no server";
   * health and reflection still answer (health says NOT_SERVING). */
  if (!c->open && atomic_load (&s->draining))
    {
      refuse (c, GRPC_STATUS_UNAVAILABLE, "shutting down");
      return false;
    }
  pthread_mutex_lock (&s->mu);
  bool full = s->inflight >= s->max_calls || (c->open && s->inflight_open >= s->max_open_calls);
  if (!full)
    {
      s->inflight++;
      s->inflight_open += c->open ? 1 : 0;
      c->accepted_ms = rpc_mono_ms ();
      c->waiting = true;
      c->wait_next = s->waiting;
      if (s->waiting != NULL)
        s->waiting->wait_prev = c;
      s->waiting = c;
    }
  pthread_mutex_unlock (&s->mu);
  if (full)
    refuse (c, GRPC_STATUS_RESOURCE_EXHAUSTED,
            c->open ? "too many calls in progress (open methods)" : "too many calls in progress");
  return !full;
}

/* Cancels the calls whose first message is overdue: a call held open
 * without a request must not keep its thread. */
static void
sweep_waiting (rpc_server_t *s)
{
  int64_t now = rpc_mono_ms ();
  pthread_mutex_lock (&s->mu);
  if (now - s->last_sweep_ms >= 250)
    {
      s->last_sweep_ms = now;
      for (rpc_call_t *c = s->waiting; c != NULL; c = c->wait_next)
        if (now - c->accepted_ms >= s->first_message_ms)
          grpc_call_cancel_with_status (c->call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                        "no request message in time: cancelled", NULL);
    }
  pthread_mutex_unlock (&s->mu);
}

/* Starts a server thread, counted in `threads` and `listening` by the
 * caller (under `mu`), who takes them back on failure. */
static void *server_thread (void *arg);

bool
rpc_spawn_thread (rpc_server_t *s)
{
  pthread_attr_t attr;
  pthread_attr_init (&attr);
  pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize (&attr, RPC_HANDLER_STACK);
  pthread_t th;
  int rc = pthread_create (&th, &attr, server_thread, s);
  pthread_attr_destroy (&attr);
  if (rc != 0)
    {
      log_msg (SEV_ERROR, "rpc: cannot start a server thread: %s", strerror (rc));
      return false;
    }
  return true;
}

/* Turns a completed accept slot into a call: NULL when it was refused (or
 * could not be made), and is answered already. */
static rpc_call_t *
call_accept (rpc_server_t *s, rpc_slot_t *slot)
{
  rpc_call_t *c = calloc (1, sizeof *c);
  if (c == NULL)
    {
      grpc_call_cancel_with_status (slot->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
      grpc_call_unref (slot->call);
      slot_free (slot);
      return NULL;
    }
  c->server = s;
  c->call = slot->call;
  c->cq = slot->cq;
  c->deadline = slot->deadline;
  c->md = slot->md; /* moved */
  if (slot->method >= 0)
    {
      c->method = &s->methods[slot->method];
      c->path = strdup (c->method->path);
    }
  else
    {
      c->deadline = slot->details.deadline;
      c->path = strndup ((const char *) GRPC_SLICE_START_PTR (slot->details.method),
                         GRPC_SLICE_LENGTH (slot->details.method));
    }
  grpc_metadata_array_init (&slot->md);
  slot->cq = NULL;
  slot->call = NULL;
  slot_free (slot);
  if (c->path == NULL)
    c->path = strdup ("?");
  return admit (s, c) ? c : NULL;
}

/* An admitted call keeps its thread for as long as it runs: if no thread
 * waits for the next call now, one is started (under max_threads; past it
 * at least RPC_SPARE_THREADS threads run no admitted call, and one of them
 * soon waits again). */
static void
ensure_listener (rpc_server_t *s)
{
  pthread_mutex_lock (&s->mu);
  bool start = s->listening == 0 && s->threads < s->max_threads;
  if (start)
    {
      s->listening++;
      s->threads++;
    }
  pthread_mutex_unlock (&s->mu);
  if (start && !rpc_spawn_thread (s))
    {
      pthread_mutex_lock (&s->mu);
      s->listening--;
      s->threads--;
      pthread_mutex_unlock (&s->mu);
    }
}

/* Before this thread goes to `slot`'s call: makes sure another waits for
 * calls (starting one when too few are free), or, when none may, refuses
 * the call (false: this thread goes on waiting). */
static bool
hand_over_listening (rpc_server_t *s, rpc_slot_t *slot)
{
  pthread_mutex_lock (&s->mu);
  s->listening--;
  /* Threads not running an admitted call: this one, those answering
   * or refusing calls, those about to wait again. With enough of
   * them, one is soon back waiting: no thread is started (so a flood
   * of refused or reset calls costs at most RPC_ACCEPT_THREADS). */
  size_t free_threads = s->threads - s->inflight;
  bool need = s->listening == 0 && free_threads < RPC_ACCEPT_THREADS;
  bool start = need && s->threads < s->max_threads;
  if (need)
    s->listening++; /* the thread to start, or this one if none may */
  if (start)
    s->threads++;
  pthread_mutex_unlock (&s->mu);
  if (!need || (start && rpc_spawn_thread (s)))
    return true;
  /* No other thread would wait for calls while this one runs (for as long
   * as its call lasts), and none may start (the cap, or pthread_create
   * failed): the call is refused instead, and this thread goes on waiting. */
  rpc_listener_charge (s->listener, slot->call);
  grpc_call_cancel_with_status (slot->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "no thread for the call", NULL);
  grpc_call_unref (slot->call);
  slot_free (slot);
  if (start)
    {
      pthread_mutex_lock (&s->mu);
      s->threads--; /* the one that did not start */
      pthread_mutex_unlock (&s->mu);
    }
  return false;
}

/* After a call: back to waiting (true), unless enough threads already do
 * (false: this thread ends). */
static bool
rejoin_listening (rpc_server_t *s)
{
  pthread_mutex_lock (&s->mu);
  bool stay = s->listening < RPC_IDLE_THREADS;
  if (stay)
    s->listening++;
  else
    {
      s->threads--;
      pthread_cond_broadcast (&s->cv);
    }
  pthread_mutex_unlock (&s->mu);
  return stay;
}

static void *
server_thread (void *arg)
{
  rpc_server_t *s = arg;
  for (;;)
    {
      grpc_event ev = grpc_completion_queue_next (s->cq, rpc_deadline_in_ms (250), NULL);
      sweep_waiting (s);
      rpc_sweep_refusing (s, false);
      if (ev.type == GRPC_QUEUE_SHUTDOWN)
        break;
      if (ev.type != GRPC_OP_COMPLETE)
        continue;
      if (ev.tag == &s->shutdown_tag)
        {
          pthread_mutex_lock (&s->mu);
          s->shutdown_done = true;
          pthread_cond_broadcast (&s->cv);
          pthread_mutex_unlock (&s->mu);
          continue;
        }
      rpc_slot_t *slot = ev.tag;
      if (!ev.success || slot->call == NULL)
        {
          slot_free (slot);
          continue;
        }
      if (!atomic_load (&s->shutting_down))
        rpc_slot_request (s, slot->method);
      /* This thread goes to the call; another waits for the next one. */
      if (!hand_over_listening (s, slot))
        continue;
      rpc_call_t *c = call_accept (s, slot);
      if (c != NULL)
        {
          ensure_listener (s);
          call_run (c);
          call_done (s, c);
        }
      if (!rejoin_listening (s))
        return NULL;
    }
  pthread_mutex_lock (&s->mu);
  s->listening--;
  s->threads--;
  pthread_cond_broadcast (&s->cv);
  pthread_mutex_unlock (&s->mu);
  return NULL;
}
