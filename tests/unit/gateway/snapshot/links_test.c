/* links_test: the export's table of hard links (gateway/snapshot/links.c)
 * and the pure entry helpers of entries.c. The table: links found by
 * (device, inode) only, paths rebuilt from directory nodes, thousands of
 * links across rehashes; the count cap (SNAP_EXPORT_MAX_HARD_LINKS), the
 * per-table byte cap (SNAP_EXPORT_LINK_TABLE_BYTES) and the gateway-wide
 * one (SNAP_EXPORT_LINK_TOTAL_BYTES), each refusing without growing, and
 * the budget handed back by snap_links_free. The helpers: host ids as a
 * sandbox sees them, names that would be taken for whiteouts.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "gateway/snapshot/export_internal.h"
#include "gateway/snapshot/links.h"

static void
path_of (const snap_links_t *t, dev_t dev, ino_t ino, char *buf)
{
  const link_rec_t *r = snap_links_find (t, dev, ino);
  assert_non_null (r);
  snap_links_path (t, r, buf, PATH_MAX + 1);
}

static void
test_links_rebuild_paths_from_directory_nodes (void **state)
{
  (void) state;
  snap_links_t t = {0};
  err_t err = ERR_INIT;
  char buf[PATH_MAX + 1];
  assert_null (snap_links_find (&t, 1, 1)); /* empty: nothing, no crash */
  uint32_t a, ab, c;
  assert_int_equal (snap_links_add_dir (&t, 0, "a", 1, &a, &err), 0);
  assert_int_equal (snap_links_add_dir (&t, a, "bXX", 1, &ab, &err), 0); /* len counts, not strlen */
  assert_int_equal (snap_links_add_dir (&t, 0, "c", 1, &c, &err), 0);
  assert_int_equal (snap_links_add (&t, 1, 100, 0, "top", &err), 0);
  assert_int_equal (snap_links_add (&t, 1, 101, ab, "deep", &err), 0);
  assert_int_equal (snap_links_add (&t, 1, 102, c, "f", &err), 0);
  path_of (&t, 1, 100, buf);
  assert_string_equal (buf, "top");
  path_of (&t, 1, 101, buf);
  assert_string_equal (buf, "a/b/deep");
  path_of (&t, 1, 102, buf);
  assert_string_equal (buf, "c/f");
  /* The same inode number on another device is another file. */
  assert_null (snap_links_find (&t, 2, 100));
  assert_null (snap_links_find (&t, 1, 103));
  size_t held = t.bytes;
  assert_true (held > 0);
  assert_int_equal (snap_links_free (&t), held);
  assert_int_equal (t.n_recs, 0);
  assert_null (snap_links_find (&t, 1, 100));
}

static void
test_links_thousands_survive_rehashing (void **state)
{
  (void) state;
  snap_links_t t = {0};
  err_t err = ERR_INIT;
  uint32_t d;
  assert_int_equal (snap_links_add_dir (&t, 0, "dir", 3, &d, &err), 0);
  enum
  {
    N = 20000
  };
  char name[32];
  for (unsigned i = 0; i < N; i++)
    {
      snprintf (name, sizeof name, "f%u", i);
      /* Inode numbers that collide in their low bits. */
      assert_int_equal (snap_links_add (&t, 7, (ino_t) i << 20, d, name, &err), 0);
    }
  assert_int_equal (t.n_recs, N);
  assert_true (t.n_slots >= 2 * N); /* load at most one half */
  char buf[PATH_MAX + 1];
  for (unsigned i = 0; i < N; i += 997)
    {
      path_of (&t, 7, (ino_t) i << 20, buf);
      snprintf (name, sizeof name, "dir/f%u", i);
      assert_string_equal (buf, name);
    }
  assert_null (snap_links_find (&t, 7, ((ino_t) N << 20)));
  size_t held = t.bytes;
  assert_int_equal (snap_links_free (&t), held);
  assert_int_equal (t.bytes, 0);
  assert_null (snap_links_find (&t, 7, 0));
}

static void
test_links_count_cap_refuses_the_next_link_and_keeps_the_rest (void **state)
{
  (void) state;
  snap_links_t t = {0};
  err_t err = ERR_INIT;
  for (size_t i = 0; i < SNAP_EXPORT_MAX_HARD_LINKS; i++)
    assert_int_equal (snap_links_add (&t, 1, (ino_t) i + 1, 0, "n", &err), 0);
  size_t bytes = t.bytes;
  assert_int_equal (snap_links_add (&t, 1, 0, 0, "one-more", &err), -1);
  assert_int_equal (err.status, ENOSPC);
  assert_non_null (strstr (err_msg (&err), "SNAP_EXPORT_MAX_HARD_LINKS"));
  err_release (&err);
  assert_int_equal (t.n_recs, SNAP_EXPORT_MAX_HARD_LINKS);
  assert_int_equal (t.bytes, bytes); /* refused before growing */
  assert_null (snap_links_find (&t, 1, 0));
  assert_non_null (snap_links_find (&t, 1, SNAP_EXPORT_MAX_HARD_LINKS));
  snap_links_free (&t);
}

/* Adds directory nodes with `len`-byte names until the table refuses;
 * returns the error's status (released). */
static int
fill (snap_links_t *t, const char *name, size_t len)
{
  err_t err = ERR_INIT;
  uint32_t node;
  for (;;)
    if (snap_links_add_dir (t, 0, name, len, &node, &err) < 0)
      {
        int status = err.status;
        if (status == ENOSPC)
          assert_non_null (strstr (err_msg (&err), "SNAP_EXPORT_LINK_TABLE_BYTES"));
        if (status == EAGAIN)
          assert_non_null (strstr (err_msg (&err), "SNAP_EXPORT_LINK_TOTAL_BYTES"));
        err_release (&err);
        return status;
      }
}

static void
test_links_byte_caps_per_table_and_for_all_tables (void **state)
{
  (void) state;
  static char name[4000];
  memset (name, 'n', sizeof name);
  /* One table stops at its own cap (names a sandbox chose fill the pool). */
  enum
  {
    MAX_TABLES = SNAP_EXPORT_LINK_TOTAL_BYTES / (1 << 20) + 1
  };
  static snap_links_t tables[MAX_TABLES];
  memset (tables, 0, sizeof tables);
  assert_int_equal (fill (&tables[0], name, sizeof name), ENOSPC);
  assert_true (tables[0].bytes <= SNAP_EXPORT_LINK_TABLE_BYTES);
  size_t n_nodes = tables[0].n_nodes;
  /* Refused again without growing: the table is as it was. */
  assert_int_equal (fill (&tables[0], name, sizeof name), ENOSPC);
  assert_int_equal (tables[0].n_nodes, n_nodes);

  /* More tables at once (concurrent exports) stop at the gateway-wide cap
   * before their own: all of them together never hold more. */
  size_t k = 1, total = tables[0].bytes;
  int status = ENOSPC;
  for (; k < MAX_TABLES && status == ENOSPC; k++)
    {
      status = fill (&tables[k], name, sizeof name);
      total += tables[k].bytes;
      assert_true (total <= SNAP_EXPORT_LINK_TOTAL_BYTES);
    }
  assert_int_equal (status, EAGAIN);
  size_t last = k - 1;

  /* Freeing one gives its share back: the last table grows again until its
   * own or the shared cap stops it. */
  size_t before = tables[last].n_nodes;
  snap_links_free (&tables[0]);
  status = fill (&tables[last], name, sizeof name);
  assert_true (status == ENOSPC || status == EAGAIN);
  assert_true (tables[last].n_nodes > before);
  for (size_t i = 0; i < MAX_TABLES; i++)
    snap_links_free (&tables[i]);

  /* With every table freed, the whole budget is back. */
  snap_links_t fresh = {0};
  assert_int_equal (fill (&fresh, name, sizeof name), ENOSPC);
  snap_links_free (&fresh);
}

/* ---- entry helpers ---------------------------------------------------------- */

static void
test_inside_id_maps_the_sandboxes_range_and_hides_the_rest (void **state)
{
  (void) state;
  /* No user namespace: ids as they are. */
  assert_int_equal (export_inside_id (1000, 0, 0), 1000);
  assert_int_equal (export_inside_id (0, 200000, 0), 0);
  /* The sandbox's range: base.. is 0.. */
  assert_int_equal (export_inside_id (200000, 200000, 65536), 0);
  assert_int_equal (export_inside_id (201000, 200000, 65536), 1000);
  assert_int_equal (export_inside_id (265535, 200000, 65536), 65535);
  /* Just outside it, another sandbox's or the host's ids: nobody. */
  assert_int_equal (export_inside_id (265536, 200000, 65536), EXPORT_NOBODY_ID);
  assert_int_equal (export_inside_id (199999, 200000, 65536), EXPORT_NOBODY_ID);
  assert_int_equal (export_inside_id (1000, 200000, 65536), EXPORT_NOBODY_ID);
  /* Host root (the image's files) stays root. */
  assert_int_equal (export_inside_id (0, 200000, 65536), 0);
}

static void
test_name_escaped_only_for_names_that_begin_like_a_whiteout (void **state)
{
  (void) state;
  assert_true (export_name_escaped (".wh.file"));
  assert_true (export_name_escaped (".wh."));
  assert_true (export_name_escaped (OCI_OPAQUE));
  assert_true (export_name_escaped (ESCAPE_PREFIX "x"));
  assert_false (export_name_escaped (".wh"));
  assert_false (export_name_escaped (".whx"));
  assert_false (export_name_escaped ("a.wh.b"));
  assert_false (export_name_escaped (".WH.upper"));
  assert_false (export_name_escaped (""));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_links_rebuild_paths_from_directory_nodes),
      cmocka_unit_test (test_links_thousands_survive_rehashing),
      cmocka_unit_test (test_links_count_cap_refuses_the_next_link_and_keeps_the_rest),
      cmocka_unit_test (test_links_byte_caps_per_table_and_for_all_tables),
      cmocka_unit_test (test_inside_id_maps_the_sandboxes_range_and_hides_the_rest),
      cmocka_unit_test (test_name_escaped_only_for_names_that_begin_like_a_whiteout),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
