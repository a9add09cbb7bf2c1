/* code/kernel: see kernel.h. */
#include "gateway/code/kernel.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
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

/* The most of a kernel.json read. */
#define CODE_KERNELSPEC_MAX (64 * 1024)
/* The most argv elements and env entries a kernelspec may have. */
#define CODE_SPEC_ARGS_MAX 64
/* How long a new kernel may take to answer kernel_info. */
#define CODE_START_MS 60000
/* Messages each socket queues before the kernel's sends wait (ZMQ_RCVHWM):
 * with JMSG_FRAME_MAX, what one context can make the gateway hold. */
#define CODE_QUEUE_MAX 4
/* Where kernelspecs are looked for, in this order (Jupyter's data path). */
static const char *const spec_dirs[] = {
    "/root/.local/share/jupyter/kernels",
    "/usr/local/share/jupyter/kernels",
    "/usr/share/jupyter/kernels",
};
#define N_SPEC_DIRS (sizeof spec_dirs / sizeof spec_dirs[0])
#define CONN_DIR "/tmp/.sandbox-kernels"

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static code_ctx_t *reg_head;

static int64_t
wall_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
code_mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
strv_free (char **v)
{
  if (v == NULL)
    return;
  for (char **p = v; *p != NULL; p++)
    free (*p);
  free (v);
}

/* ---- files inside the sandbox (the file API) ------------------------------ */

/* The file API's "caller gone" test: never (its own deadlines hold). */
static bool
never_gone (void *ctx)
{
  (void) ctx;
  return false;
}

/* Reads sandbox file `path` whole, at most `max` bytes (EFBIG beyond). */
static int
sandbox_read (sbx_runtime_t *rt, const char *sid, const char *path, size_t max, char **out, size_t *len, err_t *err)
{
  sbx_file_req_t req = {.id = sid, .op = SBX_FILE_READ, .path = path};
  sbx_file_t *f = NULL;
  if (sbx_file_start (rt, &req, never_gone, NULL, &f, err) < 0)
    return -1;
  cleanup_free char *buf = malloc (max + 1);
  size_t n = 0;
  int rc = 0;
  sbx_file_msg_t msg;
  while (buf != NULL && (rc = sbx_file_next (f, &msg, err)) > 0)
    {
      if (msg.kind != SBX_FRAME_DATA)
        continue;
      if (msg.len > max - n)
        {
          rc = err_make (err, EFBIG, "`%s` is larger than %zu bytes", path, max);
          break;
        }
      memcpy (buf + n, msg.data, msg.len);
      n += msg.len;
    }
  sbx_file_close (f);
  if (buf == NULL)
    return err_make (err, ENOMEM, "read `%s`: out of memory", path);
  if (rc < 0)
    return -1;
  buf[n] = '\0';
  *len = n;
  *out = take_ptr (&buf);
  return 0;
}

static int
sandbox_write (sbx_runtime_t *rt, const char *sid, const char *path, const char *data, err_t *err)
{
  sbx_file_req_t req = {.id = sid, .op = SBX_FILE_WRITE, .path = path, .flags = SBX_FILE_F_PARENTS, .mode = 0600};
  sbx_file_t *f = NULL;
  if (sbx_file_start (rt, &req, never_gone, NULL, &f, err) < 0)
    return -1;
  sbx_file_msg_t msg;
  int rc = sbx_file_send (f, &(struct iovec){(void *) data, strlen (data)}, 1, err);
  if (rc == 0)
    rc = sbx_file_send_end (f, err);
  if (rc == 0)
    rc = sbx_file_next (f, &msg, err) < 0 ? -1 : 0;
  sbx_file_close (f);
  return rc;
}

static bool
name_valid (const char *s, size_t max)
{
  size_t n = strlen (s);
  if (n == 0 || n > max || s[0] == '.')
    return false;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'
          || *p == '.'))
      return false;
  return true;
}

/* ---- the kernelspec -------------------------------------------------------- */

typedef struct spec_s
{
  char **argv; /* {connection_file} not yet replaced */
  char **env;  /* "K=V" */
  bool interrupt_message;
} spec_t;

static void
spec_free (spec_t *s)
{
  strv_free (s->argv);
  strv_free (s->env);
  *s = (spec_t){0};
}

static int
spec_parse (const char *text, size_t len, const char *lang, spec_t *out, err_t *err)
{
  json_error_t je;
  json_t *j = json_loadb (text, len, 0, &je);
  json_t *argv = json_object_get (j, "argv"), *env = json_object_get (j, "env");
  const char *mode = json_string_value (json_object_get (j, "interrupt_mode"));
  size_t n = json_array_size (argv);
  int rc = 0;
  if (!json_is_array (argv) || n == 0 || n > CODE_SPEC_ARGS_MAX
      || (env != NULL && (!json_is_object (env) || json_object_size (env) > CODE_SPEC_ARGS_MAX)))
    {
      rc = err_make (err, EINVAL, "kernelspec `%s`: kernel.json has no usable argv", lang);
      goto out;
    }
  out->interrupt_message = mode != NULL && strcmp (mode, "message") == 0;
  out->argv = calloc (n + 1, sizeof *out->argv);
  out->env = calloc (json_object_size (env) + 1, sizeof *out->env);
  if (out->argv == NULL || out->env == NULL)
    {
      rc = err_make (err, ENOMEM, "kernelspec `%s`: out of memory", lang);
      goto out;
    }
  for (size_t i = 0; i < n; i++)
    {
      const char *a = json_string_value (json_array_get (argv, i));
      if (a == NULL || (out->argv[i] = strdup (a)) == NULL)
        {
          rc = err_make (err, EINVAL, "kernelspec `%s`: argv[%zu] is not a string", lang, i);
          goto out;
        }
    }
  const char *k;
  json_t *v;
  size_t e = 0;
  json_object_foreach (env, k, v)
  {
    if (!json_is_string (v) || asprintf (&out->env[e], "%s=%s", k, json_string_value (v)) < 0)
      {
        out->env[e] = NULL;
        rc = err_make (err, EINVAL, "kernelspec `%s`: env `%s` is not a string", lang, k);
        goto out;
      }
    e++;
  }
out:
  json_decref (j);
  if (rc < 0)
    spec_free (out);
  return rc;
}

static int
spec_load (sbx_runtime_t *rt, const char *sid, const char *lang, spec_t *out, err_t *err)
{
  if (!name_valid (lang, CODE_LANGUAGE_MAX))
    return err_make (err, EINVAL, "invalid language `%s`", lang);
  for (size_t i = 0; i < N_SPEC_DIRS; i++)
    {
      char path[256];
      snprintf (path, sizeof path, "%s/%s/kernel.json", spec_dirs[i], lang);
      cleanup_free char *text = NULL;
      size_t len = 0;
      err_t e = ERR_INIT;
      if (sandbox_read (rt, sid, path, CODE_KERNELSPEC_MAX, &text, &len, &e) < 0)
        {
          bool missing = e.status == ENOENT && sbx_get (rt, sid, &(sbx_info_t){0}, &(err_t) ERR_INIT) == 0;
          if (!missing)
            {
              *err = e;
              return -1;
            }
          err_release (&e);
          continue;
        }
      return spec_parse (text, len, lang, out, err);
    }
  return err_make (err, ENOENT, "no kernelspec `%s` in the sandbox (looked in %s, %s, %s)", lang, spec_dirs[0],
                   spec_dirs[1], spec_dirs[2]);
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

/* On a thread inside the sandbox's network namespace: the ZMQ context (its
 * I/O thread starts here, so it stays in the namespace) and the sockets. */
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
  void **socks[] = {&c->shell, &c->control, &c->iopub};
  for (int i = 0; i < 3; i++)
    if (*socks[i] != NULL)
      {
        zmq_close (*socks[i]);
        *socks[i] = NULL;
      }
  if (c->zctx != NULL)
    {
      zmq_ctx_term (c->zctx);
      c->zctx = NULL;
    }
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
kernel_argv (const spec_t *spec, const char *conn, char ***argv, err_t *err)
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
          strv_free (v);
          return err_make (err, ENOMEM, "kernel argv: out of memory");
        }
    }
  *argv = v;
  return 0;
}

static int
merged_env (char *const *a, char *const *b, char ***out, err_t *err)
{
  size_t n = 0, k = 0;
  for (char *const *p = a; p && *p; p++)
    n++;
  for (char *const *p = b; p && *p; p++)
    n++;
  char **v = calloc (n + 1, sizeof *v);
  if (v == NULL)
    return err_make (err, ENOMEM, "kernel env: out of memory");
  for (char *const *p = a; p && *p; p++)
    if ((v[k++] = strdup (*p)) == NULL)
      goto oom;
  for (char *const *p = b; p && *p; p++)
    if ((v[k++] = strdup (*p)) == NULL)
      goto oom;
  *out = v;
  return 0;
oom:
  strv_free (v);
  return err_make (err, ENOMEM, "kernel env: out of memory");
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
 * (other messages are dropped), until `deadline`; checks the kernel's exit
 * and the context's closing. */
static int
await_reply (sbx_runtime_t *rt, code_ctx_t *c, void *sock, const char *parent, const char *type, int64_t deadline,
             jmsg_t *out, err_t *err)
{
  for (;;)
    {
      int64_t left = deadline - code_mono_ms ();
      if (left <= 0)
        return err_make (err, ETIMEDOUT, "the kernel did not answer `%s` in time", type);
      if (atomic_load (&c->closing))
        return err_make (err, ECANCELED, "the context is being deleted");
      if (code_kernel_exited (rt, c))
        return err_make (err, EIO, "%s", c->restart_reason);
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
await_iopub (sbx_runtime_t *rt, code_ctx_t *c, int64_t deadline, err_t *err)
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
      if (await_reply (rt, c, c->shell, id, "kernel_info_reply", deadline, &m, err) < 0)
        return -1;
      jmsg_clear (&m);
      int64_t until = code_mono_ms () + 500;
      if (until > deadline)
        until = deadline;
      err_t e = ERR_INIT;
      rc = await_reply (rt, c, c->iopub, id, "status", until, &m, &e);
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
kernel_start_once (sbx_runtime_t *rt, code_ctx_t *c, err_t *err)
{
  spec_t spec = {0};
  if (spec_load (rt, c->sid, c->info.language, &spec, err) < 0)
    return -1;
  c->interrupt_message = spec.interrupt_message;
  char key[37];
  jmsg_uuid (key);
  snprintf (c->key, sizeof c->key, "%s", key);
  jmsg_uuid (c->session);
  c->restart_reason[0] = '\0';
  zjob_t j = {.c = c};
  pick_ports (j.ports);
  char conn[128];
  snprintf (conn, sizeof conn, CONN_DIR "/kernel-%s.json", c->info.id);
  cleanup_free char *cj = connection_json (c, j.ports);
  char **argv = NULL, **env = NULL;
  int rc = cj == NULL ? err_make (err, ENOMEM, "connection file: out of memory") : 0;
  if (rc == 0)
    rc = sandbox_write (rt, c->sid, conn, cj, err);
  if (rc == 0)
    rc = kernel_argv (&spec, conn, &argv, err);
  if (rc == 0)
    rc = merged_env (spec.env, c->env, &env, err);
  if (rc == 0)
    {
      sbx_exec_req_t req
          = {.id = c->sid, .argv = argv, .env = env, .cwd = c->info.cwd, .no_timeout = true, .background = true};
      rc = sbx_proc_start (rt, &req, NULL, &c->proc, err);
    }
  strv_free (argv);
  strv_free (env);
  spec_free (&spec);
  if (rc == 0)
    rc = sbx_netns_run (rt, c->sid, zjob_main, &j, err);
  if (rc == 0 && j.error != 0)
    rc = err_make_sys (err, j.error, "ZMQ sockets to the kernel");
  if (rc == 0)
    rc = await_iopub (rt, c, code_mono_ms () + CODE_START_MS, err);
  if (rc < 0)
    code_kernel_close (rt, c);
  return rc;
}

/* Starts c's kernel (run_mu held; none running): again on other ports when
 * the kernel exited because one of its ports was taken, KERNEL_START_TRIES
 * tries in all. */
#define KERNEL_START_TRIES 3
int
code_kernel_start (sbx_runtime_t *rt, code_ctx_t *c, err_t *err)
{
  for (int i = 1;; i++)
    {
      err_t e = ERR_INIT;
      if (kernel_start_once (rt, c, &e) == 0)
        return 0;
      if (i == KERNEL_START_TRIES || e.status != EIO || e.msg == NULL
          || strstr (e.msg, "Address already in use") == NULL)
        {
          *err = e;
          return err_wrap (err, "start kernel `%s`", c->info.language);
        }
      err_release (&e);
    }
}

/* ---- the registry ---------------------------------------------------------- */

void
code_ctx_unref (code_ctx_t *c, sbx_runtime_t *rt)
{
  pthread_mutex_lock (&reg_mu);
  bool last = --c->refs == 0;
  pthread_mutex_unlock (&reg_mu);
  if (!last)
    return;
  code_kernel_close (rt, c);
  strv_free (c->env);
  pthread_mutex_destroy (&c->run_mu);
  free (c);
}

/* Unlinks c (reg_mu held); the registry's reference is the caller's. */
static void
unlink_locked (code_ctx_t *c)
{
  for (code_ctx_t **pp = &reg_head; *pp != NULL; pp = &(*pp)->next)
    if (*pp == c)
      {
        *pp = c->next;
        c->removed = true;
        atomic_store (&c->closing, true);
        return;
      }
}

/* Drops contexts of an earlier sandbox of the same id (reg_mu held);
 * returns them in a list to release. */
static code_ctx_t *
stale_locked (const char *sid, int64_t created)
{
  code_ctx_t *dead = NULL;
  for (code_ctx_t **pp = &reg_head; *pp != NULL;)
    {
      code_ctx_t *c = *pp;
      if (strcmp (c->sid, sid) == 0 && c->sbx_created_ms != created)
        {
          *pp = c->next;
          c->removed = true;
          atomic_store (&c->closing, true);
          c->next = dead;
          dead = c;
        }
      else
        pp = &c->next;
    }
  return dead;
}

static void
release_list (code_ctx_t *dead, sbx_runtime_t *rt)
{
  while (dead != NULL)
    {
      code_ctx_t *n = dead->next;
      code_ctx_unref (dead, rt);
      dead = n;
    }
}

/* Drops the contexts of sandboxes that are gone without a Delete (the
 * idle reaper), so that their ZMQ threads do not wait for the id's next
 * use. sbx_list renews no idle timer. Best effort. */
static void
sweep_gone (sbx_runtime_t *rt)
{
  sbx_info_t *all = NULL;
  size_t n = 0;
  err_t e = ERR_INIT;
  if (sbx_list (rt, &all, &n, &e) < 0)
    {
      err_release (&e);
      return;
    }
  code_ctx_t *dead = NULL;
  pthread_mutex_lock (&reg_mu);
  for (code_ctx_t **pp = &reg_head; *pp != NULL;)
    {
      code_ctx_t *c = *pp;
      bool live = false;
      for (size_t i = 0; i < n && !live; i++)
        live = strcmp (all[i].id, c->sid) == 0 && all[i].created_ms == c->sbx_created_ms;
      if (!live)
        {
          *pp = c->next;
          c->removed = true;
          atomic_store (&c->closing, true);
          c->next = dead;
          dead = c;
        }
      else
        pp = &c->next;
    }
  pthread_mutex_unlock (&reg_mu);
  free (all);
  release_list (dead, rt);
}

/* The sandbox (renewing its idle timer), stale contexts dropped. */
static int
sandbox_checked (sbx_runtime_t *rt, const char *sid, int64_t *created, err_t *err)
{
  sbx_info_t info;
  if (sbx_get (rt, sid, &info, err) < 0)
    return -1;
  if (info.dead)
    return err_make (err, EBUSY, "sandbox `%s` is dead: %s", sid, info.dead_reason);
  pthread_mutex_lock (&reg_mu);
  code_ctx_t *dead = stale_locked (sid, info.created_ms);
  pthread_mutex_unlock (&reg_mu);
  release_list (dead, rt);
  *created = info.created_ms;
  return 0;
}

size_t
code_count (const char *sid, int64_t created_ms)
{
  size_t n = 0;
  pthread_mutex_lock (&reg_mu);
  for (code_ctx_t *c = reg_head; c != NULL; c = c->next)
    n += strcmp (c->sid, sid) == 0 && c->sbx_created_ms == created_ms;
  pthread_mutex_unlock (&reg_mu);
  return n;
}

/* Holds context `cid` (or the default of `lang` when cid is empty: NULL
 * with no error when there is none). */
static code_ctx_t *
ctx_find (const char *sid, const char *cid, const char *lang)
{
  pthread_mutex_lock (&reg_mu);
  code_ctx_t *c = reg_head;
  for (; c != NULL; c = c->next)
    if (strcmp (c->sid, sid) == 0
        && (cid[0] ? strcmp (c->info.id, cid) == 0 : c->info.is_default && strcmp (c->info.language, lang) == 0))
      break;
  if (c != NULL)
    c->refs++;
  pthread_mutex_unlock (&reg_mu);
  return c;
}

/* Makes and registers a context (its kernel not started), held. */
static int
ctx_new (sbx_runtime_t *rt, const char *sid, int64_t created, const char *lang, const char *cwd, char *const *env,
         bool is_default, code_ctx_t **out, err_t *err)
{
  if (!name_valid (lang, CODE_LANGUAGE_MAX))
    return err_make (err, EINVAL, "invalid language `%s`", lang);
  if (cwd != NULL && cwd[0] != '\0' && (cwd[0] != '/' || strlen (cwd) > CODE_CWD_MAX))
    return err_make (err, EINVAL, "cwd must be an absolute path of at most %d bytes", CODE_CWD_MAX);
  code_ctx_t *c = calloc (1, sizeof *c);
  if (c == NULL || merged_env (env, NULL, &c->env, err) < 0)
    {
      free (c);
      return err_make (err, ENOMEM, "CreateContext: out of memory");
    }
  pthread_mutex_init (&c->run_mu, NULL);
  snprintf (c->sid, sizeof c->sid, "%s", sid);
  c->sbx_created_ms = created;
  char uuid[37];
  jmsg_uuid (uuid);
  snprintf (c->info.id, sizeof c->info.id, "ctx-%.8s%.4s", uuid, uuid + 9);
  snprintf (c->info.language, sizeof c->info.language, "%s", lang);
  snprintf (c->info.cwd, sizeof c->info.cwd, "%s", cwd != NULL && cwd[0] ? cwd : "/root");
  c->info.created_ms = wall_ms ();
  c->info.is_default = is_default;
  c->refs = 2; /* the registry's and the caller's */
  size_t max = (size_t) sbx_runtime_config (rt)->max_contexts;
  size_t max_total = (size_t) sbx_runtime_config (rt)->max_contexts_total;
  pthread_mutex_lock (&reg_mu);
  size_t n = 0, total = 0;
  bool taken = false;
  for (code_ctx_t *o = reg_head; o != NULL; o = o->next, total++)
    if (strcmp (o->sid, sid) == 0)
      {
        n++;
        taken |= is_default && o->info.is_default && strcmp (o->info.language, lang) == 0;
      }
  bool full = total >= max_total;
  if (n < max && !taken && !full)
    {
      c->next = reg_head;
      reg_head = c;
    }
  pthread_mutex_unlock (&reg_mu);
  if (n >= max || taken || full)
    {
      strv_free (c->env);
      pthread_mutex_destroy (&c->run_mu);
      free (c);
      if (taken)
        return err_make (err, EAGAIN, "sandbox `%s`: its default `%s` context is being made; retry", sid, lang);
      if (n >= max)
        return err_make (err, EAGAIN, "sandbox `%s` has %zu code contexts (SANDBOX_MAX_CONTEXTS)", sid, n);
      return err_make (err, EAGAIN, "the gateway has %zu code contexts (SANDBOX_MAX_CONTEXTS_TOTAL); delete some",
                       total);
    }
  *out = c;
  return 0;
}

/* Unregisters c and releases the registry's reference. */
static void
ctx_remove (sbx_runtime_t *rt, code_ctx_t *c)
{
  pthread_mutex_lock (&reg_mu);
  bool was = !c->removed;
  unlink_locked (c);
  pthread_mutex_unlock (&reg_mu);
  if (was)
    code_ctx_unref (c, rt);
}

static int
create_started (sbx_runtime_t *rt, const char *sid, const char *lang, const char *cwd, char *const *env,
                bool is_default, code_ctx_t **out, err_t *err)
{
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  sweep_gone (rt);
  code_ctx_t *c = NULL;
  if (ctx_new (rt, sid, created, lang, cwd, env, is_default, &c, err) < 0)
    return -1;
  pthread_mutex_lock (&c->run_mu);
  int rc = code_kernel_start (rt, c, err);
  pthread_mutex_unlock (&c->run_mu);
  if (rc < 0)
    {
      ctx_remove (rt, c);
      code_ctx_unref (c, rt);
      return -1;
    }
  *out = c;
  return 0;
}

int
code_create (sbx_runtime_t *rt, const char *sid, const char *language, const char *cwd, char *const *env,
             code_info_t *out, err_t *err)
{
  code_ctx_t *c = NULL;
  if (create_started (rt, sid, language && language[0] ? language : "python3", cwd, env, false, &c, err) < 0)
    return -1;
  *out = c->info;
  code_ctx_unref (c, rt);
  return 0;
}

/* The kernelspec names found in the sandbox's image. */
static int
list_languages (sbx_runtime_t *rt, const char *sid, char ***out, size_t *n, err_t *err)
{
  char **v = calloc (CODE_MAX_LANGUAGES + 1, sizeof *v);
  if (v == NULL)
    return err_make (err, ENOMEM, "ListContexts: out of memory");
  size_t k = 0;
  for (size_t d = 0; d < N_SPEC_DIRS; d++)
    {
      sbx_file_req_t req = {.id = sid, .op = SBX_FILE_LIST, .path = spec_dirs[d], .depth = 1};
      sbx_file_t *f = NULL;
      err_t e = ERR_INIT;
      if (sbx_file_start (rt, &req, never_gone, NULL, &f, &e) < 0)
        {
          err_release (&e);
          continue;
        }
      sbx_file_msg_t msg;
      while (sbx_file_next (f, &msg, &e) > 0)
        {
          if (msg.kind != SBX_FRAME_INFO || msg.info.type != SBX_FTYPE_DIR)
            continue;
          const char *slash = strrchr (msg.path, '/');
          const char *name = slash ? slash + 1 : msg.path;
          bool dup = !name_valid (name, CODE_LANGUAGE_MAX);
          for (size_t i = 0; i < k && !dup; i++)
            dup = strcmp (v[i], name) == 0;
          if (dup)
            continue;
          if (k == CODE_MAX_LANGUAGES)
            {
              err_release (&e);
              sbx_file_close (f);
              strv_free (v);
              return err_make (err, E2BIG, "more than %d kernelspecs in the sandbox", CODE_MAX_LANGUAGES);
            }
          if ((v[k] = strdup (name)) != NULL)
            k++;
        }
      err_release (&e);
      sbx_file_close (f);
    }
  *out = v;
  *n = k;
  return 0;
}

int
code_list (sbx_runtime_t *rt, const char *sid, code_info_t **out, size_t *n, char ***languages, size_t *n_lang,
           err_t *err)
{
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  pthread_mutex_lock (&reg_mu);
  size_t k = 0, cap = 0;
  for (code_ctx_t *c = reg_head; c != NULL; c = c->next)
    cap += strcmp (c->sid, sid) == 0;
  code_info_t *v = calloc (cap + 1, sizeof *v);
  for (code_ctx_t *c = reg_head; c != NULL && v != NULL; c = c->next)
    if (strcmp (c->sid, sid) == 0)
      v[k++] = c->info;
  pthread_mutex_unlock (&reg_mu);
  if (v == NULL)
    return err_make (err, ENOMEM, "ListContexts: out of memory");
  if (list_languages (rt, sid, languages, n_lang, err) < 0)
    {
      free (v);
      return -1;
    }
  *out = v;
  *n = k;
  return 0;
}

static int
ctx_get (sbx_runtime_t *rt, const char *sid, const char *cid, code_ctx_t **out, err_t *err)
{
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  *out = ctx_find (sid, cid, "");
  if (*out == NULL)
    return err_make (err, ENOENT, "sandbox `%s` has no code context `%s`", sid, cid);
  return 0;
}

int
code_restart (sbx_runtime_t *rt, const char *sid, const char *cid, code_info_t *out, err_t *err)
{
  code_ctx_t *c = NULL;
  if (ctx_get (rt, sid, cid, &c, err) < 0)
    return -1;
  pthread_mutex_lock (&c->run_mu);
  code_kernel_close (rt, c);
  int rc = code_kernel_start (rt, c, err);
  pthread_mutex_unlock (&c->run_mu);
  *out = c->info;
  code_ctx_unref (c, rt);
  return rc;
}

int
code_delete (sbx_runtime_t *rt, const char *sid, const char *cid, err_t *err)
{
  code_ctx_t *c = NULL;
  if (ctx_get (rt, sid, cid, &c, err) < 0)
    return -1;
  ctx_remove (rt, c);
  /* A cell running sees `closing` within CODE_POLL_MS; the kernel goes
   * with the last reference. */
  pthread_mutex_lock (&c->run_mu);
  code_kernel_close (rt, c);
  pthread_mutex_unlock (&c->run_mu);
  code_ctx_unref (c, rt);
  return 0;
}

void
code_forget_sandbox (sbx_runtime_t *rt, const char *sid)
{
  pthread_mutex_lock (&reg_mu);
  code_ctx_t *dead = stale_locked (sid, INT64_MIN);
  pthread_mutex_unlock (&reg_mu);
  release_list (dead, rt);
}

int
code_ctx_for_run (sbx_runtime_t *rt, const char *sid, const char *cid, const char *lang, code_ctx_t **out, err_t *err)
{
  if (cid != NULL && cid[0] != '\0')
    return ctx_get (rt, sid, cid, out, err);
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  *out = ctx_find (sid, "", lang);
  if (*out != NULL)
    return 0;
  return create_started (rt, sid, lang, NULL, NULL, true, out, err);
}
