/* target_test: the strict check of SHIM_GATEWAY_TARGET (shim/target.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "shim/target.h"

static void
test_gateway_targets_grpc_can_dial_are_accepted (void **state)
{
  static const char *const good[] = {
      "127.0.0.1:50051",
      "localhost:50051",
      "gateway.default.svc.cluster.local:50051",
      "sandbox-gateway:1",
      "[::1]:50051",
      "[fe80::1]:65535",
      "dns:gateway:50051",
      "dns:///gateway.example.com:443",
      "dns://8.8.8.8/gateway.example.com:443",
      "dns://8.8.8.8:53/gateway:443",
      "ipv4:127.0.0.1:50051",
      "ipv4:10.0.0.1:1,10.0.0.2:2",
      "ipv6:[::1]:50051",
      "unix:/run/sandbox-gateway.sock",
      "unix:relative.sock",
      "unix:///run/sandbox-gateway.sock",
      "unix-abstract:sandbox-gateway",
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    if (!shim_target_valid (good[i]))
      fail_msg ("`%s` was refused", good[i]);
}

static void
test_targets_that_name_no_gateway_are_refused (void **state)
{
  static const char *const bad[] = {
      "",
      "nonsense",
      "127.0.0.1",
      "127.0.0.1:",
      "127.0.0.1:0",
      "127.0.0.1:65536",
      "127.0.0.1:50051x",
      "127.0.0.1:-1",
      ":50051",
      "host name:50051",
      "host_name:50051",
      "-gateway:50051",
      "gateway-:50051",
      "gate..way:50051",
      "::1:50051",
      "[::1]50051",
      "[not-v6]:50051",
      "[::1]:",
      "http://gateway:50051",
      "dns:",
      "dns:gateway",
      "dns://gateway:50051",
      "dns:///",
      "ipv4:gateway:50051",
      "ipv4:127.0.0.1:50051,",
      "ipv6:::1:50051",
      "ipv6:[::1]:0",
      "unix:",
      "unix://relative",
      "unix-abstract:",
      "127.0.0.1:50051\n",
      "gateway:50051 ",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (shim_target_valid (bad[i]))
      fail_msg ("`%s` was accepted", bad[i]);
  assert_false (shim_target_valid (NULL));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_gateway_targets_grpc_can_dial_are_accepted),
      cmocka_unit_test (test_targets_that_name_no_gateway_are_refused),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
