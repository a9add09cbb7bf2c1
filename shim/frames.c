/* frames: reading a Forward call's frames in place (see frames.h). */
#include "shim/frames.h"

#include <errno.h>
#include <string.h>

#include "common/rpc/rpc.h"

/* ForwardFrame's `data` field's key (field 3, length-delimited). */
#define DATA_KEY 0x1a
/* The key and the longest varint length. */
#define HEAD_MAX 11

bool
frames_data_only (const grpc_byte_buffer *bb, size_t *off, size_t *len)
{
  if (bb->type != GRPC_BB_RAW || bb->data.raw.compression != GRPC_COMPRESS_NONE)
    return false;
  /* The key and the length, which may be split across slices. */
  uint8_t head[HEAD_MAX];
  size_t n = 0;
  const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
  for (size_t i = 0; i < sb->count && n < sizeof head; i++)
    {
      size_t k = GRPC_SLICE_LENGTH (sb->slices[i]);
      if (k > sizeof head - n)
        k = sizeof head - n;
      memcpy (head + n, GRPC_SLICE_START_PTR (sb->slices[i]), k);
      n += k;
    }
  if (n < 2 || head[0] != DATA_KEY)
    return false;
  uint64_t v = 0;
  for (size_t i = 1; i < n; i++)
    {
      v |= (uint64_t) (head[i] & 0x7f) << (7 * (i - 1));
      if ((head[i] & 0x80) == 0)
        {
          /* The data must run to the frame's end: nothing else in it. */
          if (v != sb->length - (i + 1))
            return false;
          *off = i + 1;
          *len = (size_t) v;
          return true;
        }
    }
  return false;
}

void
frames_drop (frames_t *f)
{
  if (f->raw != NULL)
    grpc_byte_buffer_destroy (f->raw);
  if (f->msg != NULL)
    protobuf_c_message_free_unpacked (&f->msg->base, NULL);
  f->raw = NULL;
  f->msg = NULL;
  f->left = 0;
  f->in = NULL;
  f->in_len = f->in_off = 0;
}

int
frames_take (frames_t *f, grpc_byte_buffer *bb, bool *close_write, bool *connected, err_t *err)
{
  frames_drop (f);
  bool cw = false, conn = false;
  size_t off = 0, len = 0;
  if (frames_data_only (bb, &off, &len))
    {
      f->raw = bb;
      f->left = len;
      const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
      /* The slice the data begins in (GRPC_SLICE_LENGTH reads its argument
       * more than once: no side effects in it). */
      size_t i = 0;
      for (; i < sb->count && off >= GRPC_SLICE_LENGTH (sb->slices[i]); i++)
        off -= GRPC_SLICE_LENGTH (sb->slices[i]);
      f->slice = i;
      f->slice_off = off;
    }
  else
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_unpack (bb, &sandbox__v1__forward_frame__descriptor, SIZE_MAX, &m, err);
      grpc_byte_buffer_destroy (bb);
      if (rc < 0)
        return -1;
      f->msg = (Sandbox__V1__ForwardFrame *) m;
      f->in = f->msg->data.data;
      f->in_len = f->msg->data.len;
      cw = f->msg->close_write;
      conn = f->msg->connected;
    }
  if (close_write != NULL)
    *close_write = cw;
  if (connected != NULL)
    *connected = conn;
  return 0;
}

/* Moves to the next piece of a raw frame's data: false when none is left. */
static bool
raw_piece (frames_t *f)
{
  const grpc_slice_buffer *sb = &f->raw->data.raw.slice_buffer;
  while (f->left > 0 && f->slice < sb->count)
    {
      const grpc_slice *sl = &sb->slices[f->slice];
      size_t k = GRPC_SLICE_LENGTH (*sl) - f->slice_off;
      const uint8_t *p = GRPC_SLICE_START_PTR (*sl) + f->slice_off;
      f->slice++;
      f->slice_off = 0;
      if (k == 0)
        continue;
      if (k > f->left)
        k = f->left;
      f->in = p;
      f->in_len = k;
      f->in_off = 0;
      f->left -= k;
      return true;
    }
  return false;
}

size_t
frames_next (frames_t *f, const uint8_t **p, size_t max)
{
  if (f->in_off == f->in_len && !(f->raw != NULL && raw_piece (f)))
    return 0;
  size_t k = f->in_len - f->in_off < max ? f->in_len - f->in_off : max;
  *p = f->in + f->in_off;
  f->in_off += k;
  return k;
}

bool
frames_buffered (const frames_t *f)
{
  return f->in_off < f->in_len || f->left > 0;
}

void
frames_unread (frames_t *f, size_t n)
{
  f->in_off -= n < f->in_off ? n : f->in_off;
}
