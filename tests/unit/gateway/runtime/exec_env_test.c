/* Tests of runtime/exec_env: the defaults, what a request overrides, the
 * order of the request's own entries, the terminal's TERM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/runtime/exec_env.h"

static size_t
count (char **env)
{
  size_t n = 0;
  while (env[n] != NULL)
    n++;
  return n;
}

/* The entry for `key` ("KEY="), or NULL; fails when there are two. */
static const char *
find (char **env, const char *key)
{
  const char *found = NULL;
  for (size_t i = 0; env[i] != NULL; i++)
    if (strncmp (env[i], key, strlen (key)) == 0)
      {
        if (found != NULL)
          fail_msg ("`%s` appears twice: `%s` and `%s`", key, found, env[i]);
        found = env[i];
      }
  return found;
}

static void
test_no_request_env_gives_the_defaults (void **state)
{
  char **env = sbx_exec_build_env (NULL, false);
  assert_non_null (env);
  assert_int_equal (count (env), 4);
  assert_string_equal (find (env, "PATH="), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  assert_string_equal (find (env, "HOME="), "HOME=/root");
  assert_string_equal (find (env, "LANG="), "LANG=C.UTF-8");
  assert_string_equal (find (env, "TERM="), "TERM=dumb");
  free (env);

  char *const empty[] = {NULL};
  env = sbx_exec_build_env (empty, false);
  assert_non_null (env);
  assert_int_equal (count (env), 4);
  free (env);
}

static void
test_a_terminal_defaults_term_to_xterm (void **state)
{
  char **env = sbx_exec_build_env (NULL, true);
  assert_non_null (env);
  assert_string_equal (find (env, "TERM="), "TERM=xterm-256color");
  assert_int_equal (count (env), 4);
  free (env);
}

static void
test_request_entries_override_defaults_and_keep_their_order (void **state)
{
  char *const extra[] = {"Z=last-defined-first", "HOME=/work", "A=1", "TERM=vt100", NULL};
  for (int pty = 0; pty < 2; pty++)
    {
      char **env = sbx_exec_build_env (extra, pty == 1);
      assert_non_null (env);
      /* PATH and LANG stay; HOME and TERM are the request's (also on a terminal). */
      assert_int_equal (count (env), 6);
      assert_string_equal (find (env, "HOME="), "HOME=/work");
      assert_string_equal (find (env, "TERM="), "TERM=vt100");
      assert_non_null (find (env, "PATH="));
      assert_non_null (find (env, "LANG="));
      /* The request's entries come after the defaults, in its order, and
       * are its own strings. */
      assert_ptr_equal (env[2], extra[0]);
      assert_ptr_equal (env[3], extra[1]);
      assert_ptr_equal (env[4], extra[2]);
      assert_ptr_equal (env[5], extra[3]);
      assert_null (env[6]);
      free (env);
    }
}

static void
test_only_a_whole_name_overrides (void **state)
{
  /* PATHX is not PATH, nor is a name without its `=`; an empty value
   * still overrides. */
  char *const extra[] = {"PATHX=/x", "HOM", "LANG=", NULL};
  char **env = sbx_exec_build_env (extra, false);
  assert_non_null (env);
  assert_non_null (find (env, "PATH=/usr"));
  assert_string_equal (find (env, "HOME="), "HOME=/root");
  assert_string_equal (find (env, "LANG="), "LANG=");
  assert_int_equal (count (env), 6);
  free (env);
}

static void
test_many_request_entries_are_all_kept (void **state)
{
  enum
  {
    N = 5000
  };
  char **extra = calloc (N + 1, sizeof *extra);
  char (*bufs)[16] = calloc (N, sizeof *bufs);
  assert_non_null (extra);
  assert_non_null (bufs);
  for (size_t i = 0; i < N; i++)
    {
      snprintf (bufs[i], sizeof bufs[i], "V%zu=%zu", i, i);
      extra[i] = bufs[i];
    }
  char **env = sbx_exec_build_env (extra, false);
  assert_non_null (env);
  assert_int_equal (count (env), N + 4);
  assert_ptr_equal (env[4 + N - 1], extra[N - 1]);
  free (env);
  free (bufs);
  free (extra);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_no_request_env_gives_the_defaults),
      cmocka_unit_test (test_a_terminal_defaults_term_to_xterm),
      cmocka_unit_test (test_request_entries_override_defaults_and_keep_their_order),
      cmocka_unit_test (test_only_a_whole_name_overrides),
      cmocka_unit_test (test_many_request_entries_are_all_kept),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
