/* options_test: sandbox-helper's pure parts (gateway/helper/options.c and
 * the option strings of helper.h) — the launch command line the gateway
 * writes (every option, the defaults, lists that keep every entry, a spare
 * memory group that is not the gateway's, an unknown option), volume specs
 * with their options, uid_map/gid_map lines and their size check, and the
 * overlay options both with and without a user namespace (layers relative
 * to the disk, redirects and metacopy pinned off).
 */
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

#include "gateway/helper/helper.h"

/* ---- the command line ------------------------------------------------------- */

#define MAX_ARGS 64

typedef struct parsed_s
{
  helper_opts_t o;
  const char *volumes[MAX_ARGS], *masks[MAX_ARGS], *blocked[MAX_ARGS];
  char *argv[MAX_ARGS + 1];
  int rc;
} parsed_t;

/* Parses "sandbox-helper <args...>" (NULL-terminated) into p. */
static void
parse (parsed_t *p, const char *const *args)
{
  memset (p, 0, sizeof *p);
  int argc = 0;
  p->argv[argc++] = (char *) "sandbox-helper";
  for (; args[argc - 1] != NULL; argc++)
    p->argv[argc] = (char *) args[argc - 1];
  p->argv[argc] = NULL;
  p->o.volumes = p->volumes;
  p->o.masks = p->masks;
  p->o.blocked = p->blocked;
  p->rc = helper_opts_parse (argc, p->argv, &p->o);
}

static void
test_parse_reads_every_launch_option (void **state)
{
  (void) state;
  static const char *const args[] = {"launch",
                                     "--id",
                                     "box-1",
                                     "--state",
                                     "/var/lib/sg/sandboxes/box-1",
                                     "--lower",
                                     "/images/base",
                                     "--cgroup-mount",
                                     "/cg",
                                     "--cgroup-group",
                                     "grp",
                                     "--disk-mb",
                                     "64",
                                     "--disk-inodes",
                                     "5000",
                                     "--pids",
                                     "128",
                                     "--memory-mb",
                                     "256",
                                     "--cpu-millis",
                                     "500",
                                     "--cpu-group",
                                     "--hostname",
                                     "h1",
                                     "--egress",
                                     "--restore",
                                     "--max-entries",
                                     "10",
                                     "--unpacker",
                                     "/bin/unpack",
                                     "--uid-base",
                                     "200000",
                                     "--uid-range",
                                     "65536",
                                     "--memcg-spare",
                                     SBX_CG_SPARE_PREFIX "7",
                                     NULL};
  parsed_t p;
  parse (&p, args);
  const helper_opts_t *o = &p.o;
  assert_int_equal (p.rc, 0);
  assert_string_equal (o->id, "box-1");
  assert_string_equal (o->state, "/var/lib/sg/sandboxes/box-1");
  assert_string_equal (o->lower, "/images/base");
  assert_string_equal (o->cgroup_mount, "/cg");
  assert_string_equal (o->cgroup_group, "grp");
  assert_int_equal (o->disk_mb, 64);
  assert_int_equal (o->disk_inodes, 5000);
  assert_int_equal (o->limits.pids_max, 128);
  assert_int_equal (o->limits.memory_mb, 256);
  assert_int_equal (o->limits.cpu_millis, 500);
  assert_true (o->cpu_group);
  assert_string_equal (o->hostname, "h1");
  assert_true (o->egress);
  assert_true (o->restore);
  assert_int_equal (o->max_entries, 10);
  assert_string_equal (o->unpacker, "/bin/unpack");
  assert_int_equal (o->uid_base, 200000);
  assert_int_equal (o->uid_range, 65536);
  assert_string_equal (o->memcg_spare, SBX_CG_SPARE_PREFIX "7");
}

static void
test_parse_defaults_follow_the_disk_size (void **state)
{
  (void) state;
  static const char *const bare[] = {"launch", "--id", "x", NULL};
  parsed_t p;
  parse (&p, bare);
  assert_int_equal (p.rc, 0);
  assert_string_equal (p.o.cgroup_mount, "/sys/fs/cgroup");
  assert_string_equal (p.o.cgroup_group, "sandbox-gateway");
  assert_string_equal (p.o.lower, "/");
  assert_null (p.o.state);
  assert_int_equal (p.o.disk_mb, HELPER_DEFAULT_DISK_MB);
  assert_int_equal (p.o.disk_inodes, HELPER_DEFAULT_DISK_MB * HELPER_DEFAULT_INODES_PER_MB);
  assert_int_equal (p.o.max_entries, HELPER_DEFAULT_MAX_ENTRIES);
  assert_false (p.o.egress);
  assert_false (p.o.restore);
  assert_false (p.o.cpu_group);
  assert_int_equal (p.o.uid_range, 0);

  /* Inodes follow --disk-mb when not given, and a zero or negative count
   * means "the default" too. */
  static const char *const sized[] = {"launch", "--id", "x", "--disk-mb", "10", "--max-entries", "-5", NULL};
  parse (&p, sized);
  assert_int_equal (p.o.disk_inodes, 10 * HELPER_DEFAULT_INODES_PER_MB);
  assert_int_equal (p.o.max_entries, HELPER_DEFAULT_MAX_ENTRIES);
}

static void
test_parse_lists_keep_every_entry_in_order (void **state)
{
  (void) state;
  static const char *const args[]
      = {"launch", "--volume", "/a:/x",   "--mask",   "/m1",      "--volume", "/b:/y:ro", "--block", "10.0.0.1",
         "--mask", "/m2",      "--block", "10.0.0.2", "--volume", "/c:/z",    "--id",     "x",       NULL};
  parsed_t p;
  parse (&p, args);
  assert_int_equal (p.rc, 0);
  assert_int_equal (p.o.n_volumes, 3);
  assert_string_equal (p.o.volumes[0], "/a:/x");
  assert_string_equal (p.o.volumes[1], "/b:/y:ro");
  assert_string_equal (p.o.volumes[2], "/c:/z");
  assert_int_equal (p.o.n_masks, 2);
  assert_string_equal (p.o.masks[1], "/m2");
  assert_int_equal (p.o.n_blocked, 2);
  assert_string_equal (p.o.blocked[0], "10.0.0.1");
}

static void
test_parse_drops_a_memory_group_that_is_not_a_spare (void **state)
{
  (void) state;
  /* Only the gateway's spares may be taken over: another name, or one
   * that climbs out of the gateway's group, makes a fresh group instead. */
  static const char *const outside[] = {"launch", "--id", "x", "--memcg-spare", "../../system.slice", NULL};
  static const char *const nested[] = {"launch", "--id", "x", "--memcg-spare", SBX_CG_SPARE_PREFIX "1/../..", NULL};
  parsed_t p;
  parse (&p, outside);
  assert_int_equal (p.rc, 0);
  assert_null (p.o.memcg_spare);
  parse (&p, nested);
  assert_null (p.o.memcg_spare);
}

static void
test_parse_refuses_an_unknown_option_and_stops_at_the_first_argument (void **state)
{
  (void) state;
  static const char *const unknown[] = {"launch", "--id", "x", "--no-such-option", NULL};
  parsed_t p;
  parse (&p, unknown);
  assert_int_equal (p.rc, -1);
  /* "+": the first non-option ends the options (nothing is permuted). */
  static const char *const stop[] = {"launch", "--id", "x", "stray", "--egress", NULL};
  parse (&p, stop);
  assert_int_equal (p.rc, 0);
  assert_false (p.o.egress);
  /* Each call starts afresh (getopt's state is reset). */
  static const char *const again[] = {"launch", "--egress", "--id", "y", NULL};
  parse (&p, again);
  assert_true (p.o.egress);
  assert_string_equal (p.o.id, "y");
}

/* ---- volume specs ----------------------------------------------------------- */

static void
test_parse_volume_splits_host_destination_and_options (void **state)
{
  (void) state;
  helper_volume_t v;
  helper_parse_volume ("/srv/data:/data", &v);
  assert_string_equal (v.host, "/srv/data");
  assert_string_equal (v.dst, "/data");
  assert_false (v.ro);
  assert_int_equal (v.uid, -1);
  assert_int_equal (v.gid, -1);

  helper_parse_volume ("/srv/data:/data:ro:uid=1000:gid=1001", &v);
  assert_string_equal (v.host, "/srv/data");
  assert_string_equal (v.dst, "/data");
  assert_true (v.ro);
  assert_int_equal (v.uid, 1000);
  assert_int_equal (v.gid, 1001);

  /* Options in any order; unknown ones ignored. */
  helper_parse_volume ("/h:/d:gid=5:future:ro", &v);
  assert_true (v.ro);
  assert_int_equal (v.gid, 5);
  assert_int_equal (v.uid, -1);
}

static void
test_parse_volume_without_destination_leaves_it_empty (void **state)
{
  (void) state;
  helper_volume_t v;
  helper_parse_volume ("/only-host", &v);
  assert_string_equal (v.host, "/only-host");
  assert_string_equal (v.dst, "");
  assert_false (v.ro);
}

static void
test_parse_volume_cuts_at_its_buffer_and_stays_terminated (void **state)
{
  (void) state;
  /* Longer than the spec's room (the gateway checks lengths first): the
   * copy ends inside the buffer, NUL-terminated, never past it. */
  size_t n = sizeof ((helper_volume_t *) 0)->spec + 100;
  char *in = malloc (n + 1);
  assert_non_null (in);
  memset (in, 'a', n);
  in[0] = '/';
  in[10] = ':';
  in[n] = '\0';
  helper_volume_t v;
  helper_parse_volume (in, &v);
  assert_string_equal (v.host, "/aaaaaaaaa");
  assert_int_equal (strlen (v.dst), sizeof v.spec - 12);
  free (in);
}

/* ---- id maps ---------------------------------------------------------------- */

static void
test_id_map_line_formats_inside_outside_count (void **state)
{
  (void) state;
  char buf[64];
  assert_int_equal (helper_id_map_line (buf, sizeof buf, 0, 200000, 65536), (int) strlen ("0 200000 65536\n"));
  assert_string_equal (buf, "0 200000 65536\n");
  assert_int_equal (helper_id_map_line (buf, sizeof buf, 1000, 4294967295UL, 1), 18);
  assert_string_equal (buf, "1000 4294967295 1\n");
}

static void
test_id_map_line_refuses_a_buffer_too_small (void **state)
{
  (void) state;
  char buf[16];
  /* "0 200000 65536\n" is 15 bytes: fits 16 with its NUL, not 15. */
  assert_int_equal (helper_id_map_line (buf, 16, 0, 200000, 65536), 15);
  assert_int_equal (helper_id_map_line (buf, 15, 0, 200000, 65536), -1);
  /* The largest numbers fit the callers' 64 bytes. */
  char big[64];
  assert_true (helper_id_map_line (big, sizeof big, LONG_MIN, ULONG_MAX, ULONG_MAX) > 0);
}

/* ---- overlay options -------------------------------------------------------- */

static bool
has_opt (const char *opts, const char *opt)
{
  size_t n = strlen (opt);
  for (const char *p = opts; p != NULL; p = strchr (p, ','), p = p != NULL ? p + 1 : NULL)
    if (strncmp (p, opt, n) == 0 && (p[n] == ',' || p[n] == '\0'))
      return true;
  return false;
}

static void
test_overlay_options_keep_layers_on_the_disk_and_pin_redirects_off (void **state)
{
  (void) state;
  const char *plain = HELPER_OVERLAY_OPTS ("/lower");
  const char *userns = HELPER_USERNS_OVERLAY_OPTS ("/lower");
  /* Upper and work are relative: the overlay is mounted from inside the
   * disk, so no host path (no state directory) appears in its options. */
  for (int i = 0; i < 2; i++)
    {
      const char *o = i == 0 ? plain : userns;
      assert_true (has_opt (o, "lowerdir=/lower"));
      assert_true (has_opt (o, "upperdir=upper"));
      assert_true (has_opt (o, "workdir=work"));
      assert_true (has_opt (o, "metacopy=off"));
      assert_true (has_opt (o, "index=off"));
    }
  assert_true (has_opt (plain, "redirect_dir=off"));
  assert_false (has_opt (plain, "userxattr"));
  assert_true (has_opt (userns, "userxattr"));
  assert_true (has_opt (userns, "redirect_dir=nofollow"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_parse_reads_every_launch_option),
      cmocka_unit_test (test_parse_defaults_follow_the_disk_size),
      cmocka_unit_test (test_parse_lists_keep_every_entry_in_order),
      cmocka_unit_test (test_parse_drops_a_memory_group_that_is_not_a_spare),
      cmocka_unit_test (test_parse_refuses_an_unknown_option_and_stops_at_the_first_argument),
      cmocka_unit_test (test_parse_volume_splits_host_destination_and_options),
      cmocka_unit_test (test_parse_volume_without_destination_leaves_it_empty),
      cmocka_unit_test (test_parse_volume_cuts_at_its_buffer_and_stays_terminated),
      cmocka_unit_test (test_id_map_line_formats_inside_outside_count),
      cmocka_unit_test (test_id_map_line_refuses_a_buffer_too_small),
      cmocka_unit_test (test_overlay_options_keep_layers_on_the_disk_and_pin_redirects_off),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
