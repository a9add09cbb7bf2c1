/* idle_pool_test: common/idle_pool runs every job once, reuses a waiting
 * thread for the next job instead of starting one, and keeps at most its
 * max_idle threads waiting however many ran at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "common/idle_pool.h"

static void
sleep_ms (long ms)
{
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep (&ts, NULL);
}

/* Waits (at most 10 s) until cond holds. */
#define WAIT_FOR(cond)                                                                                               \
  do                                                                                                                 \
    for (int _i = 0; _i < 10000 && !(cond); _i++)                                                                    \
      sleep_ms (1);                                                                                                  \
  while (0)

static atomic_int done;

static void
count_job (void *arg)
{
  atomic_fetch_add (&done, 1);
}

/* Blocks until *gate is set. */
static void
gated_job (void *arg)
{
  atomic_int *gate = arg;
  while (!atomic_load (gate))
    sleep_ms (1);
  atomic_fetch_add (&done, 1);
}

static void
test_a_finished_thread_takes_the_next_job (void **state)
{
  static idle_pool_t p = IDLE_POOL_INIT (2, 0);
  atomic_store (&done, 0);
  assert_int_equal (idle_pool_run (&p, count_job, NULL), 0);
  WAIT_FOR (idle_pool_idle (&p) == 1);
  assert_int_equal (idle_pool_idle (&p), 1);
  assert_int_equal (idle_pool_alive (&p), 1);
  for (int i = 0; i < 100; i++)
    {
      assert_int_equal (idle_pool_run (&p, count_job, NULL), 0);
      WAIT_FOR (atomic_load (&done) == i + 2 && idle_pool_idle (&p) == 1);
    }
  assert_int_equal (atomic_load (&done), 101);
  /* One job at a time: the one thread did them all. */
  assert_int_equal (idle_pool_alive (&p), 1);
}

static void
test_at_most_max_idle_threads_wait_after_a_burst (void **state)
{
  static idle_pool_t p = IDLE_POOL_INIT (3, 64 * 1024);
  static atomic_int gate;
  atomic_store (&done, 0);
  atomic_store (&gate, 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal (idle_pool_run (&p, gated_job, &gate), 0);
  /* All ten ran at once, each on a thread of its own. */
  assert_int_equal (idle_pool_alive (&p), 10);
  atomic_store (&gate, 1);
  WAIT_FOR (atomic_load (&done) == 10 && idle_pool_alive (&p) == 3);
  assert_int_equal (atomic_load (&done), 10);
  assert_int_equal (idle_pool_alive (&p), 3);
  assert_int_equal (idle_pool_idle (&p), 3);
  /* Three jobs at once now start no thread. */
  atomic_store (&gate, 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal (idle_pool_run (&p, gated_job, &gate), 0);
  assert_int_equal (idle_pool_idle (&p), 0);
  assert_int_equal (idle_pool_alive (&p), 3);
  atomic_store (&gate, 1);
  WAIT_FOR (atomic_load (&done) == 13 && idle_pool_idle (&p) == 3);
  assert_int_equal (atomic_load (&done), 13);
}

static void
test_max_idle_above_the_cap_keeps_the_cap (void **state)
{
  static idle_pool_t p = IDLE_POOL_INIT (1000, 0);
  static atomic_int gate;
  atomic_store (&done, 0);
  atomic_store (&gate, 0);
  for (int i = 0; i < IDLE_POOL_MAX_IDLE + 4; i++)
    assert_int_equal (idle_pool_run (&p, gated_job, &gate), 0);
  atomic_store (&gate, 1);
  WAIT_FOR (atomic_load (&done) == IDLE_POOL_MAX_IDLE + 4 && idle_pool_alive (&p) == IDLE_POOL_MAX_IDLE);
  assert_int_equal (idle_pool_alive (&p), IDLE_POOL_MAX_IDLE);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_a_finished_thread_takes_the_next_job),
      cmocka_unit_test (test_at_most_max_idle_threads_wait_after_a_burst),
      cmocka_unit_test (test_max_idle_above_the_cap_keeps_the_cap),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
