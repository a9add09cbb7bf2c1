/* response_test: the shim's one mapping of failed gateway calls to HTTP
 * statuses (shim_http_status in shim/response.c) for every gRPC code, the
 * difference between the gateway's own UNAVAILABLE (503) and no gateway at
 * all (502), and shim_gateway_error (and its variant that keeps the
 * gateway's detail, shim_gateway_error_named) answering with that status
 * and counting the failure in the metrics; restore-on-miss's signal
 * (shim_missed) is the status's reason, never its wording.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shim/metrics.h"
#include "shim/shim.h"

/* Every status code of gRPC and its HTTP status (the same whichever side
 * produced it, except UNAVAILABLE). */
static const struct
{
  grpc_status_code code;
  unsigned http;
} expected[] = {
    {GRPC_STATUS_CANCELLED, 502},
    {GRPC_STATUS_UNKNOWN, 502},
    {GRPC_STATUS_INVALID_ARGUMENT, 422},
    {GRPC_STATUS_DEADLINE_EXCEEDED, 504},
    {GRPC_STATUS_NOT_FOUND, 404},
    {GRPC_STATUS_ALREADY_EXISTS, 409},
    {GRPC_STATUS_PERMISSION_DENIED, 502},
    {GRPC_STATUS_RESOURCE_EXHAUSTED, 429},
    {GRPC_STATUS_FAILED_PRECONDITION, 409},
    {GRPC_STATUS_ABORTED, 502},
    {GRPC_STATUS_OUT_OF_RANGE, 502},
    {GRPC_STATUS_UNIMPLEMENTED, 502},
    {GRPC_STATUS_INTERNAL, 502},
    {GRPC_STATUS_DATA_LOSS, 502},
    {GRPC_STATUS_UNAUTHENTICATED, 502},
};

static void
test_every_grpc_code_has_its_http_status (void **state)
{
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
    for (int from_handler = 0; from_handler < 2; from_handler++)
      {
        unsigned got = shim_http_status (expected[i].code, from_handler);
        if (got != expected[i].http)
          fail_msg ("%s (from %s): %u, expected %u", rpc_status_name (expected[i].code),
                    from_handler ? "the handler" : "the transport", got, expected[i].http);
      }
}

static void
test_unavailable_is_503_from_the_gateway_and_502_without_one (void **state)
{
  assert_int_equal (shim_http_status (GRPC_STATUS_UNAVAILABLE, true), 503);
  assert_int_equal (shim_http_status (GRPC_STATUS_UNAVAILABLE, false), 502);
}

static void
test_codes_outside_the_table_are_bad_gateway (void **state)
{
  /* OK never reaches the mapping; a code this build does not know (a newer
   * peer) is a gateway failure like any other. */
  assert_int_equal (shim_http_status (GRPC_STATUS_OK, false), 502);
  assert_int_equal (shim_http_status ((grpc_status_code) 17, true), 502);
  assert_int_equal (shim_http_status ((grpc_status_code) 1000, false), 502);
}

/* The counter line of `code` in the metrics text. */
static unsigned long long
gateway_errors_counted (grpc_status_code code)
{
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream (&text, &len);
  assert_non_null (f);
  metrics_render (f);
  assert_int_equal (fclose (f), 0);
  assert_non_null (text);
  char key[96];
  snprintf (key, sizeof key, "shim_gateway_errors_total{code=\"%s\"} ", rpc_status_name (code));
  const char *line = strstr (text, key);
  assert_non_null (line);
  unsigned long long n = strtoull (line + strlen (key), NULL, 10);
  free (text);
  return n;
}

static void
test_gateway_error_answers_with_the_mapped_status_and_counts_it (void **state)
{
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
    {
      grpc_status_code code = expected[i].code;
      unsigned long long before = gateway_errors_counted (code);
      rpc_status_t st = {code, (char *) "details from the gateway", true};
      unsigned status = 0;
      struct MHD_Response *resp = shim_gateway_error (code, &st, &status);
      assert_non_null (resp);
      assert_int_equal (status, expected[i].http);
      MHD_destroy_response (resp);
      assert_int_equal (gateway_errors_counted (code), before + 1);
    }
}

static void
test_gateway_error_tells_unavailable_apart_by_origin (void **state)
{
  unsigned status = 0;
  rpc_status_t handler = {GRPC_STATUS_UNAVAILABLE, (char *) "shutting down", true};
  struct MHD_Response *resp = shim_gateway_error (GRPC_STATUS_UNAVAILABLE, &handler, &status);
  assert_int_equal (status, 503);
  MHD_destroy_response (resp);

  rpc_status_t transport = {GRPC_STATUS_UNAVAILABLE, (char *) "failed to connect", false};
  resp = shim_gateway_error (GRPC_STATUS_UNAVAILABLE, &transport, &status);
  assert_int_equal (status, 502);
  MHD_destroy_response (resp);

  /* No status at all (the call never started): the transport's side. */
  resp = shim_gateway_error (GRPC_STATUS_UNAVAILABLE, NULL, &status);
  assert_int_equal (status, 502);
  MHD_destroy_response (resp);
}

static void
test_gateway_error_named_keeps_the_gateway_detail_of_404_and_409 (void **state)
{
  static const grpc_status_code codes[]
      = {GRPC_STATUS_NOT_FOUND, GRPC_STATUS_ALREADY_EXISTS, GRPC_STATUS_FAILED_PRECONDITION, GRPC_STATUS_INTERNAL};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    {
      unsigned long long before = gateway_errors_counted (codes[i]);
      rpc_status_t st = {codes[i], (char *) "no process `p` in sandbox `s`", true};
      unsigned status = 0;
      struct MHD_Response *resp = shim_gateway_error_named (codes[i], &st, &status);
      assert_non_null (resp);
      assert_int_equal (status, shim_http_status (codes[i], true));
      MHD_destroy_response (resp);
      assert_int_equal (gateway_errors_counted (codes[i]), before + 1);
    }
  /* Without a detail: the contract's answer. */
  unsigned status = 0;
  struct MHD_Response *resp = shim_gateway_error_named (GRPC_STATUS_NOT_FOUND, NULL, &status);
  assert_int_equal (status, 404);
  MHD_destroy_response (resp);
}

/* Whether the gateway said the call's sandbox is missing, for a status. */
static bool
missed_after (grpc_status_code code, const char *details, bool from_handler, const char *reason)
{
  rpc_status_t st = {.code = code, .details = (char *) details, .from_handler = from_handler};
  snprintf (st.reason, sizeof st.reason, "%s", reason);
  unsigned status = 0;
  shim_missed_reset ();
  struct MHD_Response *resp = shim_gateway_error (code, &st, &status);
  MHD_destroy_response (resp);
  return shim_missed ();
}

static void
test_a_missing_sandbox_is_told_by_the_reason_whatever_the_wording (void **state)
{
  /* Any wording with the reason: missing. */
  assert_true (missed_after (GRPC_STATUS_NOT_FOUND, "sandbox `a` not found", true, ERR_REASON_SANDBOX_NOT_FOUND));
  assert_true (missed_after (GRPC_STATUS_NOT_FOUND, "no such sandbox here", true, ERR_REASON_SANDBOX_NOT_FOUND));
  assert_true (missed_after (GRPC_STATUS_NOT_FOUND, "", true, ERR_REASON_SANDBOX_NOT_FOUND));
  /* The old sentence without the reason (a file, a process): not missing. */
  assert_false (missed_after (GRPC_STATUS_NOT_FOUND, "sandbox `a` not found", true, ""));
  assert_false (missed_after (GRPC_STATUS_NOT_FOUND, "sandbox `a` not found", true, "file-not-found"));
  /* The reason on another code, or not from the gateway's handler layer. */
  assert_false (missed_after (GRPC_STATUS_INTERNAL, "x", true, ERR_REASON_SANDBOX_NOT_FOUND));
  assert_false (missed_after (GRPC_STATUS_NOT_FOUND, "x", false, ERR_REASON_SANDBOX_NOT_FOUND));
  /* Forgotten by the next error and by the reset. */
  assert_true (missed_after (GRPC_STATUS_NOT_FOUND, "x", true, ERR_REASON_SANDBOX_NOT_FOUND));
  shim_missed_reset ();
  assert_false (shim_missed ());
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_every_grpc_code_has_its_http_status),
      cmocka_unit_test (test_unavailable_is_503_from_the_gateway_and_502_without_one),
      cmocka_unit_test (test_codes_outside_the_table_are_bad_gateway),
      cmocka_unit_test (test_gateway_error_answers_with_the_mapped_status_and_counts_it),
      cmocka_unit_test (test_gateway_error_tells_unavailable_apart_by_origin),
      cmocka_unit_test (test_gateway_error_named_keeps_the_gateway_detail_of_404_and_409),
      cmocka_unit_test (test_a_missing_sandbox_is_told_by_the_reason_whatever_the_wording),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
