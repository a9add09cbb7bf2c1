/* runtime/net: egress networking of sandboxes — the host addresses that
 * egress sandboxes must not reach, and slirp4netns, which gives a sandbox's
 * network namespace a user-mode route out. No state beyond the runtime's
 * host address list (written once, at start-up). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"

/* Open files of one sandbox's slirp4netns: each connection the sandbox
 * opens out costs it one. */
#define SLIRP_MAX_FILES 1024

int
sbx_net_scan_host (sbx_runtime_t *rt, err_t *err)
{
  struct ifaddrs *ifs = NULL;
  if (getifaddrs (&ifs) < 0)
    return err_make_sys (err, errno, "list the host's addresses");
  size_t n = 0;
  for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next)
    n++;
  char **addrs = calloc (n + 1, sizeof *addrs);
  if (addrs == NULL)
    {
      freeifaddrs (ifs);
      return err_make (err, ENOMEM, "out of memory");
    }
  size_t k = 0;
  for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next)
    {
      if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
        continue;
      const struct in_addr *a = &((const struct sockaddr_in *) i->ifa_addr)->sin_addr;
      if ((ntohl (a->s_addr) >> 24) == 127)
        continue;
      char text[INET_ADDRSTRLEN];
      inet_ntop (AF_INET, a, text, sizeof text);
      if ((addrs[k] = strdup (text)) == NULL)
        break;
      k++;
    }
  freeifaddrs (ifs);
  rt->host_addrs = addrs;
  return 0;
}

/* The host's loopback is refused (--disable-host-loopback); slirp4netns
 * runs in its own mount namespace with its capabilities dropped and a
 * seccomp filter. */
int
sbx_net_start (sbx_runtime_t *rt, sbx_t *s, err_t *err)
{
  int ready[2], ex[2];
  if (pipe2 (ready, O_CLOEXEC) < 0)
    return err_make_sys (err, errno, "pipe");
  cleanup_close int ready_r = ready[0], ready_w = ready[1];
  if (pipe2 (ex, O_CLOEXEC) < 0)
    return err_make_sys (err, errno, "pipe");
  cleanup_close int ex_r = ex[0], ex_w = ex[1];
  /* The network namespace by path: given a pid, slirp4netns would join
   * that process's user namespace too, where it has no power over the
   * network namespace (the host's root owns it). */
  char netns[64];
  snprintf (netns, sizeof netns, "/proc/%d/ns/net", (int) s->holder);
  /* Through sandbox-helper, in a mount namespace of its own: see
   * `private-mounts` in gateway/helper/main.c. */
  const char *argv[] = {"sandbox-helper",
                        "private-mounts",
                        rt->cfg.slirp4netns,
                        "--configure",
                        "--mtu=65520",
                        "--disable-host-loopback",
                        "--enable-sandbox",
                        "--enable-seccomp",
                        "--ready-fd=3",
                        "--exit-fd=4",
                        "--netns-type=path",
                        netns,
                        "tap0",
                        NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_addopen (&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen (&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2 (&fa, ready_w, 3);
  posix_spawn_file_actions_adddup2 (&fa, ex_r, 4);
  posix_spawnattr_t attr;
  sbx_spawn_attr_init (&attr);
  int rc = posix_spawn (&s->slirp, rt->cfg.helper, &fa, &attr, (char *const *) argv, sbx_helper_env);
  posix_spawn_file_actions_destroy (&fa);
  posix_spawnattr_destroy (&attr);
  if (rc != 0)
    {
      s->slirp = 0;
      return err_make_sys (err, rc, "start `%s` for egress", rt->cfg.slirp4netns);
    }
  close (take_fd (&ready_w));
  s->slirp_exit_fd = sbx_fd_keep (take_fd (&ex_w));
  /* What the sandbox makes slirp4netns hold (connections, buffers) is the
   * sandbox's: it runs in the sandbox's cgroups, with a bounded number of
   * open files. */
  struct rlimit nofile = {.rlim_cur = SLIRP_MAX_FILES, .rlim_max = SLIRP_MAX_FILES};
  if (prlimit (s->slirp, RLIMIT_NOFILE, &nofile, NULL) < 0)
    return err_make_sys (err, errno, "limit slirp4netns' open files");
  if (sbx_cg_attach (&rt->cg, s->id, s->slirp, err) < 0)
    return err_wrap (err, "move slirp4netns into the sandbox's cgroups");
  if (sbx_egress_confine (rt, s->id, s->slirp, err) < 0)
    return -1;
  struct pollfd p = {.fd = ready_r, .events = POLLIN};
  char c = 0;
  if (TEMP_FAILURE_RETRY (poll (&p, 1, 10000)) != 1 || read (ready_r, &c, 1) != 1)
    return err_make (err, EIO, "slirp4netns did not configure the sandbox's network");
  return 0;
}

void
sbx_net_stop (pid_t slirp, int exit_fd)
{
  if (exit_fd >= 0)
    close (exit_fd);
  if (slirp > 0)
    {
      kill (slirp, SIGTERM);
      sbx_reap (slirp);
    }
}
