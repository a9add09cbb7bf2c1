/* runtime/exec_env: the environment a command runs with.
 *
 * The defaults (PATH, HOME, LANG, TERM) less those the request names, then
 * the request's entries in its order; on a terminal TERM defaults to
 * xterm-256color. Pure: no I/O, no state; any thread.
 */
#ifndef SBX_GATEWAY_RUNTIME_EXEC_ENV_H
#define SBX_GATEWAY_RUNTIME_EXEC_ENV_H

#include <stdbool.h>

/* `extra`: "KEY=VALUE" entries, NULL-terminated, may be NULL. Returns a
 * NULL-terminated array the caller frees (not its strings: they are
 * `extra`'s or static); NULL when out of memory. */
char **sbx_exec_build_env (char *const *extra, bool pty);

#endif
