/* router_test: path templates and route lookup (shim/router.c) over a small
 * table of this test's own: exact paths, one {id} component, 404 (no path
 * matches) against 405 (the path exists for another method), ids too long
 * for their buffer, empty ids and trailing slashes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "shim/router.h"

static const shim_route_t table[] = {
    {"GET", "/health", SHIM_BODY_NONE, false, NULL, NULL, NULL},
    {"POST", "/things", SHIM_BODY_JSON, true, NULL, NULL, NULL},
    {"GET", "/things", SHIM_BODY_NONE, true, NULL, NULL, NULL},
    {"DELETE", "/things/{id}", SHIM_BODY_NONE, true, NULL, NULL, NULL},
    {"POST", "/things/{id}/run", SHIM_BODY_JSON, true, NULL, NULL, NULL},
    {"GET", "/things/{id}/tar", SHIM_BODY_NONE, true, NULL, NULL, NULL},
};
#define N_ROUTES (sizeof table / sizeof table[0])

/* ---- shim_match_path ------------------------------------------------------ */

static void
test_template_without_id_matches_only_itself (void **state)
{
  char id[8] = "keep";
  bool too_long = true;
  assert_true (shim_match_path ("/health", "/health", id, sizeof id, &too_long));
  /* id and the flag are left alone. */
  assert_string_equal (id, "keep");
  assert_true (too_long);
  assert_false (shim_match_path ("/health", "/health/", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/health", "/healthz", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/health", "/", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/health", "", id, sizeof id, &too_long));
}

static void
test_id_component_is_copied (void **state)
{
  char id[SHIM_ID_MAX + 1];
  bool too_long = true;
  assert_true (shim_match_path ("/things/{id}/run", "/things/abc-1_2/run", id, sizeof id, &too_long));
  assert_string_equal (id, "abc-1_2");
  assert_false (too_long);
  assert_true (shim_match_path ("/things/{id}", "/things/x", id, sizeof id, &too_long));
  assert_string_equal (id, "x");
  /* Whatever the component holds: validation is the caller's. */
  assert_true (shim_match_path ("/things/{id}", "/things/a%20b..", id, sizeof id, &too_long));
  assert_string_equal (id, "a%20b..");
}

static void
test_empty_id_does_not_match (void **state)
{
  char id[8];
  bool too_long = false;
  assert_false (shim_match_path ("/things/{id}", "/things/", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}/run", "/things//run", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}", "/things", id, sizeof id, &too_long));
}

static void
test_trailing_slash_or_extra_components_do_not_match (void **state)
{
  char id[8];
  bool too_long = false;
  assert_false (shim_match_path ("/things/{id}", "/things/a/", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}", "/things/a/b", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}/run", "/things/a/run/", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}/run", "/things/a/runs", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}/run", "/things/a", id, sizeof id, &too_long));
  assert_false (shim_match_path ("/things/{id}", "/thing/a", id, sizeof id, &too_long));
}

static void
test_id_longer_than_its_buffer_is_cut_and_flagged (void **state)
{
  char id[5];
  bool too_long = false;
  assert_true (shim_match_path ("/things/{id}/run", "/things/abcd/run", id, sizeof id, &too_long));
  assert_string_equal (id, "abcd");
  assert_false (too_long);
  assert_true (shim_match_path ("/things/{id}/run", "/things/abcde/run", id, sizeof id, &too_long));
  assert_string_equal (id, "abcd");
  assert_true (too_long);
  /* The smallest buffer holds only the terminator. */
  char one[1];
  assert_true (shim_match_path ("/things/{id}", "/things/a", one, sizeof one, &too_long));
  assert_string_equal (one, "");
  assert_true (too_long);
}

static void
test_second_component_is_copied_to_pid (void **state)
{
  char id[SHIM_ID_MAX + 1], pid[SHIM_ID_MAX + 1];
  bool too_long = true;
  assert_true (shim_match_path2 ("/s/{id}/p/{pid}/out", "/s/a1/p/web-1/out", id, pid, sizeof id, &too_long));
  assert_string_equal (id, "a1");
  assert_string_equal (pid, "web-1");
  assert_false (too_long);
  assert_true (shim_match_path2 ("/s/{id}/p/{pid}", "/s/a/p/b", id, pid, sizeof id, &too_long));
  assert_string_equal (pid, "b");
  /* Empty, missing or extra components do not match. */
  assert_false (shim_match_path2 ("/s/{id}/p/{pid}", "/s/a/p/", id, pid, sizeof id, &too_long));
  assert_false (shim_match_path2 ("/s/{id}/p/{pid}", "/s/a/p", id, pid, sizeof id, &too_long));
  assert_false (shim_match_path2 ("/s/{id}/p/{pid}", "/s/a/p/b/", id, pid, sizeof id, &too_long));
  assert_false (shim_match_path2 ("/s/{id}/p/{pid}", "/s/a/q/b", id, pid, sizeof id, &too_long));
  /* Without a pid buffer a {pid} template never matches. */
  assert_false (shim_match_path ("/s/{id}/p/{pid}", "/s/a/p/b", id, sizeof id, &too_long));
  /* Too long: cut and flagged. */
  char small[4];
  assert_true (shim_match_path2 ("/s/{id}/p/{pid}", "/s/a/p/bcdefg", small, pid, sizeof small, &too_long));
  assert_true (too_long);
}

/* ---- shim_route_find ------------------------------------------------------ */

static const shim_route_t *
find (const char *url, const char *method, char *id, bool *path_known, bool *too_long)
{
  char pid[SHIM_ID_MAX + 1];
  return shim_route_find (table, N_ROUTES, url, method, id, pid, path_known, too_long);
}

static void
test_route_is_found_by_method_and_path (void **state)
{
  char id[SHIM_ID_MAX + 1];
  bool known = false, too_long = true;
  assert_ptr_equal (find ("/health", "GET", id, &known, &too_long), &table[0]);
  assert_true (known);
  assert_false (too_long);
  assert_string_equal (id, "");
  /* Same path, two methods: each finds its own. */
  assert_ptr_equal (find ("/things", "POST", id, &known, &too_long), &table[1]);
  assert_ptr_equal (find ("/things", "GET", id, &known, &too_long), &table[2]);
  assert_ptr_equal (find ("/things/t1/run", "POST", id, &known, &too_long), &table[4]);
  assert_string_equal (id, "t1");
  assert_ptr_equal (find ("/things/t2/tar", "GET", id, &known, &too_long), &table[5]);
  assert_string_equal (id, "t2");
  assert_ptr_equal (find ("/things/t3", "DELETE", id, &known, &too_long), &table[3]);
  assert_string_equal (id, "t3");
}

static void
test_unknown_path_is_404_and_known_path_with_another_method_is_405 (void **state)
{
  char id[SHIM_ID_MAX + 1];
  bool known = true, too_long = true;
  /* 404: no route has this path. */
  assert_null (find ("/nothing", "GET", id, &known, &too_long));
  assert_false (known);
  assert_false (too_long);
  assert_null (find ("/things/t1/stop", "POST", id, &known, &too_long));
  assert_false (known);
  /* 405: the path exists for other methods. */
  assert_null (find ("/health", "POST", id, &known, &too_long));
  assert_true (known);
  assert_null (find ("/things", "DELETE", id, &known, &too_long));
  assert_true (known);
  assert_null (find ("/things/t1", "GET", id, &known, &too_long));
  assert_true (known);
  assert_null (find ("/things/t1/run", "GET", id, &known, &too_long));
  assert_true (known);
  /* Methods are case-sensitive, as HTTP's are. */
  assert_null (find ("/health", "get", id, &known, &too_long));
  assert_true (known);
}

static void
test_empty_id_and_trailing_slash_are_404 (void **state)
{
  char id[SHIM_ID_MAX + 1];
  bool known = true, too_long = true;
  static const char *const urls[] = {"/things/", "/things//run", "/things/t1/", "/things/t1/run/", "/health/", ""};
  for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++)
    for (size_t m = 0; m < 3; m++)
      {
        static const char *const methods[] = {"GET", "POST", "DELETE"};
        if (find (urls[i], methods[m], id, &known, &too_long) != NULL)
          fail_msg ("%s %s matched a route", methods[m], urls[i]);
        if (known)
          fail_msg ("%s %s: path_known", methods[m], urls[i]);
      }
}

static void
test_id_too_long_is_flagged_and_cut_to_the_limit (void **state)
{
  char url[512], id[SHIM_ID_MAX + 1];
  bool known = false, too_long = false;

  /* The limit itself is fine. */
  char exact[SHIM_ID_MAX + 1];
  memset (exact, 'a', SHIM_ID_MAX);
  exact[SHIM_ID_MAX] = '\0';
  snprintf (url, sizeof url, "/things/%s/run", exact);
  assert_ptr_equal (find (url, "POST", id, &known, &too_long), &table[4]);
  assert_false (too_long);
  assert_string_equal (id, exact);

  /* One over, and far over: flagged, the id cut to SHIM_ID_MAX. */
  static const size_t lengths[] = {SHIM_ID_MAX + 1, SHIM_ID_MAX + 2, 300};
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++)
    {
      char long_id[301];
      memset (long_id, 'b', lengths[i]);
      long_id[lengths[i]] = '\0';
      snprintf (url, sizeof url, "/things/%s", long_id);
      too_long = false;
      assert_ptr_equal (find (url, "DELETE", id, &known, &too_long), &table[3]);
      assert_true (known);
      assert_true (too_long);
      assert_int_equal (strlen (id), SHIM_ID_MAX);
      assert_memory_equal (id, long_id, SHIM_ID_MAX);
    }

  /* A too long id on a path known only for other methods: 405 as usual. */
  snprintf (url, sizeof url, "/things/%0300d", 7);
  assert_null (find (url, "PUT", id, &known, &too_long));
  assert_true (known);
}

/* The ports proxy's templates: "{port}" into the second slot, "{*}" the
 * rest of the path (none, one or many components), "*" any method; an
 * earlier, more specific route wins. */
static void
test_port_and_rest_of_the_path_match_any_method (void **state)
{
  (void) state;
  static const shim_route_t proxy[] = {
      {"POST", "/s/{id}/ports/{port}/links", SHIM_BODY_JSON, true, NULL, NULL, NULL, false},
      {"*", "/s/{id}/ports/{port}/{*}", SHIM_BODY_STREAM, true, NULL, NULL, NULL, false},
      {"*", "/p/{*}", SHIM_BODY_STREAM, false, NULL, NULL, NULL, false},
  };
  char id[SHIM_ID_MAX + 1], pid[SHIM_ID_MAX + 1];
  bool known = false, too_long = false;
  const shim_route_t *r = shim_route_find (proxy, 3, "/s/box/ports/8000/", "PATCH", id, pid, &known, &too_long);
  assert_ptr_equal (r, &proxy[1]);
  assert_string_equal (id, "box");
  assert_string_equal (pid, "8000");
  r = shim_route_find (proxy, 3, "/s/box/ports/8000/a/b/c.js", "GET", id, pid, &known, &too_long);
  assert_ptr_equal (r, &proxy[1]);
  r = shim_route_find (proxy, 3, "/s/box/ports/8000/links", "POST", id, pid, &known, &too_long);
  assert_ptr_equal (r, &proxy[0]);
  r = shim_route_find (proxy, 3, "/s/box/ports/8000/links", "GET", id, pid, &known, &too_long);
  assert_ptr_equal (r, &proxy[1]);
  /* No slash after the port: not the proxy. */
  assert_null (shim_route_find (proxy, 3, "/s/box/ports/8000", "GET", id, pid, &known, &too_long));
  r = shim_route_find (proxy, 3, "/p/tok.en/x?y", "DELETE", id, pid, &known, &too_long);
  assert_ptr_equal (r, &proxy[2]);
  assert_null (shim_route_find (proxy, 3, "/px/tok", "GET", id, pid, &known, &too_long));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_template_without_id_matches_only_itself),
      cmocka_unit_test (test_id_component_is_copied),
      cmocka_unit_test (test_empty_id_does_not_match),
      cmocka_unit_test (test_trailing_slash_or_extra_components_do_not_match),
      cmocka_unit_test (test_id_longer_than_its_buffer_is_cut_and_flagged),
      cmocka_unit_test (test_second_component_is_copied_to_pid),
      cmocka_unit_test (test_route_is_found_by_method_and_path),
      cmocka_unit_test (test_unknown_path_is_404_and_known_path_with_another_method_is_405),
      cmocka_unit_test (test_empty_id_and_trailing_slash_are_404),
      cmocka_unit_test (test_id_too_long_is_flagged_and_cut_to_the_limit),
      cmocka_unit_test (test_port_and_rest_of_the_path_match_any_method),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
