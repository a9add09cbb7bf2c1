/* runtime/exec_env: a command's environment, the defaults under the
 * request's own entries (see exec_env.h). No state; any thread. */
#include "gateway/runtime/exec_env.h"

#include <stdlib.h>
#include <string.h>

static const char *const default_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
};
#define TERM_ON_A_PTY "TERM=xterm-256color"

char **
sbx_exec_build_env (char *const *extra, bool pty)
{
  size_t n_extra = 0;
  while (extra != NULL && extra[n_extra] != NULL)
    n_extra++;
  size_t n_def = sizeof default_env / sizeof default_env[0];
  char **env = calloc (n_def + n_extra + 1, sizeof *env);
  if (env == NULL)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n_def; i++)
    {
      size_t klen = strcspn (default_env[i], "=") + 1;
      bool overridden = false;
      for (size_t j = 0; j < n_extra && !overridden; j++)
        overridden = strncmp (extra[j], default_env[i], klen) == 0;
      if (!overridden)
        env[k++]
            = pty && strncmp (default_env[i], "TERM=", 5) == 0 ? (char *) TERM_ON_A_PTY : (char *) default_env[i];
    }
  for (size_t j = 0; j < n_extra; j++)
    env[k++] = extra[j];
  env[k] = NULL;
  return env;
}
