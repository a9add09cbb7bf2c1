/* code/internal: what the files of code/ share — a context (contexts.c),
 * its kernel's calls (kernel.c), the kernelspec and the sandbox files
 * (spec.c), all a cell (run.c) needs. Not for use outside code/. */
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
  atomic_bool sandbox_ended; /* its sandbox is gone or dead: nothing is done inside it any more */
  pthread_mutex_t run_mu;    /* one user of the kernel at a time */
  /* The kernel (run_mu). */
  sbx_proc_t *proc;
  void *zctx, *shell, *control, *iopub;
  /* Monitors of shell's and iopub's connections (CODE_LINK_*), and when
   * each was last seen dropped with no reconnect yet (monotonic; 0: it
   * holds). */
  void *link_mon[2];
  int64_t link_dropped_ms[2];
  char key[JMSG_KEY_MAX + 1];
  char session[37];
  bool interrupt_message;   /* interrupt_mode "message" */
  char restart_reason[400]; /* why the last kernel died, "" */
  /* The kernel's connection file (it holds the key) is in the sandbox:
   * removed once the kernel answers, else when the kernel is closed. */
  bool conn_file_present;
  char conn_file[128];
};

/* The context a cell runs in, held (made, with its kernel, for a default
 * one on first use). */
int code_ctx_for_run (sbx_runtime_t *rt, const char *sid, const char *cid, const char *lang,
                      const code_cancel_t *cancel, code_ctx_t **out, err_t *err);
void code_ctx_unref (code_ctx_t *c, sbx_runtime_t *rt);
/* How long a dropped connection to the kernel may wait for libzmq's
 * reconnect (or the kernel's exit) before it counts as dropped for good. */
#define CODE_LINK_GRACE_MS 300
/* With run_mu held: */
/* ECANCELED when `cancel` (may be NULL) says so while it waits: the
 * kernel is then stopped, restart_reason says so, and the next cell starts
 * one. */
int code_kernel_start (sbx_runtime_t *rt, code_ctx_t *c, const code_cancel_t *cancel, err_t *err);
/* Whether the kernel's shell and iopub connections hold: -1 with *err
 * (EMSGSIZE) once libzmq has dropped one without reconnecting for
 * CODE_LINK_GRACE_MS — what it does to a connection whose peer sent a
 * frame over JMSG_FRAME_MAX (ZMQ_MAXMSGSIZE) or bytes that are not ZMTP —
 * with c->restart_reason saying so: the kernel can no longer be reached
 * and is to be closed. A peer that closed its end is reconnected to and
 * counts as holding (its exit is code_kernel_exited's). */
int code_kernel_links (code_ctx_t *c, err_t *err);
void code_kernel_close (sbx_runtime_t *rt, code_ctx_t *c);
bool code_kernel_exited (sbx_runtime_t *rt, code_ctx_t *c);
int64_t code_mono_ms (void);

/* ---- spec.c ---- */

/* A kernelspec's kernel.json, parsed. */
typedef struct code_spec_s
{
  char **argv; /* {connection_file} not yet replaced */
  char **env;  /* "K=V" */
  bool interrupt_message;
} code_spec_t;

/* Reads kernelspec `lang` of sandbox `sid` (ENOENT none, EINVAL a bad
 * name or kernel.json); free with code_spec_free. */
int code_spec_load (sbx_runtime_t *rt, const char *sid, const char *lang, code_spec_t *out, err_t *err);
void code_spec_free (code_spec_t *s);
/* The kernelspec names found in the sandbox's image (each and the array
 * freed by the caller; at most CODE_MAX_LANGUAGES, E2BIG beyond). */
int code_list_languages (sbx_runtime_t *rt, const char *sid, char ***out, size_t *n, err_t *err);
/* Writes `data` to sandbox file `path` (mode 0600, parents made). */
int code_sandbox_write (sbx_runtime_t *rt, const char *sid, const char *path, const char *data, err_t *err);
/* Removes sandbox file `path` (ENOENT when it is not there). */
int code_sandbox_remove (sbx_runtime_t *rt, const char *sid, const char *path, err_t *err);
/* Whether `s` is a language or file name: [A-Za-z0-9._-], not starting
 * with '.', 1..max bytes. */
bool code_name_valid (const char *s, size_t max);
/* A NULL-terminated copy of `a` then `b` (either NULL), freed with
 * code_strv_free. */
int code_env_merge (char *const *a, char *const *b, char ***out, err_t *err);
void code_strv_free (char **v);

#endif
