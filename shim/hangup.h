/* hangup: cancels the gateway call of an HTTP client that hung up.
 *
 * While a request waits on the gateway (a long exec, a slow export), its
 * connection thread is not reading the socket, so nobody would notice the
 * client leave. One watcher thread keeps every such socket in an epoll set
 * for hang-ups only (EPOLLRDHUP/EPOLLHUP/EPOLLERR: pending request bytes do
 * not wake it) and cancels the registered call, which the gateway turns
 * into killing the command.
 *
 * Threading: hangup_add/hangup_remove from request threads; the watcher
 * thread cancels under the registry lock, so after hangup_remove returns
 * the call is never touched again.
 */
#ifndef SBX_SHIM_HANGUP_H
#define SBX_SHIM_HANGUP_H

#include "common/err.h"
#include "common/rpc/rpc.h"

typedef struct hangup_s hangup_t;

int hangup_start (err_t *err);

/* Watches `fd`; cancels `call` if the peer hangs up. NULL if it cannot
 * watch (the request then simply runs unwatched). */
hangup_t *hangup_add (int fd, rpc_client_call_t *call);

/* Stops watching. NULL is ignored. Returns true when the peer had hung up. */
bool hangup_remove (hangup_t *w);

#endif
