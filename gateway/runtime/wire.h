/* runtime/wire: the messages between the gateway, sandbox-helper and a
 * sandbox's pid 1 (the holder).
 *
 *  - Reports: the helper (launch) and the holder (per exec) answer on a
 *    SOCK_SEQPACKET socket with fixed-size sbx_report_t datagrams, so a
 *    message is never split or merged. READY carries the holder's control
 *    socket as an SCM_RIGHTS descriptor.
 *  - Exec requests: the gateway sends the holder one datagram per command:
 *    a header, then NUL-separated strings (cwd, argv..., env...), with the
 *    command's stdin, stdout, stderr, its report socket and the exec
 *    cgroup's cgroup.procs attached as descriptors. The holder forks the
 *    command from inside the sandbox, so no process has to join the
 *    sandbox's namespaces.
 *
 * Functions here are plain system calls over caller buffers: safe in the
 * single-threaded helper, the holder, and the gateway's threads.
 */
#ifndef SBX_GATEWAY_REPORT_H
#define SBX_GATEWAY_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SBX_REPORT_FD 3

typedef enum sbx_report_type_e
{
  SBX_REPORT_READY = 1, /* launch: the sandbox is up; a = holder pid; fd = its disk */
  SBX_REPORT_ERROR = 2, /* status = errno, text = what failed */
  SBX_REPORT_EXIT = 3,  /* exec: the command ended; a = exit code or -1, b = signal */
  /* exec: the command is in its session and cgroup with default signals
   * (sent by it); a = its pid in the sandbox; b = 1 (a pidfd comes) | 2 (a
   * terminal's master comes after it) */
  SBX_REPORT_STARTED = 4,
} sbx_report_type_t;

typedef struct sbx_report_s
{
  int32_t type;
  int32_t status;
  int32_t a;
  int32_t b;
  char text[496];
} sbx_report_t;

/* Sends one datagram with up to 8 descriptors attached. 0 ok, -1 errno. */
int sbx_send_fds (int sock, const void *buf, size_t len, const int *fds, size_t n_fds);

/* Receives one datagram and up to `max_fds` descriptors (set CLOEXEC;
 * *n_fds says how many). Returns the datagram's length, 0 at EOF, -1 errno.
 * Descriptors beyond max_fds, or attached to a truncated datagram, are
 * closed. */
ssize_t sbx_recv_fds (int sock, void *buf, size_t cap, int *fds, size_t *n_fds, size_t max_fds);

/* Exec requests. */
#define SBX_EXEC_MAGIC 0x53425845u /* "SBXE" */
#define SBX_EXEC_MAX (256 * 1024)  /* largest request: argv and env together */
#define SBX_CTL_NAME "ctl"         /* the holder's control socket, in the sandbox's state directory */
#define SBX_EXEC_FDS 5             /* stdin, stdout, stderr, report, cgroup.procs */

typedef struct sbx_exec_hdr_s
{
  uint32_t magic;
  uint32_t argc;
  uint32_t envc;
  uint32_t len; /* bytes of strings after the header */
  /* A terminal's size: both > 0 runs the command on a pseudo-terminal of
   * the sandbox's devpts (its master comes back with STARTED). */
  uint16_t pty_rows, pty_cols;
  uint32_t flags; /* SBX_EXEC_F_* */
} sbx_exec_hdr_t;

/* The caller wants the STARTED report (a pidfd, a terminal's master). */
#define SBX_EXEC_F_STARTED 1u

/* Encodes a request into buf (cap bytes). Returns its length, or -1 when it
 * does not fit. */
ssize_t sbx_exec_encode (char *buf, size_t cap, const char *cwd, char *const *argv, char *const *env);

/* Sets / reads the terminal size (0 0: none) and the flags of an encoded
 * request. */
void sbx_exec_set_options (char *buf, uint16_t rows, uint16_t cols, uint32_t flags);
void sbx_exec_get_options (const char *buf, uint16_t *rows, uint16_t *cols, uint32_t *flags);

/* Decodes a request in place: *cwd, argv[] and env[] point into buf, each
 * array NULL-terminated (argv and env must have argc+1 / envc+1 slots, from
 * the header). Returns 0, or -1 for a malformed request. */
int sbx_exec_decode (char *buf, size_t len, const char **cwd, char **argv, size_t argv_cap, char **env,
                     size_t env_cap);

#endif
