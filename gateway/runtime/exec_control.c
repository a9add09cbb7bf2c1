/* runtime/exec_control: what the gateway tells a command while it starts
 * and runs — the connection to the sandbox's pid 1 that takes the
 * request, and, on the
 * descriptors a started command hands back, its stdin, its terminal's
 * size and its signals. No state; any thread. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"

/* How long a call waits for the sandbox's pid 1 to take its request. */
#define SBX_HOLDER_CONNECT_MS 15000

/* A connection to the sandbox's pid 1: its control socket <state>/ctl,
 * named through /proc/self/fd (the state path may be longer than a socket
 * address allows). */
int
sbx_connect_holder (const char *state, const char *id, err_t *err)
{
  cleanup_close int dir = open (state, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cleanup_close int fd = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf (sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/" SBX_CTL_NAME, dir);
  if (fd < 0)
    return err_make_sys (err, errno, "exec: socket");
  /* A request is one message, and a message must fit the sender's buffer
   * (net.core.wmem_max, 208 KiB by default, is below SBX_EXEC_MAX): the
   * gateway, root in its network namespace, sets its own past that cap. */
  int sndbuf = SBX_EXEC_MAX + 64 * 1024;
  setsockopt (fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf);
  /* The holder takes one request at a time, each in a bounded time (a
   * command's start: START_DEADLINE_MS in helper/holder.c); a backlog of
   * callers waits for it no longer than this, connect and send. */
  struct timeval tv = {.tv_sec = SBX_HOLDER_CONNECT_MS / 1000, .tv_usec = (SBX_HOLDER_CONNECT_MS % 1000) * 1000};
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (dir < 0 || connect (fd, (struct sockaddr *) &sa, sizeof sa) < 0)
    {
      if (dir >= 0 && (errno == EAGAIN || errno == EINPROGRESS))
        return err_make (err, ETIMEDOUT, "sandbox `%s`: its pid 1 did not take the request within %d s", id,
                         SBX_HOLDER_CONNECT_MS / 1000);
      return err_make_sys (err, ESRCH, "sandbox `%s` is gone (its pid 1 does not answer)", id);
    }
  return take_fd (&fd);
}

int
sbx_exec_write (int fd, const uint8_t *data, size_t len, int wake, err_t *err)
{
  for (size_t off = 0; off < len;)
    {
      ssize_t w = write (fd, data + off, len - off);
      if (w > 0)
        off += (size_t) w;
      else if (w < 0 && errno == EAGAIN)
        {
          struct pollfd p[2] = {{.fd = fd, .events = POLLOUT}, {.fd = wake, .events = POLLIN}};
          if (poll (p, 2, -1) < 0 && errno != EINTR)
            return err_make_sys (err, errno, "poll");
          if (p[1].revents != 0)
            return err_make (err, ECANCELED, "stopped");
        }
      else if (!(w < 0 && errno == EINTR))
        return err_make (err, EPIPE, "the command's stdin is closed");
    }
  return 0;
}

int
sbx_exec_end_input_pty (int pty_fd, int wake, err_t *err)
{
  struct termios t;
  uint8_t eof = tcgetattr (pty_fd, &t) == 0 ? t.c_cc[VEOF] : 0x04;
  return sbx_exec_write (pty_fd, &eof, 1, wake, err);
}

int
sbx_exec_resize (int pty_fd, uint16_t rows, uint16_t cols, err_t *err)
{
  struct winsize ws = {.ws_row = rows, .ws_col = cols};
  if (ioctl (pty_fd, TIOCSWINSZ, &ws) < 0)
    return err_make_sys (err, errno, "resize the terminal");
  return 0;
}

#ifndef PIDFD_SIGNAL_PROCESS_GROUP
#define PIDFD_SIGNAL_PROCESS_GROUP (1U << 2)
#endif

int
sbx_exec_signal (int pidfd, int sig, err_t *err)
{
  if (sig <= 0 || sig >= NSIG)
    return err_make (err, EINVAL, "%d is not a signal number", sig);
  if (pidfd < 0)
    return err_make (err, ESRCH, "the process cannot be signalled");
  if (syscall (SYS_pidfd_send_signal, pidfd, sig, NULL, PIDFD_SIGNAL_PROCESS_GROUP) == 0)
    return 0;
  /* A kernel before 6.9 signals the process itself only. */
  if (errno == EINVAL && syscall (SYS_pidfd_send_signal, pidfd, sig, NULL, 0) == 0)
    return 0;
  return err_make_sys (err, errno, "signal %d", sig);
}
