/* helper/confine: the last steps before a sandboxed command runs.
 *
 * In bubblewrap's order: capabilities are cut to a small set (a root that
 * can own files, install packages and bind low ports inside its sandbox, but
 * cannot mount, load modules, trace, reboot, make device nodes or
 * administer the network), PR_SET_NO_NEW_PRIVS is set, and a seccomp
 * deny-list in the spirit of Docker's default profile is loaded last.
 *
 * Called only in the single-threaded helper, in the child about to exec;
 * or, for the parts a child inherits (the bounding set, no_new_privs, the
 * filter), once in the sandbox's pid 1 (sbx_confine_hold), whose children
 * then only cut their own capability sets.
 */
#ifndef SBX_GATEWAY_CONFINE_H
#define SBX_GATEWAY_CONFINE_H

#include "common/err.h"

#include <linux/filter.h>
#include <stdbool.h>
#include <stdint.h>

/* The seccomp filter, compiled once (by the gateway at start-up:
 * sbx_confine_export) and loaded by every command a sandbox's pid 1 starts
 * without compiling again. */
typedef struct sbx_confine_s
{
  struct sock_fprog prog; /* owned */
  uint64_t keep_caps;     /* capabilities kept, as a bit mask */
  bool only_held;         /* keep those of keep_caps the process holds (else: all, or fail) */
  bool inherited;         /* the bounding set, no_new_privs and the filter are the caller's already */
} sbx_confine_t;

/* Compiles the filter of sandboxed commands once, into a memory file
 * sealed against every change: its descriptor (the gateway keeps it and
 * hands it to every launch as SBX_FILTER_FD), or -1 with *err. With
 * `deny_setid` (the gateway has a writable volume) no call may set a
 * setuid or setgid bit. */
int sbx_confine_export (bool deny_setid, err_t *err);

/* The confinement of sandboxed commands, with the filter sbx_confine_export
 * compiled read from `fd`: a launch pays one read instead of a compilation,
 * and its sandbox's pid 1 keeps none of the compiler's memory. */
int sbx_confine_load (sbx_confine_t *out, int fd, err_t *err);

/* Compiles sandbox-unpack's: the sandbox's denials, plus no new sockets and
 * no exec; it keeps only what making files of any owner needs. */
int sbx_confine_prepare_unpacker (sbx_confine_t *out, err_t *err);

/* Applies capabilities, no_new_privs and the filter to the calling process
 * (a child about to exec; async-signal-safe system calls only). After
 * sbx_confine_hold in an ancestor: only the capability sets. */
int sbx_confine_apply (const sbx_confine_t *c, err_t *err);
/* The same without allocating (a child that shares its parent's memory,
 * CLONE_VM): -1 with errno and *what naming the step that failed (a
 * static string). */
int sbx_confine_apply_raw (const sbx_confine_t *c, const char **what);

/* In a process that only forks children that confine themselves (the
 * holder): takes on now what they would each apply and then inherit —
 * the bounding set cut to the kept capabilities, no_new_privs and the
 * filter — and marks *c so that sbx_confine_apply does only the rest.
 * The caller's own capability sets stay as they are. */
int sbx_confine_hold (sbx_confine_t *c, err_t *err);

#endif
