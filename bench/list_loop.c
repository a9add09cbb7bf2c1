/* list_loop: the load of bench/runtime's "list" row — a client that calls
 * List back to back while told to, in a process of its own. It stands for
 * a client on another machine: runtime_bench starts it at the lowest CPU
 * priority (nice 19, every thread of it, gRPC's own included), so what the
 * timed execs show is the gateway's side of the Lists, not this client's
 * decoding of them.
 *
 * Usage: list_loop TARGET   (CLOUD_RUN_SANDBOX_GATEWAY_SECRET in the
 * environment). Reads stdin: '1' lists, '0' pauses; at EOF it answers the
 * number of Lists that succeeded ("%ld\n") and exits, 1 when one failed. */
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

#include "bench/bench_common.h"

#define PROG "list_loop"

int
main (int argc, char **argv)
{
  if (argc != 2)
    {
      fprintf (stderr, "usage: " PROG " TARGET\n");
      return 2;
    }
  bc_auth_from_env (PROG);
  rpc_init ();
  rpc_channel_t *ch = bc_channel (PROG, argv[1]);
  long lists = 0;
  bool on = false, failed = false;
  for (;;)
    {
      struct pollfd p = {.fd = 0, .events = POLLIN};
      int n = poll (&p, 1, on ? 0 : -1);
      if (n > 0)
        {
          char c;
          if (read (0, &c, 1) != 1)
            break;
          on = c == '1';
          continue;
        }
      err_t err = ERR_INIT;
      if (bc_list (ch, &err) < 0)
        {
          fprintf (stderr, PROG ": List: %s\n", err_msg (&err));
          err_release (&err);
          failed = true;
          break;
        }
      lists++;
    }
  printf ("%ld\n", lists);
  rpc_channel_destroy (ch);
  return failed ? 1 : 0;
}
