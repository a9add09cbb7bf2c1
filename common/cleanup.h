/* cleanup: scope-bound resource helpers (__attribute__((cleanup))).
 *
 * Variables start at a sentinel (NULL, -1) and are released when they go out
 * of scope, so every early return is leak-free by construction; take_ptr and
 * take_fd hand ownership out of the scope. Header-only; no state.
 */
#ifndef SBX_COMMON_CLEANUP_H
#define SBX_COMMON_CLEANUP_H

#include <errno.h>
#include <stdlib.h>
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

#define cleanup_free __attribute__ ((cleanup (cleanup_free_fn)))
#define cleanup_close __attribute__ ((cleanup (cleanup_close_fn)))

/* Returns *pp and sets it to NULL: ownership leaves the scope. */
static inline void *
take_ptr_impl (void *pp)
{
  void **p = (void **) pp;
  void *v = *p;
  *p = NULL;
  return v;
}
#define take_ptr(pp) take_ptr_impl ((void *) (pp))

/* Returns *fd and sets it to -1. */
static inline int
take_fd (int *fd)
{
  int v = *fd;
  *fd = -1;
  return v;
}

#ifndef TEMP_FAILURE_RETRY
#define TEMP_FAILURE_RETRY(expr)                                                                   \
  ({                                                                                               \
    long _r;                                                                                       \
    do                                                                                             \
      _r = (long) (expr);                                                                          \
    while (_r == -1L && errno == EINTR);                                                           \
    _r;                                                                                            \
  })
#endif

#endif
