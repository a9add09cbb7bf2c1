/* jmsg: a signed message parses; a wrong signature, a missing delimiter,
 * too few frames and JSON that is not an object are refused with EPROTO. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/code/jmsg.h"

#define KEY "0123456789abcdef"

typedef struct msg_s
{
  const void *frames[8];
  size_t lens[8];
  char sig[65];
  size_t n;
} msg_t;

static void
build (msg_t *m, const char *header, const char *content, const char *key)
{
  const char *parts[4] = {header, "{\"msg_id\":\"p1\"}", "{}", content};
  const void *f[4];
  size_t l[4];
  for (int i = 0; i < 4; i++)
    {
      f[i] = parts[i];
      l[i] = strlen (parts[i]);
    }
  jmsg_sign (key, f, l, m->sig);
  m->n = 0;
  m->frames[m->n] = "ident";
  m->lens[m->n++] = 5;
  m->frames[m->n] = "<IDS|MSG>";
  m->lens[m->n++] = 9;
  m->frames[m->n] = m->sig;
  m->lens[m->n++] = strlen (m->sig);
  for (int i = 0; i < 4; i++)
    {
      m->frames[m->n] = f[i];
      m->lens[m->n++] = l[i];
    }
}

static void
test_signed_message_parses (void **state)
{
  msg_t m;
  build (&m, "{\"msg_type\":\"stream\",\"msg_id\":\"a\"}", "{\"name\":\"stdout\",\"text\":\"hi\"}", KEY);
  jmsg_t out = {0};
  err_t err = ERR_INIT;
  assert_int_equal (jmsg_parse (KEY, m.frames, m.lens, m.n, &out, &err), 0);
  assert_string_equal (out.msg_type, "stream");
  assert_string_equal (out.parent_id, "p1");
  assert_string_equal (json_string_value (json_object_get (out.content, "text")), "hi");
  jmsg_clear (&out);
}

static void
expect_refused (msg_t *m, const char *what)
{
  jmsg_t out = {0};
  err_t err = ERR_INIT;
  assert_int_equal (jmsg_parse (KEY, m->frames, m->lens, m->n, &out, &err), -1);
  assert_int_equal (err.status, EPROTO);
  assert_non_null (strstr (err.msg, what));
  assert_null (out.header);
  err_release (&err);
}

static void
test_wrong_key_is_refused (void **state)
{
  msg_t m;
  build (&m, "{\"msg_type\":\"stream\"}", "{}", "another key");
  expect_refused (&m, "signature");
}

static void
test_tampered_content_is_refused (void **state)
{
  msg_t m;
  build (&m, "{\"msg_type\":\"stream\"}", "{\"a\":1}", KEY);
  m.frames[6] = "{\"a\":2}";
  expect_refused (&m, "signature");
}

static void
test_no_delimiter_or_too_few_frames_is_refused (void **state)
{
  msg_t m;
  build (&m, "{\"msg_type\":\"stream\"}", "{}", KEY);
  m.frames[1] = "<IDS|MSX>";
  expect_refused (&m, "not a Jupyter message");
  build (&m, "{\"msg_type\":\"stream\"}", "{}", KEY);
  m.n = 5;
  expect_refused (&m, "not a Jupyter message");
}

static void
test_signed_json_that_is_not_the_protocols_is_refused (void **state)
{
  msg_t m;
  build (&m, "[1, 2]", "{}", KEY);
  expect_refused (&m, "JSON");
  build (&m, "{\"msg_id\":\"no type\"}", "{}", KEY);
  expect_refused (&m, "JSON");
  build (&m, "{\"msg_type\":\"x\"}", "{not json", KEY);
  expect_refused (&m, "JSON");
}

static void
test_sign_is_hmac_sha256 (void **state)
{
  /* RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?". */
  const void *f[4] = {"what do ya ", "want ", "for ", "nothing?"};
  size_t l[4] = {11, 5, 4, 8};
  char hex[65];
  jmsg_sign ("Jefe", f, l, hex);
  assert_string_equal (hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_signed_message_parses),
      cmocka_unit_test (test_wrong_key_is_refused),
      cmocka_unit_test (test_tampered_content_is_refused),
      cmocka_unit_test (test_no_delimiter_or_too_few_frames_is_refused),
      cmocka_unit_test (test_signed_json_that_is_not_the_protocols_is_refused),
      cmocka_unit_test (test_sign_is_hmac_sha256),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
