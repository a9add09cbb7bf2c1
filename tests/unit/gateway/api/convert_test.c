/* convert_test: the api layer's pure conversions (gateway/api/convert.c and
 * files.c): strict UTF-8 as proto3 `string` fields need it, repaired text
 * with the exact bytes beside it (names, argv), the runtime-to-proto
 * mapping tables (file types, watch events, compression, SandboxInfo,
 * ExitStatus), and the request checks (env names, request paths).
 * No sandbox, no call: the functions take and give plain values.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "gateway/api/internal.h"

/* ---- strict UTF-8 ----------------------------------------------------------- */

static bool
valid (const char *s)
{
  return api_utf8_valid (s, strlen (s));
}

static void
test_utf8_valid_accepts_every_sequence_length_and_the_extremes (void **state)
{
  (void) state;
  assert_true (valid (""));
  assert_true (valid ("plain ascii"));
  assert_true (valid ("caf\xc3\xa9"));      /* U+00E9 */
  assert_true (valid ("\xe2\x82\xac"));     /* U+20AC */
  assert_true (valid ("\xf0\x9f\x98\x80")); /* U+1F600 */
  assert_true (valid ("\xc2\x80"));         /* U+0080, the smallest 2-byte */
  assert_true (valid ("\xef\xbf\xbf"));     /* U+FFFF */
  assert_true (valid ("\xf4\x8f\xbf\xbf")); /* U+10FFFF, the largest */
  assert_true (valid ("\xed\x9f\xbf"));     /* U+D7FF, just below the surrogates */
  assert_true (api_utf8_valid ("a\0b", 3)); /* NUL is valid UTF-8: length, not strlen */
}

static void
test_utf8_valid_refuses_overlongs_surrogates_and_beyond_u10ffff (void **state)
{
  (void) state;
  assert_false (valid ("\xc0\xaf"));         /* overlong '/' */
  assert_false (valid ("\xc1\xbf"));         /* overlong */
  assert_false (valid ("\xe0\x80\xaf"));     /* overlong 3-byte */
  assert_false (valid ("\xf0\x80\x80\xaf")); /* overlong 4-byte */
  assert_false (valid ("\xed\xa0\x80"));     /* U+D800, a surrogate */
  assert_false (valid ("\xed\xbf\xbf"));     /* U+DFFF */
  assert_false (valid ("\xf4\x90\x80\x80")); /* U+110000 */
  assert_false (valid ("\xf5\x80\x80\x80")); /* no such lead byte */
  assert_false (valid ("\xff"));
  assert_false (valid ("\x80"));         /* a lone continuation byte */
  assert_false (valid ("\xe2\x82"));     /* cut short */
  assert_false (valid ("\xe2\x28\xa1")); /* a continuation that is not one */
  /* The length given counts, not the NUL: a valid sequence cut by n. */
  assert_false (api_utf8_valid ("\xc3\xa9", 1));
}

static void
test_utf8_text_keeps_valid_text_itself_without_a_copy (void **state)
{
  (void) state;
  const char *s = "r\xc3\xa9sum\xc3\xa9.txt";
  ProtobufCBinaryData raw = {99, (uint8_t *) "x"};
  char *owned = (char *) "x";
  const char *t = api_utf8_text (s, &raw, &owned);
  assert_ptr_equal (t, s);
  assert_null (owned);
  assert_int_equal (raw.len, 0);
  assert_null (raw.data);
}

static void
test_utf8_text_replaces_each_bad_byte_and_points_raw_at_the_exact_bytes (void **state)
{
  (void) state;
  /* A bad byte, a valid 2-byte sequence, a truncated 3-byte one, a
   * surrogate: every byte not in a valid sequence becomes U+FFFD. */
  const char *s = "a\xff\xc3\xa9\xe2\x82z\xed\xa0\x80";
  ProtobufCBinaryData raw;
  char *owned = NULL;
  const char *t = api_utf8_text (s, &raw, &owned);
  assert_non_null (t);
  assert_ptr_equal (t, owned);
  assert_string_equal (t, "a\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbdz\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  assert_true (valid (t));
  assert_int_equal (raw.len, strlen (s));
  assert_ptr_equal (raw.data, (const uint8_t *) s);
  free (owned);
}

/* ---- argv ------------------------------------------------------------------- */

static void
test_argv_to_proto_valid_argv_is_used_as_is (void **state)
{
  (void) state;
  char *argv[] = {(char *) "echo", (char *) "caf\xc3\xa9"};
  Sandbox__V1__ProcessInfo pi = SANDBOX__V1__PROCESS_INFO__INIT;
  err_t err = ERR_INIT;
  assert_int_equal (api_argv_to_proto (argv, 2, &pi, &err), 0);
  assert_ptr_equal (pi.argv, argv);
  assert_int_equal (pi.n_argv, 2);
  assert_int_equal (pi.n_argv_bytes, 0);
  api_argv_free (&pi); /* nothing was made: argv is untouched */
  assert_ptr_equal (pi.argv, argv);
}

static void
test_argv_to_proto_one_bad_element_gives_text_and_exact_bytes_for_all (void **state)
{
  (void) state;
  char *argv[] = {(char *) "cat", (char *) "bad\xfe", (char *) ""};
  Sandbox__V1__ProcessInfo pi = SANDBOX__V1__PROCESS_INFO__INIT;
  err_t err = ERR_INIT;
  assert_int_equal (api_argv_to_proto (argv, 3, &pi, &err), 0);
  assert_int_equal (pi.n_argv, 3);
  assert_int_equal (pi.n_argv_bytes, 3);
  assert_string_equal (pi.argv[0], "cat");
  assert_ptr_not_equal (pi.argv[0], argv[0]); /* copies, freed by api_argv_free */
  assert_string_equal (pi.argv[1], "bad\xef\xbf\xbd");
  assert_string_equal (pi.argv[2], "");
  for (size_t i = 0; i < 3; i++)
    {
      assert_int_equal (pi.argv_bytes[i].len, strlen (argv[i]));
      assert_memory_equal (pi.argv_bytes[i].data, argv[i], strlen (argv[i]));
    }
  api_argv_free (&pi);
  assert_null (pi.argv);
  assert_null (pi.argv_bytes);
  assert_int_equal (pi.n_argv, 0);
}

/* ---- mapping tables --------------------------------------------------------- */

static void
test_file_type_table_maps_each_runtime_type_and_anything_else_to_other (void **state)
{
  (void) state;
  assert_int_equal (api_file_type_to_proto (SBX_FTYPE_FILE), SANDBOX__V1__FILE_TYPE__FILE_TYPE_FILE);
  assert_int_equal (api_file_type_to_proto (SBX_FTYPE_DIR), SANDBOX__V1__FILE_TYPE__FILE_TYPE_DIRECTORY);
  assert_int_equal (api_file_type_to_proto (SBX_FTYPE_SYMLINK), SANDBOX__V1__FILE_TYPE__FILE_TYPE_SYMLINK);
  assert_int_equal (api_file_type_to_proto (SBX_FTYPE_OTHER), SANDBOX__V1__FILE_TYPE__FILE_TYPE_OTHER);
  assert_int_equal (api_file_type_to_proto (0), SANDBOX__V1__FILE_TYPE__FILE_TYPE_OTHER);
  assert_int_equal (api_file_type_to_proto (12345), SANDBOX__V1__FILE_TYPE__FILE_TYPE_OTHER);
}

static void
test_event_kind_table_maps_each_runtime_event_and_unknown_to_unspecified (void **state)
{
  (void) state;
  static const struct
  {
    uint32_t in;
    Sandbox__V1__FileEvent__Kind out;
  } rows[] = {
      {SBX_EVENT_WATCHING, SANDBOX__V1__FILE_EVENT__KIND__KIND_WATCHING},
      {SBX_EVENT_CREATED, SANDBOX__V1__FILE_EVENT__KIND__KIND_CREATED},
      {SBX_EVENT_MODIFIED, SANDBOX__V1__FILE_EVENT__KIND__KIND_MODIFIED},
      {SBX_EVENT_REMOVED, SANDBOX__V1__FILE_EVENT__KIND__KIND_REMOVED},
      {SBX_EVENT_RENAMED, SANDBOX__V1__FILE_EVENT__KIND__KIND_RENAMED},
      {SBX_EVENT_OVERFLOW, SANDBOX__V1__FILE_EVENT__KIND__KIND_OVERFLOW},
      {0, SANDBOX__V1__FILE_EVENT__KIND__KIND_UNSPECIFIED},
      {99, SANDBOX__V1__FILE_EVENT__KIND__KIND_UNSPECIFIED},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    assert_int_equal (api_event_kind_to_proto (rows[i].in), rows[i].out);
}

static void
test_compression_from_proto_maps_the_three_and_refuses_unknown (void **state)
{
  (void) state;
  snap_compression_t c = (snap_compression_t) 77;
  err_t err = ERR_INIT;
  assert_int_equal (api_compression_from_proto (SANDBOX__V1__COMPRESSION__COMPRESSION_NONE, &c, &err), 0);
  assert_int_equal (c, SNAP_COMPRESSION_NONE);
  assert_int_equal (api_compression_from_proto (SANDBOX__V1__COMPRESSION__COMPRESSION_GZIP, &c, &err), 0);
  assert_int_equal (c, SNAP_COMPRESSION_GZIP);
  assert_int_equal (api_compression_from_proto (SANDBOX__V1__COMPRESSION__COMPRESSION_ZSTD, &c, &err), 0);
  assert_int_equal (c, SNAP_COMPRESSION_ZSTD);
  c = SNAP_COMPRESSION_GZIP;
  assert_true (api_compression_from_proto ((Sandbox__V1__Compression) 42, &c, &err) < 0);
  assert_int_equal (err.status, EINVAL);
  assert_non_null (strstr (err_msg (&err), "42"));
  assert_int_equal (c, SNAP_COMPRESSION_GZIP); /* unchanged */
  err_release (&err);
}

static void
test_info_and_exit_to_proto_copy_every_field (void **state)
{
  (void) state;
  sbx_info_t in = {.created_ms = 111,
                   .last_used_ms = 222,
                   .allow_egress = true,
                   .process_count = 7,
                   .disk_used_bytes = 4096,
                   .disk_limit_bytes = 1 << 20,
                   .dead = true};
  snprintf (in.id, sizeof in.id, "box-1");
  snprintf (in.dead_reason, sizeof in.dead_reason, "pid 1 died");
  Sandbox__V1__SandboxInfo pb;
  api_info_to_proto (&in, &pb);
  assert_string_equal (pb.sandbox_id, "box-1");
  assert_int_equal (pb.created_at_unix_ms, 111);
  assert_int_equal (pb.last_used_unix_ms, 222);
  assert_true (pb.allow_egress);
  assert_int_equal (pb.process_count, 7);
  assert_int_equal (pb.disk_used_bytes, 4096);
  assert_int_equal (pb.disk_limit_bytes, 1 << 20);
  assert_true (pb.dead);
  assert_string_equal (pb.dead_reason, "pid 1 died");

  sbx_exec_result_t r = {
      .exit_code = -1, .signal = 9, .timed_out = true, .oom_killed = true, .pids_limited = true, .duration_ms = 1500};
  snprintf (r.message, sizeof r.message, "killed");
  Sandbox__V1__ExitStatus ex;
  api_exit_to_proto (&r, &ex);
  assert_int_equal (ex.exit_code, -1);
  assert_int_equal (ex.signal, 9);
  assert_true (ex.timed_out);
  assert_true (ex.oom_killed);
  assert_true (ex.pids_limited);
  assert_int_equal (ex.duration_ms, 1500);
  assert_string_equal (ex.message, "killed");
}

static void
test_file_info_to_proto_names_the_last_component_and_repairs_names (void **state)
{
  (void) state;
  sbx_file_wire_t w = {.type = SBX_FTYPE_SYMLINK, .size = 5, .mode = 0777, .uid = 1, .gid = 2, .mtime_ms = 9};
  Sandbox__V1__FileInfo out;
  api_names_t names = {0};
  err_t err = ERR_INIT;
  assert_int_equal (api_file_info_to_proto (&w, "/root/dir/l\xff", "/etc/\xfe", &out, &names, &err), 0);
  assert_string_equal (out.path, "/root/dir/l\xef\xbf\xbd");
  assert_string_equal (out.name, "l\xef\xbf\xbd");
  assert_string_equal (out.symlink_target, "/etc/\xef\xbf\xbd");
  assert_int_equal (out.path_bytes.len, strlen ("/root/dir/l\xff"));
  assert_memory_equal (out.name_bytes.data, "l\xff", 2);
  assert_memory_equal (out.symlink_target_bytes.data, "/etc/\xfe", 6);
  assert_int_equal (out.type, SANDBOX__V1__FILE_TYPE__FILE_TYPE_SYMLINK);
  assert_int_equal (out.mode, 0777);
  api_names_free (&names);

  /* The root and a trailing slash name themselves; no target: "". */
  w.type = SBX_FTYPE_DIR;
  assert_int_equal (api_file_info_to_proto (&w, "/", NULL, &out, &names, &err), 0);
  assert_string_equal (out.name, "/");
  assert_string_equal (out.symlink_target, "");
  assert_int_equal (out.path_bytes.len, 0); /* valid: no exact twin */
  api_names_free (&names);
}

/* ---- request checks --------------------------------------------------------- */

static void
test_env_from_proto_builds_key_value_strings (void **state)
{
  (void) state;
  Sandbox__V1__ExecRequest__EnvEntry a = SANDBOX__V1__EXEC_REQUEST__ENV_ENTRY__INIT;
  Sandbox__V1__ExecRequest__EnvEntry b = SANDBOX__V1__EXEC_REQUEST__ENV_ENTRY__INIT;
  a.key = (char *) "PATH";
  a.value = (char *) "/bin:/usr/bin";
  b.key = (char *) "EMPTY";
  b.value = (char *) "";
  Sandbox__V1__ExecRequest__EnvEntry *entries[] = {&a, &b};
  char **env = NULL;
  err_t err = ERR_INIT;
  assert_int_equal (api_env_from_proto (entries, 2, &env, &err), 0);
  assert_string_equal (env[0], "PATH=/bin:/usr/bin");
  assert_string_equal (env[1], "EMPTY=");
  assert_null (env[2]);
  api_env_free (env);

  /* None: an empty, NULL-terminated list. */
  assert_int_equal (api_env_from_proto (NULL, 0, &env, &err), 0);
  assert_null (env[0]);
  api_env_free (env);
}

static void
test_env_refuses_empty_names_and_names_with_equals (void **state)
{
  (void) state;
  static const char *const bad[] = {"", "A=B", "="};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      Sandbox__V1__ProcessStart__EnvEntry ok = SANDBOX__V1__PROCESS_START__ENV_ENTRY__INIT;
      Sandbox__V1__ProcessStart__EnvEntry e = SANDBOX__V1__PROCESS_START__ENV_ENTRY__INIT;
      ok.key = (char *) "GOOD";
      ok.value = (char *) "1";
      e.key = (char *) bad[i];
      e.value = (char *) "x";
      Sandbox__V1__ProcessStart__EnvEntry *entries[] = {&ok, &e};
      char **env = (char **) "untouched";
      err_t err = ERR_INIT;
      assert_true (api_env_from_start (entries, 2, &env, &err) < 0);
      assert_int_equal (err.status, EINVAL);
      assert_non_null (strstr (err_msg (&err), "not a variable name"));
      assert_string_equal ((const char *) env, "untouched"); /* nothing handed out */
      err_release (&err);
    }
}

static void
test_request_path_prefers_exact_bytes_and_refuses_nul_and_overlong (void **state)
{
  (void) state;
  char buf[SBX_FILE_PATH_MAX];
  err_t err = ERR_INIT;
  /* No bytes: the string itself. */
  assert_string_equal (api_request_path ("/root/a", (ProtobufCBinaryData){0, NULL}, buf, &err), "/root/a");
  /* Bytes (not UTF-8) win over the string, NUL-terminated in buf. */
  const char *p = api_request_path ("ignored", (ProtobufCBinaryData){4, (uint8_t *) "/x\xff\xfe"}, buf, &err);
  assert_ptr_equal (p, buf);
  assert_memory_equal (buf, "/x\xff\xfe", 5);
  /* A NUL byte would shorten the path: refused. */
  assert_null (api_request_path ("", (ProtobufCBinaryData){3, (uint8_t *) "a\0b"}, buf, &err));
  assert_int_equal (err.status, EINVAL);
  err_release (&err);
  /* The longest path fits (its NUL included); one byte more does not. */
  static uint8_t lng[SBX_FILE_PATH_MAX];
  memset (lng, 'a', sizeof lng);
  assert_non_null (api_request_path ("", (ProtobufCBinaryData){SBX_FILE_PATH_MAX - 1, lng}, buf, &err));
  assert_int_equal (strlen (buf), SBX_FILE_PATH_MAX - 1);
  assert_null (api_request_path ("", (ProtobufCBinaryData){SBX_FILE_PATH_MAX, lng}, buf, &err));
  assert_int_equal (err.status, ENAMETOOLONG);
  err_release (&err);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_utf8_valid_accepts_every_sequence_length_and_the_extremes),
      cmocka_unit_test (test_utf8_valid_refuses_overlongs_surrogates_and_beyond_u10ffff),
      cmocka_unit_test (test_utf8_text_keeps_valid_text_itself_without_a_copy),
      cmocka_unit_test (test_utf8_text_replaces_each_bad_byte_and_points_raw_at_the_exact_bytes),
      cmocka_unit_test (test_argv_to_proto_valid_argv_is_used_as_is),
      cmocka_unit_test (test_argv_to_proto_one_bad_element_gives_text_and_exact_bytes_for_all),
      cmocka_unit_test (test_file_type_table_maps_each_runtime_type_and_anything_else_to_other),
      cmocka_unit_test (test_event_kind_table_maps_each_runtime_event_and_unknown_to_unspecified),
      cmocka_unit_test (test_compression_from_proto_maps_the_three_and_refuses_unknown),
      cmocka_unit_test (test_info_and_exit_to_proto_copy_every_field),
      cmocka_unit_test (test_file_info_to_proto_names_the_last_component_and_repairs_names),
      cmocka_unit_test (test_env_from_proto_builds_key_value_strings),
      cmocka_unit_test (test_env_refuses_empty_names_and_names_with_equals),
      cmocka_unit_test (test_request_path_prefers_exact_bytes_and_refuses_nul_and_overlong),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
