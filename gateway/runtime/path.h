/* runtime/path: building paths and names into fixed buffers, checked.
 *
 * A path cut to fit its buffer names another file (a truncated cgroup path
 * is another cgroup), so every path the gateway and its helper build goes
 * through here: the result either fits whole or the call fails with
 * ENAMETOOLONG, naming the start of what did not fit. Only snprintf and
 * err_make; no state; any thread (not in a CLONE_VM child: err_make
 * allocates).
 */
#ifndef SBX_GATEWAY_RUNTIME_PATH_H
#define SBX_GATEWAY_RUNTIME_PATH_H

#include <stddef.h>

#include "common/err.h"

/* Formats into buf (cap bytes) as snprintf does. Returns the length, or -1
 * with *err (ENAMETOOLONG when it does not fit; err may be NULL) and
 * errno set; buf then holds "" (never a cut path). */
int sbx_path_fmt (char *buf, size_t cap, err_t *err, const char *fmt, ...) __attribute__ ((format (printf, 4, 5)));

#endif
