/* runtime/spawn: starting the programs the gateway runs (sandbox-helper,
 * slirp4netns), reading their reports, reaping them, and removing trees on
 * the host side. No state. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/socket.h>
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
sbx_spawn_helper (sbx_runtime_t *rt, char *const *argv, int in, int out, int errfd, pid_t *pid, int *report_fd,
                  err_t *err)
{
  int sv[2];
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return err_make_sys (err, errno, "socketpair");
  cleanup_close int mine = sv[0], theirs = sv[1];
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_adddup2 (&fa, in, 0);
  posix_spawn_file_actions_adddup2 (&fa, out, 1);
  posix_spawn_file_actions_adddup2 (&fa, errfd, 2);
  posix_spawn_file_actions_adddup2 (&fa, theirs, SBX_REPORT_FD);
  if (rt->base_ns_fd >= 0)
    posix_spawn_file_actions_adddup2 (&fa, rt->base_ns_fd, SBX_BASE_NS_FD);
  posix_spawnattr_t attr;
  sbx_spawn_attr_init (&attr);
  int rc = posix_spawn (pid, rt->cfg.helper, &fa, &attr, argv, sbx_helper_env);
  posix_spawn_file_actions_destroy (&fa);
  posix_spawnattr_destroy (&attr);
  if (rc != 0)
    return err_make_sys (err, rc, "spawn `%s`", rt->cfg.helper);
  *report_fd = take_fd (&mine);
  return 0;
}

int
sbx_read_report (int sock, sbx_report_t *r, int timeout_ms, int *fds, size_t max_fds)
{
  for (size_t i = 0; i < max_fds; i++)
    fds[i] = -1;
  struct pollfd p = {.fd = sock, .events = POLLIN};
  int rc = TEMP_FAILURE_RETRY (poll (&p, 1, timeout_ms));
  if (rc <= 0)
    return -1;
  int got[SBX_REPORT_MAX_FDS];
  size_t n_fds = 0;
  ssize_t n
      = sbx_recv_fds (sock, r, sizeof *r, got, &n_fds, max_fds < SBX_REPORT_MAX_FDS ? max_fds : SBX_REPORT_MAX_FDS);
  if (n == 0)
    return 0;
  if (n != (ssize_t) sizeof *r)
    {
      for (size_t i = 0; i < n_fds; i++)
        close (got[i]);
      return -1;
    }
  for (size_t i = 0; i < n_fds; i++)
    fds[i] = got[i];
  r->text[sizeof r->text - 1] = '\0';
  return 1;
}

void
sbx_reap (pid_t pid)
{
  while (waitpid (pid, NULL, 0) < 0 && errno == EINTR)
    ;
}
