/* sandbox-helper: the single-threaded program that makes a sandbox.
 *
 * The gateway is multi-threaded, so it never forks to do namespace, mount
 * or cgroup work itself: it spawns this helper (runtime/spawn.c) with a
 * report socket as fd 3 and reads typed reports (runtime/wire.h). The helper
 * creates the sandbox's cgroups and its disk (a size-limited tmpfs holding
 * the overlay's upper and work directories, a detached mount in no mount
 * table, whose descriptor goes to the gateway for snapshots), unpacks a
 * snapshot into it when restoring (with sandbox-unpack), then forks the
 * holder: pid 1 of new pid, mount, network,
 * ipc, uts and cgroup namespaces, whose root is an overlay of the image
 * under that upper layer, with a fresh /proc (sensitive parts read-only or
 * masked), a minimal /dev, no /sys and no host mount visible. It reports
 * READY with the holder's pid and the sandbox's disk, or ERROR, and exits.
 *
 * The holder stays: it reaps orphans and starts commands on the gateway's
 * request (serve_request): it forks each one from inside the sandbox into
 * the exec's own cgroup (so a timeout kills all it started), where it cuts
 * its capabilities, and reports how it ended. The bounding set,
 * no_new_privs and the seccomp filter (compiled once, when the gateway
 * starts: `sandbox-helper filter`) each command inherits from the holder,
 * which took them on once.
 *
 * Every failure is reported as errno + text; the gateway tears down what a
 * failed launch made.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

int helper_report_fd = SBX_REPORT_FD;
char *helper_args_start;
size_t helper_args_len;

void
helper_report_err (int fd, const err_t *err)
{
  sbx_report_error (fd, err->status, err_msg (err));
}

int
helper_answer (err_t *err, int fd)
{
  if (err->status != 0)
    {
      helper_report_err (helper_report_fd, err);
      err_release (err);
      return 1;
    }
  return sbx_report_ready (helper_report_fd, 0, fd) < 0 ? 1 : 0;
}

/* `sandbox-helper private-mounts PROGRAM ARGS...`: runs PROGRAM in a mount
 * namespace of its own whose mounts propagate nowhere. slirp4netns's own
 * sandbox unshares the mount namespace and detaches the old root without
 * making mounts private first: unmounts then propagate to the host's shared
 * mounts (every `ip netns` name under /run/netns vanished). Descriptors
 * are left as they are (slirp4netns' ready and exit pipes). */
static int
private_mounts (int argc, char **argv)
{
  if (argc < 3)
    return 2;
  if (unshare (CLONE_NEWNS) < 0 || mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    {
      fprintf (stderr, "sandbox-helper: a private mount namespace: %s\n", strerror (errno));
      return 126;
    }
  execvp (argv[2], argv + 2);
  fprintf (stderr, "sandbox-helper: exec `%s`: %s\n", argv[2], strerror (errno));
  return 127;
}

int
main (int argc, char **argv)
{
  if (argc < 2)
    {
      fprintf (stderr, "sandbox-helper: run by sandbox-gateway only (launch ...)\n");
      return 2;
    }
  if (strcmp (argv[1], "private-mounts") == 0)
    return private_mounts (argc, argv);
  helper_args_start = argv[0];
  helper_args_len = (size_t) (argv[argc - 1] + strlen (argv[argc - 1]) - argv[0]);
  /* Only the report socket and, for a launch, the base mount namespace,
   * the compiled filter and (with the probe) the volumes cross over;
   * nothing else leaks in, and nothing crosses an exec (the unpacker). */
  bool launch = strcmp (argv[1], "launch") == 0, probe = strcmp (argv[1], "probe") == 0;
  syscall (SYS_close_range, launch || probe ? SBX_VOLUME_FD0 + SBX_MAX_VOLUMES : SBX_VOLUME_FD0, ~0U, 0);
  fcntl (helper_report_fd, F_SETFD, FD_CLOEXEC);
  for (int fd = SBX_BASE_NS_FD; fd < SBX_VOLUME_FD0 + SBX_MAX_VOLUMES; fd++)
    if (!launch && !(probe && fd >= SBX_VOLUME_FD0))
      close (fd);
    else
      fcntl (fd, F_SETFD, FD_CLOEXEC);
  if (strcmp (argv[1], "filter") == 0)
    return helper_filter (argc > 2 && strcmp (argv[2], "--deny-setid") == 0);

  helper_opts_t o;
  memset (&o, 0, sizeof o);
  /* Each list has room for every argument: none is ever dropped. (Freed
   * when main returns, so that a leak checker sees nothing left.) */
  cleanup_free const char **volumes = calloc ((size_t) argc, sizeof *volumes);
  cleanup_free const char **masks = calloc ((size_t) argc, sizeof *masks);
  cleanup_free const char **blocked = calloc ((size_t) argc, sizeof *blocked);
  o.volumes = volumes;
  o.masks = masks;
  o.blocked = blocked;
  if (o.volumes == NULL || o.masks == NULL || o.blocked == NULL)
    {
      sbx_report_error (helper_report_fd, ENOMEM, "sandbox-helper: out of memory");
      return 2;
    }
  if (helper_opts_parse (argc, argv, &o) < 0)
    return 2;
  if (o.id == NULL)
    {
      sbx_report_error (helper_report_fd, EINVAL, "sandbox-helper: --id is required");
      return 2;
    }
  if (strcmp (argv[1], "base") == 0 && o.state != NULL)
    return helper_base (o.state);
  if (strcmp (argv[1], "launch") == 0 && o.state != NULL)
    return helper_launch (&o);
  if (strcmp (argv[1], "unpack-layer") == 0 && o.state != NULL)
    return helper_unpack_layer (&o);
  if (strcmp (argv[1], "probe") == 0 && o.state != NULL && o.uid_range > 0)
    return helper_probe (&o);
  sbx_report_error (helper_report_fd, EINVAL, "sandbox-helper: bad arguments");
  return 2;
}
