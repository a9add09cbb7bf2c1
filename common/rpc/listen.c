/* rpc/listen: a server's own listening sockets, so that connections are
 * capped before gRPC core holds them.
 *
 * gRPC core 1.51 has no connection cap (no "max allowed incoming
 * connections"), and its accept loop gives up listening on an accept error
 * such as EMFILE. So the layer listens itself: one thread accepts, checks
 * the caps — in total and per peer address — and hands the connected
 * socket to gRPC: a plaintext one through grpc_server_add_channel_from_fd,
 * which names the connection "fd:<n>" in every call's peer; a TLS one
 * through the external listener (external.cc), which names it by its peer
 * address and port ("ipv4:a.b.c.d:port"), looked up in the table by port.
 * A connection past a cap is closed at once. gRPC closes a connection's descriptor when
 * the connection ends without telling anyone, so the table of connections
 * remembers each one's inode and drops an entry whose descriptor is closed
 * or now names another file (checked when a cap is near, and every second).
 *
 * The table also keeps a budget per connection for calls refused or reset
 * before their request (rpc_listener_charge): a connection past it — an
 * HTTP/2 rapid reset, which gRPC core 1.51 does not detect — is shut down
 * through a duplicate of its descriptor checked to be the same socket.
 *
 * It does not own the connections (gRPC does) nor the calls.
 *
 * Threading: one accept thread; rpc_listener_charge and
 * rpc_listener_connections from any thread; the table is guarded by `mu`.
 */
#include "common/rpc/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"

/* Listening sockets per server ("localhost" may be two addresses). */
#define LISTEN_MAX_FDS 4
/* The table of connections is swept at most this often when a cap is
 * near, and at least every LISTEN_SWEEP_EVERY_MS. */
#define LISTEN_SWEEP_NEAR_MS 20
#define LISTEN_SWEEP_EVERY_MS 1000
/* Refused connections are logged at most once per this many. */
#define LISTEN_LOG_EVERY_MS 5000

typedef struct conn_s
{
  bool used;
  dev_t dev;
  ino_t ino;
  struct sockaddr_storage peer; /* port zeroed: the address alone */
  uint16_t port;                /* the peer's port */
  double tokens;                /* rapid-reset budget */
  int64_t refill_ms;
  bool cut; /* shut down for its resets: its calls still queued are dropped */
} conn_t;

struct rpc_listener_s
{
  grpc_server *server;
  void *external; /* TLS: the external listener's handler; NULL: plaintext */
  int fds[LISTEN_MAX_FDS];
  size_t n_fds;
  pthread_t thread;
  bool running;
  atomic_bool stop;
  pthread_mutex_t mu;
  conn_t *conns; /* indexed by descriptor */
  size_t n_conns;
  int *live;    /* descriptors of the table's entries */
  int *by_port; /* 65536: the last descriptor recorded for a peer port, or -1 */
  size_t n_live;
  size_t max_total, max_per_peer;
  int64_t last_sweep_ms, last_log_ms;
  size_t refused_since_log;
};

static int64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool
same_address (const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
  if (a->ss_family != b->ss_family)
    return false;
  if (a->ss_family == AF_INET)
    return ((const struct sockaddr_in *) a)->sin_addr.s_addr == ((const struct sockaddr_in *) b)->sin_addr.s_addr;
  if (a->ss_family == AF_INET6)
    return memcmp (&((const struct sockaddr_in6 *) a)->sin6_addr, &((const struct sockaddr_in6 *) b)->sin6_addr,
                   sizeof (struct in6_addr))
           == 0;
  return true; /* other families: one peer */
}

/* The entry of `fd` still names the socket that was accepted. */
static bool
still_open (const conn_t *c, int fd)
{
  struct stat st;
  return fstat (fd, &st) == 0 && st.st_ino == c->ino && st.st_dev == c->dev;
}

static void
forget_locked (rpc_listener_t *l, size_t i)
{
  l->conns[l->live[i]].used = false;
  l->live[i] = l->live[--l->n_live];
}

static void
sweep_locked (rpc_listener_t *l, int64_t now)
{
  l->last_sweep_ms = now;
  for (size_t i = 0; i < l->n_live;)
    if (!still_open (&l->conns[l->live[i]], l->live[i]))
      forget_locked (l, i);
    else
      i++;
}

static size_t
from_peer_locked (rpc_listener_t *l, const struct sockaddr_storage *peer)
{
  size_t n = 0;
  for (size_t i = 0; i < l->n_live; i++)
    n += same_address (&l->conns[l->live[i]].peer, peer) ? 1 : 0;
  return n;
}

/* Whether a new connection from `peer` fits under the caps (the table is
 * swept first when one is near). */
static bool
fits_locked (rpc_listener_t *l, const struct sockaddr_storage *peer, int64_t now)
{
  bool near = l->n_live >= l->max_total || from_peer_locked (l, peer) >= l->max_per_peer;
  if ((near && now - l->last_sweep_ms >= LISTEN_SWEEP_NEAR_MS) || now - l->last_sweep_ms >= LISTEN_SWEEP_EVERY_MS)
    sweep_locked (l, now);
  return l->n_live < l->max_total && from_peer_locked (l, peer) < l->max_per_peer;
}

/* Records an accepted connection: false when it cannot be (closed then). */
static bool
record_locked (rpc_listener_t *l, int fd, const struct sockaddr_storage *peer, uint16_t port, int64_t now)
{
  struct stat st;
  if ((size_t) fd >= l->n_conns || fstat (fd, &st) < 0)
    return false;
  if (l->conns[fd].used) /* the number was closed and is reused: the old entry is gone */
    for (size_t i = 0; i < l->n_live; i++)
      if (l->live[i] == fd)
        {
          forget_locked (l, i);
          break;
        }
  conn_t *c = &l->conns[fd];
  *c = (conn_t){.used = true, .dev = st.st_dev, .ino = st.st_ino, .peer = *peer, .port = port};
  l->by_port[port] = fd;
  c->tokens = RPC_CONN_RESETS_BURST;
  c->refill_ms = now;
  l->live[l->n_live++] = fd;
  return true;
}

static void
note_refused_locked (rpc_listener_t *l, int64_t now)
{
  l->refused_since_log++;
  if (now - l->last_log_ms < LISTEN_LOG_EVERY_MS)
    return;
  log_msg (SEV_WARNING,
           "rpc: %zu connection(s) closed on arrival: at most %zu connections, %zu per peer address "
           "(%zu open)",
           l->refused_since_log, l->max_total, l->max_per_peer, l->n_live);
  l->refused_since_log = 0;
  l->last_log_ms = now;
}

/* Takes one accepted connection: hands it to gRPC or closes it. */
static void
take (rpc_listener_t *l, int listen_fd, int fd, struct sockaddr_storage *peer)
{
  uint16_t port = 0;
  if (peer->ss_family == AF_INET)
    {
      port = ntohs (((struct sockaddr_in *) peer)->sin_port);
      ((struct sockaddr_in *) peer)->sin_port = 0;
    }
  else if (peer->ss_family == AF_INET6)
    {
      port = ntohs (((struct sockaddr_in6 *) peer)->sin6_port);
      ((struct sockaddr_in6 *) peer)->sin6_port = 0;
    }
  int64_t now = now_ms ();
  pthread_mutex_lock (&l->mu);
  bool ok = fits_locked (l, peer, now) && record_locked (l, fd, peer, port, now);
  if (!ok)
    note_refused_locked (l, now);
  pthread_mutex_unlock (&l->mu);
  if (!ok)
    {
      close (fd);
      return;
    }
  int one = 1;
  setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (l->external != NULL)
    {
      rpc_external_handle (l->external, listen_fd, fd);
      return;
    }
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create ();
  grpc_server_add_channel_from_fd (l->server, fd, creds);
  grpc_server_credentials_release (creds);
}

static void *
accept_thread (void *arg)
{
  rpc_listener_t *l = arg;
  struct pollfd pfd[LISTEN_MAX_FDS];
  for (size_t i = 0; i < l->n_fds; i++)
    pfd[i] = (struct pollfd){.fd = l->fds[i], .events = POLLIN};
  while (!atomic_load (&l->stop))
    {
      int n = poll (pfd, l->n_fds, 250);
      if (n <= 0)
        continue;
      for (size_t i = 0; i < l->n_fds; i++)
        {
          if ((pfd[i].revents & POLLIN) == 0)
            continue;
          struct sockaddr_storage peer;
          socklen_t len = sizeof peer;
          int fd = accept4 (l->fds[i], (struct sockaddr *) &peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd >= 0)
            take (l, l->fds[i], fd, &peer);
          else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            {
              /* Out of descriptors elsewhere in the process: the pending
               * connection waits in the backlog; try again shortly. */
              struct timespec pause = {0, 50 * 1000 * 1000};
              nanosleep (&pause, NULL);
            }
        }
    }
  return NULL;
}

/* Splits "host:port" / "[v6]:port" into its parts (in `buf`). */
static int
split_address (const char *addr, char *buf, size_t size, const char **host, const char **port, err_t *err)
{
  if (snprintf (buf, size, "%s", addr) >= (int) size)
    return err_make (err, EINVAL, "listen address `%s` is too long", addr);
  char *colon = strrchr (buf, ':');
  if (colon == NULL)
    return err_make (err, EINVAL, "listen address `%s` is not host:port", addr);
  *colon = '\0';
  *port = colon + 1;
  char *h = buf;
  if (h[0] == '[')
    {
      h++;
      char *end = strchr (h, ']');
      if (end == NULL)
        return err_make (err, EINVAL, "listen address `%s`: unclosed `[`", addr);
      *end = '\0';
    }
  *host = h[0] != '\0' ? h : NULL;
  return 0;
}

static int
listen_one (const struct addrinfo *ai, int port, err_t *err)
{
  cleanup_close int fd = socket (ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return err_make_sys (err, errno, "socket");
  int one = 1, zero = 0;
  setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ai->ai_family == AF_INET6)
    setsockopt (fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  struct sockaddr_storage sa;
  memcpy (&sa, ai->ai_addr, ai->ai_addrlen);
  if (ai->ai_family == AF_INET)
    ((struct sockaddr_in *) &sa)->sin_port = htons ((uint16_t) port);
  else
    ((struct sockaddr_in6 *) &sa)->sin6_port = htons ((uint16_t) port);
  if (bind (fd, (struct sockaddr *) &sa, ai->ai_addrlen) < 0 || listen (fd, 1024) < 0)
    return err_make_sys (err, errno == EADDRINUSE ? EADDRINUSE : errno, "bind");
  return take_fd (&fd);
}

/* The port `fd` listens on. */
static int
bound_port (int fd)
{
  struct sockaddr_storage sa;
  socklen_t len = sizeof sa;
  if (getsockname (fd, (struct sockaddr *) &sa, &len) < 0)
    return 0;
  return ntohs (sa.ss_family == AF_INET ? ((struct sockaddr_in *) &sa)->sin_port
                                        : ((struct sockaddr_in6 *) &sa)->sin6_port);
}

static int
open_sockets (rpc_listener_t *l, const char *addr, int *port_out, err_t *err)
{
  char buf[512];
  const char *host = NULL, *port = NULL;
  if (split_address (addr, buf, sizeof buf, &host, &port, err) < 0)
    return -1;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo (host, port, &hints, &res);
  if (rc != 0)
    return err_make (err, EINVAL, "listen address `%s`: %s", addr, gai_strerror (rc));
  int chosen = 0; /* port 0: the first socket picks, the others take the same */
  for (struct addrinfo *ai = res; ai != NULL && l->n_fds < LISTEN_MAX_FDS; ai = ai->ai_next)
    {
      if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
        continue;
      int want = chosen != 0 ? chosen
                             : ntohs (ai->ai_family == AF_INET ? ((struct sockaddr_in *) ai->ai_addr)->sin_port
                                                               : ((struct sockaddr_in6 *) ai->ai_addr)->sin6_port);
      int fd = listen_one (ai, want, err);
      if (fd < 0)
        {
          freeaddrinfo (res);
          return err_wrap (err, "listen on `%s`", addr);
        }
      l->fds[l->n_fds++] = fd;
      chosen = bound_port (fd);
    }
  freeaddrinfo (res);
  if (l->n_fds == 0)
    return err_make (err, EINVAL, "listen address `%s`: no IPv4 or IPv6 address", addr);
  *port_out = chosen;
  return 0;
}

int
rpc_listener_start (grpc_server *server, void *external, const char *addr, size_t max_total, size_t max_per_peer,
                    rpc_listener_t **out, int *port, err_t *err)
{
  struct rlimit nofile;
  size_t slots = 65536;
  if (getrlimit (RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < slots)
    slots = nofile.rlim_cur;
  rpc_listener_t *l = calloc (1, sizeof *l);
  if (l == NULL)
    return err_make (err, ENOMEM, "rpc listener: out of memory");
  l->server = server;
  l->external = external;
  l->max_total = max_total;
  l->max_per_peer = max_per_peer;
  l->n_conns = slots;
  l->conns = calloc (slots, sizeof *l->conns);
  l->live = calloc (max_total + 1, sizeof *l->live);
  l->by_port = malloc (65536 * sizeof *l->by_port);
  if (l->by_port != NULL)
    memset (l->by_port, 0xff, 65536 * sizeof *l->by_port);
  pthread_mutex_init (&l->mu, NULL);
  atomic_init (&l->stop, false);
  *out = l;
  if (l->conns == NULL || l->live == NULL || l->by_port == NULL)
    return err_make (err, ENOMEM, "rpc listener: out of memory");
  if (open_sockets (l, addr, port, err) < 0)
    return -1;
  if (pthread_create (&l->thread, NULL, accept_thread, l) != 0)
    return err_make (err, EAGAIN, "rpc listener: cannot start its thread");
  l->running = true;
  return 0;
}

void
rpc_listener_stop (rpc_listener_t *l)
{
  if (l == NULL)
    return;
  atomic_store (&l->stop, true);
  if (l->running)
    pthread_join (l->thread, NULL);
  l->running = false;
  for (size_t i = 0; i < l->n_fds; i++)
    close (l->fds[i]);
  l->n_fds = 0;
}

void
rpc_listener_free (rpc_listener_t *l)
{
  if (l == NULL)
    return;
  rpc_listener_stop (l);
  free (l->conns);
  free (l->live);
  free (l->by_port);
  pthread_mutex_destroy (&l->mu);
  free (l);
}

/* A TLS connection's peer, "ipv4:a.b.c.d:port" or "ipv6:[addr]:port" (the
 * brackets maybe %-escaped): its address (port zeroed) and port. */
static bool
parse_peer (const char *peer, struct sockaddr_storage *out, uint16_t *port)
{
  const char *colon = strrchr (peer, ':');
  bool v4 = strncmp (peer, "ipv4:", 5) == 0, v6 = strncmp (peer, "ipv6:", 5) == 0;
  if (colon == NULL || !(v4 || v6))
    return false;
  char *end = NULL;
  long p = strtol (colon + 1, &end, 10);
  if (end == colon + 1 || *end != '\0' || p < 0 || p > 65535)
    return false;
  char host[INET6_ADDRSTRLEN + 8];
  const char *h = peer + 5;
  size_t n = (size_t) (colon - h);
  if (n >= sizeof host)
    return false;
  memcpy (host, h, n);
  host[n] = '\0';
  memset (out, 0, sizeof *out);
  *port = (uint16_t) p;
  if (v4)
    {
      out->ss_family = AF_INET;
      return inet_pton (AF_INET, host, &((struct sockaddr_in *) out)->sin_addr) == 1;
    }
  char *in = host;
  if (strncmp (in, "%5B", 3) == 0 || strncmp (in, "%5b", 3) == 0)
    in += 3;
  else if (*in == '[')
    in++;
  size_t len = strlen (in);
  if (len >= 3 && (strcmp (in + len - 3, "%5D") == 0 || strcmp (in + len - 3, "%5d") == 0))
    in[len - 3] = '\0';
  else if (len >= 1 && in[len - 1] == ']')
    in[len - 1] = '\0';
  out->ss_family = AF_INET6;
  return inet_pton (AF_INET6, in, &((struct sockaddr_in6 *) out)->sin6_addr) == 1;
}

/* The descriptor of a call's connection: the one its peer names
 * ("fd:<n>"), or the table's entry for its peer address and port; -1. */
static int
call_fd (rpc_listener_t *l, grpc_call *call)
{
  char *peer = grpc_call_get_peer (call);
  int fd = -1;
  struct sockaddr_storage addr;
  uint16_t port = 0;
  if (peer != NULL && strncmp (peer, "fd:", 3) == 0)
    {
      char *end = NULL;
      long v = strtol (peer + 3, &end, 10);
      if (end != peer + 3 && *end == '\0' && v >= 0 && v < INT32_MAX)
        fd = (int) v;
    }
  else if (peer != NULL && l->external != NULL && parse_peer (peer, &addr, &port))
    {
      pthread_mutex_lock (&l->mu);
      int at = l->by_port[port];
      if (at < 0 || !l->conns[at].used || l->conns[at].port != port || !same_address (&l->conns[at].peer, &addr))
        {
          at = -1; /* two peers on one port: the table's entries */
          for (size_t i = 0; i < l->n_live && at < 0; i++)
            {
              const conn_t *c = &l->conns[l->live[i]];
              if (c->port == port && same_address (&c->peer, &addr))
                at = l->live[i];
            }
        }
      pthread_mutex_unlock (&l->mu);
      fd = at;
    }
  gpr_free (peer);
  return fd;
}

/* Shuts the connection down through a duplicate of its descriptor checked
 * to name the same socket (gRPC may have closed and reused the number). */
static void
cut (const conn_t *c, int fd)
{
  cleanup_close int dup = fcntl (fd, F_DUPFD_CLOEXEC, 0);
  if (dup >= 0 && still_open (c, dup))
    shutdown (dup, SHUT_RDWR);
}

void
rpc_listener_charge (rpc_listener_t *l, grpc_call *call)
{
  if (l == NULL)
    return;
  int fd = call_fd (l, call);
  if (fd < 0 || (size_t) fd >= l->n_conns)
    return;
  int64_t now = now_ms ();
  pthread_mutex_lock (&l->mu);
  conn_t *c = &l->conns[fd];
  bool over = false;
  conn_t copy;
  if (c->used)
    {
      c->tokens += (double) (now - c->refill_ms) * RPC_CONN_RESETS_PER_SECOND / 1000.0;
      if (c->tokens > RPC_CONN_RESETS_BURST)
        c->tokens = RPC_CONN_RESETS_BURST;
      c->refill_ms = now;
      c->tokens -= 1.0;
      over = c->tokens < 0 && !c->cut;
      c->cut = c->cut || over;
      copy = *c;
    }
  pthread_mutex_unlock (&l->mu);
  if (over)
    {
      log_msg (SEV_WARNING,
               "rpc: connection fd:%d closed: more than %d calls a second refused or reset before "
               "their request",
               fd, RPC_CONN_RESETS_PER_SECOND);
      cut (&copy, fd);
    }
}

bool
rpc_listener_cut (rpc_listener_t *l, grpc_call *call)
{
  if (l == NULL)
    return false;
  int fd = call_fd (l, call);
  if (fd < 0 || (size_t) fd >= l->n_conns)
    return false;
  pthread_mutex_lock (&l->mu);
  bool cut = l->conns[fd].used && l->conns[fd].cut;
  pthread_mutex_unlock (&l->mu);
  return cut;
}

size_t
rpc_listener_connections (rpc_listener_t *l)
{
  if (l == NULL)
    return 0;
  pthread_mutex_lock (&l->mu);
  sweep_locked (l, now_ms ());
  size_t n = l->n_live;
  pthread_mutex_unlock (&l->mu);
  return n;
}
