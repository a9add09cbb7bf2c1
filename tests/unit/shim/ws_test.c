/* ws_test: the WebSocket handshake helpers (shim/ws.c): the accept key
 * (RFC 6455's own example), malformed keys, header tokens, the bearer
 * secret offered as a subprotocol and the subprotocol answered.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shim/ws.h"

static void
test_accept_key_is_rfc_6455s_example (void **state)
{
  char out[WS_ACCEPT_LEN + 1];
  assert_int_equal (ws_accept_key ("dGhlIHNhbXBsZSBub25jZQ==", out), 0);
  assert_string_equal (out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

static void
test_keys_that_are_not_16_bytes_of_base64_are_refused (void **state)
{
  char out[WS_ACCEPT_LEN + 1];
  assert_int_equal (ws_accept_key (NULL, out), -1);
  assert_int_equal (ws_accept_key ("", out), -1);
  assert_int_equal (ws_accept_key ("c2hvcnQ=", out), -1);                 /* 5 bytes */
  assert_int_equal (ws_accept_key ("dGhlIHNhbXBsZSBub25jZQ=", out), -1);  /* 23 characters */
  assert_int_equal (ws_accept_key ("dGhlIHNhbXBsZSBub25jZQ=x", out), -1); /* no padding */
  assert_int_equal (ws_accept_key ("dGhlIHNhbXBsZSBub25j!Q==", out), -1); /* not base64 */
}

static void
test_header_tokens_are_comma_separated_and_case_insensitive (void **state)
{
  assert_true (ws_header_has_token ("Upgrade", "upgrade"));
  assert_true (ws_header_has_token ("keep-alive, Upgrade", "upgrade"));
  assert_true (ws_header_has_token (" websocket ,x", "websocket"));
  assert_false (ws_header_has_token ("upgrade-not", "upgrade"));
  assert_false (ws_header_has_token ("", "upgrade"));
  assert_false (ws_header_has_token (NULL, "upgrade"));
  assert_false (ws_header_has_token (",,", "upgrade"));
}

static void
test_the_bearer_subprotocol_must_carry_the_secret (void **state)
{
  assert_true (ws_offer_has_bearer ("bearer.s3cret", "s3cret"));
  assert_true (ws_offer_has_bearer ("terminal, bearer.s3cret", "s3cret"));
  assert_false (ws_offer_has_bearer ("terminal, bearer.s3cre", "s3cret"));
  assert_false (ws_offer_has_bearer ("terminal, bearer.s3crett", "s3cret"));
  assert_false (ws_offer_has_bearer ("Bearer.s3cret", "s3cret"));
  assert_false (ws_offer_has_bearer ("bearer.", ""));
  assert_false (ws_offer_has_bearer ("bearer.x", NULL));
  assert_false (ws_offer_has_bearer (NULL, "s3cret"));
}

static void
test_the_answered_subprotocol_is_one_offered (void **state)
{
  char buf[64];
  assert_string_equal (ws_pick_protocol ("bearer.k, terminal", "terminal", "k", buf, sizeof buf), "terminal");
  assert_string_equal (ws_pick_protocol ("bearer.k", "terminal", "k", buf, sizeof buf), "bearer.k");
  /* Authenticated by header (no secret passed): the bearer offer is not echoed. */
  assert_null (ws_pick_protocol ("bearer.k", "terminal", NULL, buf, sizeof buf));
  assert_null (ws_pick_protocol ("bearer.other", "terminal", "k", buf, sizeof buf));
  assert_null (ws_pick_protocol ("chat", "terminal", "k", buf, sizeof buf));
  assert_null (ws_pick_protocol (NULL, "terminal", "k", buf, sizeof buf));
  assert_null (ws_pick_protocol ("bearer.k", "terminal", "k", buf, 4)); /* does not fit */
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_accept_key_is_rfc_6455s_example),
      cmocka_unit_test (test_keys_that_are_not_16_bytes_of_base64_are_refused),
      cmocka_unit_test (test_header_tokens_are_comma_separated_and_case_insensitive),
      cmocka_unit_test (test_the_bearer_subprotocol_must_carry_the_secret),
      cmocka_unit_test (test_the_answered_subprotocol_is_one_offered),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
