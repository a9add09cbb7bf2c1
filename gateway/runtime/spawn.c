/* runtime/spawn: starting the programs the gateway runs (sandbox-helper,
 * slirp4netns), reading their reports, reaping them, and removing trees on
 * the host side. No state. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"

char *const sbx_helper_env[] = {
    (char *) "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    NULL,
};

static int
rm_entry (const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void) st;
  (void) flag;
  (void) ftw;
  remove (path);
  return 0;
}

void
sbx_remove_tree (const char *path)
{
  nftw (path, rm_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* Spawn attributes for the programs the gateway starts: the gateway blocks
 * its shutdown signals in every thread; children start with none blocked,
 * every signal at its default, and in a process group of their own, so
 * that nothing they or a sandbox do to "their group" reaches the gateway. */
void
sbx_spawn_attr_init (posix_spawnattr_t *attr)
{
  posix_spawnattr_init (attr);
  sigset_t none, all;
  sigemptyset (&none);
  sigfillset (&all);
  posix_spawnattr_setsigmask (attr, &none);
  posix_spawnattr_setsigdefault (attr, &all);
  posix_spawnattr_setpgroup (attr, 0);
  posix_spawnattr_setflags (attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
}

int
sbx_fd_keep (int fd)
{
  int high = fcntl (fd, F_DUPFD_CLOEXEC, SBX_FD_HIGH);
  if (high < 0)
    return fd; /* a low open-file limit: it stays where it is */
  close (fd);
  return high;
}

/* What the child of spawn_low needs, in the memory it shares with the
 * gateway until it execs. */
typedef struct spawn_child_s
{
  const char *path;
  char *const *argv, *const *envp;
  const int *from; /* from[i] becomes descriptor i */
  size_t n;
  int err;         /* set by the child when it fails */
  bool no_unshare; /* close_range could not give it a table of its own */
} spawn_child_t;

static int
spawn_child (void *arg)
{
  spawn_child_t *c = arg;
  /* Until this returns, the descriptor table is the gateway's (CLONE_FILES):
   * nothing here touches it before. */
  if (syscall (SYS_close_range, SBX_FD_HIGH, ~0U, CLOSE_RANGE_UNSHARE) < 0)
    {
      c->err = errno;
      c->no_unshare = true;
      _exit (127);
    }
  /* Every source first moves above the targets, so that no dup2 below
   * overwrites a source a later one still needs (5 -> 6 after 6 -> 5). */
  int high[SBX_SPAWN_MAX_FDS];
  for (size_t i = 0; i < c->n; i++)
    if ((high[i] = fcntl (c->from[i], F_DUPFD_CLOEXEC, (int) c->n)) < 0)
      {
        c->err = errno;
        _exit (127);
      }
  for (size_t i = 0; i < c->n; i++)
    if (dup2 (high[i], (int) i) < 0)
      {
        c->err = errno;
        _exit (127);
      }
  /* As sbx_spawn_attr_init's attributes: a process group of its own,
   * every signal at its default, none blocked (blocked since the clone,
   * so no handler of the gateway's ever runs here). */
  setpgid (0, 0);
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  for (int sig = 1; sig < _NSIG; sig++)
    sigaction (sig, &dfl, NULL);
  sigset_t none;
  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  execve (c->path, c->argv, c->envp);
  c->err = errno;
  _exit (127);
}

/* Starts `path` with descriptors from[0..n) as 0..n-1, as posix_spawn
 * would, but without copying the gateway's whole descriptor table: the
 * child shares it (CLONE_FILES) until close_range(CLOSE_RANGE_UNSHARE)
 * gives it a copy of what is below SBX_FD_HIGH only, where the sandboxes'
 * descriptors are not (sbx_fd_keep). posix_spawn's copy, and its closing
 * again at exec, cost a launch more with every live sandbox. 0, or an
 * errno; ENOTSUP: use posix_spawn. */
static int
spawn_low (const char *path, char *const *argv, char *const *envp, const int *from, size_t n, pid_t *pid)
{
  if (n > SBX_SPAWN_MAX_FDS)
    return EINVAL;
  for (size_t i = 0; i < n; i++)
    if (from[i] < 0 || from[i] >= SBX_FD_HIGH)
      return ENOTSUP;
  spawn_child_t c = {.path = path, .argv = argv, .envp = envp, .from = from, .n = n};
  const size_t stack_size = 64 * 1024;
  void *stack = mmap (NULL, stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED)
    return errno;
  sigset_t all, old;
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  /* CLONE_VFORK: this returns once the child has exec-ed or exited. */
  pid_t p = clone (spawn_child, (char *) stack + stack_size, CLONE_VM | CLONE_VFORK | CLONE_FILES | SIGCHLD, &c);
  int e = p < 0 ? errno : 0;
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  munmap (stack, stack_size);
  if (p < 0)
    return e;
  if (c.err != 0)
    {
      sbx_reap (p);
      return c.no_unshare ? ENOTSUP : c.err;
    }
  *pid = p;
  return 0;
}

int
sbx_spawn_helper (sbx_runtime_t *rt, char *const *argv, int in, int out, int errfd, bool volumes, pid_t *pid,
                  int *report_fd, err_t *err)
{
  int sv[2];
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return err_make_sys (err, errno, "socketpair");
  cleanup_close int mine = sv[0], theirs = sv[1];
  int from[SBX_SPAWN_MAX_FDS] = {in, out, errfd, theirs, rt->base_ns_fd, rt->filter_fd};
  size_t n = rt->filter_fd >= 0 ? 6 : rt->base_ns_fd >= 0 ? 5 : 4;
  if (volumes && rt->n_volume_fds > 0)
    {
      if (n != SBX_VOLUME_FD0)
        return err_make (err, EINVAL, "volumes are handed to a launch only once the launch descriptors exist");
      for (size_t i = 0; i < rt->n_volume_fds; i++)
        from[n++] = rt->volume_fds[i];
    }
  int rc = spawn_low (rt->cfg.helper, argv, sbx_helper_env, from, n, pid);
  if (rc == 0)
    {
      *report_fd = take_fd (&mine);
      return 0;
    }
  if (rc != ENOTSUP)
    return err_make_sys (err, rc, "spawn `%s`", rt->cfg.helper);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_adddup2 (&fa, in, 0);
  posix_spawn_file_actions_adddup2 (&fa, out, 1);
  posix_spawn_file_actions_adddup2 (&fa, errfd, 2);
  posix_spawn_file_actions_adddup2 (&fa, theirs, SBX_REPORT_FD);
  if (rt->base_ns_fd >= 0)
    posix_spawn_file_actions_adddup2 (&fa, rt->base_ns_fd, SBX_BASE_NS_FD);
  if (rt->filter_fd >= 0)
    posix_spawn_file_actions_adddup2 (&fa, rt->filter_fd, SBX_FILTER_FD);
  for (size_t i = SBX_VOLUME_FD0; i < n; i++)
    posix_spawn_file_actions_adddup2 (&fa, from[i], (int) i);
  posix_spawnattr_t attr;
  sbx_spawn_attr_init (&attr);
  rc = posix_spawn (pid, rt->cfg.helper, &fa, &attr, argv, sbx_helper_env);
  posix_spawn_file_actions_destroy (&fa);
  posix_spawnattr_destroy (&attr);
  if (rc != 0)
    return err_make_sys (err, rc, "spawn `%s`", rt->cfg.helper);
  *report_fd = take_fd (&mine);
  return 0;
}

int
sbx_run_helper_once (sbx_runtime_t *rt, const char *const *argv, bool volumes, int timeout_ms, sbx_report_t *r,
                     int *fd, int *got, err_t *err)
{
  cleanup_close int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  cleanup_close int report_fd = -1;
  pid_t pid = -1;
  if (sbx_spawn_helper (rt, (char *const *) argv, null, null, STDERR_FILENO, volumes, &pid, &report_fd, err) < 0)
    return -1;
  *got = sbx_read_report (report_fd, r, timeout_ms, fd, fd != NULL ? 1 : 0);
  if (*got != 1)
    kill (pid, SIGKILL);
  sbx_reap (pid);
  return 0;
}

void
sbx_reap (pid_t pid)
{
  while (waitpid (pid, NULL, 0) < 0 && errno == EINTR)
    ;
}
