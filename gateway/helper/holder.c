/* helper/holder: the sandbox's pid 1. It reaps orphans and starts commands
 * on the gateway's request: each is started from inside the sandbox into
 * its exec cgroup (so a timeout kills all it started), confined and
 * reported when it ends. The parts of the confinement a child inherits (the
 * bounding set, no_new_privs, the seccomp filter the gateway compiled once)
 * the holder takes on itself once, before it serves anything; each command
 * then cuts its own capability sets. Single-threaded; runs until the
 * sandbox is deleted. */
#include <poll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <grp.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/files.h"
#include "gateway/helper/helper.h"

/* A command started by the holder, and where its end is reported. */
typedef struct running_s
{
  pid_t pid;
  int report;
} running_t;

static running_t *running;
static size_t n_running, cap_running;

/* The `tasks` file of the sandbox's memory group, or -1 (cgroup v2): the
 * holder is not in that group (launch.c), everything it starts is put
 * there before it runs anything of the sandbox's, so that the sandbox's
 * memory is charged to the sandbox and its OOM killer chooses among the
 * sandbox's processes only. */
static int memcg = -1;

/* The signals whose disposition is not the default in the holder (read
 * once: it never changes them): what a command resets. */
static int held_signals[NSIG];
static size_t n_held_signals;

/* A command's child runs on this stack, in the holder's memory, until it
 * execs (see clone_command); a guard page below it. */
#define CHILD_STACK (256 * 1024)
static char *child_stack;

/* The longest the holder waits for a command's child to exec (or fail):
 * code in the sandbox can stop the child (SIGSTOP) before it has joined
 * its exec's cgroup, where no timeout would reach it. Past this the holder
 * kills it, reports the command as not started and serves on. */
#define START_DEADLINE_MS 5000

/* The holder's argv and env arrays: SBX_EXEC_MAX_ARGS / SBX_EXEC_MAX_ENV
 * entries and the NULL after them. A request with more is refused with an
 * ERROR saying so. */
#define HOLDER_MAX_ARGS (SBX_EXEC_MAX_ARGS + 1)
#define HOLDER_MAX_ENV (SBX_EXEC_MAX_ENV + 1)

/* Tells the gateway the command runs, from the command's own process once
 * its signals are back to their defaults (a signal the gateway sends after
 * this is never lost to the holder's dispositions): its pidfd and, on a
 * terminal, the master (this process's copy closes at exec). */
static void
report_started (int report, int master)
{
  int pidfd = (int) syscall (SYS_pidfd_open, getpid (), 0);
  sbx_report_started (report, getpid (), pidfd, master); /* a gateway gone: nothing to tell */
  if (pidfd >= 0)
    close (pidfd);
}

/* A command to start: what its child needs, in the holder's memory. */
typedef struct command_s
{
  const sbx_confine_t *confine;
  const int *fds; /* by sbx_exec_slot_t */
  int tty, master;
  bool started;
  bool as_user; /* runs as uid:gid (SBX_EXEC_F_USER) */
  uid_t uid;
  gid_t gid;
  const char *cwd;
  char **argv, **env;
} command_t;

/* Appends `s` to out[at..] (cap bytes, NUL-terminated, cut to fit) and
 * returns where the next part goes: strlen and memcpy only. */
static size_t
msg_put (char *out, size_t cap, size_t at, const char *s)
{
  size_t n = strlen (s);
  if (at + n > cap - 1)
    n = at < cap - 1 ? cap - 1 - at : 0;
  memcpy (out + at, s, n);
  out[at + n] = '\0';
  return at + n;
}

/* Ends the command's child that failed at `what` (on `name`, or NULL) with
 * errno `e`: an ERROR report "what `name`: reason" composed in a buffer on
 * this stack, then _exit. The child shares the holder's memory: nothing
 * here allocates (a kill in the middle of malloc would leave pid 1's heap
 * inconsistent), every call is async-signal-safe. */
static void __attribute__ ((noreturn)) child_fail (int report, int e, const char *what, const char *name)
{
  char msg[sizeof ((sbx_report_t *) 0)->text];
  size_t at = msg_put (msg, sizeof msg, 0, what);
  if (name != NULL)
    {
      at = msg_put (msg, sizeof msg, at, " `");
      at = msg_put (msg, sizeof msg, at, name);
      at = msg_put (msg, sizeof msg, at, "`");
    }
  const char *reason = strerrordesc_np (e);
  at = msg_put (msg, sizeof msg, at, ": ");
  msg_put (msg, sizeof msg, at, reason != NULL ? reason : "unknown error");
  sbx_report_error (report, e, msg);
  _exit (e == ENOENT ? 127 : 126);
}

/* Into the command's session, cgroups and default signals, reported
 * STARTED when asked for. */
static void
child_enter (const command_t *c)
{
  const int *fds = c->fds;
  int report = fds[SBX_EXEC_SLOT_REPORT];
  /* A session (and process group) of its own: kill(0, …) or a terminal's
   * job control from this command reach only what it starts. */
  if (setsid () < 0)
    child_fail (report, errno, "setsid", NULL);
  /* Into the exec's own cgroup: a timeout kills all this command starts. */
  if (TEMP_FAILURE_RETRY (write (fds[SBX_EXEC_SLOT_PROCS], "0", 1)) != 1)
    child_fail (report, errno, "join the exec's cgroup", NULL);
  /* Into the sandbox's memory group, which the holder is not in: what the
   * command uses from its exec on is charged to the sandbox, and it is
   * among what the sandbox's OOM killer may choose. (Until the exec, its
   * page faults are the holder's: they share the memory, at most
   * CHILD_STACK of it.) */
  if (memcg >= 0 && TEMP_FAILURE_RETRY (write (memcg, "0", 1)) != 1)
    child_fail (report, errno, "join the sandbox's memory cgroup", NULL);
  sigset_t none;
  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  for (size_t i = 0; i < n_held_signals; i++)
    sigaction (held_signals[i], &dfl, NULL);
  /* In its own session and cgroup, with default signals: from here on the
   * gateway may signal it and kill what it starts. */
  if (c->started)
    report_started (report, c->master);
}

/* The command's child: shares the holder's memory (the holder waits) until
 * it execs or exits, so it writes nothing of the holder's but `environ`,
 * which the holder puts back, and only async-signal-safe calls run here
 * (no allocation: child_fail). */
static int
command_child (void *arg)
{
  const command_t *c = arg;
  const int *fds = c->fds;
  int report = fds[SBX_EXEC_SLOT_REPORT];
  child_enter (c);
  /* On a terminal: it becomes the session's controlling terminal and the
   * command's stdio (the pipes go unused). */
  int tty = c->tty;
  if (tty >= 0 && ioctl (tty, TIOCSCTTY, 0) < 0)
    child_fail (report, errno, "make the terminal the controlling one", NULL);
  int in = tty >= 0 ? tty : fds[SBX_EXEC_SLOT_STDIN], out = tty >= 0 ? tty : fds[SBX_EXEC_SLOT_STDOUT],
      errfd = tty >= 0 ? tty : fds[SBX_EXEC_SLOT_STDERR];
  if (dup2 (in, 0) < 0 || dup2 (out, 1) < 0 || dup2 (errfd, 2) < 0)
    child_fail (report, errno, "set up stdio", NULL);
  if (tty > 2)
    close (tty);
  if (chdir (c->cwd) < 0)
    child_fail (report, errno, "working directory", c->cwd);
  /* Open files are a host-wide table: with the process limit, this bounds
   * what one sandbox can hold. */
  struct rlimit nofile = {.rlim_cur = 1024, .rlim_max = 1024};
  setrlimit (RLIMIT_NOFILE, &nofile);
  const char *what = NULL;
  if (sbx_confine_apply_raw (c->confine, &what) < 0)
    child_fail (report, errno, what, NULL);
  /* An image's User: its ids, no supplementary groups (where the sandbox's
   * user namespace lets groups be set at all; else it has none), and with
   * a non-zero uid no capability survives the change. */
  if (c->as_user)
    {
      if (setgroups (0, NULL) < 0 && (errno != EPERM || getgroups (0, NULL) != 0))
        child_fail (report, errno, "drop the supplementary groups", NULL);
      if (setresgid (c->gid, c->gid, c->gid) < 0 || setresuid (c->uid, c->uid, c->uid) < 0)
        child_fail (report, errno, "switch to the image's User", NULL);
    }
  /* Only stdio and the report socket (close-on-exec) cross over. */
  for (int i = 0; i < SBX_EXEC_FDS; i++)
    if (fds[i] > 2 && fds[i] != report)
      close (fds[i]);
  environ = c->env; /* execvp looks PATH up in the new environment */
  execvp (c->argv[0], c->argv);
  child_fail (report, errno, "exec", c->argv[0]);
}

/* Waits until the child `pid` has exec'd or exited (its end of `gate`
 * closed), at most START_DEADLINE_MS; past it the child is killed, and
 * waited for (not reaped: reap_children reports it). true: it exec'd or
 * exited by itself. */
static bool
await_exec (pid_t pid, int gate)
{
  struct timespec t0, t;
  clock_gettime (CLOCK_MONOTONIC, &t0);
  for (;;)
    {
      clock_gettime (CLOCK_MONOTONIC, &t);
      long spent = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
      if (spent >= START_DEADLINE_MS)
        break;
      struct pollfd p = {.fd = gate, .events = POLLIN};
      int r = poll (&p, 1, (int) (START_DEADLINE_MS - spent));
      if (r > 0)
        return true;
    }
  /* A stopped child dies of SIGKILL at once; until it is dead it may
   * still touch the memory it shares with the holder. */
  kill (pid, SIGKILL);
  siginfo_t si;
  while (waitid (P_PID, (id_t) pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
    ;
  return false;
}

/* Starts command `c`: a child that shares the holder's memory and runs on
 * child_stack while the holder waits for its exec (CLONE_VM, as
 * posix_spawn does): no copy of the holder's page tables, no copy-on-write
 * faults, nothing to tear down at exec. It has its own descriptor table,
 * signal dispositions and credentials, as after fork. The holder serves
 * nothing else until the child has exec'd or exited (a few system calls),
 * and at most START_DEADLINE_MS: not CLONE_VFORK, whose wait nothing
 * bounds (a child stopped from inside the sandbox would hold the holder,
 * and every later request, forever). The pid, or -1 with errno; *started
 * false when the child was killed at the deadline. */
static pid_t
clone_command (command_t *c, bool *started)
{
  *started = true;
  if (child_stack == NULL)
    {
      char *m
          = mmap (NULL, CHILD_STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
      if (m == MAP_FAILED)
        return -1;
      if (mprotect (m, 4096, PROT_NONE) < 0)
        {
          munmap (m, CHILD_STACK + 4096);
          return -1;
        }
      child_stack = m + 4096;
    }
  /* The child's copy of its write end closes at its exec or exit. */
  int gate[2];
  if (pipe2 (gate, O_CLOEXEC) < 0)
    return -1;
  char **env = environ;
  pid_t pid = clone (command_child, child_stack + CHILD_STACK, CLONE_VM | SIGCHLD, c);
  int saved = errno;
  close (gate[1]);
  if (pid > 0)
    *started = await_exec (pid, gate[0]);
  close (gate[0]);
  environ = env;
  /* The pages the child used go back: an idle pid 1 keeps only its own. */
  madvise (child_stack, CHILD_STACK, MADV_DONTNEED);
  errno = saved;
  return pid;
}

/* A pseudo-terminal of the sandbox's own devpts, `rows` x `cols`: its
 * master in *master, its slave (opened through the master, no path) in
 * *slave. -1 with *err. */
static int
open_pty (uint16_t rows, uint16_t cols, int *master, int *slave, err_t *err)
{
  *master = open ("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (*master < 0)
    return err_make_sys (err, errno, "open /dev/ptmx");
  int unlock = 0;
  struct winsize ws = {.ws_row = rows, .ws_col = cols};
  if (ioctl (*master, TIOCSPTLCK, &unlock) < 0 || ioctl (*master, TIOCSWINSZ, &ws) < 0
      || (*slave = ioctl (*master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0)
    {
      err_make_sys (err, errno, "set up the terminal");
      close (take_fd (master));
      return -1;
    }
  return 0;
}

/* Room for one more running child. false: out of memory. */
static bool
running_room (void)
{
  if (n_running < cap_running)
    return true;
  size_t cap = cap_running ? cap_running * 2 : 16;
  running_t *g = realloc (running, cap * sizeof *g);
  if (g == NULL)
    return false;
  running = g;
  cap_running = cap;
  return true;
}

/* A file request: a child performs it inside the sandbox (files.c) and
 * its exit is reported on the request's report socket, as a command's. */
static void
serve_file_request (int ctl, const sbx_confine_t *confine, char *buf, size_t len, int *fds, size_t n_fds)
{
  if (n_fds != SBX_FILE_FDS || !running_room ())
    {
      for (size_t i = 0; i < n_fds; i++)
        close (fds[i]);
      return; /* the gateway sees the stream end without an answer */
    }
  pid_t pid = fork ();
  if (pid == 0)
    {
      close (ctl);
      /* Into the sandbox's memory group before it touches anything of the
       * sandbox's (what it writes there is the sandbox's); it does not run
       * outside it. */
      if (memcg >= 0 && TEMP_FAILURE_RETRY (write (memcg, "0", 1)) != 1)
        _exit (1); /* the gateway sees the stream end without an answer */
      helper_file_child (confine, buf, len, fds);
    }
  if (pid > 0)
    {
      /* Into its cgroups from here too (it also joins by itself): a child
       * stopped from inside the sandbox before it got there is still
       * within reach of the call's cancellation, and charged to the
       * sandbox. */
      char num[16];
      int nlen = snprintf (num, sizeof num, "%d", (int) pid);
      (void) !write (fds[SBX_FILE_SLOT_PROCS], num, (size_t) nlen);
      if (memcg >= 0)
        (void) !write (memcg, num, (size_t) nlen);
      running[n_running++] = (running_t){pid, fds[SBX_FILE_SLOT_REPORT]};
    }
  for (size_t i = 0; i < SBX_FILE_FDS; i++)
    if (i != SBX_FILE_SLOT_REPORT || pid < 0)
      close (fds[i]);
}

/* Closes every descriptor of an exec request. */
static void
close_exec_fds (int *fds)
{
  for (int i = 0; i < SBX_EXEC_FDS; i++)
    close (fds[i]);
}

/* Decodes an exec request in `buf` (n bytes) into the holder's argv and
 * env arrays (HOLDER_MAX_ARGS / HOLDER_MAX_ENV). 0, or -1 after an ERROR
 * on `report` saying why. */
static int
decode_exec (char *buf, size_t n, int report, const char **cwd, char **argv, char **env)
{
  sbx_exec_hdr_t h;
  if (n >= sizeof h)
    {
      memcpy (&h, buf, sizeof h);
      if (h.argc >= HOLDER_MAX_ARGS || h.envc >= HOLDER_MAX_ENV)
        {
          char msg[128];
          snprintf (msg, sizeof msg, "a command may have at most %d arguments and %d environment entries",
                    HOLDER_MAX_ARGS - 1, HOLDER_MAX_ENV - 1);
          sbx_report_error (report, E2BIG, msg);
          return -1;
        }
    }
  if (sbx_exec_decode (buf, n, cwd, argv, HOLDER_MAX_ARGS, env, HOLDER_MAX_ENV) < 0)
    {
      sbx_report_error (report, EINVAL, "malformed exec request");
      return -1;
    }
  return 0;
}

/* Starts the command `c`, whose descriptors are fds[]: the report socket
 * is kept in `running` (closed when the start failed), the others closed. */
static void
start_command (command_t *c, int *fds)
{
  int report = fds[SBX_EXEC_SLOT_REPORT];
  bool started;
  pid_t pid = clone_command (c, &started);
  if (pid < 0)
    sbx_report_error (report, errno, "fork the command (process limit reached?)");
  else
    {
      if (!started)
        {
          char msg[128];
          snprintf (msg, sizeof msg,
                    "the command did not start within %d ms (stopped from inside the sandbox?): killed",
                    START_DEADLINE_MS);
          sbx_report_error (report, ETIMEDOUT, msg);
        }
      running[n_running++] = (running_t){pid, report};
    }
  for (int i = 0; i < SBX_EXEC_FDS; i++)
    if (i != SBX_EXEC_SLOT_REPORT || pid < 0)
      close (fds[i]);
}

/* An exec request: decoded, its terminal opened, its command started. */
static void
serve_exec_request (const sbx_confine_t *confine, char *buf, size_t n, int *fds)
{
  int report = fds[SBX_EXEC_SLOT_REPORT];
  static char *argv[HOLDER_MAX_ARGS], *env[HOLDER_MAX_ENV];
  const char *cwd = NULL;
  if (decode_exec (buf, n, report, &cwd, argv, env) < 0)
    {
      close_exec_fds (fds);
      return;
    }
  uint16_t rows, cols;
  uint32_t flags, uid = 0, gid = 0;
  sbx_exec_get_options (buf, &rows, &cols, &flags);
  sbx_exec_get_user (buf, &uid, &gid);
  int master = -1, slave = -1;
  cleanup_err err_t perr = ERR_INIT;
  if (rows > 0 && cols > 0 && open_pty (rows, cols, &master, &slave, &perr) < 0)
    {
      helper_report_err (report, &perr);
      close_exec_fds (fds);
      return;
    }
  if (!running_room ())
    {
      sbx_report_error (report, ENOMEM, "the sandbox's pid 1 is out of memory");
      close_exec_fds (fds);
    }
  else
    {
      /* Of the holder's descriptors only these cross the command's exec:
       * all others (the connection too) are close-on-exec. */
      command_t c = {.confine = confine,
                     .fds = fds,
                     .tty = slave,
                     .master = master,
                     .started = (flags & SBX_EXEC_F_STARTED) != 0,
                     .as_user = (flags & SBX_EXEC_F_USER) != 0,
                     .uid = (uid_t) uid,
                     .gid = (gid_t) gid,
                     .cwd = cwd,
                     .argv = argv,
                     .env = env};
      start_command (&c, fds);
    }
  if (master >= 0)
    close (master);
  if (slave >= 0)
    close (slave);
}

/* Serves the one request (a command or a file operation) of connection
 * `ctl`. */
static void
serve_request (int ctl, const sbx_confine_t *confine, char *buf)
{
  int fds[SBX_EXEC_FDS];
  size_t n_fds = 0;
  ssize_t n = sbx_recv_fds (ctl, buf, SBX_EXEC_MAX, fds, &n_fds, SBX_EXEC_FDS);
  if (n <= 0)
    return; /* closed without a request */
  uint32_t magic = 0;
  if ((size_t) n >= sizeof magic)
    memcpy (&magic, buf, sizeof magic);
  if (magic == SBX_FILE_MAGIC)
    serve_file_request (ctl, confine, buf, (size_t) n, fds, n_fds);
  else if (n_fds == SBX_EXEC_FDS)
    serve_exec_request (confine, buf, (size_t) n, fds);
  else
    for (size_t i = 0; i < n_fds; i++)
      close (fds[i]);
}

/* Reaps every child that ended; reports those that were commands. */
static void
reap_children (void)
{
  int status;
  pid_t pid;
  while ((pid = waitpid (-1, &status, WNOHANG)) > 0)
    for (size_t i = 0; i < n_running; i++)
      if (running[i].pid == pid)
        {
          if (WIFSIGNALED (status))
            sbx_report_exit (running[i].report, -1, WTERMSIG (status));
          else
            sbx_report_exit (running[i].report, WEXITSTATUS (status), 0);
          close (running[i].report);
          running[i] = running[--n_running];
          break;
        }
}

/* Gives back what the set-up dirtied and an idle pid 1 does not use (every
 * sandbox has one): the stack pages below this frame (paths, messages) and
 * the heap's free pages (paths, error messages of the set-up). Nothing
 * runs below this frame meanwhile (single-threaded, no signal handlers),
 * and pages given back read as zeros when touched again. `scratch` (`size`
 * bytes, the request buffer) holds /proc/self/maps, read without stdio so
 * that no buffer of its own is left on the heap, and is given back too. */
static void
trim_memory (char *scratch, size_t size)
{
  char here;
  uintptr_t keep = ((uintptr_t) &here & ~(uintptr_t) 4095) - 2 * 4096; /* a margin for the calls below */
  uintptr_t lo = 0;
  int fd = open ("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd >= 0)
    {
      size_t got = 0;
      ssize_t r;
      while (got < size - 1 && (r = read (fd, scratch + got, size - 1 - got)) > 0)
        got += (size_t) r;
      close (fd);
      scratch[got] = '\0';
      char *stack = strstr (scratch, "[stack]");
      if (stack != NULL)
        {
          while (stack > scratch && stack[-1] != '\n')
            stack--;
          lo = (uintptr_t) strtoull (stack, NULL, 16);
        }
    }
  if (lo != 0 && keep > lo)
    madvise ((void *) lo, keep - lo, MADV_DONTNEED);
  madvise (scratch, size, MADV_DONTNEED);
  malloc_trim (0);
}

/* pid 1 of the sandbox: starts commands on request and reaps orphans until
 * the sandbox is deleted. Signals from inside the sandbox cannot reach it:
 * it handles none (SIGCHLD is taken through a signalfd). */
void
helper_holder_loop (int ctl, int lifeline, int memcg_in, const sbx_confine_t *confine_in)
{
  memcg = memcg_in;
  /* What every child would apply and inherit, applied here once. Should it
   * fail, the children apply all of it themselves, as they did before. */
  sbx_confine_t confine_held = *confine_in, *confine = &confine_held;
  err_t herr = ERR_INIT;
  if (sbx_confine_hold (confine, &herr) < 0)
    err_release (&herr);
  for (int s = 1; s < NSIG; s++)
    {
      struct sigaction sa;
      if (sigaction (s, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL)
        held_signals[n_held_signals++] = s;
    }
  sigset_t set;
  sigemptyset (&set);
  sigaddset (&set, SIGCHLD);
  sigprocmask (SIG_BLOCK, &set, NULL);
  int sfd = signalfd (-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  char *buf = malloc (SBX_EXEC_MAX);
  if (sfd < 0 || buf == NULL)
    _exit (1);
  trim_memory (buf, SBX_EXEC_MAX);
  for (;;)
    {
      struct pollfd p[3]
          = {{.fd = ctl, .events = POLLIN}, {.fd = sfd, .events = POLLIN}, {.fd = lifeline, .events = POLLIN}};
      if (poll (p, 3, -1) < 0)
        continue;
      if (p[2].revents)
        _exit (0); /* the gateway has gone: so does the sandbox */
      if (p[1].revents)
        {
          struct signalfd_siginfo si;
          while (read (sfd, &si, sizeof si) == sizeof si)
            ;
          reap_children ();
        }
      if (p[0].revents & POLLIN)
        {
          int conn = accept4 (ctl, NULL, NULL, SOCK_CLOEXEC);
          if (conn >= 0)
            {
              serve_request (conn, confine, buf);
              close (conn);
            }
        }
    }
}

/* Unpacks stdin into <disk>/upper with sandbox-unpack, which chroots there
 * first. 0 ok; 1 it failed and reported why; -1 with *err. */
