/* health: grpc.health.v1.Health for the gateway (see health.h).
 * State: one table of services and a generation counter that Watch
 * handlers wait on, guarded by `health_mu`. */
#include "gateway/api/health.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "grpc/health/v1/health.pb-c.h"

typedef Grpc__Health__V1__HealthCheckResponse__ServingStatus serving_t;

#define SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define SERVICE_UNKNOWN GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

/* How often a quiet Watch handler looks for a cancelled client. */
#define WATCH_POLL_MS 200

static pthread_mutex_t health_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t health_cv;
static const char *const *health_services;
static bool health_down;
static bool health_failing; /* the runtime's self-check fails */
static unsigned long health_generation;

/* The status of `name`, under health_mu. */
static serving_t
status_of (const char *name)
{
  bool known = name[0] == '\0';
  for (size_t i = 0; !known && health_services[i] != NULL; i++)
    known = strcmp (health_services[i], name) == 0;
  if (!known)
    return SERVICE_UNKNOWN;
  return health_down || health_failing ? NOT_SERVING : SERVING;
}

static int
health_check (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_call_recv (call, &grpc__health__v1__health_check_request__descriptor, &m, err);
  if (rc <= 0)
    return rc < 0 ? -1 : err_make (err, EINVAL, "Check: no request message");
  Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *) m;
  pthread_mutex_lock (&health_mu);
  serving_t st = status_of (req->service);
  pthread_mutex_unlock (&health_mu);
  if (st == SERVICE_UNKNOWN)
    {
      /* Quote at most 128 characters of a name we do not know. */
      rc = err_make (err, ENOENT, "unknown service `%.128s`", req->service);
      protobuf_c_message_free_unpacked (m, NULL);
      return rc;
    }
  protobuf_c_message_free_unpacked (m, NULL);
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = st;
  return rpc_call_reply (call, &resp.base, err);
}

static int
send_status (rpc_call_t *call, serving_t st, err_t *err)
{
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = st;
  return rpc_call_send (call, &resp.base, err);
}

static int
health_watch (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_call_recv (call, &grpc__health__v1__health_check_request__descriptor, &m, err);
  if (rc <= 0)
    return rc < 0 ? -1 : err_make (err, EINVAL, "Watch: no request message");
  Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *) m;

  pthread_mutex_lock (&health_mu);
  unsigned long seen = health_generation;
  serving_t st = status_of (req->service);
  pthread_mutex_unlock (&health_mu);
  rc = send_status (call, st, err);

  while (rc == 0)
    {
      struct timespec until;
      clock_gettime (CLOCK_MONOTONIC, &until);
      until.tv_nsec += WATCH_POLL_MS * 1000000L;
      if (until.tv_nsec >= 1000000000L)
        {
          until.tv_sec++;
          until.tv_nsec -= 1000000000L;
        }
      pthread_mutex_lock (&health_mu);
      if (health_generation == seen)
        pthread_cond_timedwait (&health_cv, &health_mu, &until);
      bool changed = health_generation != seen;
      bool down = health_down;
      seen = health_generation;
      serving_t now = status_of (req->service);
      pthread_mutex_unlock (&health_mu);

      if (changed && now != st)
        {
          st = now;
          rc = send_status (call, st, err);
        }
      if (rc == 0 && down)
        {
          rc = err_make (err, ESHUTDOWN, "the gateway is shutting down");
          break;
        }
      if (rc == 0 && rpc_call_cancelled (call))
        rc = err_make (err, ECANCELED, "Watch cancelled by the client");
    }
  protobuf_c_message_free_unpacked (m, NULL);
  return rc;
}

int
health_register (rpc_server_t *server, const char *const *services, err_t *err)
{
  pthread_condattr_t ca;
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&health_cv, &ca);
  pthread_condattr_destroy (&ca);
  health_services = services;
  if (rpc_server_add_method (server, "/grpc.health.v1.Health/Check", health_check, NULL, err) < 0
      || rpc_server_add_method (server, "/grpc.health.v1.Health/Watch", health_watch, NULL, err) < 0)
    return -1;
  return 0;
}

int
health_register_check (rpc_server_t *server, err_t *err)
{
  return rpc_server_add_method (server, "/grpc.health.v1.Health/Check", health_check, NULL, err);
}

void
health_shutdown (void)
{
  pthread_mutex_lock (&health_mu);
  health_down = true;
  health_generation++;
  pthread_cond_broadcast (&health_cv);
  pthread_mutex_unlock (&health_mu);
}

void
health_set_failing (const char *failure)
{
  pthread_mutex_lock (&health_mu);
  bool failing = failure != NULL;
  bool changed = failing != health_failing;
  if (changed)
    {
      health_failing = failing;
      health_generation++;
      pthread_cond_broadcast (&health_cv);
    }
  pthread_mutex_unlock (&health_mu);
  if (changed && failing)
    log_msg (SEV_ERROR, "self-check failed, health is NOT_SERVING: %s", failure);
  else if (changed)
    log_msg (SEV_INFO, "self-check passes again, health is SERVING");
}
