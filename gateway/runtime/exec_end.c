/* runtime/exec_end: how an exec ended — the result's message, the
 * sandbox's limit events that hit it — and the removal of its cgroup, what
 * the command left running moved into the sandbox's background group (see
 * exec.c). On the exec's thread. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/exec_run.h"
#include "gateway/runtime/internal.h"

/* Fills the result's message from how the command ended. */
static void
describe_end (exec_run_t *x, uint32_t timeout)
{
  sbx_exec_result_t *res = x->res;
  bool can_send = !x->consumer_gone && (!x->sink_busy || x->sink->ready (x->sink->ctx, 0) > 0);
  if (x->start_error[0] != '\0' && can_send)
    {
      /* In one of the exec's buffers: the sink may keep it. */
      sbx_outbuf_t *b = sbx_exec_bufs_get (&x->bufs);
      if (b != NULL)
        {
          int len = snprintf ((char *) b->data, b->cap, "sandbox: %s\n", x->start_error);
          x->sink->output (x->sink->ctx, 2, b->data, (size_t) len < b->cap ? (size_t) len : b->cap - 1);
        }
      snprintf (res->message, sizeof res->message, "%.*s", (int) sizeof res->message - 1, x->start_error);
    }
  res->duration_ms = (uint64_t) (sbx_mono_ms () - x->started);
  if (res->timed_out)
    snprintf (res->message, sizeof res->message, "killed after the %u s timeout, with everything it started",
              timeout);
  else if (res->cancelled)
    snprintf (res->message, sizeof res->message, "killed: the client went away");
}

/* Says when a limit of the sandbox hit the command. */
static void
describe_limits (sbx_runtime_t *rt, const sbx_cg_events_t *before, const sbx_cg_events_t *after,
                 sbx_exec_result_t *res)
{
  if (after->oom_kills > before->oom_kills)
    {
      res->oom_killed = true;
      snprintf (res->message, sizeof res->message, "the sandbox's memory limit (%ld MiB) killed a process",
                rt->cfg.memory_mb);
    }
  if (after->pids_max_hits > before->pids_max_hits)
    res->pids_limited = true;
  if (res->pids_limited && !res->oom_killed && res->message[0] == '\0')
    snprintf (res->message, sizeof res->message, "the sandbox's process limit (%ld) refused new processes",
              rt->cfg.pids_max);
}

/* The end of a command that ran: its message, and the sandbox's limit
 * events since the last exec's end (one read of the counters per exec
 * instead of a read before and after). */
void
sbx_exec_describe (exec_run_t *x, uint32_t timeout)
{
  sbx_runtime_t *rt = x->rt;
  describe_end (x, timeout);
  sbx_cg_events_t before, after;
  sbx_cg_counters_read (&rt->cg, x->req->id, &x->ctr, false, &after);
  pthread_mutex_lock (&rt->mu);
  before = x->s->cg_seen;
  x->s->cg_seen = after;
  x->s->last_used_ms = sbx_mono_ms (); /* as sbx_release would, before the answer */
  pthread_mutex_unlock (&rt->mu);
  describe_limits (rt, &before, &after, x->res);
}

/* The exec's cgroup goes with it. What the command left running (a server
 * started with `&`) lives on in the sandbox's background group, as it
 * would after a shell's exit, and dies with the sandbox. `ran`: the
 * command ran to its end (s->cg_seen then counts this group's events). */
void
sbx_exec_remove_group (exec_run_t *x, bool ran)
{
  sbx_runtime_t *rt = x->rt;
  const char *id = x->req->id;
  cleanup_err err_t rerr = ERR_INIT;
  sbx_cg_events_t gone = {0};
  if (ran)
    sbx_cg_counters_read (&rt->cg, id, &x->ctr, true, &gone);
  sbx_cg_counters_close (&x->ctr);
  /* A sandbox deleted meanwhile (its groups went with it) may already
   * have a successor of the same id, whose groups are not this exec's. */
  if (sbx_exec_sandbox_deleting (x))
    return;
  if ((x->exited && sbx_cg_move_all (&rt->cg, id, x->group, SBX_CG_BACKGROUND, &rerr) < 0)
      || sbx_cg_remove (&rt->cg, id, x->group, &rerr) < 0)
    {
      err_warn_release (&rerr, "exec in `%s`", id);
      return;
    }
  /* Where a kernel counts an event in the exec's own group (cgroup v1,
   * and v2's local pids events), the sandbox's sum loses it with the
   * group: so must what the next exec compares with, or its own events
   * would go unseen. */
  pthread_mutex_lock (&rt->mu);
  x->s->cg_seen.pids_max_hits -= gone.pids_max_hits;
  x->s->cg_seen.oom_kills -= gone.oom_kills;
  pthread_mutex_unlock (&rt->mu);
}
