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
#ifndef SBX_GATEWAY_RUNTIME_WIRE_H
#define SBX_GATEWAY_RUNTIME_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SBX_REPORT_FD 3
/* A launching helper's fd 4: the base mount namespace, whose copy every
 * sandbox's mount namespace starts as (helper/rootfs.c). */
#define SBX_BASE_NS_FD 4
/* Its fd 5: the sandboxes' seccomp filter, compiled once by `sandbox-helper
 * filter` when the gateway starts (a sealed memory file). */
#define SBX_FILTER_FD 5
/* A launching helper's (and the probe's) fds 6..: each volume's host path,
 * opened once by the gateway (O_PATH), in SANDBOX_VOLUME_MOUNTS order. */
#define SBX_VOLUME_FD0 6
/* Most host volumes (SANDBOX_VOLUME_MOUNTS). */
#define SBX_MAX_VOLUMES 32
/* A sandbox disk's inode cap per MiB of its size, when a launch names
 * none: the helper's at creation, the gateway's when it resizes a claimed
 * pooled sandbox's disk. */
#define SBX_DISK_INODES_PER_MB 128

/* Most descriptors one datagram carries (SCM_RIGHTS): a sender refuses
 * more (EINVAL), a receiver's control buffer holds no more (a datagram
 * with more arrives truncated: EMSGSIZE, every descriptor closed). */
#define SBX_WIRE_MAX_FDS 8

typedef enum sbx_report_type_e
{
  SBX_REPORT_READY = 1,   /* launch: the sandbox is up (u.ready); its disk's descriptor attached */
  SBX_REPORT_ERROR = 2,   /* status = errno, text = what failed */
  SBX_REPORT_EXIT = 3,    /* exec: the command ended (u.exit) */
  SBX_REPORT_STARTED = 4, /* exec: the command is in its session and cgroup with default
                             signals, sent by it (u.started) */
} sbx_report_type_t;

/* What a STARTED report has attached, in this order. */
#define SBX_STARTED_F_PIDFD 1u  /* a pidfd of the command */
#define SBX_STARTED_F_MASTER 2u /* a terminal's master */
/* Most descriptors a report carries (STARTED: a pidfd and a master). */
#define SBX_REPORT_MAX_FDS 2

typedef struct sbx_report_s
{
  int32_t type;   /* sbx_report_type_t */
  int32_t status; /* ERROR: an errno value; else 0 */
  union
  {
    struct
    {
      int32_t holder_pid; /* the sandbox's pid 1, in the gateway's pid namespace */
      int32_t unused;
    } ready;
    struct
    {
      int32_t code;   /* the exit status, or -1 when a signal killed it */
      int32_t signal; /* that signal, else 0 */
    } exit;
    struct
    {
      int32_t pid;    /* in the sandbox's pid namespace */
      uint32_t flags; /* SBX_STARTED_F_*: which descriptors are attached */
    } started;
  } u;
  char text[496]; /* ERROR: NUL-terminated, cut to fit */
} sbx_report_t;

/* Sends one datagram with up to SBX_WIRE_MAX_FDS descriptors attached. 0
 * ok, -1 errno (EINVAL: too many descriptors). */
int sbx_send_fds (int sock, const void *buf, size_t len, const int *fds, size_t n_fds);

/* Receives one datagram and up to `max_fds` descriptors (set CLOEXEC;
 * *n_fds says how many). Returns the datagram's length, 0 at EOF, -1 errno.
 * Descriptors beyond max_fds, or attached to a truncated datagram, are
 * closed. */
ssize_t sbx_recv_fds (int sock, void *buf, size_t cap, int *fds, size_t *n_fds, size_t max_fds);

/* Report writers, one per type. Each sends one sbx_report_t on `sock` and
 * returns 0, or -1 with errno (a reader gone: nothing to tell). Only
 * async-signal-safe calls: the holder's command child, which shares the
 * holder's memory, reports with them. `text` is cut to fit. */
int sbx_report_error (int sock, int status, const char *text);
int sbx_report_ready (int sock, pid_t holder_pid, int fd);
int sbx_report_exit (int sock, int code, int signal);
/* `pidfd`, `master`: -1 for none; those >= 0 are attached. */
int sbx_report_started (int sock, pid_t pid, int pidfd, int master);

/* Reads one report from `sock`, waiting at most timeout_ms (-1 forever),
 * with up to `max_fds` descriptors (fds[] is filled with -1 first; at most
 * SBX_REPORT_MAX_FDS). 1 one came (text NUL-terminated), 0 the peer closed
 * silently, -1 timeout or a malformed message. */
int sbx_read_report (int sock, sbx_report_t *r, int timeout_ms, int *fds, size_t max_fds);

/* A STARTED report's descriptors, as sbx_read_report got them in `got`:
 * *pidfd and *master (-1 when the flags say none came). */
void sbx_report_started_fds (const sbx_report_t *r, const int *got, int *pidfd, int *master);

/* Exec requests. */
#define SBX_EXEC_MAGIC 0x53425845u /* "SBXE" */
#define SBX_EXEC_MAX (256 * 1024)  /* largest request: argv and env together */
#define SBX_CTL_NAME "ctl"         /* the holder's control socket, in the sandbox's state directory */
/* The most arguments and environment entries of one command (the
 * holder's arrays; the gateway refuses more before sending). */
#define SBX_EXEC_MAX_ARGS 4095
#define SBX_EXEC_MAX_ENV 4095

/* The descriptors attached to an exec request, by slot. */
typedef enum sbx_exec_slot_e
{
  SBX_EXEC_SLOT_STDIN = 0,
  SBX_EXEC_SLOT_STDOUT = 1,
  SBX_EXEC_SLOT_STDERR = 2,
  SBX_EXEC_SLOT_REPORT = 3, /* the command's report socket (STARTED, ERROR, EXIT) */
  SBX_EXEC_SLOT_PROCS = 4,  /* the exec cgroup's file that moves its writer in */
  SBX_EXEC_FDS = 5,
} sbx_exec_slot_t;

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
  /* With SBX_EXEC_F_USER: the ids (the sandbox's own) the command runs as
   * (an image's User); else root of the sandbox. */
  uint32_t uid, gid;
} sbx_exec_hdr_t;

/* The caller wants the STARTED report (a pidfd, a terminal's master). */
#define SBX_EXEC_F_STARTED 1u
/* The command runs as uid:gid of the header, without supplementary groups. */
#define SBX_EXEC_F_USER 2u

/* The length of a request's encoding. */
size_t sbx_exec_size (const char *cwd, char *const *argv, char *const *env);

/* Encodes a request into buf (cap bytes). Returns its length, or -1 when it
 * does not fit. */
ssize_t sbx_exec_encode (char *buf, size_t cap, const char *cwd, char *const *argv, char *const *env);

/* Sets / reads the terminal size (0 0: none) and the flags of an encoded
 * request. */
void sbx_exec_set_options (char *buf, uint16_t rows, uint16_t cols, uint32_t flags);
void sbx_exec_get_options (const char *buf, uint16_t *rows, uint16_t *cols, uint32_t *flags);
/* Sets / reads the ids of SBX_EXEC_F_USER. */
void sbx_exec_set_user (char *buf, uint32_t uid, uint32_t gid);
void sbx_exec_get_user (const char *buf, uint32_t *uid, uint32_t *gid);

/* Decodes a request in place: *cwd, argv[] and env[] point into buf, each
 * array NULL-terminated (argv and env must have argc+1 / envc+1 slots, from
 * the header). Returns 0, or -1 for a malformed request. */
int sbx_exec_decode (char *buf, size_t len, const char **cwd, char **argv, size_t argv_cap, char **env,
                     size_t env_cap);

/* File requests (the file API): the gateway sends the holder one datagram
 * per operation — an sbx_file_hdr_t, then `path` and `path2` (rename's
 * destination; may be empty), each NUL-terminated — with SBX_FILE_FDS
 * descriptors: a stream socket the operation talks over, its report socket
 * and its cgroup's cgroup.procs. The holder forks a child that joins the
 * cgroup, confines itself as a command would and performs the operation
 * itself, inside the sandbox: paths mean what they mean to any process
 * there. On the stream both sides send frames: an sbx_frame_t, then `len`
 * bytes (at most SBX_FRAME_MAX). What either side reads from the other is
 * checked, never trusted: the child runs in the sandbox. */
#define SBX_FILE_MAGIC 0x53425846u /* "SBXF" */

/* The descriptors attached to a file request, by slot. */
typedef enum sbx_file_slot_e
{
  SBX_FILE_SLOT_STREAM = 0, /* the stream socket the operation talks over */
  SBX_FILE_SLOT_REPORT = 1, /* its report socket (EXIT) */
  SBX_FILE_SLOT_PROCS = 2,  /* its cgroup's file that moves its writer in */
  SBX_FILE_FDS = 3,
} sbx_file_slot_t;
#define SBX_FILE_PATH_MAX 4096 /* longest path, its NUL included */

typedef enum sbx_file_op_e
{
  SBX_FILE_STAT = 1,   /* answer: INFO (the path itself, symlinks not followed) */
  SBX_FILE_READ = 2,   /* answer: INFO, DATA..., END */
  SBX_FILE_WRITE = 3,  /* then from the gateway: DATA..., END; answer: INFO */
  SBX_FILE_LIST = 4,   /* answer: INFO per entry, END */
  SBX_FILE_REMOVE = 5, /* answer: END */
  SBX_FILE_RENAME = 6, /* answer: INFO of the destination */
  SBX_FILE_MKDIR = 7,  /* answer: INFO */
  SBX_FILE_WATCH = 8,  /* answer: EVENT... until the gateway closes the stream */
} sbx_file_op_t;

/* Flags of a file request. */
#define SBX_FILE_F_PARENTS 1u   /* write, mkdir: make missing parent directories */
#define SBX_FILE_F_APPEND 2u    /* write: append in place instead of replacing */
#define SBX_FILE_F_RECURSIVE 4u /* remove, watch: the whole tree */
#define SBX_FILE_F_OVERWRITE 8u /* rename: replace an existing destination */
#define SBX_FILE_F_USER 16u     /* the operation runs as uid:gid of the header (an image's User) */

typedef struct sbx_file_hdr_s
{
  uint32_t magic;
  uint32_t op;
  uint32_t flags;
  uint32_t mode;                /* write, mkdir: permission bits; 0 the default */
  uint32_t depth;               /* list: levels below the directory (1: its entries) */
  uint32_t limit;               /* watch: most directories watched at once */
  uint64_t offset;              /* read: where to start; list: entries to skip */
  uint64_t length;              /* read: 0 to the end */
  uint32_t uid, gid;            /* with SBX_FILE_F_USER: the sandbox's own ids it runs as */
  uint32_t path_len, path2_len; /* their NULs included */
} sbx_file_hdr_t;

/* Encodes a request into buf (cap bytes); `h`'s lengths are filled in.
 * Returns its length, or -1 when a path is too long. */
ssize_t sbx_file_encode (char *buf, size_t cap, sbx_file_hdr_t *h, const char *path, const char *path2);
/* Decodes one in place (*path, *path2 point into buf). 0, or -1 when
 * malformed. */
int sbx_file_decode (char *buf, size_t len, sbx_file_hdr_t *h, const char **path, const char **path2);

typedef enum sbx_frame_kind_e
{
  SBX_FRAME_DATA = 1,  /* file bytes */
  SBX_FRAME_INFO = 2,  /* an sbx_file_wire_t, then its path and symlink target */
  SBX_FRAME_ERROR = 3, /* an int32 errno, then a text (no NUL) */
  SBX_FRAME_END = 4,   /* no payload */
  SBX_FRAME_EVENT = 5, /* an sbx_event_wire_t, then its path and old path */
} sbx_frame_kind_t;

#define SBX_FRAME_MAX (256 * 1024 + 64)

typedef struct sbx_frame_s
{
  uint32_t kind;
  uint32_t len;
} sbx_frame_t;

/* A file's description as seen inside the sandbox. */
typedef enum sbx_ftype_e
{
  SBX_FTYPE_FILE = 1,
  SBX_FTYPE_DIR = 2,
  SBX_FTYPE_SYMLINK = 3,
  SBX_FTYPE_OTHER = 4,
} sbx_ftype_t;

typedef struct sbx_file_wire_s
{
  uint32_t type; /* sbx_ftype_t */
  uint32_t mode; /* permission bits and set-id/sticky (07777) */
  uint32_t uid, gid;
  uint64_t size;
  int64_t mtime_ms;
  uint32_t path_len, target_len; /* bytes, no NULs */
} sbx_file_wire_t;

typedef enum sbx_event_kind_e
{
  SBX_EVENT_WATCHING = 1, /* every watch is in place */
  SBX_EVENT_CREATED = 2,
  SBX_EVENT_MODIFIED = 3, /* closed after a write */
  SBX_EVENT_REMOVED = 4,
  SBX_EVENT_RENAMED = 5,  /* old_path -> path */
  SBX_EVENT_OVERFLOW = 6, /* events were lost: what changed must be looked at again */
} sbx_event_kind_t;

typedef struct sbx_event_wire_s
{
  uint32_t kind; /* sbx_event_kind_t */
  uint32_t is_dir;
  uint32_t path_len, old_len; /* bytes, no NULs */
} sbx_event_wire_t;

#endif
