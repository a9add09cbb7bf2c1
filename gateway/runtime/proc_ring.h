/* runtime/proc_ring: the ring buffer of one stream of a detached process:
 * the newest `cap` bytes of its output, in one mapping of exactly `cap`
 * bytes made when asked (sbx_ring_map, at the first output) and never
 * grown, so the memory a ring holds is the pages written into it and
 * comes back whole when it is released. No locking (proc.c's proc_mu). */
#ifndef SBX_GATEWAY_RUNTIME_PROC_RING_H
#define SBX_GATEWAY_RUNTIME_PROC_RING_H

#include <stddef.h>
#include <stdint.h>

typedef struct sbx_ring_s
{
  uint8_t *buf;   /* a mapping of `cap` bytes once output came; NULL: none kept */
  size_t cap;     /* SANDBOX_PROCESS_BUFFER_BYTES */
  uint64_t total; /* bytes ever written */
} sbx_ring_t;

/* Maps the ring's `cap` bytes: 0, or -1 (nothing kept then). */
int sbx_ring_map (sbx_ring_t *r);
/* Appends `len` bytes (only counted while unmapped). */
void sbx_ring_put (sbx_ring_t *r, const uint8_t *data, size_t len);
/* How many of the newest bytes it keeps. */
size_t sbx_ring_kept (const sbx_ring_t *r);
/* Copies what a reader at *off has not read yet (at most cap bytes); a
 * reader the ring overtook skips to its oldest byte. */
size_t sbx_ring_get (const sbx_ring_t *r, uint64_t *off, uint8_t *out, size_t cap);
/* Bytes written but no longer kept. */
uint64_t sbx_ring_dropped (const sbx_ring_t *r);
/* Unmaps it: what it kept counts as dropped from now on. */
void sbx_ring_release (sbx_ring_t *r);

#endif
