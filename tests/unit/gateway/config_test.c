/* config_test: the gateway's configuration (gateway/config.c) read from the
 * environment by gw_config_load: the defaults, every refusal naming its
 * variable, SANDBOX_VOLUME_MOUNTS parsing, and what is derived (CPU millis,
 * the paths hidden from sandboxes, the unpacker beside the helper, whether
 * to persist on shutdown, the gateway's name).
 *
 * Every test starts from an environment without any variable the gateway
 * reads (SANDBOX_*, CLOUD_RUN_*, GOOGLE_*, GCE_*, STORAGE_EMULATOR_HOST,
 * ALLOW_EGRESS) and with HOME pointing at a scratch directory of its own,
 * removed afterwards. gw_config_release runs after every load, successful
 * or not, so AddressSanitizer sees any leak. Single-threaded: the
 * environment is process-wide.
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cleanup.h"
#include "common/err.h"
#include "common/log.h"
#include "gateway/config.h"

extern char **environ;

/* ---- fixture -------------------------------------------------------------- */

static char scratch[PATH_MAX]; /* mkdtemp: volumes' host paths and HOME */
static char *saved_home;

static bool
read_by_gateway (const char *name, size_t len)
{
  static const char *const prefixes[] = {"SANDBOX_", "CLOUD_RUN_", "GOOGLE_", "GCE_"};
  static const char *const names[] = {"STORAGE_EMULATOR_HOST", "ALLOW_EGRESS"};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (len >= strlen (prefixes[i]) && strncmp (name, prefixes[i], strlen (prefixes[i])) == 0)
      return true;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (len == strlen (names[i]) && strncmp (name, names[i], len) == 0)
      return true;
  return false;
}

/* Unsets every variable the gateway reads. Names are copied first:
 * unsetenv rearranges environ. */
static void
clear_gateway_env (void)
{
  size_t n = 0;
  while (environ[n] != NULL)
    n++;
  char **doomed = calloc (n + 1, sizeof *doomed);
  assert_non_null (doomed);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    {
      const char *eq = strchr (environ[i], '=');
      size_t len = eq != NULL ? (size_t) (eq - environ[i]) : strlen (environ[i]);
      if (read_by_gateway (environ[i], len))
        doomed[k++] = strndup (environ[i], len);
    }
  for (size_t i = 0; i < k; i++)
    {
      unsetenv (doomed[i]);
      free (doomed[i]);
    }
  free (doomed);
}

static int
remove_entry (const char *path, const struct stat *st, int type, struct FTW *ftw)
{
  return remove (path) < 0 && errno != ENOENT ? -1 : 0;
}

static int
setup (void **state)
{
  clear_gateway_env ();
  const char *tmp = getenv ("TEST_TMPDIR");
  snprintf (scratch, sizeof scratch, "%s/config_test.XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (mkdtemp (scratch) == NULL)
    return -1;
  const char *home = getenv ("HOME");
  saved_home = home != NULL ? strdup (home) : NULL;
  setenv ("HOME", scratch, 1);
  return 0;
}

static int
teardown (void **state)
{
  clear_gateway_env ();
  log_set_level (SEV_INFO);
  if (saved_home != NULL)
    setenv ("HOME", saved_home, 1);
  else
    unsetenv ("HOME");
  free (saved_home);
  saved_home = NULL;
  return nftw (scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

/* A formatted string (caller frees). */
static char *
fmt (const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  char *out = NULL;
  int n = vasprintf (&out, format, ap);
  va_end (ap);
  assert_true (n >= 0);
  return out;
}

/* Makes the directory scratch/name and returns its path (caller frees). */
static char *
scratch_dir (const char *name)
{
  char *path = fmt ("%s/%s", scratch, name);
  assert_int_equal (mkdir (path, 0700), 0);
  return path;
}

/* Loads, failing the test with the gateway's message when it refuses. */
static void
load_ok (gw_config_t *c)
{
  err_t err = ERR_INIT;
  int rc = gw_config_load (c, &err);
  if (rc != 0)
    fail_msg ("gw_config_load refused: %s", err_msg (&err));
  assert_null (err.msg);
}

/* Loads with `name`=`value` set, expects a refusal whose message contains
 * `named` (the variable), and releases both the error and the config. */
static void
expect_refused (const char *name, const char *value, const char *named, int status)
{
  setenv (name, value, 1);
  gw_config_t c;
  err_t err = ERR_INIT;
  int rc = gw_config_load (&c, &err);
  if (rc == 0)
    fail_msg ("%s=`%s` was accepted", name, value);
  assert_int_equal (rc, -1);
  if (strstr (err_msg (&err), named) == NULL)
    fail_msg ("%s=`%s`: the message `%s` does not name %s", name, value, err_msg (&err), named);
  assert_int_equal (err.status, status);
  err_release (&err);
  gw_config_release (&c);
  unsetenv (name);
}

static size_t
count (char *const *list)
{
  size_t n = 0;
  while (list[n] != NULL)
    n++;
  return n;
}

/* ---- defaults ------------------------------------------------------------- */

static void
test_defaults_without_any_variable (void **state)
{
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.listen, "127.0.0.1:50051");
  assert_null (c.secret);
  assert_string_equal (c.log_level, "info");
  assert_int_equal (c.max_message_mb, 16);
  assert_int_equal (c.grace_seconds, 10);
  assert_null (c.tls_cert);
  assert_null (c.tls_key);
  assert_null (c.tls_client_ca);
  assert_string_equal (c.state_dir, "/var/lib/sandbox-gateway");
  assert_string_equal (c.rootfs, "/");
  assert_int_equal (c.disk_mb, 2048);
  /* Sized from the machine: a quarter of its memory in MiB, at least 16. */
  long mib
      = (long) ((unsigned long long) sysconf (_SC_PHYS_PAGES) * (unsigned long long) sysconf (_SC_PAGESIZE) >> 20);
  long want = mib / 4;
  struct rlimit nofile;
  if (getrlimit (RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_max != RLIM_INFINITY
      && want > ((long) nofile.rlim_max - GW_FDS_RESERVED) / GW_FDS_PER_SANDBOX)
    want = ((long) nofile.rlim_max - GW_FDS_RESERVED) / GW_FDS_PER_SANDBOX;
  want = want < 16 ? 16 : want;
  assert_int_equal (c.max_sandboxes, want < 65520 ? want : 65520);
  assert_int_equal (gw_default_max_sandboxes (100), want < 100 ? want : 100);
  assert_int_equal (c.pids_max, 512);
  assert_int_equal (c.memory_mb, 2048);
  assert_null (c.cpus);
  assert_int_equal (c.cpu_millis, 0);
  assert_int_equal (c.idle_ttl, 0);
  assert_false (c.allow_egress);
  assert_null (c.volume_mounts);
  assert_null (c.volumes[0]);
  assert_string_equal (c.slirp4netns, "slirp4netns");
  assert_string_equal (c.cgroup_group, "sandbox-gateway");
  assert_string_equal (c.snapshot_dir, "/var/lib/sandbox-gateway/snapshots");
  assert_null (c.gcs_bucket);
  assert_null (c.gcs_emulator);
  assert_null (c.gcs_credentials);
  assert_string_equal (c.gcs_metadata_host, "metadata.google.internal");
  assert_int_equal (c.gcs_chunk_mb, 8);
  assert_int_equal (c.gcs_retry_seconds, 60);
  assert_string_equal (c.snapshot_prefix, "sandbox-snapshots/");
  assert_int_equal (c.snapshot_max_entries, 1000000);
  /* State and snapshots are hidden from sandboxes; nothing else is set. */
  assert_string_equal (c.masks[0], "/var/lib/sandbox-gateway");
  assert_string_equal (c.masks[1], "/var/lib/sandbox-gateway/snapshots");
  assert_null (c.masks[2]);
  /* The default store goes with the machine: nothing is persisted on
   * shutdown. The name is the host's. */
  assert_null (c.persist_on_shutdown_text);
  assert_false (c.persist_on_shutdown);
  char host[256] = "";
  assert_int_equal (gethostname (host, sizeof host - 1), 0);
  assert_string_equal (c.gateway_name, host);
  gw_config_release (&c);
}

static void
test_default_helper_and_unpacker_are_beside_this_program (void **state)
{
  char self[PATH_MAX];
  ssize_t n = readlink ("/proc/self/exe", self, sizeof self - 1);
  assert_true (n > 0);
  self[n] = '\0';
  *strrchr (self, '/') = '\0';
  cleanup_free char *helper = fmt ("%s/sandbox-helper", self);
  cleanup_free char *unpacker = fmt ("%s/sandbox-unpack", self);

  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.helper, helper);
  assert_string_equal (c.unpacker, unpacker);
  gw_config_release (&c);
}

static void
test_values_from_the_environment_are_read (void **state)
{
  setenv ("SANDBOX_LISTEN", "0.0.0.0:0", 1);
  setenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET", "s3cret", 1);
  setenv ("SANDBOX_MAX", "65000", 1);
  setenv ("SANDBOX_IDLE_TTL", "600", 1);
  setenv ("ALLOW_EGRESS", "yes", 1);
  setenv ("SANDBOX_STATE_DIR", "/srv/state", 1);
  setenv ("SANDBOX_ROOTFS", "/srv/image", 1);
  setenv ("CLOUD_RUN_SANDBOX_GCS_BUCKET", "bucket", 1);
  setenv ("STORAGE_EMULATOR_HOST", "127.0.0.1:4443", 1);
  /* Empty counts as unset: the default comes back. */
  setenv ("SANDBOX_CGROUP_GROUP", "", 1);
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.listen, "0.0.0.0:0");
  assert_string_equal (c.secret, "s3cret");
  assert_int_equal (c.max_sandboxes, 65000);
  assert_int_equal (c.idle_ttl, 600);
  assert_true (c.allow_egress);
  assert_string_equal (c.state_dir, "/srv/state");
  assert_string_equal (c.snapshot_dir, "/srv/state/snapshots");
  assert_string_equal (c.gcs_bucket, "bucket");
  assert_string_equal (c.gcs_emulator, "127.0.0.1:4443");
  assert_string_equal (c.cgroup_group, "sandbox-gateway");

  sbx_config_t rt;
  gw_config_runtime (&c, &rt);
  assert_ptr_equal (rt.state_dir, c.state_dir);
  assert_string_equal (rt.rootfs, "/srv/image");
  assert_ptr_equal (rt.helper, c.helper);
  assert_ptr_equal (rt.unpacker, c.unpacker);
  assert_int_equal (rt.max_sandboxes, 65000);
  assert_int_equal (rt.idle_ttl_seconds, 600);
  assert_true (rt.allow_egress);
  assert_ptr_equal (rt.volumes, c.volumes);
  assert_ptr_equal (rt.masks, c.masks);
  gw_config_release (&c);
}

/* Every live sandbox needs its own uid range: SANDBOX_MAX past what the
 * pool holds is refused, naming both; without user namespaces it is not. */
static void
test_sandbox_max_must_fit_the_uid_pool (void **state)
{
  setenv ("SANDBOX_UID_BASE", "4294000000", 1);
  expect_refused ("SANDBOX_MAX", "15", "SANDBOX_UID_BASE", EINVAL);
  setenv ("SANDBOX_USERNS", "false", 1);
  setenv ("SANDBOX_MAX", "15", 1);
  gw_config_t c;
  load_ok (&c);
  assert_int_equal (c.max_sandboxes, 15);
  gw_config_release (&c);
  unsetenv ("SANDBOX_USERNS");
  setenv ("SANDBOX_MAX", "14", 1);
  load_ok (&c);
  assert_int_equal (c.max_sandboxes, 14);
  gw_config_release (&c);
  unsetenv ("SANDBOX_MAX");
  unsetenv ("SANDBOX_UID_BASE");
}

/* The pool is exactly SANDBOX_UID_SLOTS ranges (0: SANDBOX_MAX of them):
 * a block past the last uid, or fewer ranges than SANDBOX_MAX, is refused
 * naming the variables; SANDBOX_MAX from memory is at most the pool. */
static void
test_uid_slots_size_the_pool (void **state)
{
  gw_config_t c;
  setenv ("SANDBOX_MAX", "20", 1);
  load_ok (&c);
  assert_int_equal (c.uid_slots, 20);
  gw_config_release (&c);
  setenv ("SANDBOX_UID_SLOTS", "30", 1);
  load_ok (&c);
  assert_int_equal (c.uid_slots, 30);
  assert_int_equal (c.max_sandboxes, 20);
  gw_config_release (&c);
  unsetenv ("SANDBOX_MAX");
  setenv ("SANDBOX_UID_SLOTS", "17", 1);
  load_ok (&c);
  assert_true (c.max_sandboxes <= 17);
  gw_config_release (&c);
  setenv ("SANDBOX_UID_SLOTS", "4", 1);
  expect_refused ("SANDBOX_MAX", "5", "SANDBOX_UID_SLOTS", EINVAL);
  setenv ("SANDBOX_UID_BASE", "4294000000", 1);
  expect_refused ("SANDBOX_UID_SLOTS", "15", "SANDBOX_UID_SLOTS", EINVAL);
  unsetenv ("SANDBOX_MAX");
  unsetenv ("SANDBOX_UID_SLOTS");
  unsetenv ("SANDBOX_UID_BASE");
}

static void
test_log_level_is_applied (void **state)
{
  setenv ("SANDBOX_LOG_LEVEL", "ERROR", 1);
  gw_config_t c;
  load_ok (&c);
  assert_false (log_enabled (SEV_WARNING));
  assert_true (log_enabled (SEV_ERROR));
  gw_config_release (&c);

  setenv ("SANDBOX_LOG_LEVEL", "debug", 1);
  load_ok (&c);
  assert_true (log_enabled (SEV_DEBUG));
  gw_config_release (&c);
}

/* ---- refusals ------------------------------------------------------------- */

static void
test_listen_without_a_valid_port_is_refused (void **state)
{
  static const char *const bad[] = {
      "127.0.0.1",  "127.0.0.1:70000", "127.0.0.1:65536", ":50051",
      "localhost:", "localhost:80x",   "localhost:-1",    "[::1]",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_refused ("SANDBOX_LISTEN", bad[i], "SANDBOX_LISTEN", EINVAL);

  static const char *const good[] = {"localhost:65535", "[::1]:8080", "0.0.0.0:0"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    {
      setenv ("SANDBOX_LISTEN", good[i], 1);
      gw_config_t c;
      load_ok (&c);
      assert_string_equal (c.listen, good[i]);
      gw_config_release (&c);
    }
}

static void
test_cpus_that_are_not_a_cpu_count_are_refused (void **state)
{
  static const char *const bad[] = {"0", "abc", "0.001", "-1", "1.5x", "4097", " ", "nan", "NaN", "inf", "-nan"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_refused ("SANDBOX_CPUS", bad[i], "SANDBOX_CPUS", EINVAL);
}

static void
test_cpus_become_rounded_millis (void **state)
{
  static const struct
  {
    const char *cpus;
    long millis;
  } cases[] = {
      {"1", 1000}, {"1.5", 1500}, {"0.01", 10}, {"0.2504", 250}, {"0.2506", 251}, {"4096", 4096000},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    {
      setenv ("SANDBOX_CPUS", cases[i].cpus, 1);
      gw_config_t c;
      load_ok (&c);
      if (c.cpu_millis != cases[i].millis)
        fail_msg ("SANDBOX_CPUS=%s: %ld millis, expected %ld", cases[i].cpus, c.cpu_millis, cases[i].millis);
      gw_config_release (&c);
    }
}

static void
test_tls_files_must_come_together (void **state)
{
  expect_refused ("SANDBOX_TLS_CERT", "/etc/gw/cert.pem", "SANDBOX_TLS_KEY", EINVAL);
  expect_refused ("SANDBOX_TLS_KEY", "/etc/gw/key.pem", "SANDBOX_TLS_CERT", EINVAL);
  expect_refused ("SANDBOX_TLS_CLIENT_CA", "/etc/gw/ca.pem", "SANDBOX_TLS_CLIENT_CA", EINVAL);

  setenv ("SANDBOX_TLS_CERT", "/etc/gw/cert.pem", 1);
  setenv ("SANDBOX_TLS_KEY", "/etc/gw/key.pem", 1);
  setenv ("SANDBOX_TLS_CLIENT_CA", "/etc/gw/ca.pem", 1);
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.tls_cert, "/etc/gw/cert.pem");
  assert_string_equal (c.tls_key, "/etc/gw/key.pem");
  assert_string_equal (c.tls_client_ca, "/etc/gw/ca.pem");
  gw_config_release (&c);
}

static void
test_relative_state_dir_and_rootfs_are_refused (void **state)
{
  expect_refused ("SANDBOX_STATE_DIR", "var/lib/sandbox-gateway", "SANDBOX_STATE_DIR", EINVAL);
  expect_refused ("SANDBOX_STATE_DIR", "./state", "SANDBOX_STATE_DIR", EINVAL);
  expect_refused ("SANDBOX_ROOTFS", "image", "SANDBOX_ROOTFS", EINVAL);
}

/* Loads with the current environment, then expects gw_config_check_files
 * to refuse naming `named`. */
static void
expect_files_refused (const char *named)
{
  gw_config_t c;
  load_ok (&c);
  err_t err = ERR_INIT;
  if (gw_config_check_files (&c, &err) == 0)
    fail_msg ("the files were accepted (expected a refusal naming %s)", named);
  if (strstr (err_msg (&err), named) == NULL)
    fail_msg ("the message `%s` does not name %s", err_msg (&err), named);
  err_release (&err);
  gw_config_release (&c);
}

static void
test_files_the_configuration_names_are_checked_naming_the_variable (void **state)
{
  cleanup_free char *image = scratch_dir ("image");
  cleanup_free char *state_dir = fmt ("%s/state", scratch);
  cleanup_free char *file = fmt ("%s/file", scratch);
  cleanup_free char *pem = fmt ("%s/cert.pem", scratch);
  cleanup_free char *junk = fmt ("%s/junk.pem", scratch);
  FILE *f = fopen (file, "w");
  assert_non_null (f);
  fclose (f);
  f = fopen (pem, "w");
  assert_non_null (f);
  /* PEM framing around what is no certificate. */
  fputs ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", f);
  fclose (f);
  f = fopen (junk, "w");
  assert_non_null (f);
  fputs ("not a certificate\n", f);
  fclose (f);

  setenv ("SANDBOX_ROOTFS", image, 1);
  setenv ("SANDBOX_STATE_DIR", state_dir, 1);
  gw_config_t c;
  load_ok (&c);
  err_t err = ERR_INIT;
  if (gw_config_check_files (&c, &err) != 0)
    fail_msg ("refused: %s", err_msg (&err));
  gw_config_release (&c);
  struct stat st;
  assert_int_equal (stat (state_dir, &st), 0); /* made when missing */
  assert_true (S_ISDIR (st.st_mode));

  setenv ("SANDBOX_ROOTFS", "/nonexistent-rootfs", 1);
  expect_files_refused ("SANDBOX_ROOTFS");
  setenv ("SANDBOX_ROOTFS", file, 1);
  expect_files_refused ("SANDBOX_ROOTFS");
  setenv ("SANDBOX_ROOTFS", image, 1);

  setenv ("SANDBOX_STATE_DIR", "/proc/nope", 1);
  expect_files_refused ("SANDBOX_STATE_DIR");
  setenv ("SANDBOX_STATE_DIR", file, 1);
  expect_files_refused ("SANDBOX_STATE_DIR");
  setenv ("SANDBOX_STATE_DIR", state_dir, 1);

  /* Files a certificate cannot come from (usable ones: tests/integration/test_tls.py). */
  setenv ("SANDBOX_TLS_KEY", pem, 1);
  const char *const bad_certs[] = {"/nonexistent.pem", scratch, junk, pem};
  for (size_t i = 0; i < sizeof bad_certs / sizeof bad_certs[0]; i++)
    {
      setenv ("SANDBOX_TLS_CERT", bad_certs[i], 1);
      expect_files_refused ("SANDBOX_TLS_CERT");
    }
}

static void
test_snapshot_prefix_must_be_relative_without_dotdot (void **state)
{
  static const char *const bad[] = {"../snapshots/", "a/../../b/", "a/..", "/abs/"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_refused ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", bad[i], "CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", EINVAL);

  setenv ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", "tenant/a/", 1);
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.snapshot_prefix, "tenant/a/");
  gw_config_release (&c);
}

static void
test_integers_out_of_bounds_are_refused (void **state)
{
  static const struct
  {
    const char *name, *value;
  } bad[] = {
      {"SANDBOX_MAX", "-1"},      {"SANDBOX_MAX", "100001"},     {"SANDBOX_MAX", "-5"},
      {"SANDBOX_MAX", "many"},    {"SANDBOX_MAX", "12abc"},      {"SANDBOX_MAX", "99999999999999999999999"},
      {"SANDBOX_DISK_MB", "15"},  {"SANDBOX_PIDS_MAX", "7"},     {"SANDBOX_MAX_MESSAGE_MB", "1025"},
      {"SANDBOX_IDLE_TTL", "-1"}, {"SANDBOX_GCS_CHUNK_MB", "0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      /* "SANDBOX_MAX:" so that SANDBOX_MAX_MESSAGE_MB does not pass for it. */
      cleanup_free char *named = fmt ("%s:", bad[i].name);
      expect_refused (bad[i].name, bad[i].value, named, EINVAL);
    }
}

static void
test_other_bad_values_are_refused_naming_the_variable (void **state)
{
  expect_refused ("ALLOW_EGRESS", "maybe", "ALLOW_EGRESS", EINVAL);
  expect_refused ("SANDBOX_LOG_LEVEL", "loud", "SANDBOX_LOG_LEVEL", EINVAL);
  expect_refused ("SANDBOX_PERSIST_ON_SHUTDOWN", "maybe", "SANDBOX_PERSIST_ON_SHUTDOWN: `maybe` is not a boolean",
                  EINVAL);
  expect_refused ("SANDBOX_GATEWAY_NAME", "a b", "SANDBOX_GATEWAY_NAME: byte 2 of 3", EINVAL);
  expect_refused ("SANDBOX_GATEWAY_NAME", "tab\there", "SANDBOX_GATEWAY_NAME", EINVAL);
  expect_refused ("SANDBOX_GATEWAY_NAME", "caf\xc3\xa9", "SANDBOX_GATEWAY_NAME", EINVAL);
  char longest[GW_NAME_MAX + 2];
  memset (longest, 'n', sizeof longest - 1);
  longest[GW_NAME_MAX + 1] = '\0';
  expect_refused ("SANDBOX_GATEWAY_NAME", longest, "SANDBOX_GATEWAY_NAME: 254 characters", EINVAL);
}

/* ---- shutdown and identity ------------------------------------------------- */

static void
set_or_unset (const char *name, const char *value)
{
  if (value != NULL)
    setenv (name, value, 1);
  else
    unsetenv (name);
}

/* SANDBOX_PERSIST_ON_SHUTDOWN as loaded with these three set (NULL: unset). */
static bool
persist_with (const char *dir, const char *bucket, const char *persist)
{
  set_or_unset ("SANDBOX_SNAPSHOT_DIR", dir);
  set_or_unset ("CLOUD_RUN_SANDBOX_GCS_BUCKET", bucket);
  set_or_unset ("SANDBOX_PERSIST_ON_SHUTDOWN", persist);
  gw_config_t c;
  load_ok (&c);
  bool on = c.persist_on_shutdown;
  gw_config_release (&c);
  return on;
}

/* Unset, persisting on shutdown follows an explicit choice of store; set,
 * it is what it says. */
static void
test_persist_on_shutdown_defaults_to_whether_a_store_was_chosen (void **state)
{
  assert_false (persist_with (NULL, NULL, NULL));
  assert_true (persist_with ("/srv/snapshots", NULL, NULL));
  assert_true (persist_with (NULL, "bucket", NULL));
  /* Empty counts as unset. */
  assert_true (persist_with ("/srv/snapshots", NULL, ""));
  assert_false (persist_with ("/srv/snapshots", NULL, "false"));
  assert_false (persist_with (NULL, "bucket", "off"));
  assert_true (persist_with (NULL, NULL, "true"));
  assert_true (persist_with (NULL, NULL, "1"));
}

static void
test_gateway_name_is_read (void **state)
{
  setenv ("SANDBOX_GATEWAY_NAME", "sandbox-gateway-0.sandbox.default.svc", 1);
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.gateway_name, "sandbox-gateway-0.sandbox.default.svc");
  gw_config_release (&c);
  char longest[GW_NAME_MAX + 1];
  memset (longest, 'n', sizeof longest - 1);
  longest[GW_NAME_MAX] = '\0';
  setenv ("SANDBOX_GATEWAY_NAME", longest, 1);
  load_ok (&c);
  assert_int_equal (strlen (c.gateway_name), GW_NAME_MAX);
  gw_config_release (&c);
}

/* ---- SANDBOX_VOLUME_MOUNTS ------------------------------------------------ */

static void
test_volume_mounts_are_parsed_with_their_modes (void **state)
{
  cleanup_free char *a = scratch_dir ("a");
  cleanup_free char *b = scratch_dir ("b");
  cleanup_free char *d = scratch_dir ("d");
  cleanup_free char *spec = fmt ("%s:/data:ro,%s:/work:rw,%s:/plain", a, b, d);
  setenv ("SANDBOX_VOLUME_MOUNTS", spec, 1);

  gw_config_t c;
  load_ok (&c);
  assert_int_equal (count (c.volumes), 3);
  cleanup_free char *want0 = fmt ("%s:/data:ro", a);
  cleanup_free char *want1 = fmt ("%s:/work", b); /* rw is the default: no suffix */
  cleanup_free char *want2 = fmt ("%s:/plain", d);
  assert_string_equal (c.volumes[0], want0);
  assert_string_equal (c.volumes[1], want1);
  assert_string_equal (c.volumes[2], want2);
  gw_config_release (&c);
}

static void
test_volume_with_a_missing_host_path_is_skipped (void **state)
{
  cleanup_free char *a = scratch_dir ("a");
  cleanup_free char *spec = fmt ("%s/missing:/gone,%s:/data:ro,%s/also-missing:/gone2:ro", scratch, a, scratch);
  setenv ("SANDBOX_VOLUME_MOUNTS", spec, 1);

  gw_config_t c;
  load_ok (&c);
  assert_int_equal (count (c.volumes), 1);
  cleanup_free char *want = fmt ("%s:/data:ro", a);
  assert_string_equal (c.volumes[0], want);
  gw_config_release (&c);
}

static void
test_bad_volume_entries_are_refused (void **state)
{
  cleanup_free char *a = scratch_dir ("a");
  static const char *const bad_tails[] = {
      "",            /* no sandbox path at all */
      ":/data:rx",   /* mode neither ro nor rw */
      ":/data:",     /* empty mode */
      ":/data:ro:x", /* trailing field */
      ":data",       /* relative sandbox path */
      ":/data/../etc",
      ":/..",
      ":/",
  };
  for (size_t i = 0; i < sizeof bad_tails / sizeof bad_tails[0]; i++)
    {
      cleanup_free char *spec = fmt ("%s%s", a, bad_tails[i]);
      expect_refused ("SANDBOX_VOLUME_MOUNTS", spec, "SANDBOX_VOLUME_MOUNTS", EINVAL);
    }
  /* ~user is not expanded (it would have become $HOMEuser). */
  expect_refused ("SANDBOX_VOLUME_MOUNTS", "~nobody/data:/data", "SANDBOX_VOLUME_MOUNTS", EINVAL);
  /* A bad entry after a good one: the good one's string is freed too. */
  cleanup_free char *spec = fmt ("%s:/ok,%s:/bad:rx", a, a);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", spec, "SANDBOX_VOLUME_MOUNTS", EINVAL);
}

/* "dir:/v0,dir:/v1,..." with n entries (caller frees). */
static char *
many_volumes (const char *dir, size_t n)
{
  char *spec = fmt ("%s", "");
  for (size_t i = 0; i < n; i++)
    {
      char *longer = fmt ("%s%s%s:/v%zu", spec, i ? "," : "", dir, i);
      free (spec);
      spec = longer;
    }
  return spec;
}

static void
test_at_most_gw_max_volumes_are_accepted (void **state)
{
  cleanup_free char *a = scratch_dir ("a");

  /* Exactly the maximum, plus missing ones (skipped, so not counted). */
  cleanup_free char *full = many_volumes (a, GW_MAX_VOLUMES);
  cleanup_free char *spec = fmt ("%s,%s/missing:/m1,%s/missing:/m2", full, scratch, scratch);
  setenv ("SANDBOX_VOLUME_MOUNTS", spec, 1);
  gw_config_t c;
  load_ok (&c);
  assert_int_equal (count (c.volumes), GW_MAX_VOLUMES);
  gw_config_release (&c);

  /* One more is refused with E2BIG (and nothing of it leaks). */
  cleanup_free char *over = many_volumes (a, GW_MAX_VOLUMES + 1);
  setenv ("SANDBOX_VOLUME_MOUNTS", over, 1);
  err_t err = ERR_INIT;
  int rc = gw_config_load (&c, &err);
  assert_int_equal (rc, -1);
  assert_int_equal (err.status, E2BIG);
  assert_non_null (strstr (err_msg (&err), "SANDBOX_VOLUME_MOUNTS"));
  err_release (&err);
  gw_config_release (&c);
}

static void
test_tilde_in_a_host_path_is_home (void **state)
{
  cleanup_free char *data = scratch_dir ("data");
  cleanup_free char *work = scratch_dir ("work");
  setenv ("SANDBOX_VOLUME_MOUNTS", "~/data:/data:ro,~/work:/home/me", 1);
  gw_config_t c;
  load_ok (&c);
  assert_int_equal (count (c.volumes), 2);
  cleanup_free char *want0 = fmt ("%s:/data:ro", data);
  cleanup_free char *want1 = fmt ("%s:/home/me", work);
  assert_string_equal (c.volumes[0], want0);
  assert_string_equal (c.volumes[1], want1);
  gw_config_release (&c);
}

static void
test_volume_owners_are_parsed_and_host_root_is_refused (void **state)
{
  cleanup_free char *a = scratch_dir ("a");
  cleanup_free char *b = scratch_dir ("b");
  cleanup_free char *spec = fmt ("%s:/a:ro:uid=4242,%s:/b:uid=4242:gid=77", a, b);
  setenv ("SANDBOX_VOLUME_MOUNTS", spec, 1);
  gw_config_t c;
  load_ok (&c);
  cleanup_free char *want0 = fmt ("%s:/a:ro:uid=4242:gid=4242", a); /* gid defaults to uid */
  cleanup_free char *want1 = fmt ("%s:/b:uid=4242:gid=77", b);
  assert_string_equal (c.volumes[0], want0);
  assert_string_equal (c.volumes[1], want1);
  gw_config_release (&c);
  static const char *const bad[] = {":/a:uid=0",  ":/a:uid=5:gid=0", ":/a:gid=5",       ":/a:uid=",     ":/a:uid=5x",
                                    ":/a:uid=-3", ":/a:owner=5",     ":/a:uid=1000000", ":/a:ro::uid=5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    {
      cleanup_free char *one = fmt ("%s%s", a, bad[i]);
      expect_refused ("SANDBOX_VOLUME_MOUNTS", one, "SANDBOX_VOLUME_MOUNTS", EINVAL);
    }
}

static void
test_nested_volumes_and_volumes_over_masks_are_refused (void **state)
{
  cleanup_free char *a = scratch_dir ("a");
  cleanup_free char *inner = scratch_dir ("a/inner");
  cleanup_free char *nested = fmt ("%s:/a,%s:/inner", a, inner);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", nested, "nest", EINVAL);
  cleanup_free char *reversed = fmt ("%s:/inner,%s:/a", inner, a);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", reversed, "nest", EINVAL);
  /* A missing inner path is where a sandbox would plant a link: refused too. */
  cleanup_free char *missing = fmt ("%s:/a,%s/not-yet:/later", a, a);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", missing, "nest", EINVAL);
  cleanup_free char *dotted = fmt ("%s/../a:/a", a);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", dotted, "SANDBOX_VOLUME_MOUNTS", EINVAL);
  /* A volume holding the image. */
  setenv ("SANDBOX_ROOTFS", inner, 1);
  cleanup_free char *image = fmt ("%s:/a", a);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", image, "SANDBOX_ROOTFS", EINVAL);
  unsetenv ("SANDBOX_ROOTFS");
  /* The same directory twice is not nesting. */
  cleanup_free char *twice = fmt ("%s:/one,%s:/two:ro", a, a);
  setenv ("SANDBOX_VOLUME_MOUNTS", twice, 1);
  gw_config_t c;
  load_ok (&c);
  assert_int_equal (count (c.volumes), 2);
  gw_config_release (&c);
  /* A volume holding the state directory, or inside it. */
  cleanup_free char *state_dir = fmt ("%s/state", a);
  setenv ("SANDBOX_STATE_DIR", state_dir, 1);
  cleanup_free char *over = fmt ("%s:/a", a);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", over, "SANDBOX_STATE_DIR", EINVAL);
  setenv ("SANDBOX_STATE_DIR", a, 1);
  cleanup_free char *under = fmt ("%s:/inner", inner);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", under, "SANDBOX_STATE_DIR", EINVAL);
  unsetenv ("SANDBOX_STATE_DIR");
}

/* ---- derived values ------------------------------------------------------- */

static void
test_masks_are_the_absolute_secret_paths (void **state)
{
  setenv ("SANDBOX_STATE_DIR", "/srv/state", 1);
  setenv ("SANDBOX_SNAPSHOT_DIR", "/srv/snapshots", 1);
  setenv ("SANDBOX_TLS_CERT", "/etc/gw/cert.pem", 1);
  setenv ("SANDBOX_TLS_KEY", "/etc/gw/key.pem", 1);
  setenv ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gw/sa.json", 1);
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.masks[0], "/srv/state");
  assert_string_equal (c.masks[1], "/srv/snapshots");
  assert_string_equal (c.masks[2], "/etc/gw/key.pem");
  assert_string_equal (c.masks[3], "/etc/gw/sa.json");
  assert_null (c.masks[4]);
  /* Borrowed from the fields, not copies. */
  assert_ptr_equal (c.masks[2], c.tls_key);
  gw_config_release (&c);

  /* Relative paths cannot be masked (they are not paths in the image). */
  setenv ("SANDBOX_TLS_KEY", "key.pem", 1);
  setenv ("GOOGLE_APPLICATION_CREDENTIALS", "sa.json", 1);
  load_ok (&c);
  assert_string_equal (c.masks[0], "/srv/state");
  assert_string_equal (c.masks[1], "/srv/snapshots");
  assert_null (c.masks[2]);
  gw_config_release (&c);
}

static void
test_unpacker_is_beside_the_configured_helper (void **state)
{
  setenv ("SANDBOX_HELPER", "/opt/sbx/bin/sandbox-helper", 1);
  gw_config_t c;
  load_ok (&c);
  assert_string_equal (c.helper, "/opt/sbx/bin/sandbox-helper");
  assert_string_equal (c.unpacker, "/opt/sbx/bin/sandbox-unpack");
  gw_config_release (&c);

  setenv ("SANDBOX_HELPER", "/helper", 1);
  load_ok (&c);
  assert_string_equal (c.unpacker, "/sandbox-unpack");
  gw_config_release (&c);

  /* A bare name (looked up on PATH): the unpacker is a bare name too. */
  setenv ("SANDBOX_HELPER", "sandbox-helper", 1);
  load_ok (&c);
  assert_string_equal (c.unpacker, "sandbox-unpack");
  gw_config_release (&c);
}

/* ---- release -------------------------------------------------------------- */

static void
test_release_frees_everything_and_zeroes (void **state)
{
  cleanup_free char *a = scratch_dir ("a");
  cleanup_free char *spec = fmt ("%s:/data", a);
  setenv ("SANDBOX_VOLUME_MOUNTS", spec, 1);
  setenv ("SANDBOX_CPUS", "2", 1);
  setenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET", "s", 1);
  gw_config_t c;
  load_ok (&c);
  gw_config_release (&c);
  assert_null (c.listen);
  assert_null (c.helper);
  assert_null (c.unpacker);
  assert_null (c.volumes[0]);
  assert_null (c.masks[0]);
  assert_int_equal (c.cpu_millis, 0);
  /* A released config can be released again. */
  gw_config_release (&c);
}

static void
test_release_after_each_kind_of_failure_frees_what_was_loaded (void **state)
{
  /* Failures at successive stages: in the table (a string already
   * read), the log level, the listen address, the CPUs, the paths, the
   * prefix (after the derived paths were made), the volumes. The leak
   * check under AddressSanitizer is the verdict. */
  cleanup_free char *a = scratch_dir ("a");
  cleanup_free char *spec = fmt ("%s:/ok,%s:relative", a, a);
  setenv ("CLOUD_RUN_SANDBOX_GATEWAY_SECRET", "s", 1);
  setenv ("SANDBOX_TLS_CERT", "/c", 1);
  setenv ("SANDBOX_TLS_KEY", "/k", 1);
  expect_refused ("SANDBOX_SNAPSHOT_MAX_ENTRIES", "0", "SANDBOX_SNAPSHOT_MAX_ENTRIES", EINVAL);
  expect_refused ("SANDBOX_LOG_LEVEL", "nope", "SANDBOX_LOG_LEVEL", EINVAL);
  expect_refused ("SANDBOX_LISTEN", "nowhere", "SANDBOX_LISTEN", EINVAL);
  expect_refused ("SANDBOX_CPUS", "x", "SANDBOX_CPUS", EINVAL);
  expect_refused ("SANDBOX_ROOTFS", "rel", "SANDBOX_ROOTFS", EINVAL);
  expect_refused ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", "../x/", "CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", EINVAL);
  expect_refused ("SANDBOX_VOLUME_MOUNTS", spec, "SANDBOX_VOLUME_MOUNTS", EINVAL);
}

/* ---- images ---------------------------------------------------------------- */

static void
test_image_layers_owner_must_be_outside_the_sandboxes_pool (void **state)
{
  (void) state;
  /* The pool: 1000000 .. 1000000 + 16 x 65536 - 1. */
  setenv ("SANDBOX_UID_BASE", "1000000", 1);
  setenv ("SANDBOX_UID_SLOTS", "16", 1);
  expect_refused ("SANDBOX_IMAGE_UID", "1000000", "SANDBOX_IMAGE_UID", EINVAL);
  expect_refused ("SANDBOX_IMAGE_UID", "950000", "SANDBOX_IMAGE_UID", EINVAL); /* its last ids overlap */
  expect_refused ("SANDBOX_IMAGE_UID", "2048575", "SANDBOX_IMAGE_UID", EINVAL);
  setenv ("SANDBOX_IMAGE_UID", "934464", 1); /* ends right below the pool */
  gw_config_t c;
  load_ok (&c);
  assert_int_equal (c.image_uid, 934464);
  assert_null (c.registry_auth_file);
  assert_null (c.insecure_registries);
  gw_config_release (&c);
  unsetenv ("SANDBOX_IMAGE_UID");
  unsetenv ("SANDBOX_UID_BASE");
  unsetenv ("SANDBOX_UID_SLOTS");
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown (test_defaults_without_any_variable, setup, teardown),
      cmocka_unit_test_setup_teardown (test_default_helper_and_unpacker_are_beside_this_program, setup, teardown),
      cmocka_unit_test_setup_teardown (test_values_from_the_environment_are_read, setup, teardown),
      cmocka_unit_test_setup_teardown (test_sandbox_max_must_fit_the_uid_pool, setup, teardown),
      cmocka_unit_test_setup_teardown (test_uid_slots_size_the_pool, setup, teardown),
      cmocka_unit_test_setup_teardown (test_log_level_is_applied, setup, teardown),
      cmocka_unit_test_setup_teardown (test_listen_without_a_valid_port_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_cpus_that_are_not_a_cpu_count_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_cpus_become_rounded_millis, setup, teardown),
      cmocka_unit_test_setup_teardown (test_tls_files_must_come_together, setup, teardown),
      cmocka_unit_test_setup_teardown (test_relative_state_dir_and_rootfs_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_files_the_configuration_names_are_checked_naming_the_variable, setup,
                                       teardown),
      cmocka_unit_test_setup_teardown (test_snapshot_prefix_must_be_relative_without_dotdot, setup, teardown),
      cmocka_unit_test_setup_teardown (test_integers_out_of_bounds_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_other_bad_values_are_refused_naming_the_variable, setup, teardown),
      cmocka_unit_test_setup_teardown (test_persist_on_shutdown_defaults_to_whether_a_store_was_chosen, setup,
                                       teardown),
      cmocka_unit_test_setup_teardown (test_gateway_name_is_read, setup, teardown),
      cmocka_unit_test_setup_teardown (test_volume_mounts_are_parsed_with_their_modes, setup, teardown),
      cmocka_unit_test_setup_teardown (test_volume_with_a_missing_host_path_is_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown (test_bad_volume_entries_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_at_most_gw_max_volumes_are_accepted, setup, teardown),
      cmocka_unit_test_setup_teardown (test_tilde_in_a_host_path_is_home, setup, teardown),
      cmocka_unit_test_setup_teardown (test_volume_owners_are_parsed_and_host_root_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_nested_volumes_and_volumes_over_masks_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_masks_are_the_absolute_secret_paths, setup, teardown),
      cmocka_unit_test_setup_teardown (test_unpacker_is_beside_the_configured_helper, setup, teardown),
      cmocka_unit_test_setup_teardown (test_release_frees_everything_and_zeroes, setup, teardown),
      cmocka_unit_test_setup_teardown (test_image_layers_owner_must_be_outside_the_sandboxes_pool, setup, teardown),
      cmocka_unit_test_setup_teardown (test_release_after_each_kind_of_failure_frees_what_was_loaded, setup,
                                       teardown),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
