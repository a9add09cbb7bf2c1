/* ws_test: the WebSocket handshake helpers (shim/ws.c): the accept key
 * (RFC 6455's own example), malformed keys, header tokens, the bearer
 * secret offered as a subprotocol and the subprotocol answered; and a
 * connection over a socketpair whose client floods pings and never reads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

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

static void
ignore_message (void *user, bool text, const uint8_t *data, size_t len)
{
  (void) user, (void) text, (void) data, (void) len;
}

/* A client writes a quarter of a million empty pings and reads nothing:
 * the queue of pongs stays bounded, the client is no longer read, and a
 * close is queued. */
static void
test_a_ping_flood_that_is_never_read_is_bounded_and_closed (void **state)
{
  int sv[2];
  assert_int_equal (socketpair (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  int wake = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  assert_true (wake >= 0);
  ws_t *ws = ws_new (sv[0], NULL, 0, 1024, ignore_message, NULL);
  assert_non_null (ws);
  static const uint8_t ping[6] = {0x89, 0x80, 1, 2, 3, 4}; /* masked, empty */
  uint8_t burst[6 * 1024];
  for (size_t i = 0; i < sizeof burst; i += 6)
    memcpy (burst + i, ping, 6);
  size_t written = 0;
  for (int round = 0; round < 256; round++)
    {
      ssize_t n = write (sv[1], burst, sizeof burst);
      written += n > 0 ? (size_t) n : 0;
      bool woken;
      assert_int_equal (ws_poll (ws, wake, 0, &woken), 1);
      /* 64 queued, plus what one 4 KiB read can hold, plus the close. */
      assert_true (ws_queued (ws) <= 64 + 4096 / 6 + 2);
    }
  assert_true (written > 64 * 1024);
  assert_true (ws_flooded (ws));
  assert_true (ws_closing (ws));
  ws_free (ws);
  close (sv[0]);
  close (sv[1]);
  close (wake);
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
      cmocka_unit_test (test_a_ping_flood_that_is_never_read_is_bounded_and_closed),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
