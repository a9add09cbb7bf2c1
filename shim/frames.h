/* frames: the bytes a Forward call brings, frame by frame, read where gRPC
 * received them.
 *
 * A ForwardFrame that carries `data` and nothing else — every data frame
 * the gateway sends — is not decoded: its bytes are read in place from the
 * received buffer's slices, so they are copied once, to where they go. Any
 * other frame is decoded (protobuf-c) and its data read from the message.
 *
 * Threading: one reader at a time; no state beyond the struct.
 */
#ifndef SBX_SHIM_FRAMES_H
#define SBX_SHIM_FRAMES_H

#include <grpc/grpc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "sandbox/v1/sandbox.pb-c.h"

typedef struct frames_s
{
  /* The current frame: in place, or decoded. */
  grpc_byte_buffer *raw;
  Sandbox__V1__ForwardFrame *msg;
  size_t slice;     /* raw: the next slice */
  size_t slice_off; /* ... and where its data begins */
  size_t left;      /* raw: data bytes not yet in a piece */
  /* The piece being read. */
  const uint8_t *in;
  size_t in_len, in_off;
} frames_t;

/* When `bb` holds a ForwardFrame with `data` alone, the offset of the
 * data's bytes in it and their count; else false. */
bool frames_data_only (const grpc_byte_buffer *bb, size_t *off, size_t *len);

/* Makes `bb` (taken over, also on failure) the current frame, dropping the
 * last one. -1 with EINVAL when it does not decode. *close_write and
 * *connected (may be NULL) say what else the frame carries. */
int frames_take (frames_t *f, grpc_byte_buffer *bb, bool *close_write, bool *connected, err_t *err);

/* Up to `max` next bytes of the current frame's data at *p (valid until
 * the frame is dropped): their count, 0 when the frame has no more. */
size_t frames_next (frames_t *f, const uint8_t **p, size_t max);

/* True when the current frame has data not yet read. */
bool frames_buffered (const frames_t *f);

/* Gives back the `n` bytes last returned by frames_next (n at most that
 * many), to be read again. */
void frames_unread (frames_t *f, size_t n);

/* Drops the current frame. */
void frames_drop (frames_t *f);

#endif
