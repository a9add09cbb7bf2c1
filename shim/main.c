/* sandbox-shim: the HTTP server that serves the existing REST contract and
 * translates it into gRPC calls to sandbox-gateway.
 *
 * Not yet implemented: this program only documents itself. It exits with a
 * non-zero status when asked to serve, so that nothing mistakes it for a
 * working shim.
 */
#include <stdio.h>
#include <string.h>

static const char usage[] = "Usage: sandbox-shim [--help]\n\n"
                            "Serves the sandbox REST contract over HTTP and translates it into gRPC\n"
                            "calls to sandbox-gateway. Not implemented yet.\n";

int
main (int argc, char **argv)
{
  if (argc > 1 && (strcmp (argv[1], "--help") == 0 || strcmp (argv[1], "-h") == 0))
    {
      fputs (usage, stdout);
      return 0;
    }
  fputs ("sandbox-shim: not implemented yet (see --help)\n", stderr);
  return 1;
}
