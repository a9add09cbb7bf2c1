/* watchdog: libmicrohttpd's connection timeout is an idle timeout: a client that sends
 * one byte a second (slowloris) renews it forever and holds a connection
 * slot. A watchdog therefore bounds each stage of a request: the head must
 * arrive within SHIM_HEADER_TIMEOUT (which also closes idle keep-alive
 * connections), a JSON body within SHIM_BODY_TIMEOUT, and a streamed restore
 * body must keep an average of SHIM_MIN_UPLOAD_RATE after its first
 * SHIM_BODY_TIMEOUT. Offenders' sockets are shut down; their threads then
 * end the connection. While a route answers, the client is not timed, nor
 * ever again once the connection is upgraded to a WebSocket (terminals are
 * capped by SHIM_MAX_TERMINALS instead, and pinged).
 *
 * Near the connection cap (WATCHDOG_PRESSURE_NUM/DEN of
 * SHIM_MAX_CONNECTIONS open), connections waiting for a head — idle
 * keep-alive connections, and heads that are slow to come — are closed
 * first, the longest waiting first, down to WATCHDOG_RELIEF_NUM/DEN of the
 * cap: a request being answered is never cut for room. Only those that
 * have waited WATCHDOG_EVICT_AFTER_MS (a client that just connected gets
 * the time to send its head). Each new connection under pressure closes
 * one such connection at once (room is made as fast as clients come);
 * the watchdog's round brings the count back to the relief mark. Under pressure, answers also carry
 * `Connection: close` (server.c), so that a cheap request (/health) does
 * not keep its connection, and its thread, afterwards.
 */
#include "shim/watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "shim/shim.h"
#include "shim/workers.h"

typedef struct conn_track_s
{
  int fd;
  stage_t stage;
  int64_t since_ns;
  uint64_t body_bytes;
  bool streaming;
  bool cut;
  struct conn_track_s *prev, *next;
} conn_track_t;

/* Pressure begins at 7/8 of SHIM_MAX_CONNECTIONS open; eviction brings
 * the count back to 3/4. */
#define WATCHDOG_PRESSURE_NUM 7
#define WATCHDOG_PRESSURE_DEN 8
#define WATCHDOG_RELIEF_NUM 3
#define WATCHDOG_RELIEF_DEN 4
/* A connection waiting this long for a head may be closed for room. */
#define WATCHDOG_EVICT_AFTER_MS 1000

static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;
static conn_track_t *tracked;
static long n_tracked;           /* under track_mu */
static long n_cut;               /* of n_tracked, cut and not yet closed (under track_mu) */
static atomic_bool pressed;      /* near the cap: answers close their connections */
static conn_track_t **evict_buf; /* the candidates of one round (watchdog thread) */
static size_t evict_cap;

static conn_track_t *
track_of (struct MHD_Connection *conn)
{
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info (conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci != NULL ? ci->socket_context : NULL;
}

void
watchdog_stage (struct MHD_Connection *conn, stage_t stage, bool streaming)
{
  conn_track_t *t = track_of (conn);
  if (t == NULL)
    return;
  pthread_mutex_lock (&track_mu);
  if (t->stage == STAGE_UPGRADED)
    {
      /* MHD reports the upgraded request completed (server.c would start
       * timing the next head): a terminal is not an HTTP request. */
      pthread_mutex_unlock (&track_mu);
      return;
    }
  t->stage = stage;
  t->since_ns = shim_mono_ns ();
  t->body_bytes = 0;
  t->streaming = streaming;
  pthread_mutex_unlock (&track_mu);
}

void
watchdog_body (struct MHD_Connection *conn, size_t n)
{
  conn_track_t *t = track_of (conn);
  if (t == NULL)
    return;
  pthread_mutex_lock (&track_mu);
  t->body_bytes += n;
  pthread_mutex_unlock (&track_mu);
}

static void cut (conn_track_t *t);
static bool under_pressure (void);
static conn_track_t *longest_waiting (int64_t now);

void
watchdog_notify_connection (void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode code)
{
  if (code == MHD_CONNECTION_NOTIFY_STARTED)
    {
      conn_track_t *t = calloc (1, sizeof *t);
      if (t == NULL)
        return;
      const union MHD_ConnectionInfo *ci = MHD_get_connection_info (conn, MHD_CONNECTION_INFO_CONNECTION_FD);
      t->fd = ci != NULL ? ci->connect_fd : -1;
      t->stage = STAGE_HEAD;
      t->since_ns = shim_mono_ns ();
      pthread_mutex_lock (&track_mu);
      t->next = tracked;
      if (tracked != NULL)
        tracked->prev = t;
      tracked = t;
      n_tracked++;
      if (under_pressure ())
        {
          conn_track_t *victim = longest_waiting (t->since_ns);
          if (victim != NULL)
            cut (victim);
        }
      pthread_mutex_unlock (&track_mu);
      *socket_context = t;
      return;
    }
  conn_track_t *t = *socket_context;
  if (t == NULL)
    return;
  pthread_mutex_lock (&track_mu);
  if (t->prev != NULL)
    t->prev->next = t->next;
  else
    tracked = t->next;
  if (t->next != NULL)
    t->next->prev = t->prev;
  n_tracked--;
  n_cut -= t->cut;
  under_pressure ();
  pthread_mutex_unlock (&track_mu);
  free (t);
  *socket_context = NULL;
}

bool
watchdog_pressed (void)
{
  return atomic_load (&pressed);
}

/* Under track_mu: shuts `t` down (its thread ends the connection). */
static void
cut (conn_track_t *t)
{
  t->cut = true;
  n_cut++;
  shutdown (t->fd, SHUT_RDWR);
}

/* Under track_mu: whether the open connections are near the cap (and
 * notes it for watchdog_pressed). */
static bool
under_pressure (void)
{
  long open = n_tracked - n_cut;
  bool p = open * WATCHDOG_PRESSURE_DEN >= shim.cfg.max_connections * WATCHDOG_PRESSURE_NUM;
  atomic_store (&pressed, p);
  return p;
}

/* Under track_mu: whether `t` waits for a head, and has for long enough
 * to be closed for room. */
static bool
evictable (const conn_track_t *t, int64_t now)
{
  return !t->cut && t->fd >= 0 && t->stage == STAGE_HEAD && now - t->since_ns >= WATCHDOG_EVICT_AFTER_MS * 1000000LL;
}

/* Under track_mu: the evictable connection that has waited longest, or
 * NULL. */
static conn_track_t *
longest_waiting (int64_t now)
{
  conn_track_t *best = NULL;
  for (conn_track_t *t = tracked; t != NULL; t = t->next)
    if (evictable (t, now) && (best == NULL || t->since_ns < best->since_ns))
      best = t;
  return best;
}

static int
longest_waiting_first (const void *a, const void *b)
{
  int64_t x = (*(conn_track_t *const *) a)->since_ns, y = (*(conn_track_t *const *) b)->since_ns;
  return x < y ? -1 : x > y;
}

/* Under track_mu: near the cap, closes connections waiting for a head,
 * the longest waiting first, until the count is back to the relief mark. */
static void
relieve (int64_t now)
{
  if (!under_pressure ())
    return;
  long excess = n_tracked - n_cut - shim.cfg.max_connections * WATCHDOG_RELIEF_NUM / WATCHDOG_RELIEF_DEN;
  size_t n = 0;
  for (conn_track_t *t = tracked; t != NULL && n < evict_cap; t = t->next)
    if (evictable (t, now))
      evict_buf[n++] = t;
  qsort (evict_buf, n, sizeof *evict_buf, longest_waiting_first);
  for (size_t i = 0; i < n && (long) i < excess; i++)
    cut (evict_buf[i]);
}

static void *
watchdog_main (void *arg)
{
  (void) arg;
  for (;;)
    {
      struct timespec tick = {0, 250 * 1000 * 1000};
      nanosleep (&tick, NULL);
      int64_t now = shim_mono_ns ();
      int64_t head = shim.cfg.header_timeout * 1000000000LL, body = shim.cfg.body_timeout * 1000000000LL;
      pthread_mutex_lock (&track_mu);
      for (conn_track_t *t = tracked; t != NULL; t = t->next)
        {
          if (t->cut || t->fd < 0)
            continue;
          int64_t age = now - t->since_ns;
          bool slow = false;
          if (t->stage == STAGE_HEAD)
            slow = age > head;
          else if (t->stage == STAGE_BODY && !t->streaming)
            slow = age > body;
          else if (t->stage == STAGE_BODY)
            slow = age > body && (double) t->body_bytes < (double) shim.cfg.min_upload_rate * (double) age / 1e9;
          if (slow)
            cut (t);
        }
      relieve (now);
      pthread_mutex_unlock (&track_mu);
      workers_expire (now);
    }
  return NULL;
}

int
watchdog_start (err_t *err)
{
  /* MHD opens at most SHIM_MAX_CONNECTIONS: the candidates fit. */
  evict_cap = (size_t) shim.cfg.max_connections + 64;
  evict_buf = calloc (evict_cap, sizeof *evict_buf);
  if (evict_buf == NULL)
    return err_make (err, ENOMEM, "out of memory");
  pthread_t th;
  int rc = pthread_create (&th, NULL, watchdog_main, NULL);
  if (rc != 0)
    return err_make_sys (err, rc, "start the slow-client watchdog");
  pthread_detach (th);
  return 0;
}
