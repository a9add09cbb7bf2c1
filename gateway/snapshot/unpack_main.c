/* sandbox-unpack: unpacks a snapshot (tar on stdin) into a sandbox's new
 * upper layer before the sandbox starts.
 *
 * Run by sandbox-helper as `sandbox-unpack UPPER MAX_ENTRIES [userxattr]
 * [max-mb=N]` (an image layer: at most N MiB of file data)
 * with the tar on stdin and the report socket on fd 3. With `userxattr` the
 * helper has already moved it into the sandbox's user namespace as its root
 * (a host uid of the sandbox's range, no privilege on the host): it can make
 * any owner the tar names within that range and nothing beyond, and marks
 * opaque directories the way an overlay mounted with `userxattr` reads
 * them. It chroots into UPPER first, so nothing a tar says can reach
 * outside it, then extracts with libarchive's secure flags on top of its
 * own checks: relative paths without "..", no writing through symlinks,
 * hard links only to files already unpacked, no device nodes, fifos or
 * sockets, at most MAX_ENTRIES entries, overlay's own xattrs dropped. OCI
 * whiteouts become overlay whiteouts. Before reading a byte of the tar it
 * sets no_new_privs, drops to the capabilities that making files needs and
 * loads a seccomp filter (no sockets, no exec, none of the calls sandboxes
 * are denied), so a libarchive bug has little to work with. The disk quota
 * is the tmpfs's size (ENOSPC). Failures are reported as errno + text
 * (EINVAL for a bad or hostile tar) and the exit status is 1.
 *
 * A program of its own so that the helper, spawned for every launch, does
 * not carry libarchive and its dependencies. Single-threaded.
 */
#include <errno.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/err.h"
#include "gateway/helper/confine.h"
#include "gateway/runtime/wire.h"
#include "gateway/snapshot/unpack.h"

static void
report_err (const err_t *err)
{
  sbx_report_error (SBX_REPORT_FD, err->status, err_msg (err));
}

int
main (int argc, char **argv)
{
  cleanup_err err_t err = ERR_INIT;
  /* After UPPER and MAX_ENTRIES, in any order: `userxattr`, `max-mb=N`. */
  bool userxattr = false, bad = argc < 3;
  long long max_bytes = 0;
  for (int i = 3; i < argc; i++)
    if (strcmp (argv[i], "userxattr") == 0)
      userxattr = true;
    else if (strncmp (argv[i], "max-mb=", 7) == 0)
      max_bytes = strtoll (argv[i] + 7, NULL, 10) << 20;
    else
      bad = true;
  if (bad || max_bytes < 0)
    {
      err_make (&err, EINVAL,
                "usage: sandbox-unpack UPPER MAX_ENTRIES [userxattr] [max-mb=N] (run by sandbox-helper)");
      report_err (&err);
      return 1;
    }
  long max_entries = strtol (argv[2], NULL, 10);
  sbx_confine_t confine;
  if (chdir (argv[1]) < 0 || chroot (".") < 0 || chdir ("/") < 0)
    err_make_sys (&err, errno, "enter `%s`", argv[1]);
  else if (sbx_confine_prepare_unpacker (&confine, &err) < 0)
    err_wrap (&err, "confine the unpacker");
  else
    {
      /* In a user namespace the opaque mark is a user.* xattr and device
       * nodes cannot be made at all: neither capability is needed. */
      if (userxattr)
        confine.keep_caps &= ~((1ULL << CAP_SYS_ADMIN) | (1ULL << CAP_MKNOD));
      if (sbx_confine_apply (&confine, &err) < 0)
        err_wrap (&err, "confine the unpacker");
      else if (snap_unpack (0, max_entries > 0 ? max_entries : 1000000, max_bytes, userxattr, &err) == 0)
        return 0;
    }
  report_err (&err);
  return 1;
}
