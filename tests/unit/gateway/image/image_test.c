/* image_test: OCI references as gateway/image/ref.c parses and refuses
 * them, and the environment of a command on an image (img_env_merge: the
 * image's Env under the request's, a request's value winning). Pure
 * functions; single-threaded. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "gateway/image/image.h"
#include "gateway/image/ref.h"

static void
test_references_name_host_repo_tag_and_digest (void **state)
{
  (void) state;
  img_ref_t r;
  err_t err = ERR_INIT;
  assert_int_equal (img_ref_parse ("127.0.0.1:5000/team/tools:3.11", &r, &err), 0);
  assert_string_equal (r.host, "127.0.0.1:5000");
  assert_string_equal (r.repo, "team/tools");
  assert_string_equal (r.tag, "3.11");
  assert_string_equal (r.digest, "");
  assert_int_equal (img_ref_parse ("python", &r, &err), 0);
  assert_string_equal (r.host, "registry-1.docker.io");
  assert_string_equal (r.repo, "library/python");
  assert_string_equal (r.tag, "latest");
  const char *d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  char ref[160];
  snprintf (ref, sizeof ref, "ghcr.io/o/r@%s", d);
  assert_int_equal (img_ref_parse (ref, &r, &err), 0);
  assert_string_equal (r.host, "ghcr.io");
  assert_string_equal (r.digest, d);
  assert_string_equal (r.tag, "");
  assert_int_equal (img_ref_parse ("localhost/x:1", &r, &err), 0);
  assert_string_equal (r.host, "localhost");
}

static void
test_hostile_references_are_einval (void **state)
{
  (void) state;
  const char *bad[] = {"",       "a/../b:1",         "Upper/case", "h:5000/r@sha256:12", "repo:", "/abs",
                       "r:-tag", "h:5000//double:1", "x y:1",      "h.io/r@md5:00",      "r:t\n", "h.io/.hid:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      img_ref_t r;
      err_t err = ERR_INIT;
      assert_int_equal (img_ref_parse (bad[i], &r, &err), -1);
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
    }
  char longref[400];
  memset (longref, 'a', sizeof longref - 1);
  longref[sizeof longref - 1] = '\0';
  img_ref_t r;
  err_t err = ERR_INIT;
  assert_int_equal (img_ref_parse (longref, &r, &err), -1);
  err_release (&err);
}

static void
test_request_env_wins_over_the_image_env (void **state)
{
  (void) state;
  char *ienv[] = {"PATH=/bin", "LANG=C", "EMPTY=", NULL};
  img_t img = {.env = ienv};
  char *const req[] = {"LANG=C.UTF-8", "MINE=1", NULL};
  char **out = NULL;
  err_t err = ERR_INIT;
  assert_int_equal (img_env_merge (&img, req, &out, &err), 0);
  const char *want[] = {"PATH=/bin", "EMPTY=", "LANG=C.UTF-8", "MINE=1", NULL};
  for (size_t i = 0; want[i] != NULL; i++)
    assert_string_equal (out[i], want[i]);
  assert_null (out[4]);
  img_env_free (out);
  assert_int_equal (img_env_merge (&img, NULL, &out, &err), 0);
  assert_string_equal (out[1], "LANG=C");
  img_env_free (out);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_references_name_host_repo_tag_and_digest),
      cmocka_unit_test (test_hostile_references_are_einval),
      cmocka_unit_test (test_request_env_wins_over_the_image_env),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
