/* snapshot/drain: persisting every live sandbox when the gateway shuts down
 * (SANDBOX_PERSIST_ON_SHUTDOWN), a few at a time, before a deadline.
 *
 * snap_drain() lists the live sandboxes and persists each to the store
 * (snap_persist) on SNAP_DRAIN_WORKERS threads, the smallest first (the
 * disk each uses; equal ones, the most recently used first), so that one
 * large sandbox does not starve many small ones.
 *
 * Each persist has its own share of the grace: what was left of it when
 * the persist began, times the workers, divided by the workers plus the
 * sandboxes still waiting (at least SNAP_DRAIN_MIN_SHARE_MS). A persist
 * that outlives its share while others wait is cancelled (outcome failed,
 * reason "share"), and its worker moves on; as the queue empties the
 * shares grow, and with nothing waiting a persist may use all the grace
 * left. A slow sandbox (much data, a slow store, a walk that finds
 * nothing to send) never holds the others back. At the deadline the
 * persists still running are cancelled (the store makes an object visible
 * only once it is complete, so none is left half written), the store's
 * requests under way are cancelled, and sandboxes whose persist has not
 * begun are skipped. Every sandbox's outcome is logged on a line of its
 * own ("outcome": persisted, with its bytes and milliseconds; deleted, when
 * the sandbox went meanwhile; failed, with the error: its unsaved work is
 * lost), then a summary. It deletes nothing: the caller deletes the
 * sandboxes afterwards, as it does without it.
 *
 * A stale copy is not persisted (outcome "stale"): one whose stored
 * snapshot another gateway has written since this copy was restored from
 * it or persisted it (snap_copy_stale): a copy left behind when its id
 * moved to another gateway (one added, or this one back after failing its
 * health checks), which must not replace the newer snapshot of the copy
 * that was served.
 *
 * A sandbox deleted while it is persisted (a Delete call still in flight)
 * stops its persist through the runtime, and nothing is committed for it:
 * that is the "deleted" outcome, not a failure.
 *
 * The drain returns by the deadline plus SNAP_DRAIN_STOP_MARGIN_MS: the
 * persists it stopped end within it (the export checks for cancellation
 * in every loop; the store cancels its requests); one that does not is
 * logged and left behind rather than joined.
 *
 * Threading: called once, from the thread that shuts the gateway down; it
 * starts its workers and joins them (or, past the margin, detaches them)
 * before it returns. The runtime and the
 * store are thread-safe.
 */
#ifndef SBX_GATEWAY_SNAPSHOT_DRAIN_H
#define SBX_GATEWAY_SNAPSHOT_DRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/runtime/runtime.h"
#include "gateway/store/store.h"

/* Persists at once. Each holds a few MiB of buffers (the export's, and a
 * GCS writer's chunk, SANDBOX_GCS_CHUNK_MB) at a time when memory is
 * already spoken for by the sandboxes. With bench/drain on 2 CPUs and a
 * local store, 100 sandboxes of 1 MiB took 590, 310, 170 and 160-215 ms
 * with 1, 2, 4 and 8 workers, and 20 of 50 MiB 1300, 1010, 750 and 820 ms:
 * four, past which it gained nothing there. A remote store (GCS) may gain
 * from more at once (not measured), at the cost of more memory. */
#define SNAP_DRAIN_WORKERS 4

/* The least share of the grace a persist gets before it is stopped for the
 * sandboxes still waiting (see snap_drain). */
#define SNAP_DRAIN_MIN_SHARE_MS 1000

/* How long past the grace the drain waits for the persists it stopped to
 * end; one still running then is left behind, and the shutdown goes on. */
#define SNAP_DRAIN_STOP_MARGIN_MS 2000

typedef struct snap_drain_result_s
{
  size_t sandboxes; /* live when the drain began */
  size_t persisted;
  size_t deleted;     /* gone meanwhile (deleted by a call in flight) */
  size_t stale;       /* copies another gateway's snapshot has superseded: not persisted */
  size_t failed;      /* failed, cancelled at the deadline, or never begun */
  uint64_t bytes;     /* stored in all */
  size_t left_behind; /* persists that did not stop within the margin (still running) */
  int64_t elapsed_ms;
} snap_drain_result_t;

/* Persists every live sandbox of `rt` to `store` until `deadline_ms`
 * (CLOCK_MONOTONIC, in milliseconds), as above; *res (may be NULL) says
 * how it went. */
void snap_drain (sbx_runtime_t *rt, snap_store_t *store, int64_t deadline_ms, snap_drain_result_t *res);

/* CLOCK_MONOTONIC in milliseconds, the clock of snap_drain's deadline. */
int64_t snap_drain_now_ms (void);

#endif
