/* runtime/ports: reaching TCP servers that run inside a sandbox, from the
 * gateway — a connection to a port on the sandbox's loopback, and the list
 * of its listening sockets.
 *
 * Both enter the sandbox's network namespace only for a moment: a
 * short-lived thread of our own joins it (setns on a pidfd of the
 * sandbox's pid 1, taken under the registry lock, so the pid cannot have
 * been reaped and reused), creates the sockets or reads
 * /proc/thread-self/net/tcp{,6}, and exits. A socket keeps the namespace it
 * was created in, so the connect and all later I/O happen on the caller's
 * thread, which never leaves the gateway's namespace; no thread that
 * serves anything else ever changes namespace. Nothing is routed: the
 * connection exists only on the sandbox's loopback, egress or not. Once a
 * sandbox has had a connection, one IPv4 socket is made ahead for its next
 * (sbx_port_prepare, off that connection's path), which then needs no
 * thread; it is closed with the sandbox.
 *
 * The owner of a listening socket is found by matching its inode against
 * the socket descriptors of the sandbox's processes (listed from its
 * cgroups; /proc/<pid>/fd links are read, never followed), within a bound;
 * its pid inside the sandbox comes from a pidfd's fdinfo.
 *
 * Threading: any thread; no state beyond the registry.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* How long a connect on the sandbox's loopback may take (a full backlog
 * drops SYNs rather than refusing them). */
#define PORTS_CONNECT_MS 10000
/* The most of /proc/net/tcp{,6} read (about 150 bytes a socket). */
#define PORTS_TABLE_MAX (8 * 1024 * 1024)
/* Bounds of the owner search: processes and descriptors looked at. */
#define PORTS_MAX_PIDS 4096
#define PORTS_MAX_FDS 65536
/* The most of a pidfd's fdinfo read (a few short lines). */
#define PORTS_FDINFO_MAX 1024

/* ---- inside the sandbox's network namespace (a thread of its own) ---------- */

typedef struct netns_job_s
{
  int pidfd;
  bool list;        /* read the tables; else make the sockets */
  bool only4;       /* the IPv4 socket alone */
  int sock4, sock6; /* out */
  char *tab[2];     /* out: tcp, tcp6 */
  size_t tab_len[2];
  int error; /* errno of the step that failed */
  const char *what;
} netns_job_t;

static int
read_table (const char *path, char **out, size_t *len)
{
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? 0 : -1; /* no IPv6: no table */
  size_t cap = 64 * 1024, n = 0;
  cleanup_free char *buf = malloc (cap + 1);
  if (buf == NULL)
    return -1;
  for (;;)
    {
      if (n == cap)
        {
          if (cap >= PORTS_TABLE_MAX)
            {
              errno = EMSGSIZE;
              return -1;
            }
          char *b = realloc (buf, cap * 2 + 1);
          if (b == NULL)
            return -1;
          buf = b;
          cap *= 2;
        }
      ssize_t r = TEMP_FAILURE_RETRY (read (fd, buf + n, cap - n));
      if (r < 0)
        return -1;
      if (r == 0)
        break;
      n += (size_t) r;
    }
  buf[n] = '\0';
  *len = n;
  *out = take_ptr (&buf);
  return 0;
}

static void *
netns_main (void *arg)
{
  netns_job_t *j = arg;
  /* This thread is ours alone and ends right after: the namespace it joins
   * is never seen by anything else the gateway runs. */
  if (setns (j->pidfd, CLONE_NEWNET) < 0)
    {
      j->error = errno == ESRCH ? ENOENT : errno;
      j->what = "enter the sandbox's network namespace";
      return NULL;
    }
  if (j->list)
    {
      if (read_table ("/proc/thread-self/net/tcp", &j->tab[0], &j->tab_len[0]) < 0
          || read_table ("/proc/thread-self/net/tcp6", &j->tab[1], &j->tab_len[1]) < 0)
        {
          j->error = errno;
          j->what = "read the sandbox's TCP table";
        }
      return NULL;
    }
  j->sock4 = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (!j->only4)
    j->sock6 = socket (AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (j->sock4 < 0)
    {
      j->error = errno;
      j->what = "socket in the sandbox's network namespace";
    }
  return NULL;
}

/* A pidfd of sandbox `id`'s pid 1, taken while the registry says it lives
 * (the holder is reaped only after `deleting` is set). Renews its idle
 * timer. */
static int
holder_pidfd (sbx_runtime_t *rt, const char *id, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  int fd = -1, saved = 0;
  if (s != NULL && s->ready && !s->deleting && s->holder > 0)
    {
      fd = (int) syscall (SYS_pidfd_open, s->holder, 0);
      saved = errno;
      s->last_used_ms = sbx_mono_ms ();
    }
  pthread_mutex_unlock (&rt->mu);
  if (s == NULL || (fd < 0 && saved == 0))
    return sbx_err_not_found (err, id, NULL);
  if (fd < 0)
    return err_make_sys (err, saved == ESRCH ? ENOENT : saved, "sandbox `%s`: pidfd of its pid 1", id);
  return fd;
}

/* Runs `j` in a thread inside sandbox `id`'s network namespace. */
static int
in_netns (sbx_runtime_t *rt, const char *id, netns_job_t *j, err_t *err)
{
  cleanup_close int pidfd = holder_pidfd (rt, id, err);
  if (pidfd < 0)
    return -1;
  j->pidfd = pidfd;
  j->sock4 = j->sock6 = -1;
  pthread_t t;
  int rc = pthread_create (&t, NULL, netns_main, j);
  if (rc != 0)
    return err_make_sys (err, rc == EAGAIN ? EAGAIN : rc, "a thread to enter sandbox `%s`", id);
  pthread_join (t, NULL);
  if (j->error != 0)
    {
      if (j->sock4 >= 0)
        close (j->sock4);
      if (j->sock6 >= 0)
        close (j->sock6);
      return err_make_sys (err, j->error == ENOENT ? ENOENT : j->error, "sandbox `%s`: %s", id, j->what);
    }
  return 0;
}

/* ---- connecting ------------------------------------------------------------- */

/* Connects `fd` (non-blocking) to `sa`, waiting at most PORTS_CONNECT_MS.
 * 0, or -1 with errno. */
static int
connect_wait (int fd, const struct sockaddr *sa, socklen_t len)
{
  if (connect (fd, sa, len) == 0)
    return 0;
  if (errno != EINPROGRESS && errno != EINTR)
    return -1;
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int r = TEMP_FAILURE_RETRY (poll (&p, 1, PORTS_CONNECT_MS));
  if (r < 0)
    return -1;
  if (r == 0)
    {
      errno = ETIMEDOUT;
      return -1;
    }
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  if (getsockopt (fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
    return -1;
  if (soerr != 0)
    {
      errno = soerr;
      return -1;
    }
  return 0;
}

/* Sandbox `id`'s spare socket (sbx_port_prepare), taken: -1 when it has
 * none. Renews its idle timer. */
static int
take_spare (sbx_runtime_t *rt, const char *id)
{
  int fd = -1;
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  if (s != NULL && s->ready && !s->deleting && s->port_spare >= 0)
    {
      fd = take_fd (&s->port_spare);
      s->last_used_ms = sbx_mono_ms ();
    }
  pthread_mutex_unlock (&rt->mu);
  return fd;
}

void
sbx_port_prepare (sbx_runtime_t *rt, const char *id)
{
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  bool make = s != NULL && s->ready && !s->deleting && s->port_spare < 0 && !s->port_spare_making;
  if (make)
    {
      /* Held: it stays linked (and its id its own) until this is done. */
      s->port_spare_making = true;
      s->refs++;
    }
  pthread_mutex_unlock (&rt->mu);
  if (!make)
    return;
  netns_job_t j = {.list = false, .only4 = true};
  cleanup_err err_t err = ERR_INIT;
  int rc = in_netns (rt, id, &j, &err);
  pthread_mutex_lock (&rt->mu);
  s->port_spare_making = false;
  if (rc == 0 && !s->deleting && s->port_spare < 0)
    s->port_spare = take_fd (&j.sock4);
  bool last = sbx_unref_locked (rt, s);
  pthread_mutex_unlock (&rt->mu);
  if (last)
    sbx_free_record (s);
  if (rc == 0 && j.sock4 >= 0)
    close (j.sock4);
}

int
sbx_port_connect (sbx_runtime_t *rt, const char *id, unsigned port, int *out, err_t *err)
{
  if (port == 0 || port > 65535)
    return err_make (err, EINVAL, "port must be from 1 to 65535");
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  /* A socket made ahead when there is one; else both kinds now. */
  cleanup_close int s4 = take_spare (rt, id);
  cleanup_close int s6 = -1;
  if (s4 < 0)
    {
      netns_job_t j = {.list = false};
      if (in_netns (rt, id, &j, err) < 0)
        return -1;
      s4 = j.sock4;
      s6 = j.sock6;
    }
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons ((uint16_t) port)};
  a4.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
  if (connect_wait (s4, (struct sockaddr *) &a4, sizeof a4) == 0)
    {
      *out = take_fd (&s4);
      return 0;
    }
  int e4 = errno;
  if (e4 == ECONNREFUSED && s6 < 0)
    {
      /* The spare was IPv4 alone: the IPv6 socket is made now. */
      netns_job_t j = {.list = false};
      cleanup_err err_t e6 = ERR_INIT;
      if (in_netns (rt, id, &j, &e6) == 0)
        {
          close (j.sock4);
          s6 = j.sock6;
        }
    }
  if (e4 == ECONNREFUSED && s6 >= 0)
    {
      /* A server bound to [::1] only. */
      struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons ((uint16_t) port)};
      a6.sin6_addr = in6addr_loopback;
      if (connect_wait (s6, (struct sockaddr *) &a6, sizeof a6) == 0)
        {
          *out = take_fd (&s6);
          return 0;
        }
      if (errno != ECONNREFUSED)
        e4 = errno;
    }
  if (e4 == ECONNREFUSED)
    return err_make (err, ENOTCONN, "nothing listens on port %u in sandbox `%s`", port, id);
  if (e4 == ETIMEDOUT)
    return err_make (err, ETIMEDOUT, "port %u in sandbox `%s` does not accept connections (backlog full?)", port, id);
  return err_make_sys (err, e4, "connect to port %u in sandbox `%s`", port, id);
}

void
sbx_port_touch (sbx_runtime_t *rt, const char *id)
{
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  if (s != NULL)
    s->last_used_ms = sbx_mono_ms ();
  pthread_mutex_unlock (&rt->mu);
}

/* ---- listing ---------------------------------------------------------------- */

/* Parses one table ("sl local rem st ... inode"): LISTEN sockets only. */
static int
parse_table (const char *tab, bool v6, sbx_port_t **ports, size_t *n, size_t *cap)
{
  const char *line = strchr (tab, '\n'); /* the header */
  while (line != NULL && *++line != '\0')
    {
      char local[64], state[8];
      unsigned long inode = 0;
      unsigned lport;
      if (sscanf (line, "%*s %63[0-9A-Fa-f]:%x %*s %7s %*s %*s %*s %*s %*s %lu", local, &lport, state, &inode) == 4
          && strcmp (state, "0A") == 0)
        {
          if (*n == *cap)
            {
              size_t nc = *cap ? *cap * 2 : 16;
              sbx_port_t *p = realloc (*ports, nc * sizeof *p);
              if (p == NULL)
                return -1;
              *ports = p;
              *cap = nc;
            }
          sbx_port_t *p = &(*ports)[(*n)++];
          memset (p, 0, sizeof *p);
          p->port = lport;
          p->ipv6 = v6;
          p->inode = inode;
          /* The kernel prints each 32-bit word of the address as a number
           * in host order: the bytes are the word's memory. */
          unsigned char addr[16];
          size_t words = v6 ? 4 : 1;
          for (size_t w = 0; w < words; w++)
            {
              char hex[9];
              memcpy (hex, local + 8 * w, 8);
              hex[8] = '\0';
              uint32_t v = (uint32_t) strtoul (hex, NULL, 16);
              memcpy (addr + 4 * w, &v, 4);
            }
          inet_ntop (v6 ? AF_INET6 : AF_INET, addr, p->address, sizeof p->address);
          if (v6)
            {
              struct in6_addr a;
              memcpy (&a, addr, 16);
              p->loopback_only = IN6_IS_ADDR_LOOPBACK (&a) || (IN6_IS_ADDR_V4MAPPED (&a) && addr[12] == 127);
            }
          else
            p->loopback_only = addr[0] == 127;
        }
      line = strchr (line, '\n');
    }
  return 0;
}

/* The pid that host process `pid`, of `pidfd`, has inside its own pid
 * namespace: the last NSpid of the pidfd's fdinfo, which the kernel
 * writes in a few lines the process cannot change. (Not from
 * /proc/<pid>/status: its Groups line comes first and grows with the
 * process's supplementary groups, 65536 of them its own to set in its user
 * namespace, so a read of a fixed size could end anywhere — after the
 * host's pid, say.) 0 when not known, and when that process is gone: its
 * pid may have been another's since. */
static int
inner_pid (int pidfd, pid_t pid)
{
  char path[64];
  snprintf (path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  char buf[PORTS_FDINFO_MAX];
  ssize_t r = fd < 0 ? -1 : TEMP_FAILURE_RETRY (read (fd, buf, sizeof buf - 1));
  if (r <= 0)
    return 0;
  buf[r] = '\0';
  char *l = strstr (buf, "\nNSpid:");
  char *end = l != NULL ? strchr (l + 1, '\n') : NULL;
  if (end == NULL)
    return 0; /* no such line (an older kernel), or not all of it */
  *end = '\0';
  char *next;
  long first = strtol (l + 7, &next, 10); /* the pid as we see it: -1 once reaped */
  char *last = strrchr (l, '\t');
  long inner = last != NULL ? strtol (last + 1, &next, 10) : 0;
  if (first != pid || inner <= 0 || *next != '\0')
    return 0;
  return (int) inner;
}

/* Matches the socket descriptors of host process `pid` against `ports`;
 * *budget counts descriptors looked at. */
static void
match_process (pid_t pid, sbx_port_t *ports, size_t n, long *budget)
{
  /* The pidfd first: if its process still lives when a match is found,
   * the pid named it all along, so the directory opened after is its. */
  cleanup_close int pidfd = (int) syscall (SYS_pidfd_open, pid, 0);
  if (pidfd < 0)
    return;
  char path[64];
  snprintf (path, sizeof path, "/proc/%d", (int) pid);
  cleanup_close int dir = open (path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  int fdd = dir < 0 ? -1 : openat (dir, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fdd < 0 ? NULL : fdopendir (fdd);
  if (d == NULL)
    {
      if (fdd >= 0)
        close (fdd);
      return;
    }
  int inner = -1;
  struct dirent *de;
  while ((de = readdir (d)) != NULL && (*budget)-- > 0)
    {
      char link[64];
      ssize_t k = readlinkat (dirfd (d), de->d_name, link, sizeof link - 1);
      if (k <= 0)
        continue;
      link[k] = '\0';
      unsigned long ino;
      if (sscanf (link, "socket:[%lu]", &ino) != 1)
        continue;
      for (size_t i = 0; i < n; i++)
        if (ports[i].inode == ino && ports[i].pid == 0)
          {
            if (inner < 0)
              inner = inner_pid (pidfd, pid);
            ports[i].pid = inner;
          }
    }
  closedir (d);
}

/* Reads the pids of one cgroup.procs file under `dir`, into pids. */
static void
read_procs (int dir, const char *name, pid_t *pids, size_t *n)
{
  char path[300];
  snprintf (path, sizeof path, "%s/cgroup.procs", name);
  cleanup_close int fd = openat (dir, path, O_RDONLY | O_CLOEXEC);
  FILE *f = fd < 0 ? NULL : fdopen (fd, "r");
  if (f == NULL)
    return;
  fd = -1;
  int p;
  while (*n < PORTS_MAX_PIDS && fscanf (f, "%d", &p) == 1)
    pids[(*n)++] = p;
  fclose (f);
}

/* Fills the pid of the ports' owners, as far as the bounds allow. */
static void
find_owners (sbx_runtime_t *rt, const char *id, sbx_port_t *ports, size_t n)
{
  cleanup_free pid_t *pids = malloc (PORTS_MAX_PIDS * sizeof *pids);
  char root[sizeof rt->cg.roots[0] + SBX_ID_MAX + 2];
  if (sbx_path_fmt (root, sizeof root, NULL, "%s/%s", rt->cg.roots[0], id) < 0)
    return;
  cleanup_close int dir = open (root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pids == NULL || dir < 0)
    return;
  size_t np = 0;
  read_procs (dir, ".", pids, &np);
  int dd = dup (dir);
  DIR *d = dd < 0 ? NULL : fdopendir (dd);
  struct dirent *de;
  while (d != NULL && (de = readdir (d)) != NULL)
    if (de->d_type == DT_DIR && de->d_name[0] != '.')
      read_procs (dir, de->d_name, pids, &np);
  if (d != NULL)
    closedir (d);
  else if (dd >= 0)
    close (dd);
  long budget = PORTS_MAX_FDS;
  for (size_t i = 0; i < np && budget > 0; i++)
    match_process (pids[i], ports, n, &budget);
}

static int
port_cmp (const void *a, const void *b)
{
  const sbx_port_t *x = a, *y = b;
  if (x->port != y->port)
    return x->port < y->port ? -1 : 1;
  if (x->ipv6 != y->ipv6)
    return x->ipv6 ? 1 : -1;
  return strcmp (x->address, y->address);
}

int
sbx_port_list (sbx_runtime_t *rt, const char *id, sbx_port_t **out, size_t *n, err_t *err)
{
  netns_job_t j = {.list = true};
  int rc = in_netns (rt, id, &j, err);
  cleanup_free char *t4 = j.tab[0];
  cleanup_free char *t6 = j.tab[1];
  if (rc < 0)
    return -1;
  cleanup_free sbx_port_t *ports = NULL;
  size_t cnt = 0, cap = 0;
  if ((t4 != NULL && parse_table (t4, false, &ports, &cnt, &cap) < 0)
      || (t6 != NULL && parse_table (t6, true, &ports, &cnt, &cap) < 0))
    return err_make (err, ENOMEM, "ListPorts: out of memory");
  if (cnt > 0)
    {
      find_owners (rt, id, ports, cnt);
      qsort (ports, cnt, sizeof *ports, port_cmp);
    }
  *n = cnt;
  *out = take_ptr (&ports);
  return 0;
}

/* ---- any work inside the namespace ---------------------------------------- */

typedef struct netns_call_s
{
  int pidfd;
  void (*fn) (void *arg);
  void *arg;
  int error;
} netns_call_t;

static void *
netns_call_main (void *arg)
{
  netns_call_t *c = arg;
  if (setns (c->pidfd, CLONE_NEWNET) < 0)
    {
      c->error = errno == ESRCH ? ENOENT : errno;
      return NULL;
    }
  c->fn (c->arg);
  return NULL;
}

int
sbx_netns_run (sbx_runtime_t *rt, const char *id, void (*fn) (void *arg), void *arg, err_t *err)
{
  cleanup_close int pidfd = holder_pidfd (rt, id, err);
  if (pidfd < 0)
    return -1;
  netns_call_t c = {.pidfd = pidfd, .fn = fn, .arg = arg};
  pthread_t t;
  int rc = pthread_create (&t, NULL, netns_call_main, &c);
  if (rc != 0)
    return err_make_sys (err, rc, "a thread to enter sandbox `%s`", id);
  pthread_join (t, NULL);
  if (c.error != 0)
    return err_make_sys (err, c.error, "sandbox `%s`: enter its network namespace", id);
  return 0;
}
