/* snapshot/export_stream: the stream side of an export (export.h) — the
 * buffers libarchive's output fills, handed in order to a thread of their
 * own that hashes them and gives them to the sink. State: per export only. */
#include "gateway/snapshot/export_internal.h"

#include <archive.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The stream side runs on a thread of its own: the walk fills a buffer
 * while the previous one is hashed and handed to the sink (a gRPC send, a
 * store upload), so reading files and hashing/sending overlap. Buffers go
 * round in order; the sink sees them in the order they were filled. A sink
 * may keep a buffer past its return (snap_export_hold: gRPC sends it without
 * a copy); it rejoins the round when the sink lets it go. */

static export_buf_t *
buf_of (const uint8_t *data)
{
  return (export_buf_t *) (void *) (data - offsetof (export_buf_t, data));
}

/* A buffer nobody holds any more: back on the free list, or freed once the
 * export is over (the last one frees the stream). st->mu held; returns
 * true when the stream itself was freed (and its mutex with it). */
static bool
buf_unheld_locked (export_stream_t *st, export_buf_t *b)
{
  if (!st->closed)
    {
      st->free_[st->n_free++] = b;
      pthread_cond_broadcast (&st->cv);
      return false;
    }
  free (b);
  if (--st->live > 0)
    return false;
  pthread_mutex_unlock (&st->mu);
  pthread_mutex_destroy (&st->mu);
  pthread_cond_destroy (&st->cv);
  err_release (&st->err);
  free (st);
  return true;
}

void
snap_export_hold (const uint8_t *data)
{
  export_buf_t *b = buf_of (data);
  pthread_mutex_lock (&b->st->mu);
  b->holds++;
  pthread_mutex_unlock (&b->st->mu);
}

void
snap_export_release (const uint8_t *data)
{
  export_buf_t *b = buf_of (data);
  export_stream_t *st = b->st;
  pthread_mutex_lock (&st->mu);
  if (--b->holds == 0 && buf_unheld_locked (st, b))
    return;
  pthread_mutex_unlock (&st->mu);
}

static void *
stream_main (void *arg)
{
  export_t *x = arg;
  export_stream_t *st = x->stream;
  pthread_mutex_lock (&st->mu);
  for (;;)
    {
      while (st->n_queued == 0 && !st->done)
        pthread_cond_wait (&st->cv, &st->mu);
      if (st->n_queued == 0)
        break;
      export_buf_t *b = st->queue[st->q_head];
      st->q_head = (st->q_head + 1) % EXPORT_BUFFERS;
      st->n_queued--;
      b->holds = 1;
      bool failed = st->failed;
      pthread_mutex_unlock (&st->mu);
      int rc = 0;
      if (!failed)
        {
          if (x->sha != NULL)
            EVP_DigestUpdate (x->sha, b->data, b->len);
          x->total += b->len;
          rc = x->sink (x->sink_ctx, b->data, b->len, &st->err);
        }
      pthread_mutex_lock (&st->mu);
      if (rc < 0)
        st->failed = true;
      if (--b->holds == 0)
        buf_unheld_locked (st, b); /* the export is running: never frees st */
      pthread_cond_broadcast (&st->cv);
    }
  pthread_mutex_unlock (&st->mu);
  return NULL;
}

/* Hands the current buffer to the stream thread and, unless `last`, takes
 * the next free one. -1 when the sink has failed or the export was told to
 * stop while it waited for a buffer its sink still held. */
static int
submit (export_t *x, bool last)
{
  export_stream_t *st = x->stream;
  pthread_mutex_lock (&st->mu);
  if (x->used > 0)
    {
      st->cur->len = x->used;
      st->queue[(st->q_head + st->n_queued) % EXPORT_BUFFERS] = st->cur;
      st->n_queued++;
      st->cur = NULL;
      pthread_cond_broadcast (&st->cv);
    }
  bool stopped = false;
  if (!last && st->cur == NULL)
    {
      /* A sink's held buffers come back when the consumer takes the
       * bytes; one that never does is stopped through `abort`, which is
       * looked at every 100 ms. */
      while (st->n_free == 0 && !st->failed && !(stopped = st->abort != NULL && atomic_load (st->abort)))
        {
          struct timespec until;
          clock_gettime (CLOCK_REALTIME, &until);
          until.tv_nsec += 100 * 1000 * 1000;
          if (until.tv_nsec >= 1000 * 1000 * 1000)
            {
              until.tv_sec++;
              until.tv_nsec -= 1000 * 1000 * 1000;
            }
          pthread_cond_timedwait (&st->cv, &st->mu, &until);
        }
      if (st->n_free > 0 && !st->failed && !stopped)
        st->cur = st->free_[--st->n_free];
    }
  bool failed = st->failed || stopped;
  pthread_mutex_unlock (&st->mu);
  x->used = 0;
  x->buf = st->cur != NULL ? st->cur->data : NULL;
  return failed || (!last && x->buf == NULL) ? -1 : 0;
}

int
export_stream_start (export_t *x, const atomic_bool *abort)
{
  export_stream_t *st = calloc (1, sizeof *st);
  if (st == NULL)
    return -1;
  x->stream = st;
  pthread_mutex_init (&st->mu, NULL);
  pthread_cond_init (&st->cv, NULL);
  st->err = (err_t) ERR_INIT;
  st->abort = abort;
  for (int i = 0; i < EXPORT_BUFFERS; i++)
    {
      export_buf_t *b = malloc (sizeof *b + x->chunk);
      if (b == NULL)
        return -1;
      b->st = st;
      b->holds = 0;
      st->live++;
      st->free_[st->n_free++] = b;
    }
  st->cur = st->free_[--st->n_free];
  x->buf = st->cur->data;
  if (pthread_create (&st->thread, NULL, stream_main, x) != 0)
    return -1;
  st->started = true;
  return 0;
}

/* Waits for the stream thread to send what is queued and stop; its error,
 * if any, becomes the export's. 0, or -1 when the sink failed. */
int
export_stream_finish (export_t *x)
{
  export_stream_t *st = x->stream;
  if (st == NULL)
    return 0;
  if (st->started)
    {
      pthread_mutex_lock (&st->mu);
      st->done = true;
      pthread_cond_broadcast (&st->cv);
      pthread_mutex_unlock (&st->mu);
      pthread_join (st->thread, NULL);
      st->started = false;
    }
  int rc = st->failed ? -1 : 0;
  if (st->failed && st->err.msg != NULL)
    {
      err_release (x->err);
      *x->err = st->err;
      st->err = (err_t) ERR_INIT;
    }
  return rc;
}

/* Finishes, frees every buffer nobody holds, and leaves those a sink still
 * holds to free themselves (and, the last of them, the stream). */
void
export_stream_release (export_t *x)
{
  export_stream_t *st = x->stream;
  if (st == NULL)
    return;
  export_stream_finish (x);
  x->stream = NULL;
  x->buf = NULL;
  pthread_mutex_lock (&st->mu);
  st->closed = true;
  if (st->cur != NULL)
    st->free_[st->n_free++] = st->cur;
  st->cur = NULL;
  for (size_t i = 0; i < st->n_queued; i++) /* left behind by a failed sink */
    st->free_[st->n_free++] = st->queue[(st->q_head + i) % EXPORT_BUFFERS];
  st->n_queued = 0;
  size_t n = st->n_free;
  st->n_free = 0;
  for (size_t i = 0; i < n; i++)
    if (buf_unheld_locked (st, st->free_[i]))
      return;
  if (st->live == 0) /* nothing was allocated, or start failed half-way */
    {
      pthread_mutex_unlock (&st->mu);
      pthread_mutex_destroy (&st->mu);
      pthread_cond_destroy (&st->cv);
      err_release (&st->err);
      free (st);
      return;
    }
  pthread_mutex_unlock (&st->mu);
}

la_ssize_t
export_write_cb (struct archive *a, void *ctx, const void *data, size_t len)
{
  export_t *x = ctx;
  if (x->failed)
    return -1;
  const uint8_t *p = data;
  size_t left = len;
  while (left > 0)
    {
      size_t n = x->chunk - x->used < left ? x->chunk - x->used : left;
      memcpy (x->buf + x->used, p, n);
      x->used += n;
      p += n;
      left -= n;
      if (x->used == x->chunk && submit (x, false) < 0)
        {
          x->failed = true;
          archive_set_error (a, ECANCELED, "the snapshot's consumer stopped");
          return -1;
        }
    }
  return (la_ssize_t) len;
}

int
export_close_cb (struct archive *a, void *ctx)
{
  export_t *x = ctx;
  if (!x->failed && (submit (x, true) < 0 || export_stream_finish (x) < 0))
    {
      x->failed = true;
      archive_set_error (a, ECANCELED, "the snapshot's consumer stopped");
      return ARCHIVE_FATAL;
    }
  return ARCHIVE_OK;
}
