/* image/gate: who may touch the image cache at once.
 *
 * Pulls run side by side, each holding the gate shared. A key — a
 * reference being pulled, a layer being fetched and unpacked — is held by
 * one pull at a time: a second pull of the same reference waits and then
 * finds it cached, a second image with the same uncached layer waits for
 * that layer and then finds it in place. Removing an image and evicting
 * take the gate exclusively, so no layer a pull is making (not yet named
 * by a record) can be swept as unnamed; a waiting exclusive holder keeps
 * new pulls out until it is done (no starvation). Every wait has its
 * caller's deadline (CLOCK_MONOTONIC ms): ETIMEDOUT past it.
 *
 * Threading: any thread; state under the gate's mutex.
 */
#ifndef SBX_GATEWAY_IMAGE_GATE_H
#define SBX_GATEWAY_IMAGE_GATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct img_gate_s
{
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t shared;         /* pulls inside */
  bool exclusive;        /* a removal or an eviction inside */
  size_t want_exclusive; /* waiting for it */
  char **keys;           /* held keys */
  size_t n_keys, cap_keys;
} img_gate_t;

void img_gate_init (img_gate_t *g);
void img_gate_destroy (img_gate_t *g);

/* Enters shared. 0, or ETIMEDOUT. */
int img_gate_enter (img_gate_t *g, int64_t deadline_ms);
/* Leaves shared; true when it was the last pull inside and the gate was
 * then taken exclusively for the caller (end it with img_gate_end). */
bool img_gate_leave_last (img_gate_t *g);

/* Holds `key` (copied) until img_gate_release. 0, ETIMEDOUT, ENOMEM. */
int img_gate_claim (img_gate_t *g, const char *key, int64_t deadline_ms);
void img_gate_release (img_gate_t *g, const char *key);

/* Takes the gate exclusively. 0, or ETIMEDOUT. */
int img_gate_exclusive (img_gate_t *g, int64_t deadline_ms);
void img_gate_end (img_gate_t *g);

/* Now, CLOCK_MONOTONIC ms (for deadlines). */
int64_t img_gate_now_ms (void);

#endif
