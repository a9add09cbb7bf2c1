/* sbx_runtime: registry, lifecycle and exec pumping of sandboxes (see
 * sbx_runtime.h). State: the registry (a list under `mu`) and the reaper
 * thread. */
#include "gateway/sbx_runtime.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/sbx_cgroup.h"
#include "gateway/sbx_report.h"

extern char **environ;

typedef struct sbx_s
{
  char id[SBX_ID_MAX + 1];
  char state[PATH_MAX + SBX_ID_MAX + 2];
  pid_t holder;
  int holder_pidfd;
  int64_t created_ms;
  int64_t last_used_ms;
  bool allow_egress;
  bool ready;    /* launch finished */
  bool deleting; /* removed from lookups */
  int refs;      /* execs using it */
  pid_t helper;  /* the launch helper, while launching */
  int ctl_fd;    /* the holder's control socket: exec requests */
  pid_t slirp;   /* slirp4netns, when egress is on */
  int slirp_exit_fd; /* closing it tells slirp4netns to exit */
  unsigned exec_seq;
  struct sbx_s *next;
} sbx_t;

struct sbx_runtime_s
{
  sbx_config_t cfg;
  /* The host's own IPv4 addresses (loopback aside), unreachable from egress
   * sandboxes: slirp4netns connects from the host's network namespace. */
  char host_addrs[32][INET_ADDRSTRLEN];
  size_t n_host_addrs;
  sbx_cg_layout_t cg;
  char sandboxes_dir[PATH_MAX];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sbx_t *list;
  size_t count;
  bool stopping;
  pthread_t reaper;
  bool reaper_running;
};

static int64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t
mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool
sbx_id_valid (const char *id)
{
  size_t n = strlen (id);
  if (n == 0 || n > SBX_ID_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    {
      char c = id[i];
      bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (!alnum && (i == 0 || (c != '_' && c != '-')))
        return false;
    }
  return true;
}

size_t
sbx_count (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  size_t n = rt->count;
  pthread_mutex_unlock (&rt->mu);
  return n;
}

const sbx_config_t *
sbx_runtime_config (const sbx_runtime_t *rt)
{
  return &rt->cfg;
}

/* ---- helpers: processes and files ------------------------------------------ */

static int
rm_entry (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void) st;
  (void) flag;
  (void) ftw;
  remove (path);
  return 0;
}

static void
remove_tree (const char *path)
{
  nftw (path, rm_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* Spawn attributes for the programs the gateway starts: the gateway blocks
 * its shutdown signals in every thread; children start with none blocked
 * and every signal at its default. */
static void
spawn_attr_init (posix_spawnattr_t *attr)
{
  posix_spawnattr_init (attr);
  sigset_t none, all;
  sigemptyset (&none);
  sigfillset (&all);
  posix_spawnattr_setsigmask (attr, &none);
  posix_spawnattr_setsigdefault (attr, &all);
  posix_spawnattr_setflags (attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

/* Spawns sandbox-helper with stdio on in/out/errfd and the report socket
 * as fd 3. *report_fd is the gateway's end. */
static int
spawn_helper (sbx_runtime_t *rt, char *const *argv, char *const *envp, int in, int out, int errfd, pid_t *pid,
              int *report_fd, err_t *err)
{
  int sv[2];
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return err_make_sys (err, errno, "socketpair");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_adddup2 (&fa, in, 0);
  posix_spawn_file_actions_adddup2 (&fa, out, 1);
  posix_spawn_file_actions_adddup2 (&fa, errfd, 2);
  posix_spawn_file_actions_adddup2 (&fa, sv[1], SBX_REPORT_FD);
  posix_spawnattr_t attr;
  spawn_attr_init (&attr);
  int rc = posix_spawn (pid, rt->cfg.helper, &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy (&fa);
  posix_spawnattr_destroy (&attr);
  close (sv[1]);
  if (rc != 0)
    {
      close (sv[0]);
      return err_make_sys (err, rc, "spawn `%s`", rt->cfg.helper);
    }
  *report_fd = sv[0];
  return 0;
}

/* Waits up to timeout_ms for one report, and the descriptor it carries
 * (*fd, or -1; NULL: none expected). 1 got one, 0 EOF, -1 timeout or error. */
static int
read_report_fd (int sock, sbx_report_t *r, int timeout_ms, int *fd)
{
  if (fd != NULL)
    *fd = -1;
  struct pollfd p = {.fd = sock, .events = POLLIN};
  int rc = TEMP_FAILURE_RETRY (poll (&p, 1, timeout_ms));
  if (rc <= 0)
    return -1;
  int fds[1];
  size_t n_fds = 0;
  ssize_t n = sbx_recv_fds (sock, r, sizeof *r, fds, &n_fds, fd != NULL ? 1 : 0);
  if (n == 0)
    return 0;
  if (n != (ssize_t) sizeof *r)
    {
      for (size_t i = 0; i < n_fds; i++)
        close (fds[i]);
      return -1;
    }
  if (fd != NULL && n_fds == 1)
    *fd = fds[0];
  r->text[sizeof r->text - 1] = '\0';
  return 1;
}

static int
read_report (int sock, sbx_report_t *r, int timeout_ms)
{
  return read_report_fd (sock, r, timeout_ms, NULL);
}

static void
reap (pid_t pid)
{
  while (waitpid (pid, NULL, 0) < 0 && errno == EINTR)
    ;
}

/* ---- registry ---------------------------------------------------------------- */

static struct sbx_s *acquire (sbx_runtime_t *rt, const char *id);
static void release (sbx_runtime_t *rt, struct sbx_s *s);

static sbx_t *
find_locked (sbx_runtime_t *rt, const char *id)
{
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (strcmp (s->id, id) == 0)
      return s;
  return NULL;
}

static void
unlink_locked (sbx_runtime_t *rt, sbx_t *s)
{
  for (sbx_t **p = &rt->list; *p != NULL; p = &(*p)->next)
    if (*p == s)
      {
        *p = s->next;
        rt->count--;
        return;
      }
}

/* Starts slirp4netns for the sandbox whose pid 1 is `holder` and waits until
 * its network is configured. The host's loopback is refused
 * (--disable-host-loopback); slirp4netns runs in its own mount namespace
 * with its capabilities dropped and a seccomp filter. */
static int
start_slirp (sbx_runtime_t *rt, sbx_t *s, err_t *err)
{
  int ready[2], ex[2];
  if (pipe2 (ready, O_CLOEXEC) < 0)
    return err_make_sys (err, errno, "pipe");
  if (pipe2 (ex, O_CLOEXEC) < 0)
    {
      close (ready[0]);
      close (ready[1]);
      return err_make_sys (err, errno, "pipe");
    }
  char pid[24];
  snprintf (pid, sizeof pid, "%d", (int) s->holder);
  const char *argv[] = {rt->cfg.slirp4netns, "--configure", "--mtu=65520", "--disable-host-loopback",
                        "--enable-sandbox", "--enable-seccomp", "--ready-fd=3", "--exit-fd=4", pid, "tap0", NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_addopen (&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen (&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2 (&fa, ready[1], 3);
  posix_spawn_file_actions_adddup2 (&fa, ex[0], 4);
  posix_spawnattr_t attr;
  spawn_attr_init (&attr);
  int rc = posix_spawnp (&s->slirp, rt->cfg.slirp4netns, &fa, &attr, (char *const *) argv, environ);
  posix_spawn_file_actions_destroy (&fa);
  posix_spawnattr_destroy (&attr);
  close (ready[1]);
  close (ex[0]);
  if (rc != 0)
    {
      close (ready[0]);
      close (ex[1]);
      s->slirp = 0;
      return err_make_sys (err, rc, "start `%s` for egress", rt->cfg.slirp4netns);
    }
  s->slirp_exit_fd = ex[1];
  struct pollfd p = {.fd = ready[0], .events = POLLIN};
  char c = 0;
  int ok = TEMP_FAILURE_RETRY (poll (&p, 1, 10000)) == 1 && read (ready[0], &c, 1) == 1;
  close (ready[0]);
  if (!ok)
    return err_make (err, EIO, "slirp4netns did not configure the sandbox's network");
  return 0;
}

static void
stop_slirp (pid_t slirp, int exit_fd)
{
  if (exit_fd >= 0)
    close (exit_fd);
  if (slirp > 0)
    {
      kill (slirp, SIGTERM);
      reap (slirp);
    }
}

/* Kills and releases everything of a sandbox that is no longer in the
 * registry. Safe on a half-made sandbox. */
static void
teardown (sbx_runtime_t *rt, const char *id, const char *state, int pidfd)
{
  err_t err = ERR_INIT;
  if (pidfd >= 0)
    {
      syscall (SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
      /* The gateway is the holders' subreaper: reap this one now, so its
       * group empties at once (ECHILD if another process adopted it). */
      siginfo_t si;
      while (waitid ((idtype_t) P_PIDFD, (id_t) pidfd, &si, WEXITED) < 0 && errno == EINTR)
        ;
      close (pidfd);
    }
  if (sbx_cg_kill (&rt->cg, id, NULL, &err) < 0)
    {
      log_msg (SEV_WARNING, "delete `%s`: %s", id, err_msg (&err));
      err_release (&err);
    }
  char disk[PATH_MAX + SBX_ID_MAX + 16];
  snprintf (disk, sizeof disk, "%s/disk", state);
  if (umount2 (disk, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
    log_msg (SEV_WARNING, "delete `%s`: unmount `%s`: %s", id, disk, strerror (errno));
  remove_tree (state);
  if (sbx_cg_remove (&rt->cg, id, NULL, &err) < 0)
    {
      log_msg (SEV_WARNING, "delete `%s`: %s", id, err_msg (&err));
      err_release (&err);
    }
}

static void
fill_info (sbx_runtime_t *rt, const sbx_t *s, sbx_info_t *out)
{
  memset (out, 0, sizeof *out);
  snprintf (out->id, sizeof out->id, "%s", s->id);
  out->created_ms = s->created_ms;
  out->last_used_ms = s->last_used_ms;
  out->allow_egress = s->allow_egress;
  long n = sbx_cg_count (&rt->cg, s->id, NULL);
  out->process_count = n > 0 ? n : 0;
  char disk[PATH_MAX + SBX_ID_MAX + 16];
  snprintf (disk, sizeof disk, "%s/disk", s->state);
  struct statfs sf;
  if (statfs (disk, &sf) == 0)
    {
      out->disk_limit_bytes = (uint64_t) sf.f_blocks * (uint64_t) sf.f_bsize;
      out->disk_used_bytes = (uint64_t) (sf.f_blocks - sf.f_bfree) * (uint64_t) sf.f_bsize;
    }
}

/* ---- start-up cleanup and the idle reaper ----------------------------------- */

/* Unmounts every mount below `dir` (deepest first), as left by a crash. */
static void
unmount_below (const char *dir)
{
  size_t dlen = strlen (dir);
  for (int pass = 0; pass < 8; pass++)
    {
      FILE *f = fopen ("/proc/self/mountinfo", "re");
      if (f == NULL)
        return;
      char line[4096];
      int found = 0;
      while (fgets (line, sizeof line, f) != NULL)
        {
          char mp[PATH_MAX];
          if (sscanf (line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
          if (strncmp (mp, dir, dlen) == 0 && (mp[dlen] == '/' || mp[dlen] == '\0'))
            {
              umount2 (mp, MNT_DETACH);
              found++;
            }
        }
      fclose (f);
      if (found == 0)
        return;
    }
}

static void
clean_leftovers (sbx_runtime_t *rt)
{
  char **ids = sbx_cg_list (&rt->cg);
  size_t n = 0;
  for (size_t i = 0; ids != NULL && ids[i] != NULL; i++, n++)
    {
      err_t err = ERR_INIT;
      sbx_cg_kill (&rt->cg, ids[i], NULL, &err);
      err_release (&err);
    }
  unmount_below (rt->sandboxes_dir);
  DIR *d = opendir (rt->sandboxes_dir);
  if (d != NULL)
    {
      struct dirent *e;
      while ((e = readdir (d)) != NULL)
        if (e->d_name[0] != '.')
          {
            char path[PATH_MAX * 2];
            snprintf (path, sizeof path, "%s/%s", rt->sandboxes_dir, e->d_name);
            remove_tree (path);
            n++;
          }
      closedir (d);
    }
  for (size_t i = 0; ids != NULL && ids[i] != NULL; i++)
    {
      err_t err = ERR_INIT;
      sbx_cg_remove (&rt->cg, ids[i], NULL, &err);
      err_release (&err);
      free (ids[i]);
    }
  free (ids);
  if (n > 0)
    log_fields (SEV_INFO, json_pack ("{s:i}", "leftovers", (int) n), "removed what a previous run left behind");
}

static void *
reaper_main (void *arg)
{
  sbx_runtime_t *rt = arg;
  int64_t ttl_ms = rt->cfg.idle_ttl_seconds * 1000;
  pthread_mutex_lock (&rt->mu);
  while (!rt->stopping)
    {
      struct timespec until;
      clock_gettime (CLOCK_MONOTONIC, &until);
      until.tv_sec += 1;
      pthread_cond_timedwait (&rt->cv, &rt->mu, &until);
      if (rt->stopping)
        break;
      int64_t now = now_ms ();
      for (sbx_t *s = rt->list; s != NULL; s = s->next)
        if (s->ready && !s->deleting && s->refs == 0 && now - s->last_used_ms >= ttl_ms)
          {
            char id[SBX_ID_MAX + 1];
            snprintf (id, sizeof id, "%s", s->id);
            pthread_mutex_unlock (&rt->mu);
            log_fields (SEV_INFO, json_pack ("{s:s, s:i}", "sandbox_id", id, "idle_ttl", (int) rt->cfg.idle_ttl_seconds),
                        "deleting an idle sandbox");
            err_t err = ERR_INIT;
            sbx_delete (rt, id, &err);
            err_release (&err);
            pthread_mutex_lock (&rt->mu);
            break; /* the list changed: rescan on the next tick */
          }
    }
  pthread_mutex_unlock (&rt->mu);
  return NULL;
}

int
sbx_runtime_new (const sbx_config_t *cfg, sbx_runtime_t **out, err_t *err)
{
  sbx_runtime_t *rt = calloc (1, sizeof *rt);
  if (rt == NULL)
    return err_make (err, ENOMEM, "runtime: out of memory");
  rt->cfg = *cfg;
  pthread_mutex_init (&rt->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&rt->cv, &ca);
  pthread_condattr_destroy (&ca);
  if (access (cfg->helper, X_OK) < 0)
    {
      err_make_sys (err, errno, "sandbox helper `%s`", cfg->helper);
      goto fail;
    }
  if (sbx_cg_detect (cfg->cgroup_mount, cfg->cgroup_group, cfg->cpu_millis > 0, &rt->cg, err) < 0)
    goto fail;
  snprintf (rt->sandboxes_dir, sizeof rt->sandboxes_dir, "%s/sandboxes", cfg->state_dir);
  if ((mkdir (cfg->state_dir, 0700) < 0 && errno != EEXIST) || (mkdir (rt->sandboxes_dir, 0700) < 0 && errno != EEXIST))
    {
      err_make_sys (err, errno, "create the state directory `%s`", rt->sandboxes_dir);
      goto fail;
    }
  clean_leftovers (rt);
  struct ifaddrs *ifs = NULL;
  if (getifaddrs (&ifs) == 0)
    {
      for (struct ifaddrs *i = ifs; i != NULL && rt->n_host_addrs < 32; i = i->ifa_next)
        {
          if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
          const struct in_addr *a = &((const struct sockaddr_in *) i->ifa_addr)->sin_addr;
          if ((ntohl (a->s_addr) >> 24) == 127)
            continue;
          inet_ntop (AF_INET, a, rt->host_addrs[rt->n_host_addrs++], INET_ADDRSTRLEN);
        }
      freeifaddrs (ifs);
    }
  if (cfg->idle_ttl_seconds > 0)
    {
      if (pthread_create (&rt->reaper, NULL, reaper_main, rt) != 0)
        {
          err_make (err, EAGAIN, "start the idle reaper");
          goto fail;
        }
      rt->reaper_running = true;
    }
  *out = rt;
  return 0;
fail:
  pthread_mutex_destroy (&rt->mu);
  pthread_cond_destroy (&rt->cv);
  free (rt);
  return -1;
}

void
sbx_runtime_stop (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  rt->stopping = true;
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (!s->ready && s->helper > 0)
      kill (s->helper, SIGKILL); /* its launch fails and tears down */
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
}

void
sbx_runtime_destroy (sbx_runtime_t *rt)
{
  if (rt == NULL)
    return;
  sbx_runtime_stop (rt);
  if (rt->reaper_running)
    pthread_join (rt->reaper, NULL);
  /* Launches in flight end (their helpers were killed) and clean up. */
  pthread_mutex_lock (&rt->mu);
  for (;;)
    {
      bool launching = false;
      for (sbx_t *s = rt->list; s != NULL; s = s->next)
        launching = launching || !s->ready;
      if (!launching)
        break;
      pthread_cond_wait (&rt->cv, &rt->mu);
    }
  pthread_mutex_unlock (&rt->mu);
  for (;;)
    {
      pthread_mutex_lock (&rt->mu);
      sbx_t *s = rt->list;
      while (s != NULL && (s->deleting || !s->ready))
        s = s->next;
      char id[SBX_ID_MAX + 1] = "";
      if (s != NULL)
        snprintf (id, sizeof id, "%s", s->id);
      pthread_mutex_unlock (&rt->mu);
      if (id[0] == '\0')
        break;
      err_t err = ERR_INIT;
      sbx_delete (rt, id, &err);
      err_release (&err);
    }
  pthread_mutex_destroy (&rt->mu);
  pthread_cond_destroy (&rt->cv);
  free (rt);
}

/* ---- launch, delete, get, list ---------------------------------------------- */

/* Feeds the tar from `src` into the helper's stdin until the source ends,
 * watching the report socket: an early report means the helper refused the
 * stream (its reason comes with it). 0 fed; -1 with *err. */
static int
feed_tar (int pipe_fd, int report_fd, sbx_source_fn src, void *src_ctx, sbx_report_t *early, bool *got_early,
          err_t *err)
{
  *got_early = false;
  for (;;)
    {
      const uint8_t *data = NULL;
      ssize_t n = src (src_ctx, &data, err);
      if (n < 0)
        return -1;
      if (n == 0)
        return 0;
      size_t off = 0;
      while (off < (size_t) n)
        {
          struct pollfd p[2] = {{.fd = pipe_fd, .events = POLLOUT}, {.fd = report_fd, .events = POLLIN}};
          if (TEMP_FAILURE_RETRY (poll (p, 2, -1)) < 0)
            return err_make_sys (err, errno, "restore: poll");
          if (p[1].revents != 0)
            {
              *got_early = read_report (report_fd, early, 0) == 1;
              return 0;
            }
          ssize_t w = TEMP_FAILURE_RETRY (write (pipe_fd, data + off, (size_t) n - off));
          if (w < 0 && errno == EAGAIN)
            continue;
          if (w < 0)
            {
              /* The helper stopped reading; its report says why. */
              *got_early = read_report (report_fd, early, 10000) == 1;
              return 0;
            }
          off += (size_t) w;
        }
    }
}

int
sbx_launch (sbx_runtime_t *rt, const char *id, bool allow_egress, sbx_info_t *out, err_t *err)
{
  return sbx_restore (rt, id, allow_egress, NULL, NULL, out, err);
}

int
sbx_restore (sbx_runtime_t *rt, const char *id, bool allow_egress, sbx_source_fn src, void *src_ctx, sbx_info_t *out,
             err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id: ids match ^[A-Za-z0-9][A-Za-z0-9_-]*$, at most 64 characters");
  sbx_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return err_make (err, ENOMEM, "launch: out of memory");
  snprintf (s->id, sizeof s->id, "%s", id);
  snprintf (s->state, sizeof s->state, "%s/%s", rt->sandboxes_dir, id);
  s->holder_pidfd = -1;
  s->slirp_exit_fd = -1;
  s->ctl_fd = -1;
  s->allow_egress = allow_egress && rt->cfg.allow_egress;
  s->created_ms = s->last_used_ms = now_ms ();

  pthread_mutex_lock (&rt->mu);
  if (rt->stopping)
    {
      pthread_mutex_unlock (&rt->mu);
      free (s);
      return err_make (err, ESHUTDOWN, "the gateway is shutting down");
    }
  if (find_locked (rt, id) != NULL)
    {
      pthread_mutex_unlock (&rt->mu);
      free (s);
      return err_make (err, EEXIST, "sandbox `%s` already exists", id);
    }
  if ((long) rt->count >= rt->cfg.max_sandboxes)
    {
      pthread_mutex_unlock (&rt->mu);
      free (s);
      return err_make (err, EAGAIN, "too many sandboxes: the limit is %ld (SANDBOX_MAX)", rt->cfg.max_sandboxes);
    }
  s->next = rt->list;
  rt->list = s;
  rt->count++;
  pthread_mutex_unlock (&rt->mu);

  char disk_mb[24], pids[24], mem[24], cpu[24];
  snprintf (disk_mb, sizeof disk_mb, "%ld", rt->cfg.disk_mb);
  snprintf (pids, sizeof pids, "%ld", rt->cfg.pids_max);
  snprintf (mem, sizeof mem, "%ld", rt->cfg.memory_mb);
  snprintf (cpu, sizeof cpu, "%ld", rt->cfg.cpu_millis);
  const char *argv[160] = {"sandbox-helper", "launch", "--id", id, "--state", s->state, "--lower", rt->cfg.rootfs,
                          "--cgroup-mount", rt->cfg.cgroup_mount, "--cgroup-group", rt->cfg.cgroup_group,
                          "--disk-mb", disk_mb, "--pids", pids, "--memory-mb", mem, "--cpu-millis", cpu};
  size_t n = 20;
  for (size_t i = 0; rt->cfg.volumes != NULL && rt->cfg.volumes[i] != NULL && n < 60; i++)
    {
      argv[n++] = "--volume";
      argv[n++] = rt->cfg.volumes[i];
    }
  for (size_t i = 0; rt->cfg.masks != NULL && rt->cfg.masks[i] != NULL && n < 80; i++)
    {
      argv[n++] = "--mask";
      argv[n++] = rt->cfg.masks[i];
    }
  if (s->allow_egress)
    {
      argv[n++] = "--egress";
      for (size_t i = 0; i < rt->n_host_addrs && n < 88; i++)
        {
          argv[n++] = "--block";
          argv[n++] = rt->host_addrs[i];
        }
    }
  char max_entries[24];
  snprintf (max_entries, sizeof max_entries, "%ld", rt->cfg.snapshot_max_entries);
  if (src != NULL)
    {
      argv[n++] = "--restore";
      argv[n++] = "--max-entries";
      argv[n++] = max_entries;
      argv[n++] = "--unpacker";
      argv[n++] = rt->cfg.unpacker;
    }
  argv[n] = NULL;

  int rc = -1;
  cleanup_close int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  int tar_pipe[2] = {-1, -1};
  pid_t helper = -1;
  cleanup_close int report_fd = -1;
  if (src != NULL && pipe2 (tar_pipe, O_CLOEXEC) < 0)
    err_make_sys (err, errno, "restore: pipe");
  else if (spawn_helper (rt, (char *const *) argv, environ, src != NULL ? tar_pipe[0] : null, null, STDERR_FILENO,
                         &helper, &report_fd, err)
           == 0)
    {
      pthread_mutex_lock (&rt->mu);
      s->helper = helper;
      bool stopping = rt->stopping;
      pthread_mutex_unlock (&rt->mu);
      if (stopping)
        kill (helper, SIGKILL);
      sbx_report_t r;
      int got = 0;
      bool fed_ok = true;
      if (src != NULL)
        {
          close (tar_pipe[0]);
          tar_pipe[0] = -1;
          bool early = false;
          fed_ok = feed_tar (tar_pipe[1], report_fd, src, src_ctx, &r, &early, err) == 0;
          close (tar_pipe[1]);
          tar_pipe[1] = -1;
          if (!fed_ok)
            kill (helper, SIGKILL);
          got = early ? 1 : 0;
        }
      int ctl = -1;
      if (fed_ok && got == 0)
        got = read_report_fd (report_fd, &r, 60000, &ctl);
      if (!fed_ok)
        {
          /* *err says why the source failed */
        }
      else if (got == 1 && r.type == SBX_REPORT_READY && ctl < 0)
        err_make (err, EIO, "launch `%s`: the helper sent no control socket", id);
      else if (got == 1 && r.type == SBX_REPORT_READY)
        {
          s->ctl_fd = ctl;
          s->holder = r.a;
          s->holder_pidfd = (int) syscall (SYS_pidfd_open, s->holder, 0);
          rc = s->allow_egress ? start_slirp (rt, s, err) : 0;
        }
      else if (got == 1 && r.type == SBX_REPORT_ERROR)
        err_make (err, r.status, "%s `%s`: %s", src != NULL ? "restore" : "launch", id, r.text);
      else
        err_make (err, EIO, "launch `%s`: the helper ended without a report", id);
      reap (helper);
      pthread_mutex_lock (&rt->mu);
      s->helper = 0;
      pthread_mutex_unlock (&rt->mu);
    }
  else
    err_wrap (err, "launch `%s`", id);
  for (int i = 0; i < 2; i++)
    if (tar_pipe[i] >= 0)
      close (tar_pipe[i]);

  if (rc < 0)
    {
      stop_slirp (s->slirp, s->slirp_exit_fd);
      if (s->ctl_fd >= 0)
        close (s->ctl_fd);
      teardown (rt, id, s->state, s->holder_pidfd);
      pthread_mutex_lock (&rt->mu);
      unlink_locked (rt, s);
      pthread_cond_broadcast (&rt->cv);
      pthread_mutex_unlock (&rt->mu);
      free (s);
      /* A failure to build the sandbox is the gateway's, not the caller's;
       * a bad snapshot (EINVAL) or one over the quota (ENOSPC) is the
       * caller's. */
      bool callers = src != NULL && (err->status == EINVAL || err->status == ENOSPC || err->status == ECANCELED);
      if (!callers && (err->status == EINVAL || err->status == ENOENT || err->status == EEXIST))
        err->status = EIO;
      return -1;
    }

  pthread_mutex_lock (&rt->mu);
  s->ready = true;
  if (out != NULL)
    fill_info (rt, s, out);
  pthread_mutex_unlock (&rt->mu);
  log_fields (SEV_INFO, json_pack ("{s:s, s:b, s:i}", "sandbox_id", id, "allow_egress", s->allow_egress, "holder_pid",
                                   (int) s->holder),
              src != NULL ? "sandbox restored" : "sandbox launched");
  return 0;
}

int
sbx_with_layer (sbx_runtime_t *rt, const char *id, bool freeze, sbx_layer_fn fn, void *ctx, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  sbx_t *s = acquire (rt, id);
  if (s == NULL)
    return err_make (err, ENOENT, "sandbox `%s` not found", id);
  char upper[sizeof s->state + 16];
  snprintf (upper, sizeof upper, "%s/disk/upper", s->state);
  int rc = 0;
  if (freeze && sbx_cg_freeze (&rt->cg, id, true, err) < 0)
    rc = err_wrap (err, "freeze `%s`", id);
  if (rc == 0)
    rc = fn (upper, ctx, err);
  if (freeze)
    {
      /* Thaw whatever happened, including a consumer that went away. */
      err_t terr = ERR_INIT;
      if (sbx_cg_freeze (&rt->cg, id, false, &terr) < 0)
        log_msg (SEV_ERROR, "thaw `%s`: %s", id, err_msg (&terr));
      err_release (&terr);
    }
  release (rt, s);
  return rc;
}

int
sbx_delete (sbx_runtime_t *rt, const char *id, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = find_locked (rt, id);
  if (s == NULL || !s->ready || s->deleting)
    {
      pthread_mutex_unlock (&rt->mu);
      return err_make (err, ENOENT, "sandbox `%s` not found", id);
    }
  s->deleting = true;
  int pidfd = s->holder_pidfd;
  s->holder_pidfd = -1;
  pid_t slirp = s->slirp;
  int slirp_exit_fd = s->slirp_exit_fd;
  s->slirp = 0;
  s->slirp_exit_fd = -1;
  char state[sizeof s->state];
  snprintf (state, sizeof state, "%s", s->state);
  pthread_mutex_unlock (&rt->mu);

  /* Kill first: execs in flight see their command die and let go. */
  stop_slirp (slirp, slirp_exit_fd);
  teardown (rt, id, state, pidfd);

  pthread_mutex_lock (&rt->mu);
  while (s->refs > 0)
    pthread_cond_wait (&rt->cv, &rt->mu);
  unlink_locked (rt, s);
  pthread_mutex_unlock (&rt->mu);
  if (s->ctl_fd >= 0)
    close (s->ctl_fd);
  free (s);
  log_fields (SEV_INFO, json_pack ("{s:s}", "sandbox_id", id), "sandbox deleted");
  return 0;
}

int
sbx_get (sbx_runtime_t *rt, const char *id, sbx_info_t *out, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = find_locked (rt, id);
  if (s == NULL || !s->ready || s->deleting)
    {
      pthread_mutex_unlock (&rt->mu);
      return err_make (err, ENOENT, "sandbox `%s` not found", id);
    }
  s->last_used_ms = now_ms ();
  fill_info (rt, s, out);
  pthread_mutex_unlock (&rt->mu);
  return 0;
}

static int
info_cmp (const void *a, const void *b)
{
  return strcmp (((const sbx_info_t *) a)->id, ((const sbx_info_t *) b)->id);
}

int
sbx_list (sbx_runtime_t *rt, sbx_info_t **out, size_t *n, err_t *err)
{
  pthread_mutex_lock (&rt->mu);
  sbx_info_t *v = calloc (rt->count + 1, sizeof *v);
  if (v == NULL)
    {
      pthread_mutex_unlock (&rt->mu);
      return err_make (err, ENOMEM, "list: out of memory");
    }
  size_t k = 0;
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (s->ready && !s->deleting)
      fill_info (rt, s, &v[k++]);
  pthread_mutex_unlock (&rt->mu);
  qsort (v, k, sizeof *v, info_cmp);
  *out = v;
  *n = k;
  return 0;
}

/* ---- exec -------------------------------------------------------------------- */

static const char *const default_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
};

/* Builds the command's environment: defaults overridden by the request. */
static char **
build_env (char *const *extra)
{
  size_t n_extra = 0;
  while (extra != NULL && extra[n_extra] != NULL)
    n_extra++;
  size_t n_def = sizeof default_env / sizeof default_env[0];
  char **env = calloc (n_def + n_extra + 1, sizeof *env);
  if (env == NULL)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n_def; i++)
    {
      size_t klen = strcspn (default_env[i], "=") + 1;
      bool overridden = false;
      for (size_t j = 0; j < n_extra && !overridden; j++)
        overridden = strncmp (extra[j], default_env[i], klen) == 0;
      if (!overridden)
        env[k++] = (char *) default_env[i];
    }
  for (size_t j = 0; j < n_extra; j++)
    env[k++] = extra[j];
  env[k] = NULL;
  return env;
}

static sbx_t *
acquire (sbx_runtime_t *rt, const char *id)
{
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = find_locked (rt, id);
  if (s != NULL && s->ready && !s->deleting)
    {
      s->refs++;
      s->last_used_ms = now_ms ();
    }
  else
    s = NULL;
  pthread_mutex_unlock (&rt->mu);
  return s;
}

static void
release (sbx_runtime_t *rt, sbx_t *s)
{
  pthread_mutex_lock (&rt->mu);
  s->refs--;
  s->last_used_ms = now_ms ();
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
}

typedef struct pump_s
{
  int fd;
  int stream;
  bool open;
} pump_t;

/* Reads what is there on `p` and hands it to the sink. -1: consumer gone. */
static int
pump (pump_t *p, uint8_t *buf, const sbx_exec_sink_t *sink, bool *got)
{
  ssize_t n = TEMP_FAILURE_RETRY (read (p->fd, buf, SBX_EXEC_CHUNK));
  if (n > 0)
    {
      *got = true;
      return sink->output (sink->ctx, p->stream, buf, (size_t) n);
    }
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
    {
      p->open = false;
      close (p->fd);
      p->fd = -1;
    }
  return 0;
}

int
sbx_exec (sbx_runtime_t *rt, const sbx_exec_req_t *req, const sbx_exec_sink_t *sink, sbx_exec_result_t *res,
          err_t *err)
{
  memset (res, 0, sizeof *res);
  if (!sbx_id_valid (req->id))
    return err_make (err, EINVAL, "invalid sandbox id");
  if (req->argv == NULL || req->argv[0] == NULL || req->argv[0][0] == '\0')
    return err_make (err, EINVAL, "argv must name a program");
  if (req->timeout_seconds > SBX_EXEC_MAX_TIMEOUT)
    return err_make (err, EINVAL, "timeout_seconds %u is above the maximum of %d", req->timeout_seconds,
                     SBX_EXEC_MAX_TIMEOUT);
  const char *cwd = req->cwd != NULL && req->cwd[0] != '\0' ? req->cwd : "/root";
  if (cwd[0] != '/')
    return err_make (err, EINVAL, "cwd `%s` is not an absolute path", cwd);
  uint32_t timeout = req->timeout_seconds ? req->timeout_seconds : SBX_EXEC_DEFAULT_TIMEOUT;

  sbx_t *s = acquire (rt, req->id);
  if (s == NULL)
    return err_make (err, ENOENT, "sandbox `%s` not found", req->id);

  pthread_mutex_lock (&rt->mu);
  unsigned seq = ++s->exec_seq;
  int ctl = s->ctl_fd;
  pthread_mutex_unlock (&rt->mu);
  char group[32];
  snprintf (group, sizeof group, "exec-%u", seq);

  cleanup_free char **env = build_env (req->env);
  cleanup_free char *msg = malloc (SBX_EXEC_MAX);
  int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, rep[2] = {-1, -1};
  cleanup_close int report_fd = -1;
  cleanup_close int procs_fd = -1;
  cleanup_free uint8_t *buf = NULL;
  int rc = -1;
  sbx_cg_events_t before, after;
  sbx_cg_events (&rt->cg, req->id, &before);
  if (msg == NULL || env == NULL)
    {
      err_make (err, ENOMEM, "exec: out of memory");
      goto done;
    }
  ssize_t msg_len = sbx_exec_encode (msg, SBX_EXEC_MAX, cwd, req->argv, env);
  if (msg_len < 0)
    {
      err_make (err, E2BIG, "argv and env together exceed %d KiB", SBX_EXEC_MAX / 1024);
      goto done;
    }
  if (sbx_cg_open_track (&rt->cg, req->id, group, &procs_fd, err) < 0)
    goto done;
  if (pipe2 (in, O_CLOEXEC) < 0 || pipe2 (out, O_CLOEXEC) < 0 || pipe2 (errp, O_CLOEXEC) < 0
      || socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rep) < 0)
    {
      err_make_sys (err, errno, "exec: pipe");
      goto done;
    }
  /* Bigger pipes: fewer wake-ups for a chatty command. */
  fcntl (out[0], F_SETPIPE_SZ, 1024 * 1024);
  fcntl (errp[0], F_SETPIPE_SZ, 256 * 1024);
  int64_t started = mono_ms ();
  /* The holder forks the command inside the sandbox with these as its
   * stdin, stdout, stderr, report socket and cgroup. */
  int pass[SBX_EXEC_FDS] = {in[0], out[1], errp[1], rep[1], procs_fd};
  if (sbx_send_fds (ctl, msg, (size_t) msg_len, pass, SBX_EXEC_FDS) < 0)
    {
      err_make_sys (err, errno == EPIPE || errno == ECONNREFUSED ? ESRCH : errno,
                    "sandbox `%s` is gone (its pid 1 does not answer)", req->id);
      goto done;
    }
  report_fd = take_fd (&rep[0]);
  close (in[0]);
  close (out[1]);
  close (errp[1]);
  close (rep[1]);
  in[0] = out[1] = errp[1] = rep[1] = -1;
  fcntl (out[0], F_SETFL, O_NONBLOCK);
  fcntl (errp[0], F_SETFL, O_NONBLOCK);
  fcntl (in[1], F_SETFL, O_NONBLOCK);
  size_t stdin_off = 0;
  if (req->stdin_len == 0)
    {
      close (in[1]);
      in[1] = -1;
    }

  buf = malloc (SBX_EXEC_CHUNK);
  if (buf == NULL)
    {
      err_make (err, ENOMEM, "exec: out of memory");
      sbx_cg_kill (&rt->cg, req->id, group, NULL);
      goto done;
    }
  pump_t pumps[2] = {{out[0], 1, true}, {errp[0], 2, true}};
  out[0] = errp[0] = -1;
  int64_t deadline = started + (int64_t) timeout * 1000;
  bool exited = false, killed = false, consumer_gone = false;
  int64_t drain_until = 0;
  char start_error[sizeof ((sbx_report_t *) 0)->text] = "";
  for (;;)
    {
      int64_t now = mono_ms ();
      if (!killed && (now >= deadline || consumer_gone || sink->cancelled (sink->ctx)))
        {
          if (now >= deadline)
            res->timed_out = true;
          else
            res->cancelled = true;
          killed = true;
          err_t kerr = ERR_INIT;
          if (sbx_cg_kill (&rt->cg, req->id, group, &kerr) < 0)
            log_msg (SEV_WARNING, "exec in `%s`: %s", req->id, err_msg (&kerr));
          err_release (&kerr);
        }
      if (exited && ((!pumps[0].open && !pumps[1].open) || now >= drain_until || consumer_gone))
        break;

      struct pollfd p[4];
      int np = 0, ip[4];
      for (int i = 0; i < 2; i++)
        if (pumps[i].open)
          {
            ip[np] = i;
            p[np++] = (struct pollfd){.fd = pumps[i].fd, .events = POLLIN};
          }
      int rep_idx = -1, in_idx = -1;
      if (!exited)
        {
          rep_idx = np;
          p[np++] = (struct pollfd){.fd = report_fd, .events = POLLIN};
        }
      if (in[1] >= 0)
        {
          in_idx = np;
          p[np++] = (struct pollfd){.fd = in[1], .events = POLLOUT};
        }
      int64_t wait = exited ? drain_until - now : deadline - now;
      if (wait > 100)
        wait = 100; /* a few looks a second at cancellation */
      if (wait < 0)
        wait = 0;
      int pr = TEMP_FAILURE_RETRY (poll (p, (nfds_t) np, (int) wait));
      if (pr < 0)
        {
          err_make_sys (err, errno, "exec: poll");
          break;
        }
      bool got = false;
      for (int i = 0; i < np; i++)
        {
          if (p[i].revents == 0)
            continue;
          if (i == rep_idx)
            {
              sbx_report_t r;
              int g = read_report (report_fd, &r, 0);
              if (g == 1 && r.type == SBX_REPORT_ERROR)
                snprintf (start_error, sizeof start_error, "%s", r.text);
              else if (g == 1 && r.type == SBX_REPORT_EXIT)
                {
                  res->exit_code = r.a;
                  res->signal = r.b;
                  exited = true;
                }
              else if (g <= 0)
                {
                  /* The sandbox's pid 1 died without a word (deleted). */
                  res->exit_code = -1;
                  res->signal = SIGKILL;
                  exited = true;
                }
              if (exited)
                drain_until = mono_ms () + 200;
            }
          else if (i == in_idx)
            {
              ssize_t w = write (in[1], req->stdin_data + stdin_off, req->stdin_len - stdin_off);
              if (w > 0)
                stdin_off += (size_t) w;
              if ((w < 0 && errno != EAGAIN) || stdin_off >= req->stdin_len)
                {
                  close (in[1]);
                  in[1] = -1;
                }
            }
          else if (!consumer_gone && pump (&pumps[ip[i]], buf, sink, &got) < 0)
            consumer_gone = true;
        }
      if (exited && got)
        drain_until = mono_ms () + 50 > drain_until ? mono_ms () + 50 : drain_until;
    }
  if (start_error[0] != '\0' && !consumer_gone)
    {
      char line[sizeof start_error + 16];
      int len = snprintf (line, sizeof line, "sandbox: %s\n", start_error);
      sink->output (sink->ctx, 2, (const uint8_t *) line, (size_t) len);
      size_t cut = strnlen (start_error, sizeof res->message - 1); /* cut to fit */
      memcpy (res->message, start_error, cut);
      res->message[cut] = 0;
    }
  for (int i = 0; i < 2; i++)
    if (pumps[i].fd >= 0)
      close (pumps[i].fd);
  res->duration_ms = (uint64_t) (mono_ms () - started);
  if (res->timed_out)
    snprintf (res->message, sizeof res->message, "killed after the %u s timeout, with everything it started",
              timeout);
  else if (res->cancelled)
    snprintf (res->message, sizeof res->message, "killed: the client went away");
  rc = 0;

done:
  sbx_cg_events (&rt->cg, req->id, &after);
  if (rc == 0 && after.oom_kills > before.oom_kills)
    {
      res->oom_killed = true;
      snprintf (res->message, sizeof res->message, "the sandbox's memory limit (%ld MiB) killed a process",
                rt->cfg.memory_mb);
    }
  else if (rc == 0 && after.pids_max_hits > before.pids_max_hits && res->message[0] == '\0')
    snprintf (res->message, sizeof res->message, "the sandbox's process limit (%ld) refused new processes",
              rt->cfg.pids_max);
  /* The exec's cgroup goes when nothing it started is left. */
  err_t rerr = ERR_INIT;
  sbx_cg_remove (&rt->cg, req->id, group, &rerr);
  err_release (&rerr);
  int fds[] = {in[0], in[1], out[0], out[1], errp[0], errp[1], rep[0], rep[1]};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    if (fds[i] >= 0)
      close (fds[i]);
  release (rt, s);
  return rc;
}
