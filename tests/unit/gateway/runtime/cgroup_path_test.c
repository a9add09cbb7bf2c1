/* Tests of the cgroup path builders (sbx_cg_path, sbx_cg_spare_path), the
 * layout they build from (sbx_cg_detect, on a directory that looks like a
 * cgroup mount) and checked path formatting (sbx_path_fmt): a path either
 * fits whole or the call fails, never a cut path. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "gateway/runtime/cgroup.h"
#include "gateway/runtime/path.h"

/* ---- sbx_cg_path ------------------------------------------------------- */

static void
test_cgroup_path_joins_the_parts_given (void **state)
{
  char out[SBX_CG_PATH_MAX];
  err_t err = ERR_INIT;
  assert_int_equal (sbx_cg_path (out, sizeof out, "/sys/fs/cgroup/g", "box", "exec-7", "cgroup.procs", &err),
                    (int) strlen ("/sys/fs/cgroup/g/box/exec-7/cgroup.procs"));
  assert_string_equal (out, "/sys/fs/cgroup/g/box/exec-7/cgroup.procs");
  assert_int_equal (sbx_cg_path (out, sizeof out, "/r", "box", NULL, "pids.max", &err), 15);
  assert_string_equal (out, "/r/box/pids.max");
  assert_int_equal (sbx_cg_path (out, sizeof out, "/r", NULL, NULL, "cgroup.subtree_control", &err), 25);
  assert_string_equal (out, "/r/cgroup.subtree_control");
  assert_int_equal (sbx_cg_path (out, sizeof out, "/r", "box", NULL, NULL, &err), 6);
  assert_string_equal (out, "/r/box");
  assert_int_equal (sbx_cg_path (out, sizeof out, "/r", NULL, NULL, NULL, &err), 2);
  assert_string_equal (out, "/r");
  assert_int_equal (err.status, 0);
}

static void
test_cgroup_path_that_does_not_fit_fails_and_is_not_cut (void **state)
{
  const char *want = "/root/box/exec-1/tasks";
  size_t len = strlen (want);
  char out[64];
  err_t err = ERR_INIT;
  /* Exactly its length and the NUL: fits. */
  assert_int_equal (sbx_cg_path (out, len + 1, "/root", "box", "exec-1", "tasks", &err), (int) len);
  assert_string_equal (out, want);
  /* One byte less, at every part: fails, and leaves no path behind. */
  for (size_t cap = 1; cap <= len; cap++)
    {
      memset (out, 'x', sizeof out);
      errno = 0;
      assert_int_equal (sbx_cg_path (out, cap, "/root", "box", "exec-1", "tasks", &err), -1);
      assert_int_equal (err.status, ENAMETOOLONG);
      assert_int_equal (errno, ENAMETOOLONG);
      assert_string_equal (out, "");
      /* The message names the path that did not fit. */
      assert_non_null (strstr (err_msg (&err), "/root/box/exec-1/tasks"));
      err_release (&err);
    }
  /* Without an err_t: still refused. */
  assert_int_equal (sbx_cg_path (out, 4, "/root", "box", NULL, NULL, NULL), -1);
  assert_string_equal (out, "");
}

static void
test_the_longest_id_sub_group_and_file_fit_the_path_buffer (void **state)
{
  char root[sizeof (((sbx_cg_layout_t *) 0)->roots[0])];
  memset (root, 'r', sizeof root - 1);
  root[0] = '/';
  root[sizeof root - 1] = '\0';
  char name[SBX_CG_NAME_MAX + 1];
  memset (name, 'n', SBX_CG_NAME_MAX);
  name[SBX_CG_NAME_MAX] = '\0';
  char out[SBX_CG_PATH_MAX];
  err_t err = ERR_INIT;
  assert_true (sbx_cg_path (out, sizeof out, root, name, name, name, &err) > 0);
  assert_int_equal (strlen (out), strlen (root) + 3 * (SBX_CG_NAME_MAX + 1));
  /* A name longer than the module's longest does not. */
  char longer[SBX_CG_NAME_MAX + 2];
  memset (longer, 'l', sizeof longer - 1);
  longer[sizeof longer - 1] = '\0';
  assert_int_equal (sbx_cg_path (out, sizeof out, root, name, name, longer, &err), -1);
  assert_int_equal (err.status, ENAMETOOLONG);
  err_release (&err);
}

/* ---- sbx_cg_detect and sbx_cg_spare_path -------------------------------- */

typedef struct mount_s
{
  char dir[256];
} mount_t;

static void
touch (const char *dir, const char *rel)
{
  char path[320];
  snprintf (path, sizeof path, "%s/%s", dir, rel);
  char *slash = strrchr (path, '/');
  *slash = '\0';
  mkdir (path, 0755);
  *slash = '/';
  int fd = open (path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  assert_true (fd >= 0);
  close (fd);
}

static int
mount_setup (void **state)
{
  mount_t *m = calloc (1, sizeof *m);
  if (m == NULL)
    return -1;
  /* Under /tmp, not the test's own (long) temporary directory: a layout's
   * roots hold 192 bytes, which that would pass (and be refused). */
  snprintf (m->dir, sizeof m->dir, "/tmp/cgroup-path-test-XXXXXX");
  if (mkdtemp (m->dir) == NULL)
    return -1;
  *state = m;
  return 0;
}

static int
mount_teardown (void **state)
{
  mount_t *m = *state;
  char cmd[300];
  snprintf (cmd, sizeof cmd, "rm -rf '%s'", m->dir);
  int rc = system (cmd);
  free (m);
  return rc == 0 ? 0 : -1;
}

static void
test_v2_layout_has_one_root_for_every_controller (void **state)
{
  mount_t *m = *state;
  touch (m->dir, "cgroup.controllers");
  sbx_cg_layout_t l;
  err_t err = ERR_INIT;
  assert_int_equal (sbx_cg_detect (m->dir, "gw", true, &l, &err), 0);
  assert_true (l.v2);
  assert_int_equal (l.n, 1);
  char want[320];
  snprintf (want, sizeof want, "%s/gw", m->dir);
  assert_string_equal (l.roots[0], want);
  assert_int_equal (l.memory, 0);
  assert_int_equal (l.freezer, 0);
  assert_int_equal (l.cpu, 0);
  assert_false (sbx_cg_spares_possible (&l));
}

static void
test_v1_layout_names_each_hierarchy_and_its_spares (void **state)
{
  mount_t *m = *state;
  touch (m->dir, "pids/cgroup.procs");
  touch (m->dir, "memory/cgroup.procs");
  touch (m->dir, "freezer/cgroup.procs");
  touch (m->dir, "cpu/cgroup.procs");
  sbx_cg_layout_t l;
  err_t err = ERR_INIT;
  /* Without a CPU limit the cpu hierarchy is left out. */
  assert_int_equal (sbx_cg_detect (m->dir, "gw", false, &l, &err), 0);
  assert_false (l.v2);
  assert_int_equal (l.n, 3);
  assert_int_equal (l.cpu, -1);
  char want[320];
  snprintf (want, sizeof want, "%s/pids/gw", m->dir);
  assert_string_equal (l.roots[0], want);
  snprintf (want, sizeof want, "%s/memory/gw", m->dir);
  assert_string_equal (l.roots[l.memory], want);
  snprintf (want, sizeof want, "%s/freezer/gw", m->dir);
  assert_string_equal (l.roots[l.freezer], want);

  assert_int_equal (sbx_cg_detect (m->dir, "gw", true, &l, &err), 0);
  assert_int_equal (l.n, 4);
  snprintf (want, sizeof want, "%s/cpu/gw", m->dir);
  assert_string_equal (l.roots[l.cpu], want);

  assert_true (sbx_cg_spares_possible (&l));
  char spare[SBX_CG_PATH_MAX];
  assert_true (sbx_cg_spare_path (&l, 12, spare, sizeof spare, &err) > 0);
  snprintf (want, sizeof want, "%s/memory/gw/" SBX_CG_SPARE_PREFIX "12", m->dir);
  assert_string_equal (spare, want);
  assert_int_equal (sbx_cg_spare_path (&l, 12, spare, strlen (want), &err), -1);
  assert_int_equal (err.status, ENAMETOOLONG);
  assert_string_equal (spare, "");
  err_release (&err);
}

static void
test_no_cgroups_at_the_mount_is_refused (void **state)
{
  mount_t *m = *state;
  sbx_cg_layout_t l;
  err_t err = ERR_INIT;
  assert_int_equal (sbx_cg_detect (m->dir, "gw", false, &l, &err), -1);
  assert_int_equal (err.status, ENOTSUP);
  err_release (&err);
}

static void
test_a_group_that_is_not_one_component_is_refused (void **state)
{
  mount_t *m = *state;
  touch (m->dir, "cgroup.controllers");
  const char *bad[] = {"", "a/b", ".", "..", "/abs"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      sbx_cg_layout_t l;
      err_t err = ERR_INIT;
      assert_int_equal (sbx_cg_detect (m->dir, bad[i], false, &l, &err), -1);
      assert_int_equal (err.status, EINVAL);
      err_release (&err);
    }
}

static void
test_a_root_longer_than_the_layout_holds_is_refused (void **state)
{
  mount_t *m = *state;
  touch (m->dir, "cgroup.controllers");
  /* A group name that makes the root longer than a layout's root holds:
   * refused at detection, not cut into another group's name. */
  char group[sizeof (((sbx_cg_layout_t *) 0)->roots[0])];
  memset (group, 'g', sizeof group - 1);
  group[sizeof group - 1] = '\0';
  sbx_cg_layout_t l;
  err_t err = ERR_INIT;
  assert_int_equal (sbx_cg_detect (m->dir, group, false, &l, &err), -1);
  assert_int_equal (err.status, ENAMETOOLONG);
  err_release (&err);
}

/* ---- sbx_path_fmt --------------------------------------------------------- */

static void
test_path_fmt_fits_exactly_or_fails (void **state)
{
  char out[16];
  err_t err = ERR_INIT;
  assert_int_equal (sbx_path_fmt (out, sizeof out, &err, "%s/%d", "/proc", 12345), 11);
  assert_string_equal (out, "/proc/12345");
  /* 15 characters and the NUL fit 16 bytes; 16 do not. */
  assert_int_equal (sbx_path_fmt (out, sizeof out, &err, "%s", "/123456789abcde"), 15);
  assert_int_equal (sbx_path_fmt (out, sizeof out, &err, "%s", "/123456789abcdef"), -1);
  assert_int_equal (err.status, ENAMETOOLONG);
  assert_string_equal (out, "");
  assert_non_null (strstr (err_msg (&err), "16 bytes"));
  err_release (&err);
  /* No room at all. */
  assert_int_equal (sbx_path_fmt (out, 0, NULL, "%s", ""), -1);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_cgroup_path_joins_the_parts_given),
      cmocka_unit_test (test_cgroup_path_that_does_not_fit_fails_and_is_not_cut),
      cmocka_unit_test (test_the_longest_id_sub_group_and_file_fit_the_path_buffer),
      cmocka_unit_test_setup_teardown (test_v2_layout_has_one_root_for_every_controller, mount_setup, mount_teardown),
      cmocka_unit_test_setup_teardown (test_v1_layout_names_each_hierarchy_and_its_spares, mount_setup,
                                       mount_teardown),
      cmocka_unit_test_setup_teardown (test_no_cgroups_at_the_mount_is_refused, mount_setup, mount_teardown),
      cmocka_unit_test_setup_teardown (test_a_group_that_is_not_one_component_is_refused, mount_setup,
                                       mount_teardown),
      cmocka_unit_test_setup_teardown (test_a_root_longer_than_the_layout_holds_is_refused, mount_setup,
                                       mount_teardown),
      cmocka_unit_test (test_path_fmt_fits_exactly_or_fails),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
