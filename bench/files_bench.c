/* files_bench: the file API of a running sandbox-gateway (and of
 * sandbox-shim in front of it) against what a client can do without it,
 * measured in the same run, run by run:
 *
 *   1. a large file (1 GiB of pseudo-random bytes): WriteFile in 256 KiB data
 *      messages against Run of `cat > f` fed the same bytes as 256 KiB stdin
 *      messages (the stream of a command's input), and against `head -c N
 *      /dev/zero > f` run inside the sandbox through Exec (the sandbox's own
 *      write, nothing transferred); ReadFile against the Exec stream of
 *      `cat f` (stdout counted and discarded);
 *   2. the same file through the shim: `curl -T` (PUT) and `curl -o
 *      /dev/null` (GET), spawned and timed here, against WriteFile and
 *      ReadFile straight to the gateway;
 *   3. a smaller file (16 MiB) the way clients moved files before the file
 *      API: uploaded as base64 in 48 KiB argv chunks, one Exec of
 *      `sh -c 'echo CHUNK | base64 -d >> f'` each, and downloaded as the
 *      Exec stream of `base64 f` decoded here; against WriteFile and
 *      ReadFile of the same bytes;
 *   4. small files: 10 000 files of 4 KiB written by 8 threads, one
 *      WriteFile each, against one Exec each of `sh -c 'echo B64 | base64 -d
 *      > f'`; then the directory listed by ListDir (depth 1) against the
 *      Exec stream of `ls -ln`.
 *
 * Every transfer's size is checked (a byte count, a FileInfo or a Stat) and
 * the first run of each path, a warm-up that is not counted, also checks
 * the content's SHA-256 both ways, so a broken path fails loudly. MB/s are
 * 10^6 bytes a second of file data.
 *
 * The secret comes from CLOUD_RUN_SANDBOX_GATEWAY_SECRET. bench/files builds
 * everything, starts a gateway and a shim and runs this. Threading: the main
 * thread, and worker threads in the small-file stage only (each with its
 * own calls on the shared channel).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "common/err.h"
#include "common/rpc/rpc.h"
#include "sandbox/v1/sandbox.pb-c.h"

#define PROG "files_bench"
#define SANDBOX_ID "filesbench"
#define PIECE (256 * 1024)      /* data messages of WriteFile and Run's stdin */
#define SEED_B64_CHUNK 49152    /* base64 characters per Exec argv in the seed's upload */
#define SMALL_SIZE 4096         /* each small file */
#define COLLECT_MAX (256 << 20) /* most output collect_exec keeps */
#define CALL_MS 600000

typedef struct opts_s
{
  const char *target; /* the gateway */
  const char *shim;   /* HOST:PORT; NULL: no shim rows */
  const char *dir;    /* work directory (a tmpfs) */
  const char *header; /* a file with the shim's Authorization header */
  const char *markdown;
  int runs;
  long mib;
  long seed_mib;
  int small;
  int threads;
  const char *stages; /* comma-separated: large, base64, small */
} opts_t;

static opts_t O
    = {.runs = 3, .mib = 1024, .seed_mib = 16, .small = 10000, .threads = 8, .stages = "large,base64,small"};

static rpc_channel_t *CH;
static const uint8_t *SRC; /* the source file, mapped */
static uint64_t SRC_LEN;
static char SRC_PATH[4096];

/* ---- helpers ------------------------------------------------------------- */

static void die (const char *fmt, ...) __attribute__ ((format (printf, 1, 2), noreturn));

static void
die (const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  fprintf (stderr, PROG ": ");
  vfprintf (stderr, fmt, ap);
  fprintf (stderr, "\n");
  va_end (ap);
  exit (1);
}

static void
sha256_hex (const uint8_t *data, size_t len, char out[65])
{
  unsigned char md[32];
  unsigned int n = 0;
  if (EVP_Digest (data, len, md, &n, EVP_sha256 (), NULL) != 1 || n != 32)
    die ("sha256 failed");
  for (int i = 0; i < 32; i++)
    snprintf (out + 2 * i, 3, "%02x", md[i]);
}

static void
sha256_final_hex (EVP_MD_CTX *ctx, char out[65])
{
  unsigned char md[32];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex (ctx, md, &n) != 1 || n != 32)
    die ("sha256 failed");
  for (int i = 0; i < 32; i++)
    snprintf (out + 2 * i, 3, "%02x", md[i]);
}

/* A unary call with the authorization metadata; the reply to *resp (NULL:
 * freed). */
static int
unary (const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
       ProtobufCMessage **resp, err_t *err)
{
  ProtobufCMessage *m = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = rpc_client_unary (CH, method, 60000, BC_MD, 1, req, desc, &m, &st, err);
  rpc_status_release (&st);
  if (rc == 0 && resp != NULL)
    *resp = m;
  else if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
  return rc;
}

/* The size of a regular file in the sandbox (Stat); dies otherwise. */
static uint64_t
stat_size (const char *path)
{
  Sandbox__V1__StatRequest req = SANDBOX__V1__STAT_REQUEST__INIT;
  req.sandbox_id = SANDBOX_ID;
  req.path = (char *) path;
  ProtobufCMessage *m = NULL;
  err_t err = ERR_INIT;
  if (unary ("/sandbox.v1.Sandbox/Stat", &req.base, &sandbox__v1__file_info__descriptor, &m, &err) < 0)
    bc_die (PROG, path, &err);
  Sandbox__V1__FileInfo *fi = (Sandbox__V1__FileInfo *) m;
  if (fi->type != SANDBOX__V1__FILE_TYPE__FILE_TYPE_FILE)
    die ("`%s` is not a regular file", path);
  uint64_t size = fi->size;
  protobuf_c_message_free_unpacked (m, NULL);
  return size;
}

/* Dies unless `path` in the sandbox is a regular file of `want` bytes. */
static void
check_size (const char *what, const char *path, uint64_t want)
{
  uint64_t got = stat_size (path);
  if (got != want)
    die ("%s: `%s` has %llu bytes, not %llu", what, path, (unsigned long long) got, (unsigned long long) want);
}

/* Remove of `path` (recursive); a missing path is fine. */
static void
remove_path (const char *path)
{
  Sandbox__V1__RemoveRequest req = SANDBOX__V1__REMOVE_REQUEST__INIT;
  req.sandbox_id = SANDBOX_ID;
  req.path = (char *) path;
  req.recursive = true;
  err_t err = ERR_INIT;
  if (unary ("/sandbox.v1.Sandbox/Remove", &req.base, &sandbox__v1__remove_response__descriptor, NULL, &err) < 0
      && err.status != ENOENT)
    bc_die (PROG, "remove", &err);
  err_release (&err);
}

static void
make_dir (const char *path)
{
  Sandbox__V1__MakeDirRequest req = SANDBOX__V1__MAKE_DIR_REQUEST__INIT;
  req.sandbox_id = SANDBOX_ID;
  req.path = (char *) path;
  req.parents = true;
  err_t err = ERR_INIT;
  if (unary ("/sandbox.v1.Sandbox/MakeDir", &req.base, &sandbox__v1__file_info__descriptor, NULL, &err) < 0)
    bc_die (PROG, "mkdir", &err);
}

/* ---- exec and Run -------------------------------------------------------- */

typedef struct buf_s
{
  char *p;
  size_t len, cap;
} buf_t;

static void
buf_add (buf_t *b, const void *data, size_t len)
{
  if (b->len + len + 1 > b->cap)
    {
      size_t cap = b->cap ? b->cap : 65536;
      while (cap < b->len + len + 1)
        cap *= 2;
      b->p = realloc (b->p, cap);
      if (b->p == NULL)
        die ("out of memory");
      b->cap = cap;
    }
  memcpy (b->p + b->len, data, len);
  b->len += len;
  b->p[b->len] = '\0';
}

/* Exec of argv with its stdout kept in *out (at most COLLECT_MAX bytes);
 * fails unless the command exits 0. */
static int
exec_collect (char **argv, size_t argc, buf_t *out, err_t *err)
{
  Sandbox__V1__ExecRequest req = SANDBOX__V1__EXEC_REQUEST__INIT;
  req.sandbox_id = SANDBOX_ID;
  req.argv = argv;
  req.n_argv = argc;
  rpc_client_call_t *c = NULL;
  if (bc_call_start (CH, "/sandbox.v1.Sandbox/Exec", CALL_MS, &req.base, &c, err) < 0)
    return -1;
  int exit_code = -2;
  buf_t errb = {0};
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__exec_event__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          free (errb.p);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__ExecEvent *ev = (Sandbox__V1__ExecEvent *) m;
      if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT && out->len + ev->stdout.len <= COLLECT_MAX)
        buf_add (out, ev->stdout.data, ev->stdout.len);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR && errb.len < 200)
        buf_add (&errb, ev->stderr.data, ev->stderr.len);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && ev->exit != NULL)
        exit_code = ev->exit->exit_code;
      protobuf_c_message_free_unpacked (m, NULL);
    }
  int rc = bc_call_finish (c, "exec", err);
  if (rc == 0 && exit_code != 0)
    rc = err_make (err, EIO, "exec `%s`: exit %d; stderr: %.200s", argv[0], exit_code, errb.p ? errb.p : "");
  free (errb.p);
  return rc;
}

/* `sha256sum path` in the sandbox; dies unless it is `want`. */
static void
check_sha_inside (const char *what, const char *path, const char *want)
{
  char *argv[] = {"sha256sum", (char *) path};
  buf_t out = {0};
  err_t err = ERR_INIT;
  if (exec_collect (argv, 2, &out, &err) < 0)
    bc_die (PROG, "sha256sum", &err);
  if (out.len < 64 || strncmp (out.p, want, 64) != 0)
    die ("%s: `%s` in the sandbox has sha256 %.64s, the source %s", what, path, out.p ? out.p : "", want);
  fprintf (stderr, PROG ": %s: sha256 of `%s` checked\n", what, path);
  free (out.p);
}

/* The rest of a Run call: its events to the end; -1 unless it exited 0. */
static int
run_finish (rpc_client_call_t *c, err_t *err)
{
  int exit_code = -2;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__process_event__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__ProcessEvent *ev = (Sandbox__V1__ProcessEvent *) m;
      if (ev->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT && ev->exit != NULL)
        exit_code = ev->exit->exit_code;
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "Run", err) < 0)
    return -1;
  return exit_code == 0 ? 0 : err_make (err, EIO, "Run: exit %d", exit_code);
}

/* Run of `sh -c 'cat > PATH'` fed `len` bytes of `data` as stdin messages
 * of PIECE bytes, then EOF, until the command's exit. */
static int
run_cat_into (const char *path, const uint8_t *data, uint64_t len, err_t *err)
{
  char script[4200];
  snprintf (script, sizeof script, "cat > '%s'", path);
  char *argv[] = {"sh", "-c", script};
  Sandbox__V1__ProcessStart start = SANDBOX__V1__PROCESS_START__INIT;
  start.sandbox_id = SANDBOX_ID;
  start.argv = argv;
  start.n_argv = 3;
  Sandbox__V1__ProcessInput in = SANDBOX__V1__PROCESS_INPUT__INIT;
  in.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_START;
  in.start = &start;
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (CH, "/sandbox.v1.Sandbox/Run", CALL_MS, BC_MD, 1, &c, err) < 0)
    return -1;
  int rc = rpc_client_send (c, &in.base, err);
  for (uint64_t off = 0; rc == 0 && off < len;)
    {
      size_t n = len - off < PIECE ? (size_t) (len - off) : PIECE;
      Sandbox__V1__ProcessInput piece = SANDBOX__V1__PROCESS_INPUT__INIT;
      piece.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_STDIN;
      piece.stdin = (ProtobufCBinaryData){.len = n, .data = (uint8_t *) data + off};
      rc = rpc_client_send (c, &piece.base, err);
      off += n;
    }
  if (rc == 0)
    {
      Sandbox__V1__ProcessInput eof = SANDBOX__V1__PROCESS_INPUT__INIT;
      eof.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_CLOSE_STDIN;
      eof.close_stdin = true;
      rc = rpc_client_send (c, &eof.base, err);
    }
  if (rc == 0)
    rc = rpc_client_close_send (c, err);
  if (rc < 0)
    {
      rpc_client_destroy (c);
      return -1;
    }
  return run_finish (c, err);
}

/* ---- WriteFile and ReadFile ---------------------------------------------- */

/* The reply of a WriteFile call whose sending ended with `rc`: a status
 * that is not OK counts only when our side did not fail first. */
static int
write_file_finish (rpc_client_call_t *c, int rc, uint64_t *size, err_t *err)
{
  if (rc < 0 && err->status != ECANCELED)
    rpc_client_cancel (c);
  ProtobufCMessage *m = NULL;
  if (rc == 0 || err->status == ECANCELED)
    {
      err_release (err);
      if (rpc_client_recv (c, &sandbox__v1__file_info__descriptor, &m, err) < 0)
        err_release (err);
      rc = 0;
    }
  if (m != NULL)
    {
      *size = ((Sandbox__V1__FileInfo *) m)->size;
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "WriteFile", rc == 0 ? err : NULL) < 0)
    rc = -1;
  if (rc == 0 && m == NULL)
    rc = err_make (err, EIO, "WriteFile: no FileInfo in the reply");
  return rc;
}

/* WriteFile of `len` bytes of `data` to `path` in data messages of `piece`
 * bytes; the size in the reply's FileInfo must be `len`. */
static int
write_file (const char *path, const uint8_t *data, uint64_t len, size_t piece, err_t *err)
{
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (CH, "/sandbox.v1.Sandbox/WriteFile", CALL_MS, BC_MD, 1, &c, err) < 0)
    return -1;
  Sandbox__V1__WriteFileHeader hdr = SANDBOX__V1__WRITE_FILE_HEADER__INIT;
  hdr.sandbox_id = SANDBOX_ID;
  hdr.path = (char *) path;
  hdr.mode = 0644;
  Sandbox__V1__WriteFileRequest req = SANDBOX__V1__WRITE_FILE_REQUEST__INIT;
  req.payload_case = SANDBOX__V1__WRITE_FILE_REQUEST__PAYLOAD_HEADER;
  req.header = &hdr;
  int rc = rpc_client_send (c, &req.base, err);
  for (uint64_t off = 0; rc == 0 && off < len;)
    {
      size_t n = len - off < piece ? (size_t) (len - off) : piece;
      Sandbox__V1__WriteFileRequest d = SANDBOX__V1__WRITE_FILE_REQUEST__INIT;
      d.payload_case = SANDBOX__V1__WRITE_FILE_REQUEST__PAYLOAD_DATA;
      d.data = (ProtobufCBinaryData){.len = n, .data = (uint8_t *) data + off};
      rc = rpc_client_send (c, &d.base, err);
      off += n;
    }
  if (rc == 0)
    rc = rpc_client_close_send (c, err);
  uint64_t size = UINT64_MAX;
  if (write_file_finish (c, rc, &size, err) < 0)
    return -1;
  if (size != len)
    return err_make (err, EIO, "WriteFile `%s`: the reply says %llu bytes, %llu sent", path,
                     (unsigned long long) size, (unsigned long long) len);
  return 0;
}

/* ReadFile of `path` to its end, every chunk counted (and hashed into
 * `hash` unless NULL) and discarded, or appended to `keep` unless NULL.
 * The bytes received and the size in the first chunk's FileInfo must both
 * be `want`. */
static int
read_file (const char *path, uint64_t want, EVP_MD_CTX *hash, err_t *err)
{
  Sandbox__V1__ReadFileRequest req = SANDBOX__V1__READ_FILE_REQUEST__INIT;
  req.sandbox_id = SANDBOX_ID;
  req.path = (char *) path;
  rpc_client_call_t *c = NULL;
  if (bc_call_start (CH, "/sandbox.v1.Sandbox/ReadFile", CALL_MS, &req.base, &c, err) < 0)
    return -1;
  uint64_t got = 0, info_size = UINT64_MAX;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__file_chunk__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__FileChunk *ch = (Sandbox__V1__FileChunk *) m;
      if (ch->info != NULL)
        info_size = ch->info->size;
      got += ch->data.len;
      if (hash != NULL)
        EVP_DigestUpdate (hash, ch->data.data, ch->data.len);
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "ReadFile", err) < 0)
    return -1;
  if (got != want || info_size != want)
    return err_make (err, EIO, "ReadFile `%s`: %llu bytes received, FileInfo says %llu, %llu expected", path,
                     (unsigned long long) got, (unsigned long long) info_size, (unsigned long long) want);
  return 0;
}

/* ReadFile of `path` with the received stream's sha256 compared to `want`. */
static void
read_file_checked (const char *what, const char *path, uint64_t len, const char *want)
{
  EVP_MD_CTX *ctx = EVP_MD_CTX_new ();
  if (ctx == NULL || EVP_DigestInit_ex (ctx, EVP_sha256 (), NULL) != 1)
    die ("sha256 init failed");
  err_t err = ERR_INIT;
  if (read_file (path, len, ctx, &err) < 0)
    bc_die (PROG, what, &err);
  char got[65];
  sha256_final_hex (ctx, got);
  EVP_MD_CTX_free (ctx);
  if (strcmp (got, want) != 0)
    die ("%s: ReadFile of `%s` has sha256 %s, the source %s", what, path, got, want);
  fprintf (stderr, PROG ": %s: sha256 of ReadFile `%s` checked\n", what, path);
}

/* ---- curl ---------------------------------------------------------------- */

/* Runs curl with `args` (after `curl -sS -H @HEADER`), its stdout read into
 * `out` (NUL-terminated, at most outlen - 1 bytes kept) and, when `hash`
 * is not NULL, hashed; the bytes of stdout go to *bytes. The wait status,
 * or -1 when it could not start. */
static int
curl_run (char **args, char *out, size_t outlen, EVP_MD_CTX *hash, uint64_t *bytes)
{
  char hdr[4200];
  snprintf (hdr, sizeof hdr, "@%s", O.header);
  char *argv[24] = {"curl", "-sS", "-H", hdr};
  int k = 4;
  for (int i = 0; args[i] != NULL && k < 23; i++)
    argv[k++] = args[i];
  argv[k] = NULL;
  int p[2];
  if (pipe2 (p, O_CLOEXEC) < 0)
    return -1;
  fcntl (p[0], F_SETPIPE_SZ, 1 << 20);
  pid_t pid = bc_spawn (argv, p[1], 2);
  close (p[1]);
  if (pid < 0)
    {
      close (p[0]);
      return -1;
    }
  static uint8_t buf[1 << 20];
  size_t kept = 0;
  uint64_t got = 0;
  for (;;)
    {
      ssize_t n = read (p[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      got += (uint64_t) n;
      if (hash != NULL)
        EVP_DigestUpdate (hash, buf, (size_t) n);
      size_t take = (size_t) n < outlen - 1 - kept ? (size_t) n : outlen - 1 - kept;
      memcpy (out + kept, buf, take);
      kept += take;
    }
  close (p[0]);
  out[kept] = '\0';
  if (bytes != NULL)
    *bytes = got;
  return bc_wait (pid);
}

static void
shim_url (char *url, size_t len, const char *path)
{
  snprintf (url, len, "http://%s/sandboxes/" SANDBOX_ID "/files?path=%s", O.shim, path);
}

/* `curl -T SRC` to PUT `path`: must answer 201 having sent every byte. */
static void
curl_put (const char *path)
{
  char url[4400];
  shim_url (url, sizeof url, path);
  char *args[] = {"-T", SRC_PATH, "-o", "/dev/null", "-w", "%{http_code} %{size_upload}", url, NULL};
  char out[128];
  int st = curl_run (args, out, sizeof out, NULL, NULL);
  unsigned code = 0;
  unsigned long long sent = 0;
  if (st != 0 || sscanf (out, "%u %llu", &code, &sent) != 2 || code != 201 || sent != SRC_LEN)
    die ("curl PUT `%s`: wait status %d, `%s` (201 and %llu bytes expected)", url, st, out,
         (unsigned long long) SRC_LEN);
}

/* `curl -o /dev/null` of `path`: must answer 200 with every byte. With
 * `check`, the body goes through a pipe here instead and its sha256 must
 * be the source's. */
static void
curl_get (const char *path, const char *check)
{
  char url[4400];
  shim_url (url, sizeof url, path);
  char out[128];
  if (check == NULL)
    {
      char *args[] = {"-o", "/dev/null", "-w", "%{http_code} %{size_download}", url, NULL};
      int st = curl_run (args, out, sizeof out, NULL, NULL);
      unsigned code = 0;
      unsigned long long got = 0;
      if (st != 0 || sscanf (out, "%u %llu", &code, &got) != 2 || code != 200 || got != SRC_LEN)
        die ("curl GET `%s`: wait status %d, `%s` (200 and %llu bytes expected)", url, st, out,
             (unsigned long long) SRC_LEN);
      return;
    }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new ();
  if (ctx == NULL || EVP_DigestInit_ex (ctx, EVP_sha256 (), NULL) != 1)
    die ("sha256 init failed");
  char *args[] = {"--fail", "-o", "-", url, NULL};
  uint64_t got = 0;
  int st = curl_run (args, out, sizeof out, ctx, &got);
  char sha[65];
  sha256_final_hex (ctx, sha);
  EVP_MD_CTX_free (ctx);
  if (st != 0 || got != SRC_LEN || strcmp (sha, check) != 0)
    die ("curl GET `%s`: wait status %d, %llu bytes, sha256 %s (%llu bytes, %s expected)", url, st,
         (unsigned long long) got, sha, (unsigned long long) SRC_LEN, check);
  fprintf (stderr, PROG ": shim GET: sha256 checked\n");
}

/* ---- 1 and 2: the large file --------------------------------------------- */

typedef struct big_run_s
{
  double write, run_cat, head, put; /* ms */
  double read, exec_cat, get;
} big_run_t;

/* The write side of one run: WriteFile, Run `cat > f`, `head -c` inside,
 * curl PUT. Each target is removed first (not timed) and, but for the
 * file ReadFile reads, after its size is checked. */
static void
big_writes (big_run_t *r, bool first, const char *sha)
{
  err_t err = ERR_INIT;
  remove_path ("/root/big");
  double t0 = bc_now_ms ();
  if (write_file ("/root/big", SRC, SRC_LEN, PIECE, &err) < 0)
    bc_die (PROG, "WriteFile", &err);
  r->write = bc_now_ms () - t0;
  if (first)
    check_sha_inside ("WriteFile", "/root/big", sha);

  remove_path ("/root/run");
  t0 = bc_now_ms ();
  if (run_cat_into ("/root/run", SRC, SRC_LEN, &err) < 0)
    bc_die (PROG, "Run cat > f", &err);
  r->run_cat = bc_now_ms () - t0;
  check_size ("Run cat > f", "/root/run", SRC_LEN);
  remove_path ("/root/run");

  char script[128];
  snprintf (script, sizeof script, "head -c %llu /dev/zero > /root/zero", (unsigned long long) SRC_LEN);
  char *argv[] = {"sh", "-c", script};
  remove_path ("/root/zero");
  t0 = bc_now_ms ();
  if (bc_exec (CH, SANDBOX_ID, argv, 3, 0, NULL, &err) < 0)
    bc_die (PROG, "head -c > f", &err);
  r->head = bc_now_ms () - t0;
  check_size ("head -c > f", "/root/zero", SRC_LEN);
  remove_path ("/root/zero");

  if (O.shim == NULL)
    return;
  remove_path ("/root/put");
  t0 = bc_now_ms ();
  curl_put ("/root/put");
  r->put = bc_now_ms () - t0;
  check_size ("shim PUT", "/root/put", SRC_LEN);
  if (first)
    check_sha_inside ("shim PUT", "/root/put", sha);
  remove_path ("/root/put");
}

/* The read side of one run, of the file big_writes left: ReadFile, the
 * Exec stream of `cat f`, curl GET. */
static void
big_reads (big_run_t *r, bool first, const char *sha)
{
  err_t err = ERR_INIT;
  if (first)
    read_file_checked ("ReadFile", "/root/big", SRC_LEN, sha);
  double t0 = bc_now_ms ();
  if (read_file ("/root/big", SRC_LEN, NULL, &err) < 0)
    bc_die (PROG, "ReadFile", &err);
  r->read = bc_now_ms () - t0;

  char *argv[] = {"cat", "/root/big"};
  uint64_t got = 0;
  t0 = bc_now_ms ();
  if (bc_exec (CH, SANDBOX_ID, argv, 2, 0, &got, &err) < 0)
    bc_die (PROG, "Exec cat", &err);
  r->exec_cat = bc_now_ms () - t0;
  if (got != SRC_LEN)
    die ("Exec cat: %llu bytes of stdout, %llu expected", (unsigned long long) got, (unsigned long long) SRC_LEN);

  if (O.shim == NULL)
    return;
  if (first)
    curl_get ("/root/big", sha);
  t0 = bc_now_ms ();
  curl_get ("/root/big", NULL);
  r->get = bc_now_ms () - t0;
}

static void
bench_big (const char *sha)
{
  bc_series_t write = {0}, run_cat = {0}, head = {0}, put = {0}, read = {0}, exec_cat = {0}, get = {0};
  fprintf (stderr, PROG ": large file: %llu bytes, 1 warm-up + %d runs of each\n", (unsigned long long) SRC_LEN,
           O.runs);
  for (int i = 0; i <= O.runs; i++)
    {
      big_run_t r = {0};
      big_writes (&r, i == 0, sha);
      big_reads (&r, i == 0, sha);
      fprintf (stderr,
               PROG
               ": large %d: WriteFile %.0f ms, Run cat>f %.0f ms, head>f %.0f ms, PUT %.0f ms; ReadFile %.0f ms, "
               "Exec cat %.0f ms, GET %.0f ms%s\n",
               i, r.write, r.run_cat, r.head, r.put, r.read, r.exec_cat, r.get, i == 0 ? " (warm-up)" : "");
      if (i == 0)
        continue;
      bc_series_add (&write, bc_mbps (SRC_LEN, r.write));
      bc_series_add (&run_cat, bc_mbps (SRC_LEN, r.run_cat));
      bc_series_add (&head, bc_mbps (SRC_LEN, r.head));
      bc_series_add (&read, bc_mbps (SRC_LEN, r.read));
      bc_series_add (&exec_cat, bc_mbps (SRC_LEN, r.exec_cat));
      if (O.shim != NULL)
        {
          bc_series_add (&put, bc_mbps (SRC_LEN, r.put));
          bc_series_add (&get, bc_mbps (SRC_LEN, r.get));
        }
    }
  char what[96];
  double mib = (double) SRC_LEN / (1 << 20);
  snprintf (what, sizeof what, "WriteFile %.0f MiB, 256 KiB msgs", mib);
  bc_row_add (what, "MB/s", &write, 1, "Run `cat > f`, 256 KiB stdin", &run_cat);
  snprintf (what, sizeof what, "WriteFile %.0f MiB (vs the sandbox's own write)", mib);
  bc_row_add (what, "MB/s", &write, 1, "Exec `head -c N /dev/zero > f`", &head);
  snprintf (what, sizeof what, "ReadFile %.0f MiB", mib);
  bc_row_add (what, "MB/s", &read, 1, "Exec `cat f` (stdout stream)", &exec_cat);
  if (O.shim != NULL)
    {
      snprintf (what, sizeof what, "shim PUT %.0f MiB (curl -T)", mib);
      bc_row_add (what, "MB/s", &put, 1, "WriteFile, direct gRPC", &write);
      snprintf (what, sizeof what, "shim GET %.0f MiB (curl -o /dev/null)", mib);
      bc_row_add (what, "MB/s", &get, 1, "ReadFile, direct gRPC", &read);
    }
  remove_path ("/root/big");
}

/* ---- 3: the seed's method ------------------------------------------------ */

/* Uploads `len` bytes of `data` to `path` as base64 in argv chunks of
 * SEED_B64_CHUNK characters, one Exec of `sh -c 'echo CHUNK | base64 -d
 * >> PATH'` each. */
static void
seed_upload (const char *path, const uint8_t *data, uint64_t len)
{
  static char script[SEED_B64_CHUNK + 4400];
  size_t raw = SEED_B64_CHUNK / 4 * 3;
  err_t err = ERR_INIT;
  for (uint64_t off = 0; off < len; off += raw)
    {
      size_t n = len - off < raw ? (size_t) (len - off) : raw;
      int k = snprintf (script, sizeof script, "echo '");
      k += EVP_EncodeBlock ((unsigned char *) script + k, data + off, (int) n);
      snprintf (script + k, sizeof script - (size_t) k, "' | base64 -d >> '%s'", path);
      char *argv[] = {"sh", "-c", script};
      if (bc_exec (CH, SANDBOX_ID, argv, 3, 0, NULL, &err) < 0)
        bc_die (PROG, "seed upload", &err);
    }
}

/* Downloads `path` as the Exec stream of `base64 path`, decoded here; the
 * decoded bytes' length must be `len` and, with `sha`, their sha256 too. */
static void
seed_download (const char *path, uint64_t len, const char *sha)
{
  char *argv[] = {"base64", (char *) path};
  buf_t out = {0};
  err_t err = ERR_INIT;
  if (exec_collect (argv, 2, &out, &err) < 0)
    bc_die (PROG, "seed download", &err);
  /* base64(1) wraps its lines at 76 columns: drop the newlines, decode. */
  size_t k = 0;
  for (size_t i = 0; i < out.len; i++)
    if (out.p[i] != '\n')
      out.p[k++] = out.p[i];
  uint8_t *dec = malloc (k / 4 * 3 + 3);
  if (dec == NULL)
    die ("out of memory");
  int n = k % 4 == 0 ? EVP_DecodeBlock (dec, (unsigned char *) out.p, (int) k) : -1;
  if (n >= 0 && k >= 1 && out.p[k - 1] == '=')
    n -= k >= 2 && out.p[k - 2] == '=' ? 2 : 1;
  if (n < 0 || (uint64_t) n != len)
    die ("seed download: %d bytes decoded from %zu characters, %llu expected", n, k, (unsigned long long) len);
  if (sha != NULL)
    {
      char got[65];
      sha256_hex (dec, (size_t) n, got);
      if (strcmp (got, sha) != 0)
        die ("seed download: sha256 %s, the source %s", got, sha);
      fprintf (stderr, PROG ": seed download: sha256 checked\n");
    }
  free (dec);
  free (out.p);
}

typedef struct seed_run_s
{
  double write, upload, read, download; /* ms */
} seed_run_t;

static void
seed_once (seed_run_t *r, uint64_t len, bool first, const char *sha)
{
  err_t err = ERR_INIT;
  remove_path ("/root/seed-ours");
  double t0 = bc_now_ms ();
  if (write_file ("/root/seed-ours", SRC, len, PIECE, &err) < 0)
    bc_die (PROG, "WriteFile", &err);
  r->write = bc_now_ms () - t0;
  remove_path ("/root/seed-b64");
  t0 = bc_now_ms ();
  seed_upload ("/root/seed-b64", SRC, len);
  r->upload = bc_now_ms () - t0;
  check_size ("seed upload", "/root/seed-b64", len);
  if (first)
    check_sha_inside ("seed upload", "/root/seed-b64", sha);

  t0 = bc_now_ms ();
  if (read_file ("/root/seed-ours", len, NULL, &err) < 0)
    bc_die (PROG, "ReadFile", &err);
  r->read = bc_now_ms () - t0;
  t0 = bc_now_ms ();
  seed_download ("/root/seed-b64", len, first ? sha : NULL);
  r->download = bc_now_ms () - t0;
}

static void
bench_seed (const char *src_sha)
{
  (void) src_sha; /* the seed file's own sha256 is computed here */
  uint64_t len = (uint64_t) O.seed_mib << 20;
  if (len > SRC_LEN)
    len = SRC_LEN;
  char sha[65];
  sha256_hex (SRC, len, sha);
  bc_series_t write = {0}, upload = {0}, read = {0}, download = {0};
  fprintf (stderr, PROG ": base64 through Exec: %llu bytes, 1 warm-up + %d runs of each\n", (unsigned long long) len,
           O.runs);
  for (int i = 0; i <= O.runs; i++)
    {
      seed_run_t r = {0};
      seed_once (&r, len, i == 0, sha);
      fprintf (stderr,
               PROG
               ": base64 %d: WriteFile %.0f ms, Exec upload %.0f ms; ReadFile %.0f ms, Exec download %.0f ms%s\n",
               i, r.write, r.upload, r.read, r.download, i == 0 ? " (warm-up)" : "");
      if (i == 0)
        continue;
      bc_series_add (&write, bc_mbps (len, r.write));
      bc_series_add (&upload, bc_mbps (len, r.upload));
      bc_series_add (&read, bc_mbps (len, r.read));
      bc_series_add (&download, bc_mbps (len, r.download));
    }
  char what[96];
  snprintf (what, sizeof what, "upload %.0f MiB: WriteFile", (double) len / (1 << 20));
  bc_row_add (what, "MB/s", &write, 1, "Exec per 48 KiB base64 argv", &upload);
  snprintf (what, sizeof what, "download %.0f MiB: ReadFile", (double) len / (1 << 20));
  bc_row_add (what, "MB/s", &read, 1, "Exec `base64 f`, decoded", &download);
  remove_path ("/root/seed-ours");
  remove_path ("/root/seed-b64");
}

/* ---- 4: small files ------------------------------------------------------ */

typedef struct small_job_s
{
  pthread_t t;
  int first, step; /* files first, first + step, ... */
  bool exec;       /* the baseline: one Exec of base64 -d each */
  const char *dir;
  err_t err;
  int failed;
} small_job_t;

static const uint8_t *
small_data (int i)
{
  return SRC + ((uint64_t) i * SMALL_SIZE) % (SRC_LEN - SMALL_SIZE);
}

static void *
small_worker (void *arg)
{
  small_job_t *j = arg;
  char path[256];
  static __thread char script[SMALL_SIZE * 2 + 512];
  for (int i = j->first; i < O.small && j->failed == 0; i += j->step)
    {
      snprintf (path, sizeof path, "%s/f%05d", j->dir, i);
      if (!j->exec)
        {
          if (write_file (path, small_data (i), SMALL_SIZE, PIECE, &j->err) < 0)
            j->failed = 1;
          continue;
        }
      int k = snprintf (script, sizeof script, "echo '");
      k += EVP_EncodeBlock ((unsigned char *) script + k, small_data (i), SMALL_SIZE);
      snprintf (script + k, sizeof script - (size_t) k, "' | base64 -d > '%s'", path);
      char *argv[] = {"sh", "-c", script};
      if (bc_exec (CH, SANDBOX_ID, argv, 3, 0, NULL, &j->err) < 0)
        j->failed = 1;
    }
  return NULL;
}

/* Writes the O.small files into `dir` with O.threads threads; the ms. */
static double
small_write (const char *dir, bool exec)
{
  remove_path (dir);
  make_dir (dir);
  small_job_t *jobs = calloc ((size_t) O.threads, sizeof *jobs);
  if (jobs == NULL)
    die ("out of memory");
  double t0 = bc_now_ms ();
  for (int t = 0; t < O.threads; t++)
    {
      jobs[t] = (small_job_t){.first = t, .step = O.threads, .exec = exec, .dir = dir, .err = ERR_INIT};
      if (pthread_create (&jobs[t].t, NULL, small_worker, &jobs[t]) != 0)
        die ("pthread_create failed");
    }
  for (int t = 0; t < O.threads; t++)
    pthread_join (jobs[t].t, NULL);
  double ms = bc_now_ms () - t0;
  for (int t = 0; t < O.threads; t++)
    if (jobs[t].failed)
      bc_die (PROG, exec ? "small files through Exec" : "small files through WriteFile", &jobs[t].err);
  free (jobs);
  return ms;
}

/* ListDir of `dir`, depth 1: exactly O.small regular files of SMALL_SIZE. */
static void
small_list (const char *dir)
{
  Sandbox__V1__ListDirRequest req = SANDBOX__V1__LIST_DIR_REQUEST__INIT;
  req.sandbox_id = SANDBOX_ID;
  req.path = (char *) dir;
  req.depth = 1;
  ProtobufCMessage *m = NULL;
  err_t err = ERR_INIT;
  if (unary ("/sandbox.v1.Sandbox/ListDir", &req.base, &sandbox__v1__list_dir_response__descriptor, &m, &err) < 0)
    bc_die (PROG, "ListDir", &err);
  Sandbox__V1__ListDirResponse *r = (Sandbox__V1__ListDirResponse *) m;
  if (r->n_entries != (size_t) O.small)
    die ("ListDir `%s`: %zu entries, %d expected", dir, r->n_entries, O.small);
  for (size_t i = 0; i < r->n_entries; i++)
    if (r->entries[i]->type != SANDBOX__V1__FILE_TYPE__FILE_TYPE_FILE || r->entries[i]->size != SMALL_SIZE)
      die ("ListDir `%s`: `%s` is not a file of %d bytes", dir, r->entries[i]->path, SMALL_SIZE);
  protobuf_c_message_free_unpacked (m, NULL);
}

/* The Exec stream of `ls -ln dir`: one line per file after "total". */
static void
small_ls (const char *dir)
{
  char *argv[] = {"ls", "-ln", (char *) dir};
  buf_t out = {0};
  err_t err = ERR_INIT;
  if (exec_collect (argv, 3, &out, &err) < 0)
    bc_die (PROG, "ls -ln", &err);
  int lines = 0;
  for (size_t i = 0; i < out.len; i++)
    lines += out.p[i] == '\n';
  if (lines != O.small + 1)
    die ("ls -ln `%s`: %d lines, %d expected", dir, lines, O.small + 1);
  free (out.p);
}

static void
bench_small (const char *src_sha)
{
  (void) src_sha; /* each small file is checked by size, one by sha256 */
  bc_series_t write = {0}, exec = {0}, list = {0}, ls = {0};
  fprintf (stderr, PROG ": small files: %d of %d bytes, %d threads, 1 warm-up + %d runs of each\n", O.small,
           SMALL_SIZE, O.threads, O.runs);
  for (int i = 0; i <= O.runs; i++)
    {
      double wms = small_write ("/root/small", false);
      double ems = small_write ("/root/small-exec", true);
      remove_path ("/root/small-exec");
      if (i == 0)
        {
          char sha[65];
          sha256_hex (small_data (O.small - 1), SMALL_SIZE, sha);
          char path[64];
          snprintf (path, sizeof path, "/root/small/f%05d", O.small - 1);
          check_sha_inside ("small WriteFile", path, sha);
        }
      double t0 = bc_now_ms ();
      small_list ("/root/small");
      double lms = bc_now_ms () - t0;
      t0 = bc_now_ms ();
      small_ls ("/root/small");
      double sms = bc_now_ms () - t0;
      fprintf (stderr, PROG ": small %d: WriteFile %.0f ms, Exec base64 %.0f ms; ListDir %.1f ms, ls -ln %.1f ms%s\n",
               i, wms, ems, lms, sms, i == 0 ? " (warm-up)" : "");
      if (i == 0)
        continue;
      bc_series_add (&write, O.small / (wms / 1e3));
      bc_series_add (&exec, O.small / (ems / 1e3));
      bc_series_add (&list, O.small / (lms / 1e3));
      bc_series_add (&ls, O.small / (sms / 1e3));
    }
  char what[96], base[64];
  snprintf (what, sizeof what, "write %d x 4 KiB, %d threads: WriteFile", O.small, O.threads);
  bc_row_add (what, "files/s", &write, 1, "Exec `echo B64 | base64 -d > f`", &exec);
  snprintf (what, sizeof what, "list %d files: ListDir depth 1", O.small);
  snprintf (base, sizeof base, "Exec `ls -ln dir`");
  bc_row_add (what, "files/s", &list, 1, base, &ls);
  remove_path ("/root/small");
}

/* ---- main ---------------------------------------------------------------- */

/* True when `name` is one of the comma-separated --stages. */
static bool
stage_on (const char *name)
{
  size_t n = strlen (name);
  const char *p = O.stages;
  while (p != NULL)
    {
      if (strncmp (p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
        return true;
      p = strchr (p, ',');
      if (p != NULL)
        p++;
    }
  return false;
}

/* Makes DIR/src, O.mib MiB of pseudo-random bytes (xorshift64*, so no
 * compression anywhere could shrink it), maps it and returns its sha256. */
static void
make_source (char sha[65])
{
  snprintf (SRC_PATH, sizeof SRC_PATH, "%s/src", O.dir);
  int fd = open (SRC_PATH, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    die ("open `%s`: %s", SRC_PATH, strerror (errno));
  SRC_LEN = (uint64_t) O.mib << 20;
  static uint64_t block[1 << 17]; /* 1 MiB */
  uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t) getpid ();
  for (uint64_t off = 0; off < SRC_LEN; off += sizeof block)
    {
      for (size_t i = 0; i < sizeof block / sizeof block[0]; i++)
        {
          x ^= x >> 12;
          x ^= x << 25;
          x ^= x >> 27;
          block[i] = x * 0x2545F4914F6CDD1Dull;
        }
      if (write (fd, block, sizeof block) != (ssize_t) sizeof block)
        die ("write `%s`: %s", SRC_PATH, strerror (errno));
    }
  void *p = mmap (NULL, SRC_LEN, PROT_READ, MAP_SHARED, fd, 0);
  close (fd);
  if (p == MAP_FAILED)
    die ("mmap `%s`: %s", SRC_PATH, strerror (errno));
  SRC = p;
  sha256_hex (SRC, SRC_LEN, sha);
}

static void
usage (FILE *f)
{
  fprintf (f, "Usage: " PROG " --target HOST:PORT --dir DIR [options]\n"
              "The file API of a running sandbox-gateway against Exec-based baselines (secret in\n"
              "CLOUD_RUN_SANDBOX_GATEWAY_SECRET). DIR should be on a tmpfs with room for the file.\n"
              "  --target HOST:PORT  the gateway\n"
              "  --shim HOST:PORT    a sandbox-shim in front of it (else no shim rows)\n"
              "  --header FILE       the shim's `Authorization: Bearer ...` header line (curl -H @FILE)\n"
              "  --dir DIR           work directory (the source file)\n"
              "  --runs N            timed runs of each, after one warm-up (default 3)\n"
              "  --mib N             the large file's size (default 1024)\n"
              "  --seed-mib N        the file moved as base64 through Exec (default 16)\n"
              "  --small N           small files written and listed (default 10000)\n"
              "  --threads N         concurrent small-file writers (default 8)\n"
              "  --stages LIST       which stages, comma-separated (default large,base64,small)\n"
              "  --markdown FILE     also write the table to FILE in Markdown\n");
}

static int
parse_opts (int argc, char **argv)
{
  static const struct option lo[] = {
      {"target", required_argument, 0, 't'},
      {"shim", required_argument, 0, 's'},
      {"header", required_argument, 0, 'H'},
      {"dir", required_argument, 0, 'd'},
      {"runs", required_argument, 0, 'n'},
      {"mib", required_argument, 0, 'M'},
      {"seed-mib", required_argument, 0, 'S'},
      {"small", required_argument, 0, 'k'},
      {"threads", required_argument, 0, 'j'},
      {"markdown", required_argument, 0, 'm'},
      {"stages", required_argument, 0, 'T'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  int chr;
  while ((chr = getopt_long (argc, argv, "h", lo, NULL)) != -1)
    switch (chr)
      {
      case 't': O.target = optarg; break;
      case 's': O.shim = optarg; break;
      case 'H': O.header = optarg; break;
      case 'd': O.dir = optarg; break;
      case 'n': O.runs = atoi (optarg); break;
      case 'M': O.mib = atol (optarg); break;
      case 'S': O.seed_mib = atol (optarg); break;
      case 'k': O.small = atoi (optarg); break;
      case 'j': O.threads = atoi (optarg); break;
      case 'm': O.markdown = optarg; break;
      case 'T': O.stages = optarg; break;
      case 'h': usage (stdout); exit (0);
      default: usage (stderr); return -1;
      }
  if (O.target == NULL || O.dir == NULL || O.runs < 1 || O.mib < 1 || O.seed_mib < 1 || O.small < 1 || O.small > 99999
      || O.threads < 1 || (O.shim != NULL && O.header == NULL))
    {
      usage (stderr);
      return -1;
    }
  return 0;
}

int
main (int argc, char **argv)
{
  if (parse_opts (argc, argv) < 0)
    return 2;
  bc_auth_from_env (PROG);
  signal (SIGPIPE, SIG_IGN);
  char sha[65];
  double t0 = bc_now_ms ();
  make_source (sha);
  fprintf (stderr, PROG ": source: %llu bytes in %.1f s, sha256 %s\n", (unsigned long long) SRC_LEN,
           (bc_now_ms () - t0) / 1e3, sha);

  rpc_init ();
  CH = bc_channel (PROG, O.target);
  err_t err = ERR_INIT;
  if (bc_launch (CH, SANDBOX_ID, &err) < 0)
    bc_die (PROG, "launch", &err);

  static const struct
  {
    const char *name, *what;
    void (*fn) (const char *sha);
  } STAGES[] = {
      {"large", "large file", bench_big},
      {"base64", "base64 through Exec", bench_seed},
      {"small", "small files", bench_small},
  };
  for (size_t i = 0; i < sizeof STAGES / sizeof STAGES[0]; i++)
    if (stage_on (STAGES[i].name))
      {
        double s0 = bc_now_ms ();
        STAGES[i].fn (sha);
        fprintf (stderr, PROG ": %s: done in %.1f s\n", STAGES[i].what, (bc_now_ms () - s0) / 1e3);
      }

  if (bc_delete (CH, SANDBOX_ID, &err) < 0)
    bc_die (PROG, "delete", &err);
  bc_table_widths (52, 34);
  int rc = bc_print_tables (O.markdown) < 0 ? 1 : 0;
  rpc_channel_destroy (CH);
  rpc_shutdown ();
  return rc;
}
