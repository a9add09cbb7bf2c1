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
 */
#include "shim/watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "shim/shim.h"

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

static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;
static conn_track_t *tracked;

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
  pthread_mutex_unlock (&track_mu);
  free (t);
  *socket_context = NULL;
}

static void *
watchdog_main (void *arg)
{
  (void) arg;
  for (;;)
    {
      struct timespec tick = {0, 500 * 1000 * 1000};
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
            {
              t->cut = true;
              shutdown (t->fd, SHUT_RDWR);
            }
        }
      pthread_mutex_unlock (&track_mu);
    }
  return NULL;
}

int
watchdog_start (err_t *err)
{
  pthread_t th;
  int rc = pthread_create (&th, NULL, watchdog_main, NULL);
  if (rc != 0)
    return err_make_sys (err, rc, "start the slow-client watchdog");
  pthread_detach (th);
  return 0;
}
