/* routes/terminal_pump: a terminal's gateway → client direction — the
 * thread that receives the Run call's ProcessEvents and queues their bytes
 * (and the exit message) for the socket thread, bounded by
 * TERMINAL_MAX_BUFFERED (flow control: a slow client holds the gateway
 * back, not the shim's memory).
 *
 * Threading: the pump thread is the call's only receiver; the queue is
 * under the terminal's mu, shared with the socket thread.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/terminal_messages.h"
#include "shim/routes/terminal_term.h"

void
terminal_wake (term_t *t)
{
  uint64_t one = 1;
  if (write (t->wake_fd, &one, sizeof one) < 0)
    {
      /* the counter is full: a wake-up is pending anyway */
    }
}

static chunk_t *
chunk_new (bool text, const void *data, size_t len)
{
  chunk_t *c = malloc (sizeof *c + len);
  if (c == NULL)
    return NULL;
  c->next = NULL;
  c->text = text;
  c->len = len;
  memcpy (c->data, data, len);
  return c;
}

static chunk_t *
exit_chunk (const Sandbox__V1__ExitStatus *x)
{
  char *text = terminal_exit_text (x);
  chunk_t *c = text != NULL ? chunk_new (true, text, strlen (text)) : NULL;
  free (text);
  return c;
}

/* Queues `c` for the socket thread, waiting for room. False (and `c`
 * freed) once the socket side is done. */
static bool
term_push (term_t *t, chunk_t *c)
{
  pthread_mutex_lock (&t->mu);
  while (t->buffered > 0 && t->buffered + c->len > TERMINAL_MAX_BUFFERED && !t->closing)
    pthread_cond_wait (&t->cv, &t->mu);
  bool ok = !t->closing;
  if (ok)
    {
      if (t->tail != NULL)
        t->tail->next = c;
      else
        t->head = c;
      t->tail = c;
      t->buffered += c->len;
    }
  pthread_mutex_unlock (&t->mu);
  if (!ok)
    free (c);
  else
    terminal_wake (t);
  return ok;
}

void *
terminal_pump (void *arg)
{
  term_t *t = arg;
  bool exited = false;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      err_t err = ERR_INIT;
      int rc = rpc_client_recv (t->call, &sandbox__v1__process_event__descriptor, &m, &err);
      err_release (&err);
      if (rc <= 0)
        break;
      Sandbox__V1__ProcessEvent *e = (Sandbox__V1__ProcessEvent *) m;
      chunk_t *c = NULL;
      if (e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STDOUT && e->stdout.len > 0)
        c = chunk_new (false, e->stdout.data, e->stdout.len);
      else if (e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STDERR && e->stderr.len > 0)
        c = chunk_new (false, e->stderr.data, e->stderr.len);
      else if (e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT && e->exit != NULL)
        {
          c = exit_chunk (e->exit);
          exited = true;
        }
      if (c != NULL)
        metrics_bytes (false, c->len);
      protobuf_c_message_free_unpacked (m, NULL);
      if (c != NULL && !term_push (t, c))
        break;
    }
  pthread_mutex_lock (&t->mu);
  t->ended = true;
  t->exited = exited;
  pthread_mutex_unlock (&t->mu);
  terminal_wake (t);
  return NULL;
}
