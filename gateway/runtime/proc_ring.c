/* runtime/proc_ring: the ring buffer of one stream of a detached process
 * (see proc_ring.h). No locking: proc.c holds proc_mu around every call. */
#include <string.h>
#include <sys/mman.h>

#include "gateway/runtime/proc_ring.h"

void
sbx_ring_put (sbx_ring_t *r, const uint8_t *data, size_t len)
{
  if (r->buf == NULL)
    {
      r->total += len;
      return;
    }
  if (len > r->cap)
    {
      r->total += len - r->cap;
      data += len - r->cap;
      len = r->cap;
    }
  size_t at = (size_t) (r->total % r->cap);
  size_t first = len < r->cap - at ? len : r->cap - at;
  memcpy (r->buf + at, data, first);
  memcpy (r->buf, data + first, len - first);
  r->total += len;
}

size_t
sbx_ring_kept (const sbx_ring_t *r)
{
  if (r->buf == NULL)
    return 0;
  return r->total < r->cap ? (size_t) r->total : r->cap;
}

size_t
sbx_ring_get (const sbx_ring_t *r, uint64_t *off, uint8_t *out, size_t cap)
{
  uint64_t oldest = r->total - sbx_ring_kept (r);
  if (*off < oldest)
    *off = oldest;
  size_t n = (size_t) (r->total - *off) < cap ? (size_t) (r->total - *off) : cap;
  for (size_t done = 0; done < n;)
    {
      size_t at = (size_t) ((*off + done) % r->cap);
      size_t k = n - done < r->cap - at ? n - done : r->cap - at;
      memcpy (out + done, r->buf + at, k);
      done += k;
    }
  *off += n;
  return n;
}

uint64_t
sbx_ring_dropped (const sbx_ring_t *r)
{
  return r->total - sbx_ring_kept (r);
}

void
sbx_ring_release (sbx_ring_t *r)
{
  if (r->buf != NULL)
    munmap (r->buf, r->cap);
  r->buf = NULL;
}

int
sbx_ring_map (sbx_ring_t *r)
{
  void *m = mmap (NULL, r->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return -1;
  r->buf = m;
  return 0;
}
