/* terminal_messages_test: the terminal WebSocket's JSON messages
 * (shim/routes/terminal_messages.c) — control messages parsed into
 * ProcessInput or refused with their reason, and the exit message in the
 * exit convention every answer shares (route_exit_code_json: N, -N for
 * signal N, null on a timeout). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shim/routes/routes.h"
#include "shim/routes/terminal_messages.h"

/* Parses `text`: the reason (NULL when fine); the input in *in. */
static const char *
control (const char *text, Sandbox__V1__ProcessInput *in, Sandbox__V1__PtySize *size)
{
  *in = (Sandbox__V1__ProcessInput) SANDBOX__V1__PROCESS_INPUT__INIT;
  *size = (Sandbox__V1__PtySize) SANDBOX__V1__PTY_SIZE__INIT;
  json_t *doc = NULL;
  const char *why = terminal_control_of ((const uint8_t *) text, strlen (text), in, size, &doc);
  json_decref (doc);
  return why;
}

static void
test_resize_signal_and_close_stdin_become_process_input (void **state)
{
  (void) state;
  Sandbox__V1__ProcessInput in;
  Sandbox__V1__PtySize size;
  assert_null (control ("{\"type\":\"resize\",\"rows\":30,\"cols\":100}", &in, &size));
  assert_int_equal (in.input_case, SANDBOX__V1__PROCESS_INPUT__INPUT_RESIZE);
  assert_ptr_equal (in.resize, &size);
  assert_int_equal (size.rows, 30);
  assert_int_equal (size.cols, 100);
  assert_null (control ("{\"type\":\"signal\",\"signal\":\"SIGINT\"}", &in, &size));
  assert_int_equal (in.input_case, SANDBOX__V1__PROCESS_INPUT__INPUT_SIGNAL);
  assert_int_equal (in.signal, 2);
  assert_null (control ("{\"type\":\"signal\",\"signal\":\"term\"}", &in, &size));
  assert_int_equal (in.signal, 15);
  assert_null (control ("{\"type\":\"signal\",\"signal\":64}", &in, &size));
  assert_int_equal (in.signal, 64);
  /* Every kill(1) name, as the REST signal route takes them. */
  assert_null (control ("{\"type\":\"signal\",\"signal\":\"sigusr2\"}", &in, &size));
  assert_int_equal (in.signal, 12);
  assert_null (control ("{\"type\":\"signal\",\"signal\":\"PWR\"}", &in, &size));
  assert_int_equal (in.signal, 30);
  assert_null (control ("{\"type\":\"close_stdin\"}", &in, &size));
  assert_int_equal (in.input_case, SANDBOX__V1__PROCESS_INPUT__INPUT_CLOSE_STDIN);
  assert_true (in.close_stdin);
}

static void
test_bad_control_messages_are_refused_with_their_reason (void **state)
{
  (void) state;
  static const struct
  {
    const char *text, *why;
  } bad[] = {
      {"not json", "JSON object with a string"},
      {"[1]", "JSON object with a string"},
      {"{\"type\":1}", "JSON object with a string"},
      {"{\"type\":\"resize\",\"rows\":0,\"cols\":1}", "rows"},
      {"{\"type\":\"resize\",\"rows\":1,\"cols\":65536}", "rows"},
      {"{\"type\":\"resize\",\"rows\":\"1\",\"cols\":1}", "rows"},
      {"{\"type\":\"signal\",\"signal\":0}", "signal"},
      {"{\"type\":\"signal\",\"signal\":65}", "signal"},
      {"{\"type\":\"signal\",\"signal\":\"SIGNOPE\"}", "signal"},
      {"{\"type\":\"signal\",\"signal\":2.0}", "signal"},
      {"{\"type\":\"signal\",\"type\":\"resize\"}", "JSON object with a string"},
      {"{\"type\":\"reboot\"}", "unknown"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      Sandbox__V1__ProcessInput in;
      Sandbox__V1__PtySize size;
      const char *why = control (bad[i].text, &in, &size);
      if (why == NULL || strstr (why, bad[i].why) == NULL)
        fail_msg ("`%s`: `%s`, not `%s`", bad[i].text, why ? why : "(accepted)", bad[i].why);
      assert_int_equal (in.input_case, SANDBOX__V1__PROCESS_INPUT__INPUT__NOT_SET);
    }
}

static void
expect_exit (int32_t code, int32_t sig, bool timed_out, const char *want)
{
  Sandbox__V1__ExitStatus x = SANDBOX__V1__EXIT_STATUS__INIT;
  x.exit_code = code;
  x.signal = sig;
  x.timed_out = timed_out;
  char *text = terminal_exit_text (&x);
  assert_non_null (text);
  assert_string_equal (text, want);
  free (text);
}

static void
test_the_exit_message_follows_the_one_exit_convention (void **state)
{
  (void) state;
  expect_exit (3, 0, false, "{\"type\":\"exit\",\"exit_code\":3,\"signal\":null,\"timed_out\":false}");
  /* The gateway reports -1 and the signal: -N and N here, as exec's -N. */
  expect_exit (-1, 15, false, "{\"type\":\"exit\",\"exit_code\":-15,\"signal\":15,\"timed_out\":false}");
  expect_exit (-1, 9, true, "{\"type\":\"exit\",\"exit_code\":null,\"signal\":9,\"timed_out\":true}");
}

static void
test_exit_code_and_signal_json (void **state)
{
  (void) state;
  Sandbox__V1__ExitStatus x = SANDBOX__V1__EXIT_STATUS__INIT;
  x.exit_code = 0;
  json_t *c = route_exit_code_json (&x), *s = route_exit_signal_json (&x);
  assert_true (json_is_integer (c) && json_integer_value (c) == 0);
  assert_true (json_is_null (s));
  json_decref (c);
  json_decref (s);
  x.exit_code = -1;
  x.signal = 6;
  c = route_exit_code_json (&x);
  s = route_exit_signal_json (&x);
  assert_true (json_is_integer (c) && json_integer_value (c) == -6);
  assert_true (json_is_integer (s) && json_integer_value (s) == 6);
  json_decref (c);
  json_decref (s);
  x.timed_out = true;
  c = route_exit_code_json (&x);
  assert_true (json_is_null (c));
  json_decref (c);
}

static void
test_the_error_message_carries_the_reason (void **state)
{
  (void) state;
  char *text = terminal_error_text ("unknown \"type\"");
  assert_string_equal (text, "{\"type\":\"error\",\"detail\":\"unknown \\\"type\\\"\"}");
  free (text);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_resize_signal_and_close_stdin_become_process_input),
      cmocka_unit_test (test_bad_control_messages_are_refused_with_their_reason),
      cmocka_unit_test (test_the_exit_message_follows_the_one_exit_convention),
      cmocka_unit_test (test_exit_code_and_signal_json),
      cmocka_unit_test (test_the_error_message_carries_the_reason),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
