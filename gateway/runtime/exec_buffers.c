/* runtime/exec_buffers: the buffers exec and file output is read into and
 * lent to sinks without a copy (sbx_exec_hold / sbx_exec_release), and the
 * gateway-wide count of what exec output holds beyond each exec's first
 * buffer (sbx_config_t.exec_buffer_total_bytes). Reference counts and the
 * count are atomic: a buffer is released on whichever thread gRPC drops
 * it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"

/* Bytes of exec output buffers beyond each exec's first one, in the whole
 * gateway: held to sbx_config_t.exec_buffer_total_bytes. A buffer may
 * outlive its exec and the runtime (gRPC drops its last reference), so the
 * count is the process's, not a runtime's. */
static atomic_size_t exec_charged;

static sbx_outbuf_t *
outbuf_of (const uint8_t *data)
{
  return (sbx_outbuf_t *) (void *) ((uint8_t *) data - offsetof (sbx_outbuf_t, data));
}

void
sbx_exec_hold (const uint8_t *data)
{
  atomic_fetch_add (&outbuf_of (data)->refs, 1);
}

void
sbx_exec_release (const uint8_t *data)
{
  sbx_outbuf_t *b = outbuf_of (data);
  if (atomic_fetch_sub (&b->refs, 1) == 1)
    {
      if (b->charged > 0)
        atomic_fetch_sub (&exec_charged, b->charged);
      free (b);
    }
}

size_t
sbx_exec_buffered_bytes (void)
{
  return atomic_load (&exec_charged);
}

sbx_outbuf_t *
sbx_outbuf_new (size_t size, size_t charge, size_t limit)
{
  if (charge > 0)
    {
      size_t held = atomic_load (&exec_charged);
      do
        if (charge > limit || held > limit - charge)
          return NULL;
      while (!atomic_compare_exchange_weak (&exec_charged, &held, held + charge));
    }
  sbx_outbuf_t *b = malloc (sizeof *b + size);
  if (b == NULL)
    {
      atomic_fetch_sub (&exec_charged, charge);
      return NULL;
    }
  atomic_init (&b->refs, 1);
  b->cap = size;
  b->charged = charge;
  return b;
}

uint8_t *
sbx_outbufs_get (sbx_outbufs_t *p, size_t size)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (p->b[i] != NULL && atomic_load (&p->b[i]->refs) == 1)
      return p->b[i]->data;
  size_t slot = 0;
  while (slot < SBX_OUTBUFS - 1 && p->b[slot] != NULL)
    slot++;
  sbx_outbuf_t *b = sbx_outbuf_new (size, 0, 0);
  if (b == NULL)
    return NULL;
  if (p->b[slot] != NULL)
    sbx_exec_release (p->b[slot]->data);
  p->b[slot] = b;
  return b->data;
}

void
sbx_outbufs_free (sbx_outbufs_t *p)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (p->b[i] != NULL)
      {
        sbx_exec_release (p->b[i]->data);
        p->b[i] = NULL;
      }
}

/* Gives back the grown buffers no sink holds, and starts small again: the
 * client stalled, or the command is quiet. What a stalled exec holds is
 * then the one message in flight. */
void
sbx_exec_bufs_trim (sbx_exec_bufs_t *x)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (x->grown[i] != NULL && atomic_load (&x->grown[i]->refs) == 1)
      {
        sbx_exec_release (x->grown[i]->data);
        x->grown[i] = NULL;
      }
  x->want = SBX_EXEC_BUF_FIRST;
}

/* A buffer no sink holds, to read output into: one of `want` bytes when
 * one is free or the gateway's total has room for a new one, else the
 * first (reads go on, smaller); NULL when none is free. */
sbx_outbuf_t *
sbx_exec_bufs_get (sbx_exec_bufs_t *x)
{
  if (x->want > SBX_EXEC_BUF_FIRST)
    {
      size_t empty = SBX_OUTBUFS;
      for (size_t i = 0; i < SBX_OUTBUFS; i++)
        {
          sbx_outbuf_t *b = x->grown[i];
          if (b != NULL && atomic_load (&b->refs) == 1 && b->cap == x->want)
            return b;
          if (b != NULL && atomic_load (&b->refs) == 1)
            {
              /* Free, and outgrown: its room goes back. */
              sbx_exec_release (b->data);
              x->grown[i] = b = NULL;
            }
          if (b == NULL && empty == SBX_OUTBUFS)
            empty = i;
        }
      size_t total = x->total;
      sbx_outbuf_t *b = empty < SBX_OUTBUFS ? sbx_outbuf_new (x->want, x->want, total) : NULL;
      if (b != NULL)
        return x->grown[empty] = b;
    }
  if (x->first == NULL)
    x->first = sbx_outbuf_new (SBX_EXEC_BUF_FIRST, 0, 0);
  if (x->first != NULL && atomic_load (&x->first->refs) == 1)
    return x->first;
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (x->grown[i] != NULL && atomic_load (&x->grown[i]->refs) == 1)
      return x->grown[i];
  return NULL;
}

void
sbx_exec_bufs_free (sbx_exec_bufs_t *x)
{
  for (size_t i = 0; i < SBX_OUTBUFS; i++)
    if (x->grown[i] != NULL)
      {
        sbx_exec_release (x->grown[i]->data);
        x->grown[i] = NULL;
      }
  if (x->first != NULL)
    {
      sbx_exec_release (x->first->data);
      x->first = NULL;
    }
}
