/* labels_test: common/labels accepts Kubernetes label keys and values and
 * refuses the rest, parses equality-based selectors (=, ==, !=, existence,
 * non-existence) and refuses malformed ones, and matches selectors against
 * a sandbox's labels. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/labels.h"

static void
test_keys_follow_kubernetes_syntax (void **state)
{
  (void) state;
  const char *good[] = {"app", "a", "app.kubernetes.io/name", "example.com/a-b_c.d", "A9", "x/y"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    assert_true (lbl_key_valid (good[i], NULL));
  const char *bad[]
      = {"", "-a", "a-", "a b", "a=b", "/a", "Example.com/a", "a/", "a/b/c", "ex..com/a", "-x.com/a", "é"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_false (lbl_key_valid (bad[i], NULL));
  char name[70];
  memset (name, 'a', 63);
  name[63] = '\0';
  assert_true (lbl_key_valid (name, NULL));
  name[63] = 'a';
  name[64] = '\0';
  assert_false (lbl_key_valid (name, NULL));
}

static void
test_values_may_be_empty_but_not_malformed (void **state)
{
  (void) state;
  assert_true (lbl_value_valid (""));
  assert_true (lbl_value_valid ("v1.2_3-x"));
  assert_false (lbl_value_valid ("a/b"));
  assert_false (lbl_value_valid ("_a"));
  assert_false (lbl_value_valid ("a b"));
  char v[70];
  memset (v, 'v', 64);
  v[64] = '\0';
  assert_false (lbl_value_valid (v));
}

static void
test_check_caps_the_count_and_names_the_bad_key (void **state)
{
  (void) state;
  const char *keys[LBL_MAX + 1], *vals[LBL_MAX + 1];
  char names[LBL_MAX + 1][16];
  for (int i = 0; i <= LBL_MAX; i++)
    {
      snprintf (names[i], sizeof names[i], "k%d", i);
      keys[i] = names[i];
      vals[i] = "v";
    }
  err_t err = ERR_INIT;
  assert_int_equal (lbl_check (keys, vals, LBL_MAX, &err), 0);
  assert_int_equal (lbl_check (keys, vals, LBL_MAX + 1, &err), -1);
  assert_int_equal (err.status, EINVAL);
  err_release (&err);
  const char *bk[] = {"ok", "not ok"}, *bv[] = {"1", "2"};
  assert_int_equal (lbl_check (bk, bv, 2, &err), -1);
  assert_non_null (strstr (err_msg (&err), "not ok"));
  err_release (&err);
  const char *dk[] = {"a", "a"};
  assert_int_equal (lbl_check (dk, bv, 2, &err), -1);
  err_release (&err);
}

static void
test_selector_parses_every_form (void **state)
{
  (void) state;
  static lbl_selector_t sel;
  err_t err = ERR_INIT;
  assert_int_equal (lbl_selector_parse (" app = web , tier==db,env!=prod, team , !gone ", &sel, &err), 0);
  assert_int_equal (sel.n, 5);
  assert_int_equal (sel.reqs[0].op, LBL_OP_EQ);
  assert_string_equal (sel.reqs[0].key, "app");
  assert_string_equal (sel.reqs[0].value, "web");
  assert_int_equal (sel.reqs[1].op, LBL_OP_EQ);
  assert_string_equal (sel.reqs[1].value, "db");
  assert_int_equal (sel.reqs[2].op, LBL_OP_NE);
  assert_string_equal (sel.reqs[2].key, "env");
  assert_int_equal (sel.reqs[3].op, LBL_OP_EXISTS);
  assert_int_equal (sel.reqs[4].op, LBL_OP_ABSENT);
  assert_string_equal (sel.reqs[4].key, "gone");
  assert_int_equal (lbl_selector_parse ("", &sel, &err), 0);
  assert_int_equal (sel.n, 0);
  assert_int_equal (lbl_selector_parse (NULL, &sel, &err), 0);
  assert_int_equal (lbl_selector_parse ("k=", &sel, &err), 0); /* an empty value */
}

static void
test_selector_refuses_malformed_text (void **state)
{
  (void) state;
  static lbl_selector_t sel;
  const char *bad[] = {"=v",   "a,,b",  "a,",    ",a",   "a=b=c", "a!=b=c", "env in (a,b)", "!",
                       "!a=b", "a b=c", "a=b c", "k=-v", "===",   "a!==b",  "a=!b"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      err_t err = ERR_INIT;
      assert_int_equal (lbl_selector_parse (bad[i], &sel, &err), -1);
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
    }
}

static void
test_selector_bounds_its_size (void **state)
{
  (void) state;
  static lbl_selector_t sel;
  static char text[LBL_SELECTOR_MAX + 16];
  memset (text, 'a', sizeof text - 1);
  text[sizeof text - 1] = '\0';
  err_t err = ERR_INIT;
  assert_int_equal (lbl_selector_parse (text, &sel, &err), -1);
  err_release (&err);
  /* LBL_SELECTOR_REQS + 1 requirements "a,a,a,...". */
  size_t k = 0;
  for (int i = 0; i <= LBL_SELECTOR_REQS; i++)
    {
      text[k++] = 'a';
      text[k++] = ',';
    }
  text[k - 1] = '\0';
  assert_int_equal (lbl_selector_parse (text, &sel, &err), -1);
  assert_non_null (strstr (err_msg (&err), "requirements"));
  err_release (&err);
}

static void
test_selector_matches_labels (void **state)
{
  (void) state;
  static lbl_selector_t sel;
  err_t err = ERR_INIT;
  const char *web[] = {"app=web", "env=prod", "owner=", NULL};
  const char *db[] = {"app=db", NULL};
  struct
  {
    const char *sel;
    bool web, db, none;
  } cases[] = {
      {"app=web", true, false, false},
      {"app==db", false, true, false},
      {"app!=web", false, true, true},
      {"env!=prod", false, true, true},
      {"env", true, false, false},
      {"!env", false, true, true},
      {"owner", true, false, false},
      {"owner=", true, false, false},
      {"app,!env", false, true, false},
      {"", true, true, true},
      {"app=web,env=dev", false, false, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    {
      assert_int_equal (lbl_selector_parse (cases[i].sel, &sel, &err), 0);
      assert_int_equal (lbl_selector_matches (&sel, web), cases[i].web);
      assert_int_equal (lbl_selector_matches (&sel, db), cases[i].db);
      assert_int_equal (lbl_selector_matches (&sel, NULL), cases[i].none);
    }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_keys_follow_kubernetes_syntax),
      cmocka_unit_test (test_values_may_be_empty_but_not_malformed),
      cmocka_unit_test (test_check_caps_the_count_and_names_the_bad_key),
      cmocka_unit_test (test_selector_parses_every_form),
      cmocka_unit_test (test_selector_refuses_malformed_text),
      cmocka_unit_test (test_selector_bounds_its_size),
      cmocka_unit_test (test_selector_matches_labels),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
