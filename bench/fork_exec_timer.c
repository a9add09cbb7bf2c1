/* fork_exec_timer: the exec benchmark's honest baseline. A small
 * single-threaded process, as a user's shell or script is, that runs a
 * program the plainest way (fork, execv, waitpid) each time it reads a line
 * on stdin, and answers with the milliseconds it took (CLOCK_MONOTONIC
 * around the three). Timed here, not in the multi-threaded benchmark
 * client, where fork costs several times more (it copies a large, busy
 * address space).
 *
 * Usage: fork_exec_timer PROGRAM   (one "%.6f\n" answer per input line;
 * "-1\n" when the program could not run or did not exit 0) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

int
main (int argc, char **argv)
{
  if (argc != 2)
    {
      fprintf (stderr, "usage: fork_exec_timer PROGRAM\n");
      return 2;
    }
  char line[64];
  setvbuf (stdout, NULL, _IOLBF, 0);
  while (fgets (line, sizeof line, stdin) != NULL)
    {
      double t0 = now_ms ();
      pid_t pid = fork ();
      if (pid == 0)
        {
          char *const args[] = {argv[1], NULL};
          execv (argv[1], args);
          _exit (127);
        }
      int status = 0;
      bool ok = pid > 0 && waitpid (pid, &status, 0) == pid && WIFEXITED (status) && WEXITSTATUS (status) == 0;
      double ms = now_ms () - t0;
      printf (ok ? "%.6f\n" : "-1\n", ms);
    }
  return 0;
}
