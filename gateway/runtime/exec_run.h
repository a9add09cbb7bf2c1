/* runtime/exec_run: one exec in flight, shared by exec.c (starting,
 * pumping, the run's steps) and exec_end.c (its result, its cgroup's
 * removal). Private to the runtime; an exec belongs to its thread.
 */
#ifndef SBX_GATEWAY_RUNTIME_EXEC_RUN_H
#define SBX_GATEWAY_RUNTIME_EXEC_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "gateway/runtime/internal.h"

typedef struct pump_s
{
  int fd;
  int stream;
  size_t owed; /* bytes in the pipe at the exit report: delivered whatever the drain's bound */
} pump_t;

/* One exec in flight. */
typedef struct sbx_exec_s
{
  sbx_runtime_t *rt;
  sbx_t *s;
  const sbx_exec_req_t *req;
  const sbx_exec_sink_t *sink;
  sbx_exec_result_t *res;
  char group[32];
  pump_t pumps[2]; /* stdout, stderr; fd -1 once closed */
  int stdin_fd;    /* -1 once all of stdin is written */
  int stream_fd;   /* stdin_stream: the write end to hand over at STARTED */
  size_t stdin_off;
  int report_fd;
  int64_t started, deadline, exited_at, drain_until, killed_at;
  int64_t cancel_checked; /* when the sink was last asked whether the caller went away */
  bool exited, killed, consumer_gone;
  bool started_seen; /* the STARTED report came (or never will) */
  bool sink_busy;    /* an asynchronous sink (sink->ready) has not taken the last output yet */
  char start_error[sizeof ((sbx_report_t *) 0)->text];
  sbx_exec_bufs_t bufs;  /* where output is read into */
  bool buf_wait;         /* no buffer was free: the pipes wait EXEC_BUF_RETRY_MS */
  sbx_cg_counters_t ctr; /* the limit-event counters, opened while the command starts */
} exec_run_t;

/* The sandbox is being deleted (its groups may already be gone). */
bool sbx_exec_sandbox_deleting (exec_run_t *x);
/* The end of a command that ran: its message, and the sandbox's limit
 * events since the last exec's end. */
void sbx_exec_describe (exec_run_t *x, uint32_t timeout);
/* Removes the exec's cgroup, moving what the command left running into
 * the background group; `ran`: the command ran to its end. */
void sbx_exec_remove_group (exec_run_t *x, bool ran);

#endif
