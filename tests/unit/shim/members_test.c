/* members_test: the pure parts of routing over several gateways
 * (shim/members.c) — rendezvous weights (deterministic, spread evenly,
 * and moving only the ids of a member that comes or goes), the owner's
 * choice over member states (down skipped, draining kept, every one down,
 * none listed), the state a probe's answers make, and SHIM_GATEWAYS's
 * syntax check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shim/members.h"

#define IDS 3000

static const char *const names[]
    = {"gw-0.gw:50051", "gw-1.gw:50051", "gw-2.gw:50051", "gw-3.gw:50051", "gw-4.gw:50051"};

/* The owner of `id` among the first n names, all up. */
static int
owner (const char *id, size_t n)
{
  uint64_t w[8];
  bool listed[8];
  member_state_t st[8];
  for (size_t i = 0; i < n; i++)
    {
      w[i] = members_weight (names[i], id);
      listed[i] = true;
      st[i] = MEMBER_UP;
    }
  bool failover = true;
  int k = members_choose (w, listed, st, n, &failover);
  assert_false (failover);
  return k;
}

static void
id_of (int i, char *out, size_t cap)
{
  snprintf (out, cap, "sandbox-%d", i);
}

static void
test_weights_are_deterministic_and_per_member (void **state)
{
  (void) state;
  assert_true (members_weight ("a:1", "x") == members_weight ("a:1", "x"));
  assert_true (members_weight ("a:1", "x") != members_weight ("a:2", "x"));
  assert_true (members_weight ("a:1", "x") != members_weight ("a:1", "y"));
  assert_true (members_weight ("a:1", NULL) == members_weight ("a:1", ""));
}

static void
test_ids_spread_evenly_over_members (void **state)
{
  (void) state;
  size_t count[3] = {0};
  for (int i = 0; i < IDS; i++)
    {
      char id[32];
      id_of (i, id, sizeof id);
      int k = owner (id, 3);
      assert_true (k >= 0 && k < 3);
      count[k]++;
    }
  /* About IDS / 3 each: within 15 %. */
  for (int k = 0; k < 3; k++)
    assert_true (count[k] > IDS / 3 * 85 / 100 && count[k] < IDS / 3 * 115 / 100);
}

static void
test_a_member_that_joins_takes_only_its_share_and_one_that_leaves_gives_only_its_own (void **state)
{
  (void) state;
  size_t moved = 0;
  for (int i = 0; i < IDS; i++)
    {
      char id[32];
      id_of (i, id, sizeof id);
      int before = owner (id, 4), after = owner (id, 5);
      /* Joining: an id either stays or goes to the new member. */
      if (before != after)
        {
          assert_int_equal (after, 4);
          moved++;
        }
      /* Leaving (from 5 back to 4) is the same pair seen the other way:
       * only the leaver's ids move. */
    }
  /* About 1/5 of the ids. */
  assert_true (moved > IDS / 5 * 80 / 100 && moved < IDS / 5 * 120 / 100);
}

static void
test_the_owner_is_the_highest_member_not_down (void **state)
{
  (void) state;
  uint64_t w[4] = {10, 40, 30, 20};
  bool listed[4] = {true, true, true, true};
  member_state_t st[4] = {MEMBER_UP, MEMBER_UP, MEMBER_UP, MEMBER_UP};
  bool failover = true;
  assert_int_equal (members_choose (w, listed, st, 4, &failover), 1);
  assert_false (failover);
  /* Down: the next one, and that is a failover. */
  st[1] = MEMBER_DOWN;
  assert_int_equal (members_choose (w, listed, st, 4, &failover), 2);
  assert_true (failover);
  /* Draining keeps its ids (its refusals answer, nobody restores them). */
  st[1] = MEMBER_DRAINING;
  assert_int_equal (members_choose (w, listed, st, 4, &failover), 1);
  assert_false (failover);
  /* Unlisted is ignored, whatever its state. */
  listed[1] = false;
  st[1] = MEMBER_UP;
  assert_int_equal (members_choose (w, listed, st, 4, &failover), 2);
  assert_false (failover);
}

static void
test_every_member_down_routes_to_the_highest_and_none_listed_to_none (void **state)
{
  (void) state;
  uint64_t w[3] = {5, 7, 6};
  bool listed[3] = {true, true, true};
  member_state_t st[3] = {MEMBER_DOWN, MEMBER_DOWN, MEMBER_DOWN};
  bool failover = true;
  assert_int_equal (members_choose (w, listed, st, 3, &failover), 1);
  assert_false (failover);
  bool none[3] = {false, false, false};
  assert_int_equal (members_choose (w, none, st, 3, &failover), -1);
  assert_int_equal (members_choose (w, listed, st, 0, &failover), -1);
}

static void
test_probe_answers_make_the_member_state (void **state)
{
  (void) state;
  assert_int_equal (members_state_of_probe (false, false, false), MEMBER_DOWN);
  assert_int_equal (members_state_of_probe (false, true, true), MEMBER_DOWN);
  assert_int_equal (members_state_of_probe (true, true, false), MEMBER_UP);
  assert_int_equal (members_state_of_probe (true, true, true), MEMBER_UP);
  assert_int_equal (members_state_of_probe (true, false, true), MEMBER_DRAINING);
  assert_int_equal (members_state_of_probe (true, false, false), MEMBER_DOWN);
}

static void
test_the_gateway_list_syntax_is_checked (void **state)
{
  (void) state;
  assert_null (members_check_spec (NULL));
  assert_null (members_check_spec ("10.0.0.1:50051"));
  assert_null (members_check_spec ("a:1,b:2,[::1]:3,unix:/run/gw.sock"));
  assert_null (members_check_spec ("dns-srv:_grpc._tcp.gw.ns.svc.cluster.local"));
  assert_non_null (members_check_spec ("dns-srv:"));
  assert_non_null (members_check_spec ("dns-srv:a,b"));
  assert_non_null (members_check_spec (""));
  assert_non_null (members_check_spec (","));
  assert_non_null (members_check_spec ("a:1,,b:2"));
  assert_non_null (members_check_spec ("a:1,"));
  assert_non_null (members_check_spec (",a:1"));
  assert_non_null (members_check_spec ("a:1,not a target"));
  assert_non_null (members_check_spec ("a:0"));
  /* MEMBERS_MAX entries pass; one more does not, and says the cap. */
  size_t cap = (MEMBERS_MAX + 1) * 16;
  char *list = malloc (cap);
  size_t len = 0;
  for (int i = 0; i < MEMBERS_MAX; i++)
    len += (size_t) snprintf (list + len, cap - len, "%sg%d:1", i ? "," : "", i);
  assert_null (members_check_spec (list));
  snprintf (list + len, cap - len, ",g%d:1", MEMBERS_MAX);
  const char *why = members_check_spec (list);
  assert_non_null (why);
  assert_non_null (strstr (why, MEMBERS_MAX_TEXT));
  free (list);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_weights_are_deterministic_and_per_member),
      cmocka_unit_test (test_ids_spread_evenly_over_members),
      cmocka_unit_test (test_a_member_that_joins_takes_only_its_share_and_one_that_leaves_gives_only_its_own),
      cmocka_unit_test (test_the_owner_is_the_highest_member_not_down),
      cmocka_unit_test (test_every_member_down_routes_to_the_highest_and_none_listed_to_none),
      cmocka_unit_test (test_probe_answers_make_the_member_state),
      cmocka_unit_test (test_the_gateway_list_syntax_is_checked),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
