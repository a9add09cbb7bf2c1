/* routes/reuse: an answer made by asking the gateways, reused for a while.
 *
 * /health and /ready need no token, so a flood of them must not become a
 * flood of gateway calls, nor of workers waiting for one. One request at a
 * time asks (on its worker, within the calls' own deadlines); the others
 * meanwhile take the last answer at once. Only before the first answer do
 * they wait for it (once per process, bounded by those deadlines).
 */
#ifndef SHIM_ROUTES_REUSE_H
#define SHIM_ROUTES_REUSE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct shim_reuse_s
{
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t reuse_ns; /* how long an answer is reused */
  int64_t at_ns;    /* under mu: when the last answer was made, -1 never */
  bool asking;      /* under mu: a request is asking */
  void *last;       /* under mu: the last answer, `size` bytes */
  size_t size;
} shim_reuse_t;

#define SHIM_REUSE_INIT(ms, last_var)                                                                                \
  {                                                                                                                  \
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, (int64_t) (ms) *1000000, -1, false, &(last_var),            \
        sizeof (last_var)                                                                                            \
  }

/* Fills `answer` (`r->size` bytes): the last answer when it is younger than
 * the reuse time or another request is asking, else `ask`'s (which is kept
 * for the next ones). */
void shim_reuse (shim_reuse_t *r, void (*ask) (void *answer), void *answer);

#endif
