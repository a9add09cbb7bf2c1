/* err: the one error type of the project's own code.
 *
 * In the style of crun's libcrun_error_t: an error is a status (an errno
 * value) plus an allocated, human-readable message that names the thing and
 * the reason ("open `/x`: No such file or directory"). Functions that can fail
 * return int (0 ok, negative on error) and take `err_t *err` last; on failure
 * they fill *err and return the negative value err_make() gives back, so call
 * sites stay one line:
 *
 *     if (fd < 0)
 *       return err_make (err, errno, "open `%s`", path);
 *
 * The status is mapped to a gRPC status or an HTTP status only at the outer
 * edge (rpc_status_from_errno, the shim's route table).
 *
 * Thread safety: an err_t belongs to one thread; the functions keep no state.
 */
#ifndef SBX_COMMON_ERR_H
#define SBX_COMMON_ERR_H

#include <stdarg.h>

typedef struct err_s
{
  int status; /* errno value; 0 when no error */
  char *msg;  /* owned; NULL when no error */
} err_t;

/* clang-format off */
#define ERR_INIT {0, NULL}
/* clang-format on */

/* Fills *err with `status` and the formatted message and returns -1.
 * Any previous content of *err is released first. `status` 0 is stored as
 * EIO so that a filled error is never mistaken for success. */
int err_make (err_t *err, int status, const char *fmt, ...) __attribute__ ((format (printf, 3, 4)));

/* As err_make, appending ": <strerror(status)>" to the message. */
int err_make_sys (err_t *err, int status, const char *fmt, ...) __attribute__ ((format (printf, 3, 4)));

/* Prefixes the message of an already filled *err with context:
 * "launch `a`: " + old message. Keeps the status. Returns -1. */
int err_wrap (err_t *err, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

/* Frees the message and resets *err to ERR_INIT. Safe on an empty err. */
void err_release (err_t *err);

/* The message, or "" for an empty error. The pointer stays owned by *err. */
const char *err_msg (const err_t *err);

/* An err_t released when its scope ends: `cleanup_err err_t e = ERR_INIT;`. */
static inline void
err_cleanup_ (err_t *e)
{
  err_release (e);
}
#define cleanup_err __attribute__ ((cleanup (err_cleanup_)))

#endif
