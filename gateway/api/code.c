/* api/code: the handlers of the code-context methods — CreateContext,
 * ListContexts, RestartContext, DeleteContext and RunCode (events as
 * CodeEvents, streamed as the kernel produces them). The contexts
 * themselves are gateway/code's. State: none beyond the call. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "gateway/api/internal.h"
#include "gateway/code/kernel.h"

static void
context_to_proto (const code_info_t *in, Sandbox__V1__CodeContext *out)
{
  sandbox__v1__code_context__init (out);
  out->context_id = (char *) in->id;
  out->language = (char *) in->language;
  out->cwd = (char *) in->cwd;
  out->created_at_unix_ms = in->created_ms;
  out->is_default = in->is_default;
}

/* Whether the client left (cancelled, or its deadline passed): what stops a
 * kernel's start and interrupts a cell (code_cancel_t, code_sink_t). */
static bool
call_cancelled (void *vcall)
{
  rpc_call_t *call = vcall;
  return rpc_call_cancelled (call) || rpc_call_deadline_ms_left (call) <= 0;
}

static int
reply_context (rpc_call_t *call, const code_info_t *info, err_t *err)
{
  Sandbox__V1__CodeContext pb;
  context_to_proto (info, &pb);
  return rpc_call_reply (call, &pb.base, err);
}

int
api_create_context (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__create_context_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__CreateContextRequest *req = (const Sandbox__V1__CreateContextRequest *) m;
  char **env = NULL;
  if (api_env_from_context (req->env, req->n_env, &env, err) < 0)
    return -1;
  code_info_t info;
  code_cancel_t cancel = {.cancelled = call_cancelled, .arg = call};
  int rc = code_create (ctx->rt, req->sandbox_id, req->language, req->cwd, env, &cancel, &info, err);
  api_env_free (env);
  if (rc < 0)
    return -1;
  return reply_context (call, &info, err);
}

int
api_list_contexts (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__list_contexts_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__ListContextsRequest *req = (const Sandbox__V1__ListContextsRequest *) m;
  cleanup_free code_info_t *infos = NULL;
  char **langs = NULL;
  size_t n = 0, n_lang = 0;
  if (code_list (ctx->rt, req->sandbox_id, &infos, &n, &langs, &n_lang, err) < 0)
    return -1;
  Sandbox__V1__CodeContext *pb = calloc (n + 1, sizeof *pb);
  Sandbox__V1__CodeContext **ptrs = calloc (n + 1, sizeof *ptrs);
  int rc = 0;
  if (pb == NULL || ptrs == NULL)
    rc = err_make (err, ENOMEM, "ListContexts: out of memory");
  else
    {
      for (size_t i = 0; i < n; i++)
        {
          context_to_proto (&infos[i], &pb[i]);
          ptrs[i] = &pb[i];
        }
      Sandbox__V1__ListContextsResponse resp = SANDBOX__V1__LIST_CONTEXTS_RESPONSE__INIT;
      resp.n_contexts = n;
      resp.contexts = ptrs;
      resp.n_languages = n_lang;
      resp.languages = langs;
      rc = rpc_call_reply (call, &resp.base, err);
    }
  free (pb);
  free (ptrs);
  for (size_t i = 0; i < n_lang; i++)
    free (langs[i]);
  free (langs);
  return rc;
}

int
api_restart_context (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__restart_context_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__RestartContextRequest *req = (const Sandbox__V1__RestartContextRequest *) m;
  code_info_t info;
  code_cancel_t cancel = {.cancelled = call_cancelled, .arg = call};
  if (code_restart (ctx->rt, req->sandbox_id, req->context_id, &cancel, &info, err) < 0)
    return -1;
  return reply_context (call, &info, err);
}

int
api_delete_context (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__delete_context_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__DeleteContextRequest *req = (const Sandbox__V1__DeleteContextRequest *) m;
  if (code_delete (ctx->rt, req->sandbox_id, req->context_id, err) < 0)
    return -1;
  Sandbox__V1__DeleteContextResponse resp = SANDBOX__V1__DELETE_CONTEXT_RESPONSE__INIT;
  return rpc_call_reply (call, &resp.base, err);
}

/* ---- RunCode ------------------------------------------------------------------ */

/* A string a kernel sent, as proto3 `string` needs it (valid UTF-8). */
static char *
utf8 (const char *s, char **owned)
{
  ProtobufCBinaryData raw = {0};
  *owned = NULL;
  if (s == NULL)
    return (char *) "";
  const char *t = api_utf8_text (s, &raw, owned);
  return (char *) (t ? t : "");
}

static int
send_result (rpc_call_t *call, const code_event_t *ev, err_t *err)
{
  Sandbox__V1__CodeResult r = SANDBOX__V1__CODE_RESULT__INIT;
  char *owned[CODE_MIME_N] = {0};
  char **fields[CODE_MIME_N] = {&r.text, &r.html, &r.markdown, &r.svg, &r.json, &r.latex, &r.javascript};
  for (int i = 0; i < CODE_MIME_N; i++)
    *fields[i] = utf8 (ev->mime[i], &owned[i]);
  r.png = (ProtobufCBinaryData){ev->png_len, (uint8_t *) ev->png};
  r.jpeg = (ProtobufCBinaryData){ev->jpeg_len, (uint8_t *) ev->jpeg};
  r.is_main_result = ev->is_main;
  Sandbox__V1__CodeEvent pb = SANDBOX__V1__CODE_EVENT__INIT;
  pb.event_case = SANDBOX__V1__CODE_EVENT__EVENT_RESULT;
  pb.result = &r;
  int rc = rpc_call_send_start (call, &pb.base, err);
  for (int i = 0; i < CODE_MIME_N; i++)
    free (owned[i]);
  return rc;
}

static int
send_error (rpc_call_t *call, const code_event_t *ev, err_t *err)
{
  Sandbox__V1__CodeError e = SANDBOX__V1__CODE_ERROR__INIT;
  cleanup_free char *o1 = NULL, *o2 = NULL;
  e.name = utf8 (ev->ename, &o1);
  e.value = utf8 (ev->evalue, &o2);
  cleanup_free char **lines = calloc (ev->n_traceback + 1, sizeof *lines);
  cleanup_free char **owned = calloc (ev->n_traceback + 1, sizeof *owned);
  if (lines == NULL || owned == NULL)
    return err_make (err, ENOMEM, "RunCode: out of memory");
  for (size_t i = 0; i < ev->n_traceback; i++)
    lines[i] = utf8 (ev->traceback[i], &owned[i]);
  e.n_traceback = ev->n_traceback;
  e.traceback = lines;
  Sandbox__V1__CodeEvent pb = SANDBOX__V1__CODE_EVENT__INIT;
  pb.event_case = SANDBOX__V1__CODE_EVENT__EVENT_ERROR;
  pb.error = &e;
  int rc = rpc_call_send_start (call, &pb.base, err);
  for (size_t i = 0; i < ev->n_traceback; i++)
    free (owned[i]);
  return rc;
}

static int
send_event (void *vcall, const code_event_t *ev, err_t *err)
{
  rpc_call_t *call = vcall;
  Sandbox__V1__CodeEvent pb = SANDBOX__V1__CODE_EVENT__INIT;
  cleanup_free char *owned = NULL;
  Sandbox__V1__CodeEnd end = SANDBOX__V1__CODE_END__INIT;
  switch (ev->kind)
    {
    case CODE_EV_STDOUT:
      pb.event_case = SANDBOX__V1__CODE_EVENT__EVENT_STDOUT;
      pb.stdout = utf8 (ev->text, &owned);
      break;
    case CODE_EV_STDERR:
      pb.event_case = SANDBOX__V1__CODE_EVENT__EVENT_STDERR;
      pb.stderr = utf8 (ev->text, &owned);
      break;
    case CODE_EV_RESULT: return send_result (call, ev, err);
    case CODE_EV_ERROR: return send_error (call, ev, err);
    case CODE_EV_END:
      end.execution_count = ev->execution_count;
      end.duration_ms = ev->duration_ms;
      end.restarted = ev->restarted;
      end.message = utf8 (ev->message, &owned);
      pb.event_case = SANDBOX__V1__CODE_EVENT__EVENT_END;
      pb.end = &end;
      break;
    }
  return rpc_call_send_start (call, &pb.base, err);
}

/* Whether the client has taken the last event (one is under way at a
 * time: rpc_call_send_start). */
static int
event_taken (void *vcall, int wait_ms, err_t *err)
{
  return rpc_call_send_wait_for (vcall, wait_ms, err);
}

int
api_run_code (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__run_code_request__descriptor, &m, err) < 0)
    return -1;
  const Sandbox__V1__RunCodeRequest *req = (const Sandbox__V1__RunCodeRequest *) m;
  code_run_req_t r = {.sid = req->sandbox_id,
                      .cid = req->context_id,
                      .language = req->language,
                      .code = req->code,
                      .timeout_seconds = req->timeout_seconds};
  code_sink_t sink = {.event = send_event, .ready = event_taken, .cancelled = call_cancelled, .ctx = call};
  return code_run (ctx->rt, &r, &sink, err);
}
