/* code/kernel: code contexts — a Jupyter kernel per context, running
 * inside its sandbox as one of its detached processes — and running cells
 * in them.
 *
 * A context is started from a kernelspec found in the sandbox's image
 * (`kernel.json` under the Jupyter data directories, read through the file
 * API, so inside the sandbox: the gateway never resolves a sandbox path).
 * Its connection file is written into the sandbox the same way, and the
 * kernel is started with sbx_proc_start from the kernelspec's argv: it has
 * the sandbox's namespaces, user, seccomp and cgroup, and counts toward
 * SANDBOX_MAX_PROCESSES.
 *
 * The kernel's ports are on the sandbox's loopback. The gateway reaches
 * them with libzmq: each context has a ZMQ context of its own, made on a
 * thread that has joined the sandbox's network namespace (sbx_netns_run),
 * so the ZMQ I/O thread it starts lives in that namespace and every
 * connection it makes is on the sandbox's loopback; no other gateway
 * thread changes namespace. (libzmq cannot adopt a socket connected
 * elsewhere, as Forward does, so the I/O thread itself must be inside.)
 *
 * Nothing the kernel sends is trusted: frames are bounded (ZMQ_MAXMSGSIZE,
 * JMSG_FRAME_MAX: libzmq drops the connection of a kernel that sends a
 * bigger one, which a monitor of the connection notices, and the call
 * fails at once with EMSGSIZE), queues are bounded (ZMQ_RCVHWM), every
 * message is signature-checked before it is parsed, and every wait has a
 * deadline.
 *
 * Contexts are the gateway's bookkeeping of kernels: they die with their
 * sandbox however it ends (the runtime's end hook: Delete, an expiry, its
 * pid 1 dying; a relaunched id has new ones) and a snapshot does not carry
 * them.
 *
 * Threading: any thread. A registry mutex guards the list; each context has
 * a run mutex held while one call (a cell, a restart) uses its kernel.
 */
#ifndef SBX_GATEWAY_CODE_KERNEL_H
#define SBX_GATEWAY_CODE_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "gateway/runtime/runtime.h"

#define CODE_ID_MAX 40
#define CODE_LANGUAGE_MAX 64
#define CODE_CWD_MAX 1024
/* The most kernelspecs ListContexts reports. */
#define CODE_MAX_LANGUAGES 64

typedef struct code_info_s
{
  char id[CODE_ID_MAX + 1];
  char language[CODE_LANGUAGE_MAX + 1];
  char cwd[CODE_CWD_MAX + 1];
  int64_t created_ms; /* Unix epoch */
  bool is_default;
} code_info_t;

/* How a call that waits (a kernel's start) learns its caller left: NULL,
 * or `cancelled` asked every CODE_POLL_MS with `arg`. */
typedef struct code_cancel_s
{
  bool (*cancelled) (void *arg);
  void *arg;
} code_cancel_t;

/* Starts a context in sandbox `sid`: its kernel is ready on return.
 * ENOENT no sandbox or no kernelspec `language`, EAGAIN
 * SANDBOX_MAX_CONTEXTS, EINVAL bad language, cwd or env, ECANCELED
 * `cancel` said so while the kernel started (it is then stopped and the
 * context dropped). `cancel` may be NULL. */
int code_create (sbx_runtime_t *rt, const char *sid, const char *language, const char *cwd, char *const *env,
                 const code_cancel_t *cancel, code_info_t *out, err_t *err);
/* The contexts of sandbox `sid` (*out freed by the caller), and the names
 * of the kernelspecs its image has (each and the array freed by the
 * caller). */
int code_list (sbx_runtime_t *rt, const char *sid, code_info_t **out, size_t *n, char ***languages, size_t *n_lang,
               err_t *err);
/* ECANCELED as code_create's (the context stays, without a kernel: its
 * next cell starts one). */
int code_restart (sbx_runtime_t *rt, const char *sid, const char *cid, const code_cancel_t *cancel, code_info_t *out,
                  err_t *err);
int code_delete (sbx_runtime_t *rt, const char *sid, const char *cid, err_t *err);
/* Has the runtime tell the code layer of every sandbox that ends (its end
 * hook: deleted for any reason, expired, or dead), so that its contexts,
 * their kernels' ZMQ sockets and threads go with it at once. Once, before
 * any sandbox exists. */
void code_attach (sbx_runtime_t *rt);
/* How many contexts sandbox `sid` (created at `created_ms`) has. */
size_t code_count (const char *sid, int64_t created_ms);

typedef enum code_ev_kind_e
{
  CODE_EV_STDOUT = 1,
  CODE_EV_STDERR,
  CODE_EV_RESULT,
  CODE_EV_ERROR,
  CODE_EV_END,
} code_ev_kind_t;

/* The MIME types a result carries, by index. */
typedef enum code_mime_e
{
  CODE_MIME_TEXT,
  CODE_MIME_HTML,
  CODE_MIME_MARKDOWN,
  CODE_MIME_SVG,
  CODE_MIME_JSON,
  CODE_MIME_LATEX,
  CODE_MIME_JAVASCRIPT,
  CODE_MIME_N
} code_mime_t;

/* One event of a cell; everything is lent for the callback's duration. */
typedef struct code_event_s
{
  code_ev_kind_t kind;
  const char *text; /* STDOUT, STDERR */
  /* RESULT */
  const char *mime[CODE_MIME_N]; /* NULL when absent */
  const uint8_t *png, *jpeg;
  size_t png_len, jpeg_len;
  bool is_main;
  /* ERROR */
  const char *ename, *evalue;
  const char *const *traceback;
  size_t n_traceback;
  /* END */
  uint32_t execution_count;
  uint64_t duration_ms;
  bool restarted;
  const char *message;
} code_event_t;

typedef struct code_sink_s
{
  /* -1: the consumer is gone (the cell is then interrupted). It may keep
   * the event under way after it returns (its data copied). */
  int (*event) (void *ctx, const code_event_t *ev, err_t *err);
  /* Whether the consumer has taken the last event, waiting up to
   * `wait_ms`: 1 yes, 0 not yet (the cell reads nothing more from the
   * kernel meanwhile, but its timeout, cancellation and the kernel's exit
   * still act), -1 gone. NULL: event returns only once it is taken. */
  int (*ready) (void *ctx, int wait_ms, err_t *err);
  bool (*cancelled) (void *ctx);
  void *ctx;
} code_sink_t;

typedef struct code_run_req_s
{
  const char *sid;
  const char *cid;      /* NULL or "": the default context of `language` */
  const char *language; /* NULL or "": python3 */
  const char *code;
  uint32_t timeout_seconds; /* 0: SBX_EXEC_DEFAULT_TIMEOUT */
} code_run_req_t;

/* Runs a cell, its events to `sink`, END last. 0 when the cell ran (errors
 * of the code itself are events), -1 with *err when it could not (ENOENT,
 * EPROTO a kernel that broke the protocol, EMSGSIZE one whose frame was
 * over JMSG_FRAME_MAX, ECANCELED the caller left: also while a kernel for
 * the cell started, which then stops within CODE_POLL_MS). */
int code_run (sbx_runtime_t *rt, const code_run_req_t *req, const code_sink_t *sink, err_t *err);

#endif
