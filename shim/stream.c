/* stream: a blocking content reader run on workers, a piece at a time,
 * behind a non-blocking one that MHD calls (see stream.h). State: one
 * bridge per streamed answer. Its fields are written by the worker only
 * while the connection is suspended and read by MHD only after the
 * resume (MHD's own locking orders the two). */
#include "shim/stream.h"

#include <stdlib.h>
#include <string.h>

#include "shim/workers.h"

struct shim_stream_s
{
  MHD_ContentReaderCallback read;
  MHD_ContentReaderFreeCallback free_cb;
  void *cls;
  struct MHD_Connection *conn;
  shim_req_t *req; /* until the answer is queued (for the prefetch), else NULL */
  uint64_t size;   /* announced, or MHD_SIZE_UNKNOWN */
  char *buf;
  size_t block, len, off;
  uint64_t pos; /* bytes the reader gave so far */
  ssize_t end;  /* 0, or the reader's end (END_OF_STREAM, END_WITH_ERROR) */
  shim_work_t work;
  worker_job_t job;
};

/* One call of the route's reader (on a worker). */
static void
fill (shim_stream_t *s)
{
  if (s->buf == NULL)
    s->buf = malloc (s->block);
  ssize_t n = s->buf != NULL ? s->read (s->cls, s->pos, s->buf, s->block) : MHD_CONTENT_READER_END_WITH_ERROR;
  if (n > 0)
    {
      s->len = (size_t) n;
      s->off = 0;
      s->pos += (uint64_t) n;
    }
  else /* the readers never answer 0 (they block until there is data) */
    s->end = n < 0 ? n : MHD_CONTENT_READER_END_OF_STREAM;
}

static void
fill_job (void *arg)
{
  shim_stream_t *s = arg;
  fill (s);
  shim_work_done (s->conn, &s->work);
}

static void
fill_expired (void *arg)
{
  shim_stream_t *s = arg;
  s->end = MHD_CONTENT_READER_END_WITH_ERROR;
  shim_work_done (s->conn, &s->work);
}

/* MHD's reader (an event thread): from the buffer, else suspend and fill. */
static ssize_t
bridge_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  (void) pos;
  shim_stream_t *s = cls;
  if (!shim_called_back (&s->work))
    return 0; /* its worker reads: nothing yet */
  if (s->off < s->len)
    {
      size_t k = s->len - s->off < max ? s->len - s->off : max;
      memcpy (buf, s->buf + s->off, k);
      s->off += k;
      return (ssize_t) k;
    }
  if (s->end != 0)
    return s->end;
  s->job = (worker_job_t){.run = fill_job, .expire = fill_expired, .arg = s};
  shim_suspend (s->conn, &s->work);
  if (workers_submit (&s->job) < 0)
    {
      s->end = MHD_CONTENT_READER_END_WITH_ERROR;
      shim_work_done (s->conn, &s->work);
      shim_called_back (&s->work);
    }
  return 0;
}

static void
bridge_free (void *cls)
{
  shim_stream_t *s = cls;
  shim_called_back (&s->work);
  if (s->req != NULL && s->req->stream == s)
    s->req->stream = NULL;
  if (s->free_cb != NULL)
    s->free_cb (s->cls);
  free (s->buf);
  free (s);
}

struct MHD_Response *
shim_stream_response (shim_req_t *r, uint64_t size, size_t block, MHD_ContentReaderCallback read, void *cls,
                      MHD_ContentReaderFreeCallback free_cb)
{
  shim_stream_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return NULL;
  *s = (shim_stream_t){.read = read,
                       .free_cb = free_cb,
                       .cls = cls,
                       .conn = r->conn,
                       .req = r,
                       .size = size,
                       .block = block > 0 ? block : 4096};
  struct MHD_Response *resp = MHD_create_response_from_callback (size, s->block, bridge_read, s, bridge_free);
  if (resp == NULL)
    {
      free (s);
      return NULL;
    }
  r->stream = s;
  return resp;
}

void
shim_stream_prefetch (shim_req_t *r)
{
  shim_stream_t *s = r->stream;
  if (s != NULL && s->size != 0 && s->len == 0 && s->end == 0)
    fill (s);
}

void
shim_stream_detach (shim_req_t *r)
{
  if (r->stream != NULL)
    r->stream->req = NULL;
  r->stream = NULL;
}
