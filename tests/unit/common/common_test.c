/* common_test: the error type, environment configuration and the bearer
 * check of common/. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/bearer.h"
#include "common/cleanup.h"
#include "common/config.h"
#include "common/err.h"

static void
test_err_make_and_wrap_build_one_message (void **state)
{
  err_t err = ERR_INIT;
  assert_int_equal (err_make (&err, ENOENT, "open `%s`", "/x"), -1);
  assert_int_equal (err.status, ENOENT);
  assert_int_equal (err_wrap (&err, "launch `%s`", "a"), -1);
  assert_string_equal (err_msg (&err), "launch `a`: open `/x`");
  assert_int_equal (err.status, ENOENT);
  err_release (&err);
  assert_string_equal (err_msg (&err), "");
  assert_int_equal (err_make_sys (&err, EACCES, "mkdir `%s`", "/y"), -1);
  assert_string_equal (err_msg (&err), "mkdir `/y`: Permission denied");
  /* A zero status never reads as success. */
  err_make (&err, 0, "odd");
  assert_int_not_equal (err.status, 0);
  err_release (&err);
}

static char *s_val;
static long i_val;
static bool b_val;
static const cfg_var_t vars[] = {
    {"T_STR", CFG_STRING, "dflt", "a string", 0, 0, &s_val, NULL, false},
    {"T_INT", CFG_INT, "5", "an int", 1, 10, &i_val, NULL, false},
    {"T_BOOL", CFG_BOOL, "false", "a bool", 0, 0, &b_val, NULL, false},
    {"T_FALLBACK", CFG_STRING, NULL, "falls back", 0, 0, NULL, "T_OTHER", true},
};

static void
reset (void)
{
  free (s_val);
  s_val = NULL;
  unsetenv ("T_STR");
  unsetenv ("T_INT");
  unsetenv ("T_BOOL");
}

static void
test_config_reads_defaults_and_values (void **state)
{
  err_t err = ERR_INIT;
  reset ();
  assert_int_equal (cfg_load (vars, 3, &err), 0);
  assert_string_equal (s_val, "dflt");
  assert_int_equal (i_val, 5);
  assert_false (b_val);
  reset ();
  setenv ("T_STR", "x", 1);
  setenv ("T_INT", "10", 1);
  setenv ("T_BOOL", "TRUE", 1);
  assert_int_equal (cfg_load (vars, 3, &err), 0);
  assert_string_equal (s_val, "x");
  assert_int_equal (i_val, 10);
  assert_true (b_val);
  reset ();
}

static void
test_config_refuses_bad_values_naming_the_variable (void **state)
{
  static const char *const bad_ints[] = {"abc", "0", "11", "5x", "99999999999999999999999"};
  for (size_t i = 0; i < sizeof bad_ints / sizeof bad_ints[0]; i++)
    {
      err_t err = ERR_INIT;
      reset ();
      setenv ("T_INT", bad_ints[i], 1);
      assert_int_equal (cfg_load (vars, 3, &err), -1);
      assert_non_null (strstr (err_msg (&err), "T_INT"));
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
    }
  err_t err = ERR_INIT;
  reset ();
  setenv ("T_BOOL", "maybe", 1);
  assert_int_equal (cfg_load (vars, 3, &err), -1);
  assert_non_null (strstr (err_msg (&err), "T_BOOL"));
  err_release (&err);
  reset ();
}

static void
test_config_help_lists_every_variable_and_hides_secrets (void **state)
{
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream (&text, &len);
  cfg_print_help (out, "usage", vars, 4);
  fclose (out);
  assert_non_null (strstr (text, "T_STR"));
  assert_non_null (strstr (text, "default: dflt"));
  assert_non_null (strstr (text, "T_INT"));
  assert_non_null (strstr (text, "[1..10]"));
  assert_non_null (strstr (text, "T_BOOL"));
  assert_non_null (strstr (text, "the value of T_OTHER"));
  free (text);
}

static char *secret_val;
static const cfg_var_t secret_vars[] = {
    {"T_SECRET", CFG_STRING, NULL, "a secret", 0, 0, &secret_val, NULL, true},
};

static void
test_config_secret_loses_one_line_end_and_refuses_other_whitespace (void **state)
{
  static const struct
  {
    const char *value, *want; /* want NULL: refused */
  } cases[] = {
      {"s3cret", "s3cret"}, {"s3cret\n", "s3cret"}, {"s3cret\r\n", "s3cret"},
      {"s3cret\n\n", NULL}, {"s3 cret", NULL},      {" s3cret", NULL},
      {"s3cret ", NULL},    {"s3cret\t", NULL},     {"s3cret \n", NULL},
      {"s3\ncret", NULL},   {"\n", NULL},           {"s3cret\r", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    {
      err_t err = ERR_INIT;
      setenv ("T_SECRET", cases[i].value, 1);
      int rc = cfg_load (secret_vars, 1, &err);
      if (cases[i].want != NULL)
        {
          assert_int_equal (rc, 0);
          assert_string_equal (secret_val, cases[i].want);
        }
      else
        {
          assert_int_equal (rc, -1);
          assert_non_null (strstr (err_msg (&err), "T_SECRET"));
          assert_null (strstr (err_msg (&err), "s3"));
          assert_null (secret_val);
        }
      err_release (&err);
      free (secret_val);
      secret_val = NULL;
    }
  unsetenv ("T_SECRET");
}

static void
test_bearer_matches_only_the_exact_secret (void **state)
{
  assert_true (bearer_matches ("Bearer s3cret", "s3cret"));
  assert_true (bearer_matches ("bearer s3cret", "s3cret"));
  assert_false (bearer_matches ("Bearer s3cre", "s3cret"));
  assert_false (bearer_matches ("Bearer s3cretX", "s3cret"));
  assert_false (bearer_matches ("Basic s3cret", "s3cret"));
  assert_false (bearer_matches ("s3cret", "s3cret"));
  assert_false (bearer_matches (NULL, "s3cret"));
  /* An unset or empty secret matches nothing, not even an empty token. */
  assert_false (bearer_matches ("Bearer ", ""));
  assert_false (bearer_matches ("Bearer x", NULL));
}

/* An error filled in a scope of its own, released when the scope ends
 * (under the ASan build a leak here fails the test). */
static const char *
make_and_drop (void)
{
  cleanup_err err_t e = ERR_INIT;
  err_make (&e, ENOENT, "gone");
  return e.msg != NULL ? "made" : "not made";
}

static void
test_cleanup_err_releases_and_reason_travels_with_the_error (void **state)
{
  assert_string_equal (make_and_drop (), "made");
  cleanup_err err_t e = ERR_INIT;
  err_make_reason (&e, ENOENT, ERR_REASON_SANDBOX_NOT_FOUND, "sandbox `%s` not found", "a");
  assert_int_equal (e.status, ENOENT);
  assert_string_equal (e.reason, ERR_REASON_SANDBOX_NOT_FOUND);
  err_wrap (&e, "exec");
  assert_string_equal (e.reason, ERR_REASON_SANDBOX_NOT_FOUND); /* kept by a wrap */
  assert_string_equal (err_msg (&e), "exec: sandbox `a` not found");
  err_make (&e, EIO, "other");
  assert_null (e.reason); /* a new error has none */
  err_release (&e);
  assert_null (e.reason);
}

static void
test_take_ptr_hands_the_pointer_out_and_clears_it (void **state)
{
  cleanup_free char *s = strdup ("x");
  char *got = take_ptr (&s);
  assert_null (s);
  assert_string_equal (got, "x");
  free (got);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_err_make_and_wrap_build_one_message),
      cmocka_unit_test (test_cleanup_err_releases_and_reason_travels_with_the_error),
      cmocka_unit_test (test_take_ptr_hands_the_pointer_out_and_clears_it),
      cmocka_unit_test (test_config_reads_defaults_and_values),
      cmocka_unit_test (test_config_refuses_bad_values_naming_the_variable),
      cmocka_unit_test (test_config_help_lists_every_variable_and_hides_secrets),
      cmocka_unit_test (test_config_secret_loses_one_line_end_and_refuses_other_whitespace),
      cmocka_unit_test (test_bearer_matches_only_the_exact_secret),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
