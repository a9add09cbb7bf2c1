/* service: sandbox.v1.Sandbox method table and the auth guard in front of
 * it (see service.h). State: the secret, set once at registration. */
#include "gateway/service.h"

#include <errno.h>
#include <stdlib.h>

#include "common/bearer.h"
#include "common/cleanup.h"
#include "common/log.h"

static const char *service_secret;

/* A method of the service; `fn` runs only after authentication. */
typedef struct service_method_s
{
  const char *path;
  rpc_handler_fn fn;
} service_method_t;

/* Methods whose runtime has not landed yet answer UNIMPLEMENTED, and say so. */
static int
not_implemented (rpc_call_t *call, void *user, err_t *err)
{
  return err_make (err, ENOSYS, "%s is not implemented yet", rpc_call_method (call));
}

static const service_method_t service_methods[] = {
    {"/sandbox.v1.Sandbox/Launch", not_implemented},
    {"/sandbox.v1.Sandbox/Restore", not_implemented},
    {"/sandbox.v1.Sandbox/Exec", not_implemented},
    {"/sandbox.v1.Sandbox/ExportSnapshot", not_implemented},
    {"/sandbox.v1.Sandbox/PersistSnapshot", not_implemented},
    {"/sandbox.v1.Sandbox/Connect", not_implemented},
    {"/sandbox.v1.Sandbox/Delete", not_implemented},
    {"/sandbox.v1.Sandbox/Get", not_implemented},
    {"/sandbox.v1.Sandbox/List", not_implemented},
};

static int
guarded (rpc_call_t *call, void *user, err_t *err)
{
  const service_method_t *m = user;
  if (service_secret == NULL || service_secret[0] == '\0')
    {
      rpc_call_finish (call, GRPC_STATUS_UNAVAILABLE, "gateway secret not configured");
      return 0;
    }
  cleanup_free char *auth = rpc_call_metadata (call, "authorization");
  if (!bearer_matches (auth, service_secret))
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "method", rpc_call_method (call)),
                  "rejected a call with a missing or wrong bearer token");
      rpc_call_finish (call, GRPC_STATUS_UNAUTHENTICATED, "invalid or missing bearer token");
      return 0;
    }
  return m->fn (call, NULL, err);
}

int
service_register (rpc_server_t *server, const char *secret, err_t *err)
{
  service_secret = secret;
  for (size_t i = 0; i < sizeof service_methods / sizeof service_methods[0]; i++)
    if (rpc_server_add_method (server, service_methods[i].path, guarded, (void *) &service_methods[i], err) < 0)
      return -1;
  return 0;
}
