/* cleanup: scope-bound resource helpers (__attribute__((cleanup))).
 *
 * Variables start at a sentinel (NULL, -1) and are released when they go out
 * of scope, so every early return is leak-free by construction; take_ptr and
 * take_fd hand ownership out of the scope. Header-only; no state.
 */
#ifndef SBX_COMMON_CLEANUP_H
#define SBX_COMMON_CLEANUP_H

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static inline void
cleanup_free_fn (void *p)
{
  free (*(void **) p);
}

static inline void
cleanup_close_fn (int *fd)
{
  if (*fd >= 0)
    {
      int saved = errno;
      close (*fd);
      errno = saved;
    }
}

static inline void
cleanup_pipe_fn (int (*fds)[2])
{
  cleanup_close_fn (&(*fds)[0]);
  cleanup_close_fn (&(*fds)[1]);
}

/* A child process: killed (SIGKILL) and reaped when the scope ends, unless
 * take_pid handed it out. */
static inline void
cleanup_pid_fn (pid_t *pid)
{
  if (*pid > 0)
    {
      int saved = errno;
      kill (*pid, SIGKILL);
      while (waitpid (*pid, NULL, 0) < 0 && errno == EINTR)
        ;
      errno = saved;
    }
}

#define cleanup_free __attribute__ ((cleanup (cleanup_free_fn)))
#define cleanup_close __attribute__ ((cleanup (cleanup_close_fn)))
/* For `int p[2]` pipes and socket pairs: both ends closed. */
#define cleanup_pipe __attribute__ ((cleanup (cleanup_pipe_fn)))
#define cleanup_pid __attribute__ ((cleanup (cleanup_pid_fn)))

/* Returns *pp and sets it to NULL: ownership leaves the scope. `pp` must
 * point to a pointer: the unevaluated `0 ? *(pp) :` arm makes anything
 * else (a pointer to an int, the pointer itself) a compile error
 * (pointer/integer mismatch, or no `*` to apply), as bubblewrap's
 * steal_pointer does. */
static inline void *
take_ptr_impl (void *pp)
{
  void **p = (void **) pp;
  void *v = *p;
  *p = NULL;
  return v;
}
#define take_ptr(pp) (0 ? *(pp) : take_ptr_impl ((void *) (pp)))

/* Returns *pid and sets it to -1: the caller reaps it. */
static inline pid_t
take_pid (pid_t *pid)
{
  pid_t v = *pid;
  *pid = -1;
  return v;
}

/* Returns *fd and sets it to -1. */
static inline int
take_fd (int *fd)
{
  int v = *fd;
  *fd = -1;
  return v;
}

#ifndef TEMP_FAILURE_RETRY
#define TEMP_FAILURE_RETRY(expr)                                                                                     \
  ({                                                                                                                 \
    long _r;                                                                                                         \
    do                                                                                                               \
      _r = (long) (expr);                                                                                            \
    while (_r == -1L && errno == EINTR);                                                                             \
    _r;                                                                                                              \
  })
#endif

#endif
