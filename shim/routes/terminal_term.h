/* routes/terminal_term: one terminal's state (term_t), shared by the
 * socket side (terminal.c) and the pump (terminal_pump.c). Private to
 * shim/routes/terminal*.c. Threading: as terminal.c says.
 */
#ifndef SBX_SHIM_ROUTES_TERMINAL_TERM_H
#define SBX_SHIM_ROUTES_TERMINAL_TERM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc/rpc.h"
#include "shim/shim.h"
#include "shim/ws.h"

/* Output taken from the gateway and not yet handed to the socket. */
#define TERMINAL_MAX_BUFFERED (1024 * 1024)

typedef struct chunk_s
{
  struct chunk_s *next;
  bool text;
  size_t len;
  uint8_t data[];
} chunk_t;

typedef struct term_s
{
  rpc_client_call_t *call;
  bool call_visible; /* under reg_mu: terminal_stop_all may cancel it */
  char sandbox_id[SHIM_ID_MAX + 1], process_id[SHIM_ID_MAX + 1];
  int wake_fd; /* eventfd: output queued, or the shim is stopping */
  int64_t start_ns;
  /* After the upgrade (the socket thread owns the terminal from then on). */
  struct MHD_UpgradeResponseHandle *urh;
  ws_t *ws;
  pthread_t pump;
  bool pump_started;
  bool input_failed; /* a send failed: the call has ended */
  /* Between pump and socket thread, under mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  chunk_t *head, *tail;
  size_t buffered;
  bool ended;   /* the pump saw the end of the gateway's stream */
  bool exited;  /* an exit event came */
  bool closing; /* the socket side is done: the pump stops waiting for room */
  /* The registry, under reg_mu. */
  struct term_s *prev, *next;
} term_t;

/* Wakes the socket thread (its eventfd). */
void terminal_wake (term_t *t);

/* The pump thread (arg: the term_t): the call's receiver. ProcessEvents
 * become chunks queued for the socket thread (at most
 * TERMINAL_MAX_BUFFERED bytes: a full queue holds the pump back); sets
 * `ended` (and `exited`) at the stream's end. */
void *terminal_pump (void *arg);

#endif
