/* stream: streamed answers whose bytes come from a blocking source (a
 * gateway stream, a sandbox's server), served from libmicrohttpd's event
 * threads, which must never block.
 *
 * A route hands its blocking content reader to shim_stream_response
 * instead of MHD_create_response_from_callback. The reader then runs on a
 * worker (workers.h), one piece at a time, into a buffer of the response's
 * block size; while it runs, the connection is suspended, and the worker
 * resumes it with the piece. MHD then sends it from the buffer. So the
 * reader sees the calls it always saw — in order, one at a time, never
 * after its free callback — only on a worker's thread; and a client that
 * does not read costs no thread (MHD asks for the next piece only when the
 * last is sent).
 *
 * The first piece is read at once, on the worker that ran the route
 * (shim_stream_prefetch), so a short answer costs no extra hop.
 *
 * Threading: shim_stream_response and shim_stream_prefetch on the worker
 * running the route; the rest is MHD's and the workers'.
 */
#ifndef SBX_SHIM_STREAM_H
#define SBX_SHIM_STREAM_H

#include <microhttpd.h>

#include "shim/shim.h"

typedef struct shim_stream_s shim_stream_t;

/* As MHD_create_response_from_callback (the same arguments, the same
 * ownership of `cls`: `free_cb` is called once the answer is done), for a
 * reader that may block. NULL when out of memory (`free_cb` not called).
 * Remembered in r->stream for the prefetch. */
struct MHD_Response *shim_stream_response (shim_req_t *r, uint64_t size, size_t block, MHD_ContentReaderCallback read,
                                           void *cls, MHD_ContentReaderFreeCallback free_cb);

/* Reads the first piece of r's streamed answer, if the route made one. */
void shim_stream_prefetch (shim_req_t *r);

/* The answer is queued: r's state may be freed before the stream is. */
void shim_stream_detach (shim_req_t *r);

#endif
