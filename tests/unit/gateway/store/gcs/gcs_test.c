/* gcs_test: the GCS snapshot store (gateway/store/gcs) against fake_gcs.py, a
 * local fake of the storage JSON API started by this test on loopback, with
 * faults injected through its control endpoints: round trips, uploads that
 * survive 503s, 429s, dropped connections, partial commits and stalls, an
 * outage longer than the retry budget, downloads (404, corrupted crc32c,
 * truncation, retried start), remove/exists, cancelling every request (the
 * gateway's shutdown), and the credentials paths
 * (service-account JWT checked by the fake's /token, the metadata server,
 * token refresh after 401). Plus unit tests of the header parsers and CRC32C.
 *
 * Two fake servers run for the whole test: one without auth (the emulator
 * convention) and one that requires tokens (--pubkey). Each test resets the
 * faults and objects of both first. Verdicts never depend on timing except
 * the outage test's bounds, which are generous.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "common/err.h"
#include "common/log.h"
#include "gateway/store/gcs/gcs.h"
#include "gateway/store/gcs/parse.h"

extern char **environ;

#define BUCKET "test-bucket"
#define FAKE_GCS "tests/gcs/fake_gcs.py"
#define SA_KEY "tests/gcs/sa_key.pem"
#define SA_PUB "tests/gcs/sa_pub.pem"
#define OTHER_KEY "tests/gcs/other_key.pem"
#define KIB 1024u
#define MIB (1024u * 1024u)

/* ---- the fake servers ---------------------------------------------------- */

typedef struct fake_s
{
  pid_t pid;
  int port;
} fake_t;

static fake_t plain_srv = {-1, 0}; /* no auth */
static fake_t auth_srv = {-1, 0};  /* --pubkey */
static char tmpdir[512];

static int
fake_start (fake_t *f, const char *pubkey)
{
  int p[2];
  if (pipe2 (p, O_CLOEXEC) < 0)
    return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_adddup2 (&fa, p[1], STDOUT_FILENO);
  char *argv[] = {"/usr/bin/python3", FAKE_GCS, pubkey ? "--pubkey" : NULL, (char *) pubkey, NULL};
  int rc = posix_spawn (&f->pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy (&fa);
  close (p[1]);
  if (rc != 0)
    {
      close (p[0]);
      return -1;
    }
  char line[32] = "";
  size_t got = 0;
  while (got + 1 < sizeof line && strchr (line, '\n') == NULL)
    {
      struct pollfd pfd = {p[0], POLLIN, 0};
      if (poll (&pfd, 1, 20000) <= 0)
        break;
      ssize_t n = read (p[0], line + got, sizeof line - 1 - got);
      if (n <= 0)
        break;
      got += (size_t) n;
      line[got] = '\0';
    }
  close (p[0]);
  f->port = atoi (line);
  return f->port > 0 ? 0 : -1;
}

static void
fake_stop (fake_t *f)
{
  if (f->pid > 0)
    {
      kill (f->pid, SIGTERM);
      waitpid (f->pid, NULL, 0);
    }
  f->pid = -1;
}

static size_t
collect (char *data, size_t size, size_t n, void *user)
{
  json_t **out = user;
  json_error_t jerr;
  json_decref (*out);
  *out = json_loadb (data, size * n, 0, &jerr);
  return size * n;
}

/* POSTs (body non-NULL) or GETs a control endpoint; returns its JSON answer
 * (caller decrefs). Small answers arrive in one piece. */
static json_t *
ctl (const fake_t *f, const char *path, const char *body)
{
  char url[128];
  snprintf (url, sizeof url, "http://127.0.0.1:%d%s", f->port, path);
  CURL *h = curl_easy_init ();
  json_t *out = NULL;
  curl_easy_setopt (h, CURLOPT_URL, url);
  curl_easy_setopt (h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt (h, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt (h, CURLOPT_WRITEDATA, &out);
  if (body != NULL)
    curl_easy_setopt (h, CURLOPT_POSTFIELDS, body);
  CURLcode rc = curl_easy_perform (h);
  curl_easy_cleanup (h);
  assert_int_equal (rc, CURLE_OK);
  return out;
}

static void
fault (const fake_t *f, const char *json)
{
  json_decref (ctl (f, "/_control/fault", json));
}

static long
stat_of (const fake_t *f, const char *name)
{
  json_t *s = ctl (f, "/_control/stats", NULL);
  assert_non_null (s);
  long v = (long) json_integer_value (json_object_get (s, name));
  json_decref (s);
  return v;
}

/* ---- helpers ------------------------------------------------------------- */

static uint8_t *
make_data (size_t len, uint32_t seed)
{
  uint8_t *d = malloc (len);
  assert_non_null (d);
  uint32_t x = seed | 1;
  for (size_t i = 0; i < len; i++)
    {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      d[i] = (uint8_t) x;
    }
  return d;
}

static double
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Options for test stores: fast backoff so retries do not slow the tests. */
typedef struct store_opts_s
{
  size_t chunk;
  unsigned budget_ms;
  long stall_s;
  const char *credentials_file; /* with the auth server */
  const char *metadata;         /* "host:port": metadata server of the auth server */
  bool auth_server_no_creds;    /* the auth server, as an emulator (no credentials) */
} store_opts_t;

static snap_store_t *
store_with (const store_opts_t *o)
{
  char host[64], endpoint[80];
  gcs_config_t cfg = {0};
  cfg.bucket = BUCKET;
  cfg.chunk_size = o->chunk ? o->chunk : 256 * KIB;
  cfg.retry_budget_ms = o->budget_ms ? o->budget_ms : 20000;
  cfg.backoff_initial_ms = 20;
  cfg.backoff_max_ms = 200;
  cfg.stall_timeout_s = o->stall_s;
  if (o->credentials_file != NULL || o->metadata != NULL)
    {
      snprintf (endpoint, sizeof endpoint, "http://127.0.0.1:%d", auth_srv.port);
      cfg.endpoint = endpoint;
      cfg.credentials_file = o->credentials_file;
      cfg.metadata_host = o->metadata;
    }
  else
    {
      snprintf (host, sizeof host, "127.0.0.1:%d", o->auth_server_no_creds ? auth_srv.port : plain_srv.port);
      cfg.emulator_host = host;
    }
  err_t err = ERR_INIT;
  snap_store_t *st = NULL;
  if (gcs_store_new (&cfg, &st, &err) < 0)
    fail_msg ("gcs_store_new: %s", err_msg (&err));
  assert_string_equal (st->kind, "gcs");
  return st;
}

static snap_store_t *
plain_store (size_t chunk, unsigned budget_ms)
{
  store_opts_t o = {.chunk = chunk, .budget_ms = budget_ms};
  return store_with (&o);
}

/* Uploads `data` in pieces of `piece` bytes. */
static int
upload (snap_store_t *st, const char *name, const uint8_t *data, size_t len, size_t piece, err_t *err)
{
  snap_writer_t *w = NULL;
  if (st->ops->writer_open (st, name, &w, err) < 0)
    return -1;
  for (size_t off = 0; off < len;)
    {
      size_t n = len - off < piece ? len - off : piece;
      if (st->ops->writer_write (w, data + off, n, err) < 0)
        {
          st->ops->writer_abort (w);
          return -1;
        }
      off += n;
    }
  return st->ops->writer_commit (w, err);
}

/* Downloads into *out (caller frees) with reads of `cap` bytes. */
static int
download (snap_store_t *st, const char *name, size_t cap, uint8_t **out, size_t *len, err_t *err)
{
  snap_reader_t *r = NULL;
  *out = NULL;
  *len = 0;
  if (st->ops->reader_open (st, name, &r, err) < 0)
    return -1;
  size_t have = 0, alloc = 0;
  uint8_t *buf = NULL;
  int rc = 0;
  for (;;)
    {
      if (alloc - have < cap)
        {
          alloc = alloc * 2 + cap;
          buf = realloc (buf, alloc);
          assert_non_null (buf);
        }
      ssize_t n = st->ops->reader_read (r, buf + have, cap, err);
      if (n < 0)
        {
          rc = -1;
          break;
        }
      if (n == 0)
        break;
      have += (size_t) n;
    }
  st->ops->reader_close (r);
  if (rc < 0)
    {
      free (buf);
      return -1;
    }
  *out = buf;
  *len = have;
  return 0;
}

static void
assert_object_is (snap_store_t *st, const char *name, const uint8_t *data, size_t len)
{
  err_t err = ERR_INIT;
  uint8_t *got = NULL;
  size_t got_len = 0;
  if (download (st, name, 100 * KIB + 7, &got, &got_len, &err) < 0)
    fail_msg ("download `%s`: %s", name, err_msg (&err));
  assert_int_equal (got_len, len);
  assert_memory_equal (got, data, len);
  free (got);
}

static void
assert_upload_ok (snap_store_t *st, const char *name, const uint8_t *data, size_t len, size_t piece)
{
  err_t err = ERR_INIT;
  if (upload (st, name, data, len, piece, &err) < 0)
    fail_msg ("upload `%s`: %s", name, err_msg (&err));
}

static void
assert_absent (snap_store_t *st, const char *name)
{
  err_t err = ERR_INIT;
  int e = st->ops->exists (st, name, &err);
  if (e < 0)
    fail_msg ("exists `%s`: %s", name, err_msg (&err));
  assert_int_equal (e, 0);
}

/* ---- fixtures ------------------------------------------------------------ */

static int
group_setup (void **state)
{
  log_set_level (SEV_ERROR); /* retries log warnings; keep the output readable */
  unsetenv ("http_proxy");
  unsetenv ("https_proxy");
  unsetenv ("HTTP_PROXY");
  unsetenv ("HTTPS_PROXY");
  unsetenv ("ALL_PROXY");
  unsetenv ("all_proxy");
  setenv ("NO_PROXY", "127.0.0.1,localhost", 1);
  curl_global_init (CURL_GLOBAL_DEFAULT);
  const char *t = getenv ("TEST_TMPDIR");
  snprintf (tmpdir, sizeof tmpdir, "%s", t != NULL ? t : "/tmp");
  if (fake_start (&plain_srv, NULL) < 0 || fake_start (&auth_srv, SA_PUB) < 0)
    {
      fake_stop (&plain_srv);
      fake_stop (&auth_srv);
      return -1;
    }
  return 0;
}

static int
group_teardown (void **state)
{
  fake_stop (&plain_srv);
  fake_stop (&auth_srv);
  curl_global_cleanup ();
  return 0;
}

static int
test_setup (void **state)
{
  json_decref (ctl (&plain_srv, "/_control/reset", "{\"objects\": true}"));
  json_decref (ctl (&auth_srv, "/_control/reset", "{\"objects\": true}"));
  return 0;
}

/* ---- parsing and CRC32C -------------------------------------------------- */

static void
test_crc32c_matches_known_vectors_on_both_paths (void **state)
{
  for (int sw = 0; sw < 2; sw++)
    {
      gcs_crc32c_force_sw = sw;
      assert_int_equal (gcs_crc32c (0, (const uint8_t *) "123456789", 9), 0xE3069283u);
      uint8_t zeros[32] = {0};
      assert_int_equal (gcs_crc32c (0, zeros, sizeof zeros), 0x8A9136AAu);
      assert_int_equal (gcs_crc32c (0, NULL, 0), 0u);
    }
  /* Pieces at odd offsets give the whole's value on both paths. */
  uint8_t *d = make_data (100003, 7);
  gcs_crc32c_force_sw = 1;
  uint32_t whole = gcs_crc32c (0, d, 100003);
  gcs_crc32c_force_sw = 0;
  uint32_t hw = gcs_crc32c (0, d, 100003);
  assert_int_equal (whole, hw);
  uint32_t c = 0;
  for (size_t off = 0, step = 1; off < 100003; off += step, step = step * 3 % 997 + 1)
    c = gcs_crc32c (c, d + off, off + step <= 100003 ? step : 100003 - off);
  assert_int_equal (c, whole);
  free (d);
  char b64[9];
  gcs_crc32c_base64 (gcs_crc32c (0, (const uint8_t *) "hello", 5), b64);
  assert_string_equal (b64, "mnG7TA==");
}

static void
test_range_header_parsing_refuses_malformed_values (void **state)
{
  uint64_t c = 0;
  assert_int_equal (gcs_parse_range ("bytes=0-99", 10, &c), 0);
  assert_int_equal (c, 100);
  assert_int_equal (gcs_parse_range ("BYTES=0-0", 9, &c), 0);
  assert_int_equal (c, 1);
  const char *bad[] = {"bytes=1-99",
                       "bytes=0-",
                       "bytes=-5",
                       "bytes=0-99x",
                       "bytes 0-99",
                       "bytes=0-9,0-3",
                       "",
                       "bytes=0-18446744073709551615",
                       "bytes=0-99999999999999999999999",
                       "bytes=00-5 "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal (gcs_parse_range (bad[i], strlen (bad[i]), &c), -1);
  /* The length is respected: no read past it. */
  assert_int_equal (gcs_parse_range ("bytes=0-99", 9, &c), 0);
  assert_int_equal (c, 10);
}

static void
test_goog_hash_parsing_finds_crc32c_and_refuses_garbage (void **state)
{
  uint32_t c = 0;
  const char *v = "crc32c=n03x6A==,md5=Ojk9c3dhfxgoKVVHYwFbHQ==";
  assert_int_equal (gcs_parse_goog_hash_crc32c (v, strlen (v), &c), 1);
  char b64[9];
  gcs_crc32c_base64 (c, b64);
  assert_string_equal (b64, "n03x6A==");
  v = "md5=Ojk9c3dhfxgoKVVHYwFbHQ==,  CRC32C=mnG7TA== ";
  assert_int_equal (gcs_parse_goog_hash_crc32c (v, strlen (v), &c), 1);
  assert_int_equal (c, gcs_crc32c (0, (const uint8_t *) "hello", 5));
  v = "md5=Ojk9c3dhfxgoKVVHYwFbHQ==";
  assert_int_equal (gcs_parse_goog_hash_crc32c (v, strlen (v), &c), 0);
  const char *bad[] = {"crc32c=",
                       "crc32c=AAAA",
                       "crc32c=n03x6A=",
                       "crc32c=n03x6A===",
                       "crc32c=n0$x6A==",
                       "crc32c=n03x6B==" /* non-zero spare bits */,
                       "crc32c=n03x6A==,crc32c=mnG7TA=="};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal (gcs_parse_goog_hash_crc32c (bad[i], strlen (bad[i]), &c), -1);
}

static void
test_header_lines_match_names_in_any_case_only (void **state)
{
  const char *v = NULL;
  size_t n = 0;
  const char *line = "LOCATION:  http://x/y \r\n";
  assert_int_equal (gcs_header_value (line, strlen (line), "location", &v, &n), 1);
  assert_int_equal (n, strlen ("http://x/y"));
  assert_memory_equal (v, "http://x/y", n);
  line = "Location : http://x\r\n";
  assert_int_equal (gcs_header_value (line, strlen (line), "location", &v, &n), 0);
  line = "Locations: http://x\r\n";
  assert_int_equal (gcs_header_value (line, strlen (line), "location", &v, &n), 0);
  line = "Range:\r\n";
  assert_int_equal (gcs_header_value (line, strlen (line), "range", &v, &n), 1);
  assert_int_equal (n, 0);
  assert_int_equal (gcs_header_value ("Ran", 3, "range", &v, &n), 0);

  long code = 0;
  assert_int_equal (gcs_parse_status_line ("HTTP/1.1 308 Resume Incomplete\r\n", 32, &code), 1);
  assert_int_equal (code, 308);
  assert_int_equal (gcs_parse_status_line ("HTTP/2 200\r\n", 12, &code), 1);
  assert_int_equal (code, 200);
  assert_int_equal (gcs_parse_status_line ("HTTP/1.1 2000\r\n", 15, &code), -1);
  assert_int_equal (gcs_parse_status_line ("HTTP/1.1 099 x\r\n", 16, &code), -1);
  assert_int_equal (gcs_parse_status_line ("HTTP/", 5, &code), -1);
  assert_int_equal (gcs_parse_status_line ("Content-Type: x", 15, &code), 0);
}

static void
test_bad_settings_are_refused_with_the_reason (void **state)
{
  err_t err = ERR_INIT;
  snap_store_t *st = NULL;
  gcs_config_t cfg = {.emulator_host = "127.0.0.1:1"};
  assert_int_equal (gcs_store_new (&cfg, &st, &err), -1);
  assert_int_equal (err.status, EINVAL);
  assert_non_null (strstr (err_msg (&err), "CLOUD_RUN_SANDBOX_GCS_BUCKET"));
  cfg.bucket = BUCKET;
  cfg.chunk_size = 300 * KIB;
  assert_int_equal (gcs_store_new (&cfg, &st, &err), -1);
  assert_int_equal (err.status, EINVAL);
  assert_non_null (strstr (err_msg (&err), "256 KiB"));
  cfg.chunk_size = 0;
  cfg.emulator_host = NULL;
  cfg.credentials_file = "/nonexistent/key.json";
  assert_int_equal (gcs_store_new (&cfg, &st, &err), -1);
  assert_int_equal (err.status, ENOENT);
  assert_non_null (strstr (err_msg (&err), "/nonexistent/key.json"));
  char path[600];
  snprintf (path, sizeof path, "%s/not-a-key.json", tmpdir);
  FILE *f = fopen (path, "w");
  assert_non_null (f);
  fputs ("{\"type\": \"service_account\", \"client_email\": \"a@b\", \"private_key\": \"nope\"}", f);
  fclose (f);
  cfg.credentials_file = path;
  assert_int_equal (gcs_store_new (&cfg, &st, &err), -1);
  assert_int_equal (err.status, EINVAL);
  assert_non_null (strstr (err_msg (&err), "not an RSA key"));
  err_release (&err);

  /* Defaults: the prefix, and an emulator host without a scheme. */
  gcs_config_t ok = {.bucket = BUCKET, .emulator_host = "127.0.0.1:1"};
  assert_int_equal (gcs_store_new (&ok, &st, &err), 0);
  assert_string_equal (st->prefix, GCS_DEFAULT_PREFIX);
  st->ops->destroy (st);
}

static void
test_config_from_env_reads_the_documented_variables (void **state)
{
  setenv ("CLOUD_RUN_SANDBOX_GCS_BUCKET", "b1", 1);
  setenv ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", "p/", 1);
  setenv ("STORAGE_EMULATOR_HOST", "", 1);
  setenv ("GCE_METADATA_HOST", "127.0.0.1:9", 1);
  gcs_config_t cfg;
  gcs_config_from_env (&cfg);
  assert_string_equal (cfg.bucket, "b1");
  assert_string_equal (cfg.prefix, "p/");
  assert_null (cfg.emulator_host); /* empty counts as unset */
  assert_string_equal (cfg.metadata_host, "127.0.0.1:9");
  assert_int_equal (cfg.chunk_size, 0);
  unsetenv ("CLOUD_RUN_SANDBOX_GCS_BUCKET");
  unsetenv ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX");
  unsetenv ("STORAGE_EMULATOR_HOST");
  unsetenv ("GCE_METADATA_HOST");
}

/* ---- round trips and upload faults --------------------------------------- */

static void
test_multi_chunk_object_round_trips_byte_identical (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  size_t len = 3 * MIB + 12345;
  uint8_t *d = make_data (len, 1);
  long puts_before = stat_of (&plain_srv, "chunk_puts");
  assert_upload_ok (st, "sandbox-snapshots/round trip/ä.tar", d, len, 70001);
  assert_true (stat_of (&plain_srv, "chunk_puts") - puts_before >= 13);
  assert_object_is (st, "sandbox-snapshots/round trip/ä.tar", d, len);
  /* An empty object and one of exactly one chunk. */
  assert_upload_ok (st, "empty.tar", d, 0, 1);
  assert_object_is (st, "empty.tar", d, 0);
  assert_upload_ok (st, "one-chunk.tar", d, 256 * KIB, 256 * KIB);
  assert_object_is (st, "one-chunk.tar", d, 256 * KIB);
  free (d);
  st->ops->destroy (st);
}

static void
test_upload_survives_injected_503s (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  size_t len = MIB + 999;
  uint8_t *d = make_data (len, 2);
  fault (&plain_srv, "{\"kind\": \"status\", \"code\": 503, \"count\": 2, \"methods\": [\"POST\"]}");
  fault (&plain_srv, "{\"kind\": \"status\", \"code\": 503, \"count\": 3, \"methods\": [\"PUT\"]}");
  /* A 503 whose request was applied: the client must learn the offset. */
  fault (&plain_srv, "{\"kind\": \"status\", \"code\": 503, \"count\": 1, \"methods\": [\"PUT\"], \"commit\": true}");
  assert_upload_ok (st, "o503.tar", d, len, 100000);
  assert_int_equal (stat_of (&plain_srv, "faults_pending"), 0);
  assert_object_is (st, "o503.tar", d, len);
  free (d);
  st->ops->destroy (st);
}

static void
test_upload_survives_429s (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  size_t len = 700 * KIB;
  uint8_t *d = make_data (len, 3);
  fault (&plain_srv, "{\"kind\": \"status\", \"code\": 429, \"count\": 4}");
  assert_upload_ok (st, "o429.tar", d, len, len);
  assert_int_equal (stat_of (&plain_srv, "faults_pending"), 0);
  assert_object_is (st, "o429.tar", d, len);
  free (d);
  st->ops->destroy (st);
}

static void
test_upload_survives_connection_dropped_mid_chunk (void **state)
{
  /* 1 MiB chunks; the server reads 60% of one (commits 512 KiB of it) and
   * hangs up: the writer must resume from 512 KiB into its buffer. A second
   * drop commits nothing. */
  snap_store_t *st = plain_store (MIB, 0);
  size_t len = 3 * MIB + 5;
  uint8_t *d = make_data (len, 4);
  fault (&plain_srv,
         "{\"kind\": \"drop\", \"count\": 1, \"methods\": [\"PUT\"], \"path\": \"upload_id=\", \"fraction\": 0.6}");
  fault (&plain_srv, "{\"kind\": \"drop\", \"count\": 1, \"methods\": [\"PUT\"], \"path\": \"upload_id=\", "
                     "\"fraction\": 0.1, \"commit\": false}");
  assert_upload_ok (st, "drop.tar", d, len, 64 * KIB);
  assert_int_equal (stat_of (&plain_srv, "faults_pending"), 0);
  assert_true (stat_of (&plain_srv, "status_queries") >= 2);
  assert_object_is (st, "drop.tar", d, len);
  free (d);
  st->ops->destroy (st);
}

static void
test_upload_resends_what_a_partial_commit_left (void **state)
{
  snap_store_t *st = plain_store (MIB, 0);
  size_t len = 2 * MIB + 77;
  uint8_t *d = make_data (len, 5);
  fault (&plain_srv, "{\"kind\": \"partial\", \"count\": 2}");
  assert_upload_ok (st, "partial.tar", d, len, 300 * KIB);
  assert_int_equal (stat_of (&plain_srv, "faults_pending"), 0);
  assert_object_is (st, "partial.tar", d, len);
  free (d);
  st->ops->destroy (st);
}

static void
test_slow_server_within_budget_works (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 2000);
  size_t len = 600 * KIB;
  uint8_t *d = make_data (len, 6);
  fault (&plain_srv, "{\"kind\": \"slow\", \"delay\": 1.0, \"count\": 3}");
  assert_upload_ok (st, "slow.tar", d, len, len);
  assert_int_equal (stat_of (&plain_srv, "faults_pending"), 0);
  assert_object_is (st, "slow.tar", d, len);
  free (d);
  st->ops->destroy (st);
}

static void
test_stalled_connection_is_detected_and_upload_resumes (void **state)
{
  /* The server sits on a chunk for 30 s; with a 1 s stall limit (curl
   * averages the speed over a few seconds, so it notices within ~6 s) the
   * client gives up on that exchange, asks for the committed offset (a
   * status query, which an answered chunk never needs) and goes on. */
  store_opts_t o = {.chunk = 256 * KIB, .stall_s = 1};
  snap_store_t *st = store_with (&o);
  size_t len = 800 * KIB;
  uint8_t *d = make_data (len, 7);
  fault (&plain_srv, "{\"kind\": \"slow\", \"delay\": 30, \"count\": 1, \"methods\": [\"PUT\"]}");
  long queries = stat_of (&plain_srv, "status_queries");
  double t0 = now_s ();
  assert_upload_ok (st, "stall.tar", d, len, len);
  assert_true (now_s () - t0 < 29.0); /* did not wait for the stalled answer */
  assert_true (stat_of (&plain_srv, "status_queries") - queries >= 1);
  assert_object_is (st, "stall.tar", d, len);
  free (d);
  st->ops->destroy (st);
}

static void
test_outage_longer_than_budget_fails_clearly_and_leaves_no_object (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 2000);
  size_t len = MIB;
  uint8_t *d = make_data (len, 8);
  fault (&plain_srv, "{\"kind\": \"status\", \"code\": 503, \"count\": 100000, \"methods\": [\"PUT\"]}");
  err_t err = ERR_INIT;
  double t0 = now_s ();
  assert_int_equal (upload (st, "outage.tar", d, len, len, &err), -1);
  double took = now_s () - t0;
  assert_true (took >= 1.9);
  assert_true (took < 15.0);
  assert_int_equal (err.status, ETIMEDOUT);
  assert_non_null (strstr (err_msg (&err), "gs://" BUCKET "/outage.tar"));
  assert_non_null (strstr (err_msg (&err), "HTTP 503"));
  err_release (&err);
  json_decref (ctl (&plain_srv, "/_control/reset", "{}"));
  assert_absent (st, "outage.tar");
  free (d);
  st->ops->destroy (st);
}

static void
test_abort_leaves_no_object (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  uint8_t *d = make_data (MIB, 9);
  err_t err = ERR_INIT;
  snap_writer_t *w = NULL;
  assert_int_equal (st->ops->writer_open (st, "aborted.tar", &w, &err), 0);
  assert_int_equal (st->ops->writer_write (w, d, MIB, &err), 0);
  st->ops->writer_abort (w);
  assert_absent (st, "aborted.tar");
  free (d);
  st->ops->destroy (st);
}

/* Cancels a store's requests after a while, from another thread. */
typedef struct cancel_later_s
{
  snap_store_t *st;
  long after_ms;
} cancel_later_t;

static void *
cancel_later_main (void *arg)
{
  cancel_later_t *c = arg;
  struct timespec ts = {c->after_ms / 1000, (c->after_ms % 1000) * 1000000L};
  nanosleep (&ts, NULL);
  c->st->ops->cancel_all (c->st);
  return NULL;
}

static void
test_cancel_all_ends_a_stalled_upload_at_once_and_leaves_no_object (void **state)
{
  /* Every chunk's PUT waits 30 s for its answer, and the retry budget is
   * 20 s: only the cancel ends the upload soon. */
  snap_store_t *st = plain_store (256 * KIB, 20000);
  size_t len = 800 * KIB;
  uint8_t *d = make_data (len, 10);
  fault (&plain_srv, "{\"kind\": \"slow\", \"delay\": 30, \"count\": 100, \"methods\": [\"PUT\"]}");
  cancel_later_t c = {.st = st, .after_ms = 500};
  pthread_t t;
  assert_int_equal (pthread_create (&t, NULL, cancel_later_main, &c), 0);
  err_t err = ERR_INIT;
  double t0 = now_s ();
  assert_int_equal (upload (st, "cancelled.tar", d, len, len, &err), -1);
  assert_true (now_s () - t0 < 5.0);
  if (strstr (err_msg (&err), "cancelled") == NULL)
    fail_msg ("the error does not say it was cancelled: %s", err_msg (&err));
  err_release (&err);
  pthread_join (t, NULL);
  /* Any later request fails at once, without reaching the server. */
  long requests = stat_of (&plain_srv, "requests");
  t0 = now_s ();
  assert_int_equal (st->ops->exists (st, "cancelled.tar", &err), -1);
  assert_true (now_s () - t0 < 1.0);
  err_release (&err);
  assert_int_equal (stat_of (&plain_srv, "requests"), requests);
  st->ops->destroy (st);
  json_decref (ctl (&plain_srv, "/_control/reset", "{}"));
  snap_store_t *fresh = plain_store (256 * KIB, 0);
  assert_absent (fresh, "cancelled.tar");
  fresh->ops->destroy (fresh);
  free (d);
}

/* ---- downloads ------------------------------------------------------------ */

static void
test_download_of_missing_object_is_enoent (void **state)
{
  snap_store_t *st = plain_store (0, 0);
  err_t err = ERR_INIT;
  snap_reader_t *r = NULL;
  assert_int_equal (st->ops->reader_open (st, "missing.tar", &r, &err), -1);
  assert_int_equal (err.status, ENOENT);
  assert_non_null (strstr (err_msg (&err), "no snapshot"));
  assert_non_null (strstr (err_msg (&err), "missing.tar"));
  err_release (&err);
  st->ops->destroy (st);
}

static void
test_download_with_corrupted_crc_is_ebadmsg (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  size_t len = 500 * KIB;
  uint8_t *d = make_data (len, 10);
  assert_upload_ok (st, "crc.tar", d, len, len);
  fault (&plain_srv, "{\"kind\": \"bad_hash\", \"count\": 1}");
  err_t err = ERR_INIT;
  uint8_t *got = NULL;
  size_t got_len = 0;
  assert_int_equal (download (st, "crc.tar", 64 * KIB, &got, &got_len, &err), -1);
  assert_int_equal (err.status, EBADMSG);
  assert_non_null (strstr (err_msg (&err), "crc32c mismatch"));
  err_release (&err);
  assert_object_is (st, "crc.tar", d, len); /* the next download is fine */
  free (d);
  st->ops->destroy (st);
}

static void
test_download_cut_short_is_an_error (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  size_t len = 900 * KIB;
  uint8_t *d = make_data (len, 11);
  assert_upload_ok (st, "cut.tar", d, len, len);
  fault (&plain_srv, "{\"kind\": \"truncate\", \"count\": 1}");
  err_t err = ERR_INIT;
  uint8_t *got = NULL;
  size_t got_len = 0;
  assert_int_equal (download (st, "cut.tar", 64 * KIB, &got, &got_len, &err), -1);
  assert_int_equal (err.status, EIO);
  assert_non_null (strstr (err_msg (&err), "cut.tar"));
  err_release (&err);
  free (d);
  st->ops->destroy (st);
}

static void
test_download_retries_its_start (void **state)
{
  snap_store_t *st = plain_store (256 * KIB, 0);
  size_t len = 300 * KIB;
  uint8_t *d = make_data (len, 12);
  assert_upload_ok (st, "retry-get.tar", d, len, len);
  fault (&plain_srv, "{\"kind\": \"status\", \"code\": 503, \"count\": 2, \"methods\": [\"GET\"]}");
  fault (&plain_srv, "{\"kind\": \"drop\", \"count\": 1, \"methods\": [\"GET\"]}");
  assert_object_is (st, "retry-get.tar", d, len);
  assert_int_equal (stat_of (&plain_srv, "faults_pending"), 0);
  free (d);
  st->ops->destroy (st);
}

static void
test_remove_and_exists (void **state)
{
  snap_store_t *st = plain_store (0, 0);
  err_t err = ERR_INIT;
  const uint8_t d[] = "tar";
  assert_upload_ok (st, "sandbox-snapshots/x.tar", d, 3, 3);
  assert_int_equal (st->ops->exists (st, "sandbox-snapshots/x.tar", &err), 1);
  assert_int_equal (st->ops->exists (st, "sandbox-snapshots/y.tar", &err), 0);
  assert_int_equal (st->ops->remove (st, "sandbox-snapshots/x.tar", &err), 0);
  assert_int_equal (st->ops->exists (st, "sandbox-snapshots/x.tar", &err), 0);
  assert_int_equal (st->ops->remove (st, "sandbox-snapshots/x.tar", &err), -1);
  assert_int_equal (err.status, ENOENT);
  err_release (&err);
  /* Every upload is a new generation, with its time. */
  snap_gen_t g1, g2;
  assert_int_equal (st->ops->stat (st, "sandbox-snapshots/x.tar", &g1, &err), 0);
  assert_string_equal (g1.gen, "");
  assert_upload_ok (st, "sandbox-snapshots/x.tar", d, 3, 3);
  assert_int_equal (st->ops->stat (st, "sandbox-snapshots/x.tar", &g1, &err), 1);
  assert_true (g1.gen[0] != '\0');
  assert_true (g1.mtime_ms > 1700000000000LL);
  assert_upload_ok (st, "sandbox-snapshots/x.tar", d, 3, 3);
  assert_int_equal (st->ops->stat (st, "sandbox-snapshots/x.tar", &g2, &err), 1);
  assert_string_not_equal (g1.gen, g2.gen);
  assert_int_equal (st->ops->remove (st, "sandbox-snapshots/x.tar", &err), 0);
  /* Names GCS refuses are refused before any request. */
  assert_int_equal (st->ops->exists (st, "a\nb", &err), -1);
  assert_int_equal (err.status, EINVAL);
  err_release (&err);
  st->ops->destroy (st);
}

/* ---- credentials ----------------------------------------------------------- */

static char *
read_text (const char *path)
{
  FILE *f = fopen (path, "r");
  assert_non_null (f);
  char *buf = calloc (1, 16384);
  assert_non_null (buf);
  size_t n = fread (buf, 1, 16383, f);
  fclose (f);
  buf[n] = '\0';
  return buf;
}

/* Writes a service-account key file for `pem_path` whose token_uri is the
 * auth server's /token; returns its path (static buffer per call site). */
static void
write_key_json (const char *pem_path, char *out, size_t cap)
{
  char *pem = read_text (pem_path);
  char uri[80];
  snprintf (uri, sizeof uri, "http://127.0.0.1:%d/token", auth_srv.port);
  json_t *key = json_pack ("{s:s, s:s, s:s, s:s, s:s}", "type", "service_account", "client_email",
                           "snapshots@test-project.iam.gserviceaccount.com", "private_key", pem, "private_key_id",
                           "k1", "token_uri", uri);
  snprintf (out, cap, "%s/%s.json", tmpdir, strrchr (pem_path, '/') + 1);
  assert_int_equal (json_dump_file (key, out, 0), 0);
  json_decref (key);
  free (pem);
}

/* A key whose token_uri is plain HTTP is refused when the storage endpoint
 * is https: the signed assertion and the token would travel unencrypted.
 * (Against a plain-http endpoint, as in these tests, it is accepted.) */
static void
test_plain_http_token_uri_is_refused_for_an_https_endpoint (void **state)
{
  char key[600];
  write_key_json (SA_KEY, key, sizeof key);
  gcs_config_t cfg = {.bucket = BUCKET, .endpoint = "https://storage.example.invalid", .credentials_file = key};
  snap_store_t *st = NULL;
  err_t err = ERR_INIT;
  assert_int_equal (gcs_store_new (&cfg, &st, &err), -1);
  assert_int_equal (err.status, EINVAL);
  assert_non_null (strstr (err_msg (&err), "plain HTTP"));
  err_release (&err);
}

static void
test_service_account_jwt_is_accepted_and_token_cached (void **state)
{
  char key[600];
  write_key_json (SA_KEY, key, sizeof key);
  store_opts_t o = {.credentials_file = key};
  snap_store_t *st = store_with (&o);
  long grants = stat_of (&auth_srv, "token_grants");
  size_t len = 600 * KIB;
  uint8_t *d = make_data (len, 13);
  assert_upload_ok (st, "sa.tar", d, len, len);
  assert_object_is (st, "sa.tar", d, len);
  err_t err = ERR_INIT;
  assert_int_equal (st->ops->exists (st, "sa.tar", &err), 1);
  assert_int_equal (stat_of (&auth_srv, "token_grants") - grants, 1);

  /* A revoked token: the API answers 401, the store fetches a new one. */
  json_decref (ctl (&auth_srv, "/_control/revoke", "{}"));
  assert_int_equal (st->ops->remove (st, "sa.tar", &err), 0);
  assert_int_equal (stat_of (&auth_srv, "token_grants") - grants, 2);
  free (d);
  st->ops->destroy (st);
}

typedef struct upload_job_s
{
  snap_store_t *st;
  int n;
  int rc;
} upload_job_t;

static void *
upload_thread (void *arg)
{
  upload_job_t *j = arg;
  char name[32];
  snprintf (name, sizeof name, "t%d.tar", j->n);
  uint8_t *d = make_data (300 * KIB + (size_t) j->n, (uint32_t) j->n + 100);
  err_t err = ERR_INIT;
  j->rc = upload (j->st, name, d, 300 * KIB + (size_t) j->n, 50000, &err);
  err_release (&err);
  free (d);
  return NULL;
}

static void
test_threads_share_one_token_fetch (void **state)
{
  char key[600];
  write_key_json (SA_KEY, key, sizeof key);
  store_opts_t o = {.credentials_file = key};
  snap_store_t *st = store_with (&o);
  long grants = stat_of (&auth_srv, "token_grants");
  pthread_t t[4];
  upload_job_t jobs[4];
  for (int i = 0; i < 4; i++)
    {
      jobs[i] = (upload_job_t){st, i, -1};
      assert_int_equal (pthread_create (&t[i], NULL, upload_thread, &jobs[i]), 0);
    }
  for (int i = 0; i < 4; i++)
    {
      pthread_join (t[i], NULL);
      assert_int_equal (jobs[i].rc, 0);
    }
  assert_int_equal (stat_of (&auth_srv, "token_grants") - grants, 1);
  assert_int_equal (stat_of (&auth_srv, "objects"), 4);
  st->ops->destroy (st);
}

static void
test_jwt_signed_by_another_key_is_refused (void **state)
{
  char key[600];
  write_key_json (OTHER_KEY, key, sizeof key);
  store_opts_t o = {.credentials_file = key};
  snap_store_t *st = store_with (&o);
  uint8_t d[16] = {0};
  err_t err = ERR_INIT;
  assert_int_equal (upload (st, "other.tar", d, sizeof d, sizeof d, &err), -1);
  assert_int_equal (err.status, EACCES);
  assert_non_null (strstr (err_msg (&err), "refused the credentials"));
  assert_non_null (strstr (err_msg (&err), "Invalid JWT Signature"));
  assert_non_null (strstr (err_msg (&err), "snapshots@test-project.iam.gserviceaccount.com"));
  assert_null (strstr (err_msg (&err), "PRIVATE KEY"));
  err_release (&err);
  assert_int_equal (stat_of (&auth_srv, "objects"), 0);
  st->ops->destroy (st);
}

static void
test_metadata_server_token_works (void **state)
{
  char host[64];
  snprintf (host, sizeof host, "127.0.0.1:%d", auth_srv.port);
  store_opts_t o = {.metadata = host};
  snap_store_t *st = store_with (&o);
  long grants = stat_of (&auth_srv, "metadata_grants");
  size_t len = 400 * KIB;
  uint8_t *d = make_data (len, 14);
  assert_upload_ok (st, "md.tar", d, len, len);
  assert_object_is (st, "md.tar", d, len);
  assert_int_equal (stat_of (&auth_srv, "metadata_grants") - grants, 1);
  free (d);
  st->ops->destroy (st);
}

static void
test_requests_without_credentials_are_refused_by_an_auth_server (void **state)
{
  store_opts_t o = {.auth_server_no_creds = true};
  snap_store_t *st = store_with (&o);
  err_t err = ERR_INIT;
  assert_int_equal (st->ops->exists (st, "x.tar", &err), -1);
  assert_int_equal (err.status, EACCES);
  assert_non_null (strstr (err_msg (&err), "HTTP 401"));
  err_release (&err);
  st->ops->destroy (st);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_crc32c_matches_known_vectors_on_both_paths),
      cmocka_unit_test (test_range_header_parsing_refuses_malformed_values),
      cmocka_unit_test (test_goog_hash_parsing_finds_crc32c_and_refuses_garbage),
      cmocka_unit_test (test_header_lines_match_names_in_any_case_only),
      cmocka_unit_test (test_bad_settings_are_refused_with_the_reason),
      cmocka_unit_test (test_config_from_env_reads_the_documented_variables),
      cmocka_unit_test_setup (test_multi_chunk_object_round_trips_byte_identical, test_setup),
      cmocka_unit_test_setup (test_upload_survives_injected_503s, test_setup),
      cmocka_unit_test_setup (test_upload_survives_429s, test_setup),
      cmocka_unit_test_setup (test_upload_survives_connection_dropped_mid_chunk, test_setup),
      cmocka_unit_test_setup (test_upload_resends_what_a_partial_commit_left, test_setup),
      cmocka_unit_test_setup (test_slow_server_within_budget_works, test_setup),
      cmocka_unit_test_setup (test_stalled_connection_is_detected_and_upload_resumes, test_setup),
      cmocka_unit_test_setup (test_outage_longer_than_budget_fails_clearly_and_leaves_no_object, test_setup),
      cmocka_unit_test_setup (test_abort_leaves_no_object, test_setup),
      cmocka_unit_test_setup (test_cancel_all_ends_a_stalled_upload_at_once_and_leaves_no_object, test_setup),
      cmocka_unit_test_setup (test_download_of_missing_object_is_enoent, test_setup),
      cmocka_unit_test_setup (test_download_with_corrupted_crc_is_ebadmsg, test_setup),
      cmocka_unit_test_setup (test_download_cut_short_is_an_error, test_setup),
      cmocka_unit_test_setup (test_download_retries_its_start, test_setup),
      cmocka_unit_test_setup (test_remove_and_exists, test_setup),
      cmocka_unit_test_setup (test_plain_http_token_uri_is_refused_for_an_https_endpoint, test_setup),
      cmocka_unit_test_setup (test_service_account_jwt_is_accepted_and_token_cached, test_setup),
      cmocka_unit_test_setup (test_threads_share_one_token_fetch, test_setup),
      cmocka_unit_test_setup (test_jwt_signed_by_another_key_is_refused, test_setup),
      cmocka_unit_test_setup (test_metadata_server_token_works, test_setup),
      cmocka_unit_test_setup (test_requests_without_credentials_are_refused_by_an_auth_server, test_setup),
  };
  return cmocka_run_group_tests (tests, group_setup, group_teardown);
}
