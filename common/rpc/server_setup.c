/* rpc/server_setup: making a server (see rpc.h): its options, methods,
 * credentials and listening addresses, then its start — the first accept
 * slots and the first thread. Calls are run by server.c, the end is
 * server_stop.c.
 */
#include "common/rpc/internal.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"

/* The external listener's channel argument: a pointer to the server's own
 * slot, which outlives every copy gRPC core makes of it. */
static void *
slot_copy (void *p)
{
  return p;
}

static void
slot_destroy (void *p)
{
  (void) p;
}

static int
slot_cmp (void *a, void *b)
{
  return a < b ? -1 : a > b;
}

int
rpc_server_new (const rpc_opts_t *opts, rpc_server_t **out, err_t *err)
{
  rpc_server_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return err_make (err, ENOMEM, "rpc server: out of memory");
  if (opts != NULL)
    s->opts = *opts;
  s->tls_cert_file = s->opts.tls_cert_file != NULL ? strdup (s->opts.tls_cert_file) : NULL;
  s->tls_key_file = s->opts.tls_key_file != NULL ? strdup (s->opts.tls_key_file) : NULL;
  s->tls_ca_file = s->opts.tls_ca_file != NULL ? strdup (s->opts.tls_ca_file) : NULL;
  pthread_mutex_init (&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&s->cv, &ca);
  pthread_condattr_destroy (&ca);
  atomic_init (&s->shutting_down, false);
  atomic_init (&s->draining, false);
  s->max_calls = s->opts.max_calls > 0 ? s->opts.max_calls : RPC_DEFAULT_MAX_CALLS;
  s->max_open_calls = s->opts.max_open_calls > 0 ? s->opts.max_open_calls : RPC_DEFAULT_MAX_OPEN_CALLS;
  s->first_message_ms = s->opts.first_message_ms > 0 ? s->opts.first_message_ms : RPC_DEFAULT_FIRST_MESSAGE_MS;

  s->max_threads = RPC_MAX_THREADS (s->max_calls);
  s->opts.max_calls = s->max_calls;

  /* gRPC core's own budget: memory for its transports (near it, it sends
   * GOAWAY to connections without calls, then cancels streams) and threads
   * (gRPC core 1.51 applies the thread budget only to the C++ synchronous
   * server; this layer's own cap, max_threads, is the one that holds). */
  s->quota = grpc_resource_quota_create ("rpc server");
  grpc_resource_quota_resize (s->quota, RPC_MEMORY_QUOTA_BYTES);
  grpc_resource_quota_set_max_threads (s->quota, (int) s->max_threads);
  rpc_channel_args_t args;
  rpc_channel_args_init (&args, &s->opts, true);
  grpc_arg *q = &args.args[args.channel_args.num_args++];
  q->type = GRPC_ARG_POINTER;
  q->key = (char *) GRPC_ARG_RESOURCE_QUOTA;
  q->value.pointer.p = s->quota;
  q->value.pointer.vtable = grpc_resource_quota_arg_vtable ();
  if (s->tls_cert_file != NULL || s->tls_key_file != NULL)
    {
      /* Where gRPC core puts the handler of the external listener (see
       * rpc_server_start): TLS connections are accepted here too. */
      static const grpc_arg_pointer_vtable slot_vtable = {slot_copy, slot_destroy, slot_cmp};
      grpc_arg *h = &args.args[args.channel_args.num_args++];
      h->type = GRPC_ARG_POINTER;
      h->key = (char *) RPC_EXTERNAL_LISTENER;
      h->value.pointer.p = &s->external_handler;
      h->value.pointer.vtable = &slot_vtable;
    }
  s->max_message = args.max_message;
  s->server = grpc_server_create (&args.channel_args, NULL);
  s->cq = grpc_completion_queue_create_for_next (NULL);
  grpc_server_register_completion_queue (s->server, s->cq, NULL);
  *out = s;
  return 0;
}

int
rpc_server_add_method (rpc_server_t *s, const char *path, rpc_handler_fn fn, void *user, err_t *err)
{
  return rpc_server_add_admitted_method (s, path, NULL, fn, user, err);
}

int
rpc_server_add_admitted_method (rpc_server_t *s, const char *path, rpc_admit_fn admit_fn, rpc_handler_fn fn,
                                void *user, err_t *err)
{
  if (s->started)
    return err_make (err, EBUSY, "register `%s`: the server has already started", path);
  rpc_method_t *m = realloc (s->methods, (s->n_methods + 1) * sizeof *m);
  if (m == NULL)
    return err_make (err, ENOMEM, "register `%s`: out of memory", path);
  s->methods = m;
  rpc_method_t *nm = &s->methods[s->n_methods];
  nm->path = strdup (path);
  nm->fn = fn;
  nm->admit = admit_fn;
  nm->user = user;
  nm->handle = grpc_server_register_method (s->server, path, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
  if (nm->path == NULL || nm->handle == NULL)
    {
      free (nm->path);
      return err_make (err, EINVAL, "register `%s`: refused (registered twice?)", path);
    }
  s->n_methods++;
  return 0;
}

static int
server_credentials (rpc_server_t *s, grpc_server_credentials **out, err_t *err)
{
  if (s->tls_cert_file == NULL && s->tls_key_file == NULL)
    {
      *out = grpc_insecure_server_credentials_create ();
      return 0;
    }
  if (s->tls_cert_file == NULL || s->tls_key_file == NULL)
    return err_make (err, EINVAL, "TLS needs both a certificate and a key file");
  cleanup_free char *cert = NULL;
  cleanup_free char *key = NULL;
  cleanup_free char *ca = NULL;
  if (rpc_read_pem (s->tls_cert_file, &cert, err) < 0 || rpc_read_pem (s->tls_key_file, &key, err) < 0)
    return err_wrap (err, "TLS");
  if (s->tls_ca_file != NULL && rpc_read_pem (s->tls_ca_file, &ca, err) < 0)
    return err_wrap (err, "TLS client CA");
  grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
  *out
      = grpc_ssl_server_credentials_create_ex (ca, &pair, 1,
                                               ca != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
                                               NULL);
  if (*out == NULL)
    return err_make (err, EINVAL, "TLS: the certificate or key is not valid PEM");
  return 0;
}

int
rpc_server_start (rpc_server_t *s, const char *addr, int *bound_port, err_t *err)
{
  if (s->started)
    return err_make (err, EBUSY, "the server has already started");
  /* TCP: the layer listens itself (listen.c), so that connections are
   * capped; plaintext connections go to gRPC as ready sockets, TLS ones to
   * the external listener that carries the credentials. A unix socket:
   * gRPC core listens (uncapped; its peers are local). */
  bool own = strncmp (addr, "unix:", 5) != 0;
  bool tls = s->tls_cert_file != NULL || s->tls_key_file != NULL;
  int port = 0;
  if (!own || tls)
    {
      grpc_server_credentials *creds = NULL;
      if (server_credentials (s, &creds, err) < 0)
        return -1;
      port = grpc_server_add_http2_port (s->server, own ? RPC_EXTERNAL_LISTENER : addr, creds);
      grpc_server_credentials_release (creds);
      if (own && s->external_handler == NULL)
        return err_make (err, EINVAL, "TLS: gRPC core made no listener for accepted connections");
      if (!own && port == 0)
        return err_make (err, EADDRINUSE, "cannot listen on `%s` (address in use or not valid)", addr);
    }
  grpc_server_start (s->server);
  s->started = true;
  pthread_mutex_lock (&s->mu);
  s->threads = s->listening = 1;
  pthread_mutex_unlock (&s->mu);
  if (!rpc_spawn_thread (s))
    {
      pthread_mutex_lock (&s->mu);
      s->threads = s->listening = 0;
      pthread_mutex_unlock (&s->mu);
      return err_make (err, EAGAIN, "cannot start the rpc server's thread");
    }
  for (int d = 0; d < RPC_ACCEPT_DEPTH; d++)
    {
      for (size_t i = 0; i < s->n_methods; i++)
        rpc_slot_request (s, (long) i);
      if (d < 2)
        rpc_slot_request (s, -1);
    }
  if (own)
    {
      size_t max_conns = s->opts.max_connections > 0 ? s->opts.max_connections : RPC_DEFAULT_MAX_CONNECTIONS;
      size_t per_peer = s->opts.max_connections_per_peer > 0 ? s->opts.max_connections_per_peer
                                                             : RPC_DEFAULT_MAX_CONNECTIONS_PER_PEER;
      if (rpc_listener_start (s->server, tls ? s->external_handler : NULL, addr, max_conns, per_peer, &s->listener,
                              &port, err)
          < 0)
        return err->status == EADDRINUSE ? -1 : err_make (err, EADDRINUSE, "cannot listen: %s", err_msg (err));
    }
  if (bound_port != NULL)
    *bound_port = port;
  return 0;
}
