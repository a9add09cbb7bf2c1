/* code/kernel: a context's kernel — started from its kernelspec as a
 * detached process of the sandbox, its ZMQ sockets made inside the
 * sandbox's network namespace, the wait for its first answers, its exit
 * noticed (with its last words) and its close. The contexts around it are
 * contexts.c's, the files it reads spec.c's. State: the context's kernel
 * fields, with its run mutex held. */
#include <errno.h>
#include <jansson.h>
#include <openssl/rand.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/code/internal.h"

/* How long a new kernel may take to answer kernel_info. */
#define CODE_START_MS 60000
/* Messages each socket queues before the kernel's sends wait (ZMQ_RCVHWM):
 * with JMSG_FRAME_MAX, what one context can make the gateway hold. */
#define CODE_QUEUE_MAX 4
#define CONN_DIR "/tmp/.sandbox-kernels"

int64_t
code_mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the kernel ------------------------------------------------------------ */

typedef struct zjob_s
{
  code_ctx_t *c;
  unsigned ports[5]; /* shell, iopub, stdin, control, hb */
  int error;
} zjob_t;

static void *
zsock (void *zctx, int type)
{
  void *s = zmq_socket (zctx, type);
  if (s == NULL)
    return NULL;
  int zero = 0, hwm = CODE_QUEUE_MAX;
  int64_t max = JMSG_FRAME_MAX;
  zmq_setsockopt (s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt (s, ZMQ_MAXMSGSIZE, &max, sizeof max);
  zmq_setsockopt (s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  return s;
}

/* The connections code_kernel_links watches, by index of link_mon. */
static const char *const link_names[2] = {"shell", "iopub"};
/* The most monitor events read per look (a reconnecting socket makes one
 * per retry, ZMQ_RECONNECT_IVL apart). */
#define CODE_LINK_EVENTS_MAX 16

/* A PAIR socket told when `sock`'s connection drops and when libzmq
 * reconnects it; NULL on failure (errno). */
static void *
link_monitor (void *zctx, void *sock, int i)
{
  char ep[32];
  snprintf (ep, sizeof ep, "inproc://link-%d", i);
  if (zmq_socket_monitor (sock, ep, ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED) < 0)
    return NULL;
  void *m = zmq_socket (zctx, ZMQ_PAIR);
  if (m == NULL)
    return NULL;
  int zero = 0;
  zmq_setsockopt (m, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_connect (m, ep) < 0)
    {
      int e = errno;
      zmq_close (m);
      errno = e;
      return NULL;
    }
  return m;
}

/* On a thread inside the sandbox's network namespace: the ZMQ context (its
 * I/O thread starts here, so it stays in the namespace), the sockets and
 * the monitors of shell's and iopub's connections. */
static void
zjob_main (void *arg)
{
  zjob_t *j = arg;
  code_ctx_t *c = j->c;
  c->zctx = zmq_ctx_new ();
  if (c->zctx == NULL)
    {
      j->error = errno;
      return;
    }
  zmq_ctx_set (c->zctx, ZMQ_IO_THREADS, 1);
  c->shell = zsock (c->zctx, ZMQ_DEALER);
  c->control = zsock (c->zctx, ZMQ_DEALER);
  c->iopub = zsock (c->zctx, ZMQ_SUB);
  if (c->shell == NULL || c->control == NULL || c->iopub == NULL)
    {
      j->error = errno;
      return;
    }
  zmq_setsockopt (c->iopub, ZMQ_SUBSCRIBE, "", 0);
  void *watched[2] = {c->shell, c->iopub};
  for (int i = 0; i < 2; i++)
    if ((c->link_mon[i] = link_monitor (c->zctx, watched[i], i)) == NULL)
      {
        j->error = errno;
        return;
      }
  char ep[64];
  void *socks[] = {c->shell, c->iopub, NULL, c->control};
  for (int i = 0; i < 4; i++)
    {
      if (socks[i] == NULL)
        continue;
      snprintf (ep, sizeof ep, "tcp://127.0.0.1:%u", j->ports[i]);
      if (zmq_connect (socks[i], ep) < 0)
        {
          j->error = errno;
          return;
        }
    }
}

/* Removes the kernel's connection file from the sandbox, if it is there
 * and the sandbox has not ended (best effort: a failure is logged). */
static void
conn_file_remove (sbx_runtime_t *rt, code_ctx_t *c)
{
  if (!c->conn_file_present)
    return;
  c->conn_file_present = false;
  if (atomic_load (&c->sandbox_ended))
    return;
  err_t e = ERR_INIT;
  if (code_sandbox_remove (rt, c->sid, c->conn_file, &e) < 0 && e.status == ENOENT)
    err_release (&e);
  err_warn_release (&e, "remove the connection file `%s` of context `%s`", c->conn_file, c->info.id);
}

void
code_kernel_close (sbx_runtime_t *rt, code_ctx_t *c)
{
  if (c->proc != NULL)
    {
      err_t e = ERR_INIT;
      sbx_proc_signal_proc (rt, c->proc, SIGKILL, &e);
      err_release (&e);
      sbx_proc_put (rt, c->proc);
      c->proc = NULL;
    }
  conn_file_remove (rt, c);
  void **socks[] = {&c->shell, &c->control, &c->iopub, &c->link_mon[0], &c->link_mon[1]};
  for (size_t i = 0; i < sizeof socks / sizeof socks[0]; i++)
    if (*socks[i] != NULL)
      {
        zmq_close (*socks[i]);
        *socks[i] = NULL;
      }
  c->link_dropped_ms[0] = c->link_dropped_ms[1] = 0;
  if (c->zctx != NULL)
    {
      zmq_ctx_term (c->zctx);
      c->zctx = NULL;
    }
}

/* The next event on monitor `m` without waiting: ZMQ_EVENT_*, 0 when none
 * is there. An event is two frames: (event, value) in 6 bytes, then the
 * endpoint. */
static unsigned
link_event (void *m)
{
  unsigned ev = 0;
  bool more = true;
  for (int part = 0; more; part++)
    {
      zmq_msg_t msg;
      zmq_msg_init (&msg);
      if (zmq_msg_recv (&msg, m, ZMQ_DONTWAIT) < 0)
        {
          zmq_msg_close (&msg);
          return ev;
        }
      if (part == 0 && zmq_msg_size (&msg) >= 2)
        {
          uint16_t v;
          memcpy (&v, zmq_msg_data (&msg), sizeof v);
          ev = v;
        }
      more = zmq_msg_more (&msg);
      zmq_msg_close (&msg);
    }
  return ev;
}

int
code_kernel_links (code_ctx_t *c, err_t *err)
{
  int64_t now = code_mono_ms ();
  for (int i = 0; i < 2; i++)
    {
      if (c->link_mon[i] == NULL)
        continue;
      for (int k = 0; k < CODE_LINK_EVENTS_MAX; k++)
        {
          unsigned ev = link_event (c->link_mon[i]);
          if (ev == 0)
            break;
          if (ev == ZMQ_EVENT_DISCONNECTED && c->link_dropped_ms[i] == 0)
            c->link_dropped_ms[i] = now;
          else if (ev == ZMQ_EVENT_CONNECT_RETRIED)
            c->link_dropped_ms[i] = 0; /* the peer closed its end: libzmq reconnects */
        }
      if (c->link_dropped_ms[i] != 0 && now - c->link_dropped_ms[i] >= CODE_LINK_GRACE_MS)
        {
          snprintf (c->restart_reason, sizeof c->restart_reason,
                    "the kernel's `%s` connection was dropped: it sent a frame over the gateway's %d MiB cap "
                    "(JMSG_FRAME_MAX) or bytes that are not ZMTP",
                    link_names[i], JMSG_FRAME_MAX >> 20);
          return err_make (err, EMSGSIZE, "%s; the kernel was stopped and the context's next cell starts a new one",
                           c->restart_reason);
        }
    }
  return 0;
}

/* The last non-empty line of what the exited kernel wrote to stderr (a
 * Python traceback's last line names the cause), at most cap - 1 bytes of
 * it; "" when none. Reads at most KERNEL_WORDS_READS chunks of the ring. */
#define KERNEL_WORDS_READS 256
static void
kernel_last_words (sbx_runtime_t *rt, code_ctx_t *c, char *out, size_t cap)
{
  char tail[256];
  size_t len = 0;
  sbx_proc_cursor_t cur;
  sbx_proc_cursor_start (rt, c->proc, true, &cur);
  for (int i = 0; i < KERNEL_WORDS_READS; i++)
    {
      uint8_t buf[4096];
      int stream = 0;
      sbx_exec_result_t res;
      int n = sbx_proc_read (rt, c->proc, &cur, buf, sizeof buf, &stream, 0, &res);
      if (n <= 0)
        break;
      if (stream != 2)
        continue;
      size_t take = (size_t) n < sizeof tail ? (size_t) n : sizeof tail;
      if (len + take > sizeof tail)
        {
          size_t drop = len + take - sizeof tail;
          memmove (tail, tail + drop, len - drop);
          len -= drop;
        }
      memcpy (tail + len, buf + (size_t) n - take, take);
      len += take;
    }
  while (len > 0 && (tail[len - 1] == '\n' || tail[len - 1] == '\r' || tail[len - 1] == ' '))
    len--;
  size_t start = len;
  while (start > 0 && tail[start - 1] != '\n')
    start--;
  size_t n = len - start < cap - 1 ? len - start : cap - 1;
  for (size_t i = 0; i < n; i++)
    out[i] = (unsigned char) tail[start + i] < 0x20 ? ' ' : tail[start + i];
  out[n] = '\0';
}

/* Whether the kernel process has exited; why into c->restart_reason (with
 * the last line of its stderr when it exited with a status). */
bool
code_kernel_exited (sbx_runtime_t *rt, code_ctx_t *c)
{
  if (c->proc == NULL)
    return true;
  sbx_proc_info_t pi;
  sbx_proc_info (rt, c->proc, &pi);
  if (!pi.exited)
    return false;
  if (pi.res.oom_killed)
    snprintf (c->restart_reason, sizeof c->restart_reason,
              "the kernel was killed: out of memory (the sandbox's memory limit)");
  else if (pi.res.signal != 0)
    snprintf (c->restart_reason, sizeof c->restart_reason, "the kernel was killed by signal %d", pi.res.signal);
  else
    {
      char words[200];
      kernel_last_words (rt, c, words, sizeof words);
      snprintf (c->restart_reason, sizeof c->restart_reason, "the kernel exited with status %d%s%s", pi.res.exit_code,
                words[0] ? ": " : "", words);
    }
  return true;
}

static char *
connection_json (const code_ctx_t *c, const unsigned ports[5])
{
  json_t *j = json_pack ("{s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:s, s:s, s:s}", "shell_port", ports[0], "iopub_port",
                         ports[1], "stdin_port", ports[2], "control_port", ports[3], "hb_port", ports[4], "ip",
                         "127.0.0.1", "key", c->key, "transport", "tcp", "signature_scheme", "hmac-sha256",
                         "kernel_name", c->info.language);
  char *s = j ? json_dumps (j, JSON_COMPACT) : NULL;
  json_decref (j);
  return s;
}

/* argv with {connection_file} replaced, env the kernelspec's then the
 * caller's. */
static int
kernel_argv (const code_spec_t *spec, const char *conn, char ***argv, err_t *err)
{
  size_t n = 0;
  while (spec->argv[n] != NULL)
    n++;
  char **v = calloc (n + 1, sizeof *v);
  if (v == NULL)
    return err_make (err, ENOMEM, "kernel argv: out of memory");
  for (size_t i = 0; i < n; i++)
    {
      const char *a = spec->argv[i];
      const char *hit = strstr (a, "{connection_file}");
      if (hit == NULL)
        v[i] = strdup (a);
      else if (asprintf (&v[i], "%.*s%s%s", (int) (hit - a), a, conn, hit + strlen ("{connection_file}")) < 0)
        v[i] = NULL;
      if (v[i] == NULL)
        {
          code_strv_free (v);
          return err_make (err, ENOMEM, "kernel argv: out of memory");
        }
    }
  *argv = v;
  return 0;
}

static void
pick_ports (unsigned ports[5])
{
  unsigned char r[2];
  if (RAND_bytes (r, sizeof r) != 1)
    r[0] = r[1] = (unsigned char) rand ();
  /* A block of five in 20000..32759: the sandbox's own loopback, below the
   * kernel's ephemeral range (32768..60999 by default) that the sockets
   * connected to other kernels take their local ports from; only the
   * sandbox's own servers can be in the way (the kernel then fails to bind,
   * and the start tries other ports, KERNEL_START_TRIES in all). */
  unsigned base = 20000 + ((unsigned) (r[0] << 8 | r[1]) % 2552) * 5;
  for (int i = 0; i < 5; i++)
    ports[i] = base + (unsigned) i;
}

/* Waits for a message on `sock` answering `parent` of type `type`
 * (other messages are dropped), until `deadline`; checks the kernel's exit,
 * its connections, the context's closing and the caller's cancellation
 * (`cancel`, may be NULL). */
static int
await_reply (sbx_runtime_t *rt, code_ctx_t *c, void *sock, const char *parent, const char *type, int64_t deadline,
             const code_cancel_t *cancel, jmsg_t *out, err_t *err)
{
  for (;;)
    {
      int64_t left = deadline - code_mono_ms ();
      if (left <= 0)
        return err_make (err, ETIMEDOUT, "the kernel did not answer `%s` in time", type);
      if (atomic_load (&c->closing))
        return err_make (err, ECANCELED, "the context is being deleted");
      if (cancel != NULL && cancel->cancelled (cancel->arg))
        return err_make (err, ECANCELED, "the call was cancelled while the kernel started; it was stopped");
      if (code_kernel_exited (rt, c))
        return err_make (err, EIO, "%s", c->restart_reason);
      if (code_kernel_links (c, err) < 0)
        return -1;
      zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
      int r = zmq_poll (&it, 1, left < CODE_POLL_MS ? (long) left : CODE_POLL_MS);
      if (r < 0 && errno != EINTR)
        return err_make_sys (err, errno, "poll the kernel");
      if (r <= 0)
        continue;
      jmsg_t m = {0};
      int g = jmsg_recv (sock, c->key, &m, err);
      if (g < 0)
        return -1;
      if (g == 0)
        continue;
      if (strcmp (m.parent_id, parent) == 0 && strcmp (m.msg_type, type) == 0)
        {
          *out = m;
          return 0;
        }
      jmsg_clear (&m);
    }
}

/* After kernel_info_reply: waits until iopub carries a message of ours, so
 * that the first cell's output is not lost (a SUB socket sees only what is
 * published after its subscription reached the kernel). */
static int
await_iopub (sbx_runtime_t *rt, code_ctx_t *c, int64_t deadline, const code_cancel_t *cancel, err_t *err)
{
  for (;;)
    {
      char id[37];
      json_t *content = json_object ();
      int rc = jmsg_send (c->shell, c->key, c->session, "kernel_info_request", content, id, err);
      json_decref (content);
      if (rc < 0)
        return -1;
      jmsg_t m = {0};
      if (await_reply (rt, c, c->shell, id, "kernel_info_reply", deadline, cancel, &m, err) < 0)
        return -1;
      jmsg_clear (&m);
      int64_t until = code_mono_ms () + 500;
      if (until > deadline)
        until = deadline;
      err_t e = ERR_INIT;
      rc = await_reply (rt, c, c->iopub, id, "status", until, cancel, &m, &e);
      if (rc == 0)
        {
          jmsg_clear (&m);
          return 0;
        }
      if (e.status != ETIMEDOUT || code_mono_ms () >= deadline)
        {
          *err = e;
          return -1;
        }
      err_release (&e);
    }
}

/* One try at starting c's kernel on fresh ports (run_mu held; none
 * running). */
static int
kernel_start_once (sbx_runtime_t *rt, code_ctx_t *c, const code_cancel_t *cancel, err_t *err)
{
  code_spec_t spec = {0};
  if (code_spec_load (rt, c->sid, c->info.language, &spec, err) < 0)
    return -1;
  c->interrupt_message = spec.interrupt_message;
  char key[37];
  jmsg_uuid (key);
  snprintf (c->key, sizeof c->key, "%s", key);
  jmsg_uuid (c->session);
  c->restart_reason[0] = '\0';
  zjob_t j = {.c = c};
  pick_ports (j.ports);
  snprintf (c->conn_file, sizeof c->conn_file, CONN_DIR "/kernel-%s.json", c->info.id);
  cleanup_free char *cj = connection_json (c, j.ports);
  char **argv = NULL, **env = NULL;
  int rc = cj == NULL ? err_make (err, ENOMEM, "connection file: out of memory") : 0;
  if (rc == 0)
    rc = code_sandbox_write (rt, c->sid, c->conn_file, cj, err);
  c->conn_file_present = true; /* even after a failed write: a part may be there */
  if (rc == 0)
    rc = kernel_argv (&spec, c->conn_file, &argv, err);
  if (rc == 0)
    rc = code_env_merge (spec.env, c->env, &env, err);
  if (rc == 0 && cancel != NULL && cancel->cancelled (cancel->arg))
    rc = err_make (err, ECANCELED, "the call was cancelled before the kernel started");
  if (rc == 0)
    {
      sbx_exec_req_t req
          = {.id = c->sid, .argv = argv, .env = env, .cwd = c->info.cwd, .no_timeout = true, .background = true};
      rc = sbx_proc_start (rt, &req, NULL, &c->proc, err);
    }
  code_strv_free (argv);
  code_strv_free (env);
  code_spec_free (&spec);
  if (rc == 0)
    rc = sbx_netns_run (rt, c->sid, zjob_main, &j, err);
  if (rc == 0 && j.error != 0)
    rc = err_make_sys (err, j.error, "ZMQ sockets to the kernel");
  if (rc == 0)
    rc = await_iopub (rt, c, code_mono_ms () + CODE_START_MS, cancel, err);
  if (rc < 0)
    code_kernel_close (rt, c);
  else
    /* The kernel has read it and bound its ports: the key need not stay
     * where any process of the sandbox can read it. */
    conn_file_remove (rt, c);
  return rc;
}

/* Starts c's kernel (run_mu held; none running): again on other ports when
 * the kernel exited because one of its ports was taken, KERNEL_START_TRIES
 * tries in all. A start the caller cancelled stops at once, within
 * CODE_POLL_MS of the cancel: the kernel is killed and its sockets and
 * threads closed. */
#define KERNEL_START_TRIES 3
int
code_kernel_start (sbx_runtime_t *rt, code_ctx_t *c, const code_cancel_t *cancel, err_t *err)
{
  for (int i = 1;; i++)
    {
      err_t e = ERR_INIT;
      if (kernel_start_once (rt, c, cancel, &e) == 0)
        return 0;
      if (i == KERNEL_START_TRIES || e.status != EIO || e.msg == NULL
          || strstr (e.msg, "Address already in use") == NULL)
        {
          if (e.status == ECANCELED)
            snprintf (c->restart_reason, sizeof c->restart_reason, "the kernel's last start was cancelled");
          *err = e;
          return err_wrap (err, "start kernel `%s`", c->info.language);
        }
      err_release (&e);
    }
}
