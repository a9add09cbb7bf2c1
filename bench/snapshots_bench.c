/* snapshots_bench: snapshot throughput of a running sandbox-gateway against
 * GNU tar on the same tree, in the same run:
 *
 *   1. export: ExportSnapshot (compression NONE) of a sandbox holding a 1 GiB
 *      tree of mixed file sizes, every chunk received and discarded, against
 *      `tar -cf - -C DIR/tree .` of the same tree on a tmpfs, its stdout read
 *      and discarded by this program through a pipe;
 *   2. restore: Restore of a new sandbox from that tree's tar (a file on the
 *      tmpfs, streamed in 1 MiB pieces) until the SandboxInfo reply, against
 *      `tar -xf DIR/tree.tar -C DIR/x` onto the tmpfs;
 *   3. persist: PersistSnapshot of the same sandbox to a GCS store (a gateway
 *      pointed at fake_gcs.py) against the same bytes to a local store.
 *
 * The tree is made once inside a sandbox (`head -c N /dev/urandom` per file)
 * and copied out once: the first export, which doubles as the warm-up, goes
 * to DIR/tree.tar and `tar -x` of it makes DIR/tree. Every figure is MB/s of
 * the tree's file data (the same number of bytes for ours and the
 * baseline), so a tar format's header overhead does not count for either.
 * One warm-up run of each side precedes the timed runs, which alternate
 * between ours and the baseline.
 *
 * The gateway's bearer secret comes from CLOUD_RUN_SANDBOX_GATEWAY_SECRET.
 * bench/snapshots builds everything, starts the servers and runs this.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "common/err.h"
#include "common/rpc/rpc.h"
#include "sandbox/v1/sandbox.pb-c.h"

#define PROG "snapshots_bench"
#define PIECE (1024 * 1024)

typedef struct opts_s
{
  const char *target;     /* gateway with the local store */
  const char *gcs_target; /* gateway with the GCS store; NULL: no persist rows */
  const char *dir;        /* work directory on a tmpfs */
  const char *markdown;
  int runs;
  long tree_mib;
  pid_t gateway_pid; /* the local-store gateway: its VmRSS growth is reported */
} opts_t;

static opts_t O = {.runs = 3, .tree_mib = 1024};

/* The tree: `count` files of `size` bytes per class, 4 KiB to 64 MiB, spread
 * over 16 directories; 640 files, 1024 MiB at the default size. */
static const struct
{
  int count;
  long size;
} CLASSES[] = {
    {9, 64L << 20},   {16, 16L << 20}, {32, 4L << 20},   {39, 1L << 20},
    {64, 256L << 10}, {96, 64L << 10}, {128, 16L << 10}, {256, 4L << 10},
};
#define NCLASSES (sizeof CLASSES / sizeof CLASSES[0])

static int COUNTS[NCLASSES];
static uint64_t TREE_BYTES;
static int TREE_FILES;

static rpc_channel_t *CH, *GCS_CH;

/* ---- the tree ------------------------------------------------------------ */

static void
plan_tree (void)
{
  for (size_t i = 0; i < NCLASSES; i++)
    {
      int n = (int) lround ((double) CLASSES[i].count * (double) O.tree_mib / 1024.0);
      COUNTS[i] = n < 1 ? 1 : n;
      TREE_BYTES += (uint64_t) COUNTS[i] * (uint64_t) CLASSES[i].size;
      TREE_FILES += COUNTS[i];
    }
}

static void
make_tree (const char *id)
{
  /* One shell loop: the classes as "count size" words. */
  char classes[512] = "";
  size_t k = 0;
  for (size_t i = 0; i < NCLASSES; i++)
    k += (size_t) snprintf (classes + k, sizeof classes - k, "%s%d:%ld", i ? " " : "", COUNTS[i], CLASSES[i].size);
  char script[2048];
  snprintf (script, sizeof script,
            "set -e; r=/root/tree; d=0; while [ $d -lt 16 ]; do mkdir -p $r/d$d; d=$((d+1)); done; "
            "for c in %s; do n=${c%%:*}; s=${c#*:}; i=0; while [ $i -lt $n ]; do "
            "head -c $s /dev/urandom > $r/d$((i %% 16))/f$s-$i; i=$((i+1)); done; done",
            classes);
  char *argv[] = {"sh", "-c", script};
  err_t err = ERR_INIT;
  double t0 = bc_now_ms ();
  if (bc_exec (CH, id, argv, 3, 600, NULL, &err) < 0)
    bc_die (PROG, "making the tree in the sandbox", &err);
  fprintf (stderr, PROG ": tree: %d files, %.0f MiB, made in the sandbox in %.1f s\n", TREE_FILES,
           (double) TREE_BYTES / (1 << 20), (bc_now_ms () - t0) / 1e3);
}

/* ---- export -------------------------------------------------------------- */

/* ExportSnapshot of `id`, every chunk written to `fd` (or discarded when
 * -1), with the stream's sha256 unless `skip_sha256`. The stream's size
 * goes to *bytes; the final chunk's size must be there and agree, and its
 * hash be there exactly when asked for. */
static int
export_once (const char *id, int fd, bool skip_sha256, uint64_t *bytes, err_t *err)
{
  Sandbox__V1__ExportSnapshotRequest req = SANDBOX__V1__EXPORT_SNAPSHOT_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  req.compression = SANDBOX__V1__COMPRESSION__COMPRESSION_NONE;
  req.skip_sha256 = skip_sha256;
  bool hashed = false;
  rpc_client_call_t *c = NULL;
  if (bc_call_start (CH, "/sandbox.v1.Sandbox/ExportSnapshot", 600000, &req.base, &c, err) < 0)
    return -1;
  uint64_t got = 0, total = 0;
  bool last = false;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__snapshot_chunk__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__SnapshotChunk *ch = (Sandbox__V1__SnapshotChunk *) m;
      got += ch->data.len;
      if (fd >= 0)
        for (size_t off = 0; off < ch->data.len;)
          {
            ssize_t w = write (fd, ch->data.data + off, ch->data.len - off);
            if (w < 0 && errno == EINTR)
              continue;
            if (w < 0)
              {
                protobuf_c_message_free_unpacked (m, NULL);
                rpc_client_destroy (c);
                return err_make_sys (err, errno, "writing the exported tar");
              }
            off += (size_t) w;
          }
      if (ch->last)
        {
          last = true;
          total = ch->total_bytes;
          hashed = ch->sha256 != NULL && strlen (ch->sha256) == 64;
        }
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "export", err) < 0)
    return -1;
  if (!last || total != got)
    return err_make (err, EIO, "export: %llu bytes received, the last chunk says %llu%s", (unsigned long long) got,
                     (unsigned long long) total, last ? "" : " (no last chunk)");
  if (hashed == skip_sha256)
    return err_make (err, EIO, "export: the last chunk %s a sha256", hashed ? "has" : "lacks");
  *bytes = got;
  return 0;
}

/* `tar -cf - -C DIR/tree .`, its stdout read here through a pipe and
 * discarded; with `digest`, `tar ... | openssl dgst -sha256` (the fastest
 * SHA-256 a shell user has; coreutils' sha256sum is slower here), its
 * output read here. Returns the milliseconds, or NAN when it failed. */
static double
tar_c_once (bool digest, uint64_t *bytes)
{
  char tree[4096];
  snprintf (tree, sizeof tree, "%s/tree", O.dir);
  int p[2];
  if (pipe2 (p, O_CLOEXEC) < 0)
    return NAN;
  /* The largest pipe an unprivileged writer may have (1 MiB by default): the
   * baseline gets the biggest buffer it can. */
  fcntl (p[0], F_SETPIPE_SZ, 1 << 20);
  char *tar_argv[] = {"tar", "-cf", "-", "-C", tree, ".", NULL};
  char *dgst_argv[] = {"bash", "-c", "set -o pipefail; tar -cf - -C \"$0\" . | openssl dgst -sha256", tree, NULL};
  char **argv = digest ? dgst_argv : tar_argv;
  static char buf[PIECE];
  double t0 = bc_now_ms ();
  pid_t pid = bc_spawn (argv, p[1], 2);
  close (p[1]);
  if (pid < 0)
    {
      close (p[0]);
      return NAN;
    }
  uint64_t got = 0;
  for (;;)
    {
      ssize_t n = read (p[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      got += (uint64_t) n;
    }
  close (p[0]);
  int st = bc_wait (pid);
  double ms = bc_now_ms () - t0;
  if (st != 0)
    return NAN;
  *bytes = got;
  return ms;
}

/* Both exports of `src` and their baselines, interleaved. */
static void
bench_export (const char *src)
{
  bc_series_t plain = {0}, tar = {0}, hashed = {0}, tar_dgst = {0}, rss = {0};
  err_t err = ERR_INIT;
  fprintf (stderr, PROG ": export: 1 warm-up + %d runs of each\n", O.runs);
  for (int i = 0; i <= O.runs; i++)
    {
      uint64_t pb = 0, hb = 0, tb = 0, db = 0;
      bc_rss_sampler_t sampler;
      bc_rss_start (&sampler, O.gateway_pid);
      double t0 = bc_now_ms ();
      if (export_once (src, -1, true, &pb, &err) < 0)
        bc_die (PROG, "export", &err);
      double pms = bc_now_ms () - t0;
      long grew = bc_rss_stop (&sampler);
      double tms = tar_c_once (false, &tb);
      t0 = bc_now_ms ();
      if (export_once (src, -1, false, &hb, &err) < 0)
        bc_die (PROG, "export with sha256", &err);
      double hms = bc_now_ms () - t0;
      double dms = tar_c_once (true, &db);
      if (isnan (tms) || isnan (dms))
        {
          fprintf (stderr, PROG ": tar -c%s failed\n", isnan (tms) ? "" : " | openssl dgst");
          exit (1);
        }
      fprintf (stderr,
               PROG ": export %d: ours %.0f ms (%llu bytes), tar -c %.0f ms (%llu bytes); with sha256: ours %.0f ms, "
                    "tar -c | openssl dgst %.0f ms%s\n",
               i, pms, (unsigned long long) pb, tms, (unsigned long long) tb, hms, dms, i == 0 ? " (warm-up)" : "");
      if (i > 0)
        {
          bc_series_add (&plain, bc_mbps (TREE_BYTES, pms));
          bc_series_add (&tar, bc_mbps (TREE_BYTES, tms));
          bc_series_add (&hashed, bc_mbps (TREE_BYTES, hms));
          bc_series_add (&tar_dgst, bc_mbps (TREE_BYTES, dms));
          if (grew >= 0)
            bc_series_add (&rss, (double) grew / 1024);
        }
    }
  char what[128];
  snprintf (what, sizeof what, "export %.0f MiB tree, p99 col = slowest", (double) TREE_BYTES / (1 << 20));
  bc_row_add (what, "MB/s", &plain, 1, "tar -c | (pipe to bench)", &tar);
  snprintf (what, sizeof what, "export %.0f MiB tree with sha256, p99 col = slowest",
            (double) TREE_BYTES / (1 << 20));
  bc_row_add (what, "MB/s", &hashed, 1, "tar -c | openssl dgst -sha256", &tar_dgst);
  if (rss.n > 0)
    {
      snprintf (what, sizeof what, "gateway VmRSS growth during export (peak - start), p99 col = largest");
      bc_row_add (what, "MiB", &rss, 99, NULL, NULL);
    }
}

/* ---- restore ------------------------------------------------------------- */

/* Restore of `id` from `path`, streamed in 1 MiB pieces, until the reply. */
static int
restore_once (rpc_channel_t *ch, const char *id, const char *path, err_t *err)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  static uint8_t buf[PIECE];
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (ch, "/sandbox.v1.Sandbox/Restore", 600000, BC_MD, 1, &c, err) < 0)
    {
      close (fd);
      return -1;
    }
  Sandbox__V1__RestoreHeader hdr = SANDBOX__V1__RESTORE_HEADER__INIT;
  hdr.sandbox_id = (char *) id;
  Sandbox__V1__RestoreRequest req = SANDBOX__V1__RESTORE_REQUEST__INIT;
  req.payload_case = SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_HEADER;
  req.header = &hdr;
  int rc = rpc_client_send (c, &req.base, err);
  while (rc == 0)
    {
      ssize_t n = read (fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        {
          rc = err_make_sys (err, errno, "read `%s`", path);
          break;
        }
      if (n == 0)
        break;
      Sandbox__V1__RestoreRequest piece = SANDBOX__V1__RESTORE_REQUEST__INIT;
      piece.payload_case = SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_TAR_CHUNK;
      piece.tar_chunk.data = buf;
      piece.tar_chunk.len = (size_t) n;
      rc = rpc_client_send (c, &piece.base, err);
    }
  close (fd);
  if (rc == 0)
    rc = rpc_client_close_send (c, err);
  if (rc < 0 && err->status != ECANCELED)
    rpc_client_cancel (c); /* our side failed: do not wait for the server */
  ProtobufCMessage *m = NULL;
  if (rc == 0 || err->status == ECANCELED)
    {
      err_release (err);
      if (rpc_client_recv (c, &sandbox__v1__sandbox_info__descriptor, &m, err) < 0)
        err_release (err);
      rc = 0;
    }
  if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
  /* A status that is not OK counts only when our side did not fail first. */
  if (bc_call_finish (c, "restore", rc == 0 ? err : NULL) < 0)
    rc = -1;
  return rc;
}

static void
rm_rf (const char *path)
{
  char *argv[] = {"rm", "-rf", (char *) path, NULL};
  if (bc_run (argv, 2) != 0)
    {
      fprintf (stderr, PROG ": rm -rf %s failed\n", path);
      exit (1);
    }
}

/* `tar -xf DIR/tree.tar -C DIR/x`; the milliseconds, or NAN. */
static double
tar_x_once (const char *tarpath)
{
  char x[4096];
  snprintf (x, sizeof x, "%s/x", O.dir);
  rm_rf (x);
  if (mkdir (x, 0755) < 0)
    return NAN;
  char *argv[] = {"tar", "-xf", (char *) tarpath, "-C", x, NULL};
  double t0 = bc_now_ms ();
  int st = bc_run (argv, 2);
  double ms = bc_now_ms () - t0;
  rm_rf (x);
  return st == 0 ? ms : NAN;
}

static void
bench_restore (const char *tarpath)
{
  bc_series_t ours = {0}, tar = {0}, rss = {0};
  err_t err = ERR_INIT;
  fprintf (stderr, PROG ": restore: 1 warm-up + %d runs of each\n", O.runs);
  for (int i = 0; i <= O.runs; i++)
    {
      char id[64];
      snprintf (id, sizeof id, "snapbench-restore-%d", i);
      bc_rss_sampler_t sampler;
      bc_rss_start (&sampler, O.gateway_pid);
      double t0 = bc_now_ms ();
      if (restore_once (CH, id, tarpath, &err) < 0)
        bc_die (PROG, "restore", &err);
      double ms = bc_now_ms () - t0;
      long grew = bc_rss_stop (&sampler);
      /* Not timed: the restored sandbox's memory goes back before the next
       * run. */
      if (bc_delete (CH, id, &err) < 0)
        bc_die (PROG, "delete", &err);
      double tms = tar_x_once (tarpath);
      if (isnan (tms))
        {
          fprintf (stderr, PROG ": tar -x failed\n");
          exit (1);
        }
      fprintf (stderr, PROG ": restore %d: ours %.0f ms, tar -x %.0f ms%s\n", i, ms, tms, i == 0 ? " (warm-up)" : "");
      if (i > 0)
        {
          bc_series_add (&ours, bc_mbps (TREE_BYTES, ms));
          bc_series_add (&tar, bc_mbps (TREE_BYTES, tms));
          if (grew >= 0)
            bc_series_add (&rss, (double) grew / 1024);
        }
    }
  char what[96];
  snprintf (what, sizeof what, "restore %.0f MiB tree, p99 col = slowest", (double) TREE_BYTES / (1 << 20));
  bc_row_add (what, "MB/s", &ours, 1, "tar -x (tmpfs to tmpfs)", &tar);
  if (rss.n > 0)
    bc_row_add ("gateway VmRSS growth during restore (peak - start), p99 col = largest", "MiB", &rss, 99, NULL, NULL);
}

/* ---- persist ------------------------------------------------------------- */

/* PersistSnapshot of `id`; the bytes written and the store's kind. */
static int
persist_once (rpc_channel_t *ch, const char *id, uint64_t *bytes, char *store, size_t store_len, err_t *err)
{
  Sandbox__V1__PersistSnapshotRequest req = SANDBOX__V1__PERSIST_SNAPSHOT_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  rpc_client_call_t *c = NULL;
  if (bc_call_start (ch, "/sandbox.v1.Sandbox/PersistSnapshot", 600000, &req.base, &c, err) < 0)
    return -1;
  bool done = false;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &sandbox__v1__persist_progress__descriptor, &m, err);
      if (rc < 0)
        {
          rpc_client_destroy (c);
          return -1;
        }
      if (rc == 0)
        break;
      Sandbox__V1__PersistProgress *p = (Sandbox__V1__PersistProgress *) m;
      if (p->done)
        {
          done = true;
          *bytes = p->bytes_written;
          snprintf (store, store_len, "%s", p->store ? p->store : "");
        }
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (bc_call_finish (c, "persist", err) < 0)
    return -1;
  if (!done)
    return err_make (err, EIO, "persist: no final progress event");
  return 0;
}

static void
bench_persist (const char *src, const char *tarpath)
{
  err_t err = ERR_INIT;
  /* The same tree in the GCS gateway: restored from the same tar. */
  double t0 = bc_now_ms ();
  if (restore_once (GCS_CH, src, tarpath, &err) < 0)
    bc_die (PROG, "restore into the GCS gateway", &err);
  fprintf (stderr, PROG ": persist: the tree restored into the GCS gateway in %.1f s\n", (bc_now_ms () - t0) / 1e3);
  bc_series_t gcs = {0}, local = {0};
  fprintf (stderr, PROG ": persist: 1 warm-up + %d runs of each\n", O.runs);
  for (int i = 0; i <= O.runs; i++)
    {
      uint64_t gb = 0, lb = 0;
      char gstore[16] = "", lstore[16] = "";
      t0 = bc_now_ms ();
      if (persist_once (GCS_CH, src, &gb, gstore, sizeof gstore, &err) < 0)
        bc_die (PROG, "persist to GCS", &err);
      double gms = bc_now_ms () - t0;
      t0 = bc_now_ms ();
      if (persist_once (CH, src, &lb, lstore, sizeof lstore, &err) < 0)
        bc_die (PROG, "persist to the local store", &err);
      double lms = bc_now_ms () - t0;
      if (strcmp (gstore, "gcs") != 0 || strcmp (lstore, "local") != 0)
        {
          fprintf (stderr, PROG ": persist: stores are `%s` and `%s`, expected gcs and local\n", gstore, lstore);
          exit (1);
        }
      fprintf (stderr, PROG ": persist %d: gcs %.0f ms (%llu bytes), local %.0f ms (%llu bytes)%s\n", i, gms,
               (unsigned long long) gb, lms, (unsigned long long) lb, i == 0 ? " (warm-up)" : "");
      if (i > 0)
        {
          bc_series_add (&gcs, bc_mbps (TREE_BYTES, gms));
          bc_series_add (&local, bc_mbps (TREE_BYTES, lms));
        }
    }
  char what[96];
  snprintf (what, sizeof what, "persist %.0f MiB tree to GCS, p99 col = slowest", (double) TREE_BYTES / (1 << 20));
  bc_row_add (what, "MB/s", &gcs, 1, "local store (tmpfs)", &local);
  if (bc_delete (GCS_CH, src, &err) < 0)
    bc_die (PROG, "delete", &err);
}

/* ---- main ---------------------------------------------------------------- */

static void
usage (FILE *f)
{
  fprintf (f, "Usage: " PROG " --target HOST:PORT --dir DIR [options]\n"
              "Snapshot throughput of a running sandbox-gateway against GNU tar (secret in\n"
              "CLOUD_RUN_SANDBOX_GATEWAY_SECRET). DIR should be on a tmpfs with room for 3 trees.\n"
              "  --target HOST:PORT      the gateway (local snapshot store)\n"
              "  --gcs-target HOST:PORT  a gateway with the GCS store (persist rows; else skipped)\n"
              "  --dir DIR               work directory (the tree, its tar, tar -x's target)\n"
              "  --runs N                timed runs of each, after one warm-up (default 3)\n"
              "  --tree-mib N            size of the tree (default 1024; the classes scale)\n"
              "  --gateway-pid PID       the --target gateway's pid: its VmRSS growth during\n"
              "                          export and restore is reported\n"
              "  --markdown FILE         also write the table to FILE in Markdown\n");
}

int
main (int argc, char **argv)
{
  static const struct option lo[] = {
      {"target", required_argument, 0, 't'},
      {"gcs-target", required_argument, 0, 'g'},
      {"dir", required_argument, 0, 'd'},
      {"runs", required_argument, 0, 'n'},
      {"tree-mib", required_argument, 0, 's'},
      {"markdown", required_argument, 0, 'm'},
      {"gateway-pid", required_argument, 0, 'p'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  int chr;
  while ((chr = getopt_long (argc, argv, "h", lo, NULL)) != -1)
    switch (chr)
      {
      case 't': O.target = optarg; break;
      case 'g': O.gcs_target = optarg; break;
      case 'd': O.dir = optarg; break;
      case 'n': O.runs = atoi (optarg); break;
      case 's': O.tree_mib = atol (optarg); break;
      case 'm': O.markdown = optarg; break;
      case 'p': O.gateway_pid = (pid_t) atoi (optarg); break;
      case 'h': usage (stdout); return 0;
      default: usage (stderr); return 2;
      }
  if (O.target == NULL || O.dir == NULL || O.runs < 1 || O.tree_mib < 1)
    {
      usage (stderr);
      return 2;
    }
  bc_auth_from_env (PROG);
  signal (SIGPIPE, SIG_IGN);
  plan_tree ();

  rpc_init ();
  CH = bc_channel (PROG, O.target);
  if (O.gcs_target != NULL)
    GCS_CH = bc_channel (PROG, O.gcs_target);

  const char *src = "snapbench-src";
  err_t err = ERR_INIT;
  if (bc_launch (CH, src, &err) < 0)
    bc_die (PROG, "launch", &err);
  make_tree (src);

  /* The copy out: the first export (which also warms the export path up)
   * goes to DIR/tree.tar, and tar -x of it makes DIR/tree. */
  char tarpath[4096], tree[4096];
  snprintf (tarpath, sizeof tarpath, "%s/tree.tar", O.dir);
  snprintf (tree, sizeof tree, "%s/tree", O.dir);
  int fd = open (tarpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    {
      perror (tarpath);
      return 1;
    }
  uint64_t tar_bytes = 0;
  double t0 = bc_now_ms ();
  if (export_once (src, fd, false, &tar_bytes, &err) < 0)
    bc_die (PROG, "export to a file", &err);
  close (fd);
  fprintf (stderr, PROG ": copied out: %s, %llu bytes, in %.1f s\n", tarpath, (unsigned long long) tar_bytes,
           (bc_now_ms () - t0) / 1e3);
  rm_rf (tree);
  if (mkdir (tree, 0755) < 0)
    {
      perror (tree);
      return 1;
    }
  char *xargv[] = {"tar", "-xf", tarpath, "-C", tree, NULL};
  if (bc_run (xargv, 2) != 0)
    {
      fprintf (stderr, PROG ": tar -x of the exported tree failed\n");
      return 1;
    }

  double s0 = bc_now_ms ();
  bench_export (src);
  fprintf (stderr, PROG ": export: done in %.1f s\n", (bc_now_ms () - s0) / 1e3);
  s0 = bc_now_ms ();
  bench_restore (tarpath);
  fprintf (stderr, PROG ": restore: done in %.1f s\n", (bc_now_ms () - s0) / 1e3);
  if (GCS_CH != NULL)
    {
      s0 = bc_now_ms ();
      bench_persist (src, tarpath);
      fprintf (stderr, PROG ": persist: done in %.1f s\n", (bc_now_ms () - s0) / 1e3);
    }
  else
    fprintf (stderr, PROG ": persist: no --gcs-target; skipped\n");

  if (bc_delete (CH, src, &err) < 0)
    bc_die (PROG, "delete", &err);
  int rc = bc_print_tables (O.markdown) < 0 ? 1 : 0;
  rpc_channel_destroy (CH);
  if (GCS_CH != NULL)
    rpc_channel_destroy (GCS_CH);
  rpc_shutdown ();
  return rc;
}
