/* names_test: a sandbox's own file names through a snapshot — export's
 * escape rule (export_name_escaped: ESCAPE_PREFIX before a name that begins
 * with ".wh.") and restore's unescape (snap_unpack_unescape_path) give back
 * every name, the bare ".wh." included, in any component of a path, while
 * names that were never escaped pass unchanged; and the unescape's bound.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/snapshot/export_internal.h"
#include "gateway/snapshot/unpack.h"

/* The stored form of one name, as export writes it. */
static void
stored (const char *name, char *out, size_t cap)
{
  snprintf (out, cap, "%s%s", export_name_escaped (name) ? ESCAPE_PREFIX : "", name);
}

static void
test_every_whiteout_like_name_round_trips (void **state)
{
  (void) state;
  static const char *const names[] = {
      ".wh.",                           /* the bare prefix: shortest escaped form */
      ".wh.x",          ".wh..wh..opq", /* looks like the opaque marker */
      ".wh..wh.u.wh.x",                 /* looks like an escaped name already */
      ".wh..",          ".wh...",       "plain", ".wh", ".whx", "a.wh.b",
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    {
      char s[PATH_MAX], back[PATH_MAX];
      stored (names[i], s, sizeof s);
      assert_int_equal (snap_unpack_unescape_path (s, back, sizeof back), 0);
      assert_string_equal (back, names[i]);
    }
}

static void
test_every_component_of_a_path_is_unescaped (void **state)
{
  (void) state;
  char back[PATH_MAX];
  assert_int_equal (
      snap_unpack_unescape_path ("root/" ESCAPE_PREFIX ".wh./" ESCAPE_PREFIX ".wh.x/f", back, sizeof back), 0);
  assert_string_equal (back, "root/.wh./.wh.x/f");
  /* Real whiteouts and markers are never escaped, and stay as they are. */
  assert_int_equal (snap_unpack_unescape_path ("etc/.wh.hostname", back, sizeof back), 0);
  assert_string_equal (back, "etc/.wh.hostname");
  assert_int_equal (snap_unpack_unescape_path ("d/.wh..wh..opq", back, sizeof back), 0);
  assert_string_equal (back, "d/.wh..wh..opq");
  /* The prefix alone, or followed by something else than ".wh.", is a name
   * of its own (in the space the OCI format reserves), kept. */
  assert_int_equal (snap_unpack_unescape_path (ESCAPE_PREFIX, back, sizeof back), 0);
  assert_string_equal (back, ESCAPE_PREFIX);
  assert_int_equal (snap_unpack_unescape_path (ESCAPE_PREFIX "x", back, sizeof back), 0);
  assert_string_equal (back, ESCAPE_PREFIX "x");
  /* Runs of slashes become one. */
  assert_int_equal (snap_unpack_unescape_path ("a//b///c", back, sizeof back), 0);
  assert_string_equal (back, "a/b/c");
}

static void
test_unescape_refuses_what_does_not_fit (void **state)
{
  (void) state;
  char back[8];
  assert_int_equal (snap_unpack_unescape_path ("abcde", back, sizeof back), 0);
  assert_string_equal (back, "abcde");
  assert_int_equal (snap_unpack_unescape_path ("abcdefghij", back, sizeof back), -1);
  /* Unescaping shrinks: a stored form longer than the buffer may fit. */
  assert_int_equal (snap_unpack_unescape_path (ESCAPE_PREFIX ".wh.", back, sizeof back), 0);
  assert_string_equal (back, ".wh.");
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_every_whiteout_like_name_round_trips),
      cmocka_unit_test (test_every_component_of_a_path_is_unescaped),
      cmocka_unit_test (test_unescape_refuses_what_does_not_fit),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
