/* code/internal: what kernel.c shares with run.c — a context and the
 * kernel calls a cell needs. */
#ifndef SBX_GATEWAY_CODE_INTERNAL_H
#define SBX_GATEWAY_CODE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "gateway/code/jmsg.h"
#include "gateway/code/kernel.h"

/* The poll step of every wait (cancellation, deadlines and the kernel's
 * exit are checked this often). */
#define CODE_POLL_MS 100
/* How long an interrupted cell may take to stop before its kernel is
 * restarted. */
#define CODE_INTERRUPT_GRACE_MS 3000

typedef struct code_ctx_s code_ctx_t;
struct code_ctx_s
{
  code_ctx_t *next; /* registry (reg_mu) */
  int refs;         /* reg_mu */
  bool removed;     /* out of the registry (reg_mu) */
  char sid[SBX_ID_MAX + 1];
  int64_t sbx_created_ms; /* tells a relaunched sandbox of the same id */
  code_info_t info;
  char **env; /* the caller's, "K=V", NULL-terminated */
  atomic_bool closing;
  pthread_mutex_t run_mu; /* one user of the kernel at a time */
  /* The kernel (run_mu). */
  sbx_proc_t *proc;
  void *zctx, *shell, *control, *iopub;
  char key[JMSG_KEY_MAX + 1];
  char session[37];
  bool interrupt_message;   /* interrupt_mode "message" */
  char restart_reason[400]; /* why the last kernel died, "" */
};

/* The context a cell runs in, held (made, with its kernel, for a default
 * one on first use). */
int code_ctx_for_run (sbx_runtime_t *rt, const char *sid, const char *cid, const char *lang, code_ctx_t **out,
                      err_t *err);
void code_ctx_unref (code_ctx_t *c, sbx_runtime_t *rt);
/* With run_mu held: */
int code_kernel_start (sbx_runtime_t *rt, code_ctx_t *c, err_t *err);
void code_kernel_close (sbx_runtime_t *rt, code_ctx_t *c);
bool code_kernel_exited (sbx_runtime_t *rt, code_ctx_t *c);
int64_t code_mono_ms (void);

#endif
