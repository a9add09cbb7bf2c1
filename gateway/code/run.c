/* code/run: running one cell — execute_request on shell, the kernel's
 * iopub messages for it turned into events in the order they come, the
 * execute_reply and the kernel's return to idle as its end. Cancellation
 * and the timeout interrupt the kernel (SIGINT to its process group, or
 * interrupt_request on control when its kernelspec says
 * interrupt_mode "message"); a kernel that does not stop within
 * CODE_INTERRUPT_GRACE_MS is restarted (stopped, when the call was
 * cancelled: the next cell starts a new one). A kernel whose connection libzmq
 * dropped (a frame over JMSG_FRAME_MAX) fails the call at once and is
 * stopped; the next cell starts a new one. State: per call, on the
 * caller's thread, with the context's run mutex held. */
#include <errno.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/code/internal.h"

static const char *const mime_names[CODE_MIME_N] = {
    [CODE_MIME_TEXT] = "text/plain",
    [CODE_MIME_HTML] = "text/html",
    [CODE_MIME_MARKDOWN] = "text/markdown",
    [CODE_MIME_SVG] = "image/svg+xml",
    [CODE_MIME_JSON] = "application/json",
    [CODE_MIME_LATEX] = "text/latex",
    [CODE_MIME_JAVASCRIPT] = "application/javascript",
};

/* Decodes base64 text (whitespace ignored): a malloc'd buffer, NULL when
 * it is not base64. */
static uint8_t *
b64_decode (const char *s, size_t *out_len)
{
  size_t n = strlen (s), k = 0;
  cleanup_free char *clean = malloc (n + 1);
  if (clean == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (s[i] != '\n' && s[i] != '\r' && s[i] != ' ' && s[i] != '\t')
      clean[k++] = s[i];
  if (k % 4 != 0)
    return NULL;
  uint8_t *buf = malloc (k / 4 * 3 + 1);
  if (buf == NULL)
    return NULL;
  int r = k == 0 ? 0 : EVP_DecodeBlock (buf, (unsigned char *) clean, (int) k);
  if (r < 0)
    {
      free (buf);
      return NULL;
    }
  size_t pad = k >= 1 && clean[k - 1] == '=' ? (k >= 2 && clean[k - 2] == '=' ? 2 : 1) : 0;
  *out_len = (size_t) r - pad;
  return buf;
}

typedef struct cell_s
{
  sbx_runtime_t *rt;
  code_ctx_t *c;
  const code_sink_t *sink;
  char msg_id[37];
  bool gone; /* the consumer left: nothing more is emitted */
  bool got_reply, got_idle;
  uint32_t execution_count;
} cell_t;

static int
emit (cell_t *cl, const code_event_t *ev, err_t *err)
{
  if (cl->gone)
    return 0;
  err_t e = ERR_INIT;
  if (cl->sink->event (cl->sink->ctx, ev, &e) < 0)
    {
      /* The caller's stream is gone; the cell is interrupted. */
      cl->gone = true;
      err_release (&e);
    }
  (void) err;
  return 0;
}

static int
emit_result (cell_t *cl, json_t *content, bool is_main, err_t *err)
{
  json_t *data = json_object_get (content, "data");
  code_event_t ev = {.kind = CODE_EV_RESULT, .is_main = is_main};
  char *json_text = NULL;
  for (int i = 0; i < CODE_MIME_N; i++)
    {
      json_t *v = json_object_get (data, mime_names[i]);
      if (i == CODE_MIME_JSON && v != NULL)
        ev.mime[i] = json_text = json_dumps (v, JSON_COMPACT | JSON_ENCODE_ANY);
      else
        ev.mime[i] = json_string_value (v);
    }
  cleanup_free uint8_t *png = NULL, *jpeg = NULL;
  const char *p = json_string_value (json_object_get (data, "image/png"));
  const char *j = json_string_value (json_object_get (data, "image/jpeg"));
  if (p != NULL)
    ev.png = png = b64_decode (p, &ev.png_len);
  if (j != NULL)
    ev.jpeg = jpeg = b64_decode (j, &ev.jpeg_len);
  int rc = emit (cl, &ev, err);
  free (json_text);
  return rc;
}

static int
emit_error (cell_t *cl, json_t *content, err_t *err)
{
  json_t *tb = json_object_get (content, "traceback");
  size_t n = json_array_size (tb);
  cleanup_free const char **lines = calloc (n + 1, sizeof *lines);
  if (lines == NULL)
    return err_make (err, ENOMEM, "RunCode: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if ((lines[k] = json_string_value (json_array_get (tb, i))) != NULL)
      k++;
  const char *ename = json_string_value (json_object_get (content, "ename"));
  const char *evalue = json_string_value (json_object_get (content, "evalue"));
  code_event_t ev = {.kind = CODE_EV_ERROR,
                     .ename = ename ? ename : "",
                     .evalue = evalue ? evalue : "",
                     .traceback = lines,
                     .n_traceback = k};
  return emit (cl, &ev, err);
}

/* One iopub message. */
static int
on_iopub (cell_t *cl, const jmsg_t *m, err_t *err)
{
  if (strcmp (m->parent_id, cl->msg_id) != 0)
    return 0; /* another request's (a kernel_info at start, a restart's) */
  const char *t = m->msg_type;
  if (strcmp (t, "stream") == 0)
    {
      const char *name = json_string_value (json_object_get (m->content, "name"));
      const char *text = json_string_value (json_object_get (m->content, "text"));
      if (name == NULL || text == NULL)
        return 0;
      code_event_t ev = {.kind = strcmp (name, "stderr") == 0 ? CODE_EV_STDERR : CODE_EV_STDOUT, .text = text};
      return emit (cl, &ev, err);
    }
  if (strcmp (t, "execute_result") == 0 || strcmp (t, "display_data") == 0)
    return emit_result (cl, m->content, strcmp (t, "execute_result") == 0, err);
  if (strcmp (t, "error") == 0)
    return emit_error (cl, m->content, err);
  if (strcmp (t, "status") == 0)
    {
      const char *st = json_string_value (json_object_get (m->content, "execution_state"));
      if (st != NULL && strcmp (st, "idle") == 0)
        cl->got_idle = true;
    }
  return 0;
}

static void
interrupt (cell_t *cl)
{
  code_ctx_t *c = cl->c;
  err_t e = ERR_INIT;
  if (c->interrupt_message)
    {
      char id[37];
      json_t *content = json_object ();
      jmsg_send (c->control, c->key, c->session, "interrupt_request", content, id, &e);
      json_decref (content);
    }
  else if (c->proc != NULL)
    sbx_proc_signal_proc (cl->rt, c->proc, SIGINT, &e);
  err_warn_release (&e, "interrupt the kernel of `%s`", c->info.id);
}

/* Whether the consumer has taken the last event (waiting up to
 * CODE_POLL_MS): while it has not, nothing more is read from the kernel,
 * whose messages wait in their bounded queues (CODE_QUEUE_MAX). */
static bool
consumer_ready (cell_t *cl)
{
  if (cl->gone || cl->sink->ready == NULL)
    return true;
  err_t e = ERR_INIT;
  int r = cl->sink->ready (cl->sink->ctx, CODE_POLL_MS, &e);
  if (r < 0)
    {
      cl->gone = true;
      err_release (&e);
    }
  return r != 0;
}

/* Reads what is there on shell and iopub: at most one event. */
static int
drain (cell_t *cl, err_t *err)
{
  code_ctx_t *c = cl->c;
  zmq_pollitem_t it[2] = {{.socket = c->iopub, .events = ZMQ_POLLIN}, {.socket = c->shell, .events = ZMQ_POLLIN}};
  int r = zmq_poll (it, 2, CODE_POLL_MS);
  if (r < 0 && errno != EINTR)
    return err_make_sys (err, errno, "poll the kernel");
  for (int i = 0; r > 0 && i < 2; i++)
    {
      if (!(it[i].revents & ZMQ_POLLIN))
        continue;
      jmsg_t m = {0};
      int g = jmsg_recv (it[i].socket, c->key, &m, err);
      if (g < 0)
        return -1;
      if (g == 0)
        continue;
      int rc = 0;
      if (i == 0)
        rc = on_iopub (cl, &m, err);
      else if (strcmp (m.msg_type, "execute_reply") == 0 && strcmp (m.parent_id, cl->msg_id) == 0)
        {
          cl->got_reply = true;
          json_int_t n = json_integer_value (json_object_get (m.content, "execution_count"));
          cl->execution_count = n > 0 && n <= UINT32_MAX ? (uint32_t) n : 0;
        }
      jmsg_clear (&m);
      if (rc < 0)
        return -1;
    }
  return 0;
}

typedef struct outcome_s
{
  bool restarted, died;
  char message[512];
} outcome_t;

/* Sends the cell and waits for its end, the deadline or the consumer's
 * leaving. */
static int
cell_run (cell_t *cl, const code_run_req_t *req, outcome_t *o, err_t *err)
{
  code_ctx_t *c = cl->c;
  json_t *content = json_pack ("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", req->code, "silent", 0, "store_history", 1,
                               "user_expressions", "allow_stdin", 0, "stop_on_error", 1);
  if (content == NULL)
    return err_make (err, EINVAL, "RunCode: the code is not valid UTF-8");
  int rc = jmsg_send (c->shell, c->key, c->session, "execute_request", content, cl->msg_id, err);
  json_decref (content);
  if (rc < 0)
    return -1;
  uint32_t timeout = req->timeout_seconds ? req->timeout_seconds : SBX_EXEC_DEFAULT_TIMEOUT;
  if (timeout > SBX_EXEC_MAX_TIMEOUT)
    timeout = SBX_EXEC_MAX_TIMEOUT;
  int64_t deadline = code_mono_ms () + (int64_t) timeout * 1000, grace = 0;
  bool timed_out = false;
  while (!(cl->got_reply && cl->got_idle))
    {
      int64_t now = code_mono_ms ();
      if (atomic_load (&c->closing))
        return err_make (err, ECANCELED, "the context was deleted");
      if (!cl->gone && cl->sink->cancelled (cl->sink->ctx))
        cl->gone = true;
      if (grace == 0 && (cl->gone || now >= deadline))
        {
          timed_out = !cl->gone;
          interrupt (cl);
          grace = now + CODE_INTERRUPT_GRACE_MS;
        }
      if (grace != 0 && now >= grace)
        {
          code_kernel_close (cl->rt, c);
          if (!timed_out)
            {
              /* The caller is gone: nobody waits for a new kernel, so the
               * next cell starts one (and says why). */
              snprintf (c->restart_reason, sizeof c->restart_reason,
                        "a cancelled cell did not stop within %d ms of an interrupt and its kernel was stopped",
                        CODE_INTERRUPT_GRACE_MS);
              return 0;
            }
          snprintf (o->message, sizeof o->message,
                    "timed out after %u s; the kernel did not stop within %d ms of an interrupt and was restarted: "
                    "the context's variables are gone",
                    timeout, CODE_INTERRUPT_GRACE_MS);
          o->restarted = true;
          code_cancel_t cancel = {.cancelled = cl->sink->cancelled, .arg = cl->sink->ctx};
          return code_kernel_start (cl->rt, c, &cancel, err);
        }
      if (code_kernel_exited (cl->rt, c))
        {
          o->died = true;
          snprintf (o->message, sizeof o->message, "%s; the context's next cell restarts it", c->restart_reason);
          return 0;
        }
      if (code_kernel_links (c, err) < 0)
        {
          /* Unreachable now: the next cell starts a new kernel and says
           * why (restart_reason). */
          code_kernel_close (cl->rt, c);
          return -1;
        }
      if (!consumer_ready (cl))
        continue;
      if (drain (cl, err) < 0)
        return -1;
    }
  if (timed_out)
    snprintf (o->message, sizeof o->message, "timed out after %u s: interrupted", timeout);
  return 0;
}

int
code_run (sbx_runtime_t *rt, const code_run_req_t *req, const code_sink_t *sink, err_t *err)
{
  const char *lang = req->language && req->language[0] ? req->language : "python3";
  code_cancel_t cancel = {.cancelled = sink->cancelled, .arg = sink->ctx};
  code_ctx_t *c = NULL;
  if (code_ctx_for_run (rt, req->sid, req->cid, lang, &cancel, &c, err) < 0)
    return -1;
  pthread_mutex_lock (&c->run_mu);
  int64_t start = code_mono_ms ();
  outcome_t o = {0};
  char before[sizeof ((code_ctx_t *) 0)->restart_reason] = "";
  int rc = 0;
  if (c->proc == NULL || code_kernel_exited (rt, c))
    {
      /* Its kernel died (or a restart failed): a fresh one. */
      snprintf (before, sizeof before, "%s", c->restart_reason[0] ? c->restart_reason : "the kernel was not running");
      code_kernel_close (rt, c);
      rc = code_kernel_start (rt, c, &cancel, err);
    }
  cell_t cl = {.rt = rt, .c = c, .sink = sink};
  if (rc == 0)
    rc = cell_run (&cl, req, &o, err);
  if (rc == 0 && before[0] && !o.restarted)
    {
      char m[sizeof o.message];
      snprintf (m, sizeof m, "%s", o.message);
      snprintf (o.message, sizeof o.message,
                "%.150s; it was restarted before this cell: the context's variables are "
                "gone%s%.200s",
                before, m[0] ? "; " : "", m);
      o.restarted = true;
    }
  /* The last events go once the context is free: a consumer that does not
   * read holds up its own call only. */
  pthread_mutex_unlock (&c->run_mu);
  if (rc == 0 && o.died)
    {
      code_event_t ev = {.kind = CODE_EV_ERROR, .ename = "KernelDied", .evalue = o.message};
      emit (&cl, &ev, err);
    }
  if (rc == 0 && cl.gone)
    rc = err_make (err, ECANCELED, "RunCode: the call was cancelled; the kernel was interrupted");
  if (rc == 0)
    {
      code_event_t ev = {.kind = CODE_EV_END,
                         .execution_count = cl.execution_count,
                         .duration_ms = (uint64_t) (code_mono_ms () - start),
                         .restarted = o.restarted,
                         .message = o.message};
      rc = sink->event (sink->ctx, &ev, err);
    }
  code_ctx_unref (c, rt);
  return rc;
}
