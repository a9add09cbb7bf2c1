/* members: the gateway set and rendezvous routing (see members.h). */
#include "shim/members.h"

#include <arpa/nameser.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <resolv.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/target.h"

#define MEMBER_NAME_MAX 300
#define SRV_PREFIX "dns-srv:"
/* Calls go here when no member is listed: a path nothing can create, so
 * the call fails at once, UNAVAILABLE. */
/* The longest a health probe may take (at most one health period): a hung
 * gateway is then found down within two periods. */
#define MEMBERS_PROBE_DEADLINE_MS 5000
/* How often the first probes are looked for at start. */
#define MEMBERS_FIRST_PROBE_POLL_MS 50
#define NOWHERE_TARGET "unix:/proc/self/sandbox-shim-no-gateway"

static const char *const state_names[] = {"down", "up", "draining"};

typedef struct member_s
{
  char name[MEMBER_NAME_MAX]; /* stable: hashed for routing; also the target */
  uint64_t hash;
  rpc_channel_t *ch;
  pthread_t prober;
  bool prober_started;
  atomic_int state;
  atomic_bool listed;
  atomic_bool probed; /* a probe has finished */
  atomic_ullong routed, failovers;
} member_t;

static struct
{
  members_config_t cfg;
  rpc_opts_t opts;
  bool routing; /* SHIM_GATEWAYS set */
  member_t table[MEMBERS_MAX];
  atomic_int n; /* published entries of table */
  rpc_channel_t *nowhere;
  pthread_mutex_t mu; /* appends; the condition below */
  pthread_cond_t cond;
  bool stopping;
  pthread_t resolver;
  bool resolver_started;
  atomic_ullong routed_nowhere;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* ---- hashing ------------------------------------------------------------- */

/* MurmurHash3's 64-bit finaliser: every input bit affects every output bit. */
static uint64_t
mix64 (uint64_t k)
{
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

/* FNV-1a over the text, then mixed. */
static uint64_t
hash_text (const char *s)
{
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s != '\0'; s++)
    h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
  return mix64 (h);
}

/* The rendezvous weight of member hash `m` for id hash `id`. */
static uint64_t
weight (uint64_t m, uint64_t id)
{
  return mix64 (m ^ mix64 (id + 0x9e3779b97f4a7c15ULL));
}

uint64_t
members_weight (const char *member, const char *id)
{
  return weight (hash_text (member), hash_text (id != NULL ? id : ""));
}

int
members_choose (const uint64_t *weights, const bool *listed, const member_state_t *states, size_t n, bool *failover)
{
  int best = -1, live = -1;
  for (size_t i = 0; i < n; i++)
    {
      if (!listed[i])
        continue;
      if (best < 0 || weights[i] > weights[best])
        best = (int) i;
      if (states[i] != MEMBER_DOWN && (live < 0 || weights[i] > weights[live]))
        live = (int) i;
    }
  if (live < 0)
    live = best;
  *failover = live != best;
  return live;
}

member_state_t
members_state_of_probe (bool answered, bool serving, bool refused_by_handler)
{
  if (!answered)
    return MEMBER_DOWN;
  if (serving)
    return MEMBER_UP;
  return refused_by_handler ? MEMBER_DRAINING : MEMBER_DOWN;
}

/* ---- the table ------------------------------------------------------------- */

static int64_t
mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static member_t *
find (const char *name)
{
  int n = atomic_load (&g.n);
  for (int i = 0; i < n; i++)
    if (strcmp (g.table[i].name, name) == 0)
      return &g.table[i];
  return NULL;
}

static void set_state (member_t *m, member_state_t s, const char *why);
static void *prober_main (void *arg);

/* Adds `name` (under g.mu). NULL when the table is full or the channel
 * cannot be made. */
static member_t *
add_locked (const char *name, err_t *err)
{
  int n = atomic_load (&g.n);
  if (n >= MEMBERS_MAX)
    {
      err_make (err, ENOSPC, "more than %d gateways: `%s` ignored", MEMBERS_MAX, name);
      return NULL;
    }
  member_t *m = &g.table[n];
  memset (m, 0, sizeof *m);
  snprintf (m->name, sizeof m->name, "%s", name);
  m->hash = hash_text (name);
  if (rpc_channel_new (name, &g.opts, &m->ch, err) < 0)
    return NULL;
  /* A single gateway is never probed: it is up. */
  atomic_store (&m->state, g.routing ? MEMBER_DOWN : MEMBER_UP);
  atomic_store (&m->probed, !g.routing);
  atomic_store (&m->listed, true);
  if (g.routing)
    {
      int rc = pthread_create (&m->prober, NULL, prober_main, m);
      if (rc != 0)
        {
          rpc_channel_destroy (m->ch);
          err_make (err, rc, "gateway `%s`: cannot start its prober", name);
          return NULL;
        }
      m->prober_started = true;
    }
  atomic_store (&g.n, n + 1);
  return m;
}

/* Makes the listed members exactly `names` (n of them). */
static void
set_listed (char names[][MEMBER_NAME_MAX], size_t n)
{
  pthread_mutex_lock (&g.mu);
  int have = atomic_load (&g.n);
  for (int i = 0; i < have; i++)
    {
      member_t *m = &g.table[i];
      bool keep = false;
      for (size_t j = 0; j < n && !keep; j++)
        keep = strcmp (m->name, names[j]) == 0;
      if (atomic_exchange (&m->listed, keep) != keep)
        log_fields (keep ? SEV_INFO : SEV_WARNING, json_pack ("{s:s}", "gateway", m->name),
                    keep ? "gateway `%s` is listed again" : "gateway `%s` is no longer listed", m->name);
    }
  for (size_t j = 0; j < n; j++)
    if (find (names[j]) == NULL)
      {
        err_t err = ERR_INIT;
        if (add_locked (names[j], &err) == NULL)
          log_msg (SEV_ERROR, "gateway set: %s", err_msg (&err));
        else
          log_fields (SEV_INFO, json_pack ("{s:s}", "gateway", names[j]), "gateway `%s` joins the set", names[j]);
        err_release (&err);
      }
  pthread_cond_broadcast (&g.cond);
  pthread_mutex_unlock (&g.mu);
}

/* ---- probing ---------------------------------------------------------------- */

static void
set_state (member_t *m, member_state_t s, const char *why)
{
  member_state_t old = (member_state_t) atomic_exchange (&m->state, (int) s);
  if (old != s || !atomic_load (&m->probed))
    log_fields (s == MEMBER_UP ? SEV_INFO : SEV_WARNING,
                json_pack ("{s:s, s:s, s:s}", "gateway", m->name, "state", state_names[s], "reason", why),
                "gateway `%s` is %s: %s", m->name, state_names[s], why);
}

/* One probe: health Check, and when not serving, whether the gateway
 * refuses sandbox calls itself (draining) or serves them (its self-check
 * fails: down). */
static void
probe (member_t *m, int64_t deadline_ms)
{
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hreq.service = "sandbox.v1.Sandbox";
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  err_t err = ERR_INIT;
  char why[400];
  member_state_t s = MEMBER_DOWN;
  bool answered = rpc_client_unary (m->ch, "/grpc.health.v1.Health/Check", deadline_ms, NULL, 0, &hreq.base,
                                    &grpc__health__v1__health_check_response__descriptor, &resp, &st, &err)
                  == 0;
  if (!answered)
    snprintf (why, sizeof why, "health check failed (%s): %.300s", rpc_status_name (st.code),
              st.details != NULL ? st.details : "");
  else if (((Grpc__Health__V1__HealthCheckResponse *) resp)->status
           == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
    {
      s = members_state_of_probe (true, true, false);
      snprintf (why, sizeof why, "serving");
    }
  else
    {
      Sandbox__V1__StatusRequest sreq = SANDBOX__V1__STATUS_REQUEST__INIT;
      ProtobufCMessage *sresp = NULL;
      rpc_status_t sst = RPC_STATUS_INIT;
      err_t serr = ERR_INIT;
      int rc = rpc_client_unary (m->ch, "/sandbox.v1.Sandbox/Status", deadline_ms, g.cfg.md, g.cfg.n_md, &sreq.base,
                                 &sandbox__v1__status_response__descriptor, &sresp, &sst, &serr);
      s = members_state_of_probe (true, false, rc < 0 && sst.code == GRPC_STATUS_UNAVAILABLE && sst.from_handler);
      if (s == MEMBER_DRAINING)
        {
          snprintf (why, sizeof why, "not serving, refusing sandbox calls (%.300s)",
                    sst.details != NULL ? sst.details : "");
        }
      else
        snprintf (why, sizeof why, "health NOT_SERVING (its self-check fails)");
      if (sresp != NULL)
        protobuf_c_message_free_unpacked (sresp, NULL);
      rpc_status_release (&sst);
      err_release (&serr);
    }
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  err_release (&err);
  set_state (m, s, why);
  atomic_store (&m->probed, true);
}

/* Waits on g.cond (g.mu held) until woken or `until` (monotonic ms). */
static void
wait_until (int64_t until)
{
  int64_t left = until - mono_ms ();
  if (left <= 0)
    return;
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t) (left / 1000);
  ts.tv_nsec += (long) (left % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L)
    {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
  pthread_cond_timedwait (&g.cond, &g.mu, &ts);
}

static void *
prober_main (void *arg)
{
  member_t *m = arg;
  int64_t period = g.cfg.health_seconds * 1000;
  /* A probe answers within the period, so a hung gateway is found down
   * within two periods. */
  int64_t deadline = period < MEMBERS_PROBE_DEADLINE_MS ? period : MEMBERS_PROBE_DEADLINE_MS;
  pthread_mutex_lock (&g.mu);
  while (!g.stopping)
    {
      pthread_mutex_unlock (&g.mu);
      if (atomic_load (&m->listed))
        probe (m, deadline);
      int64_t next = mono_ms () + period;
      pthread_mutex_lock (&g.mu);
      pthread_cond_broadcast (&g.cond); /* members_start waits for first probes */
      while (!g.stopping && mono_ms () < next)
        wait_until (next);
    }
  pthread_mutex_unlock (&g.mu);
  return NULL;
}

/* ---- SRV --------------------------------------------------------------------- */

/* Resolves the SRV records of `name` into names[] ("<target>:<port>").
 * The count, or -1 when the query failed (the set is then kept as is). */
static int
resolve_srv (const char *name, char names[][MEMBER_NAME_MAX], size_t cap, char *why, size_t why_cap)
{
  struct __res_state rs;
  memset (&rs, 0, sizeof rs);
  if (res_ninit (&rs) != 0)
    {
      snprintf (why, why_cap, "cannot read the resolver configuration");
      return -1;
    }
  /* Only one thread resolves at a time (start-up, then the resolver). */
  static unsigned char ans[65536];
  int len = res_nquery (&rs, name, ns_c_in, ns_t_srv, ans, sizeof ans);
  int herr = rs.res_h_errno;
  res_nclose (&rs);
  if (len < 0)
    {
      snprintf (why, why_cap, "SRV query for `%s` failed: %s", name, hstrerror (herr));
      return -1;
    }
  ns_msg msg;
  if (ns_initparse (ans, len, &msg) < 0)
    {
      snprintf (why, why_cap, "SRV answer for `%s` does not parse", name);
      return -1;
    }
  size_t n = 0;
  for (int i = 0; i < ns_msg_count (msg, ns_s_an) && n < cap; i++)
    {
      ns_rr rr;
      if (ns_parserr (&msg, ns_s_an, i, &rr) < 0 || ns_rr_type (rr) != ns_t_srv || ns_rr_rdlen (rr) < 7)
        continue;
      const unsigned char *rd = ns_rr_rdata (rr);
      unsigned port = ns_get16 (rd + 4);
      char target[NS_MAXDNAME];
      if (dn_expand (ns_msg_base (msg), ns_msg_end (msg), rd + 6, target, sizeof target) < 0 || target[0] == '\0'
          || port == 0)
        continue;
      size_t tl = strlen (target);
      if (target[tl - 1] == '.')
        target[tl - 1] = '\0';
      char member[MEMBER_NAME_MAX];
      if ((size_t) snprintf (member, sizeof member, "%s:%u", target, port) >= sizeof member
          || !shim_target_valid (member))
        continue;
      bool dup = false;
      for (size_t j = 0; j < n && !dup; j++)
        dup = strcmp (names[j], member) == 0;
      if (!dup)
        memcpy (names[n++], member, sizeof member);
    }
  return (int) n;
}

/* One resolution; true when it gave an answer. */
static bool
refresh_srv (const char *name)
{
  static char names[MEMBERS_MAX][MEMBER_NAME_MAX];
  char why[600];
  int n = resolve_srv (name, names, MEMBERS_MAX, why, sizeof why);
  if (n < 0)
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "srv", name), "gateway set kept as it was: %s", why);
      return false;
    }
  set_listed (names, (size_t) n);
  return true;
}

static void *
resolver_main (void *arg)
{
  const char *name = arg;
  pthread_mutex_lock (&g.mu);
  while (!g.stopping)
    {
      int64_t next = mono_ms () + g.cfg.refresh_seconds * 1000;
      while (!g.stopping && mono_ms () < next)
        wait_until (next);
      if (g.stopping)
        break;
      pthread_mutex_unlock (&g.mu);
      refresh_srv (name);
      pthread_mutex_lock (&g.mu);
    }
  pthread_mutex_unlock (&g.mu);
  return NULL;
}

/* ---- the interface ------------------------------------------------------------ */

const char *
members_check_spec (const char *gateways)
{
  if (gateways == NULL)
    return NULL;
  if (strncmp (gateways, SRV_PREFIX, strlen (SRV_PREFIX)) == 0)
    {
      const char *name = gateways + strlen (SRV_PREFIX);
      if (name[0] == '\0' || strlen (name) >= NS_MAXDNAME || strpbrk (name, " ,/:") != NULL)
        return "dns-srv needs a DNS name (e.g. dns-srv:_grpc._tcp.sandbox-gateway.ns.svc.cluster.local)";
      return NULL;
    }
  char *copy = strdup (gateways);
  if (copy == NULL)
    return "out of memory";
  const char *why = NULL;
  size_t n = 0;
  char *save = NULL;
  for (char *t = strtok_r (copy, ",", &save); t != NULL && why == NULL; t = strtok_r (NULL, ",", &save))
    {
      n++;
      if (strlen (t) >= MEMBER_NAME_MAX || !shim_target_valid (t))
        why = "every entry must be a gateway address (host:port, [IPv6]:port, dns:..., ipv4:..., unix:...)";
    }
  free (copy);
  if (why == NULL && n == 0)
    why = "names no gateway";
  if (why == NULL && n > MEMBERS_MAX)
    why = "names more than " MEMBERS_MAX_TEXT " gateways";
  if (why == NULL && (gateways[0] == ',' || gateways[strlen (gateways) - 1] == ',' || strstr (gateways, ",,")))
    why = "has an empty entry";
  return why;
}

/* Waits until every listed member has been probed once, for at most
 * `ms`. */
static void
wait_first_probes (int64_t ms)
{
  int64_t end = mono_ms () + ms;
  pthread_mutex_lock (&g.mu);
  for (;;)
    {
      bool all = true;
      int n = atomic_load (&g.n);
      for (int i = 0; i < n && all; i++)
        all = !atomic_load (&g.table[i].listed) || atomic_load (&g.table[i].probed);
      int64_t left = end - mono_ms ();
      if (all || left <= 0)
        break;
      wait_until (mono_ms () + (left < MEMBERS_FIRST_PROBE_POLL_MS ? left : MEMBERS_FIRST_PROBE_POLL_MS));
    }
  pthread_mutex_unlock (&g.mu);
}

int
members_start (const members_config_t *cfg, err_t *err)
{
  g.cfg = *cfg;
  g.opts = *cfg->opts;
  g.routing = cfg->gateways != NULL;
  if (rpc_channel_new (NOWHERE_TARGET, &g.opts, &g.nowhere, err) < 0)
    return -1;
  if (!g.routing)
    {
      pthread_mutex_lock (&g.mu);
      member_t *m = add_locked (cfg->target, err);
      pthread_mutex_unlock (&g.mu);
      return m != NULL ? 0 : -1;
    }
  if (strncmp (cfg->gateways, SRV_PREFIX, strlen (SRV_PREFIX)) == 0)
    {
      const char *name = cfg->gateways + strlen (SRV_PREFIX);
      refresh_srv (name);
      int rc = pthread_create (&g.resolver, NULL, resolver_main, (void *) name);
      if (rc != 0)
        return err_make (err, rc, "cannot start the SRV resolver");
      g.resolver_started = true;
    }
  else
    {
      static char names[MEMBERS_MAX][MEMBER_NAME_MAX];
      char *copy = strdup (cfg->gateways);
      if (copy == NULL)
        return err_make (err, ENOMEM, "out of memory");
      size_t n = 0;
      char *save = NULL;
      for (char *t = strtok_r (copy, ",", &save); t != NULL && n < MEMBERS_MAX; t = strtok_r (NULL, ",", &save))
        snprintf (names[n++], MEMBER_NAME_MAX, "%s", t);
      free (copy);
      set_listed (names, n);
    }
  wait_first_probes (cfg->health_seconds * 1000 < 3000 ? cfg->health_seconds * 1000 : 3000);
  return 0;
}

void
members_stop (void)
{
  pthread_mutex_lock (&g.mu);
  g.stopping = true;
  pthread_cond_broadcast (&g.cond);
  pthread_mutex_unlock (&g.mu);
  if (g.resolver_started)
    pthread_join (g.resolver, NULL);
  int n = atomic_load (&g.n);
  for (int i = 0; i < n; i++)
    {
      if (g.table[i].prober_started)
        pthread_join (g.table[i].prober, NULL);
      rpc_channel_destroy (g.table[i].ch);
    }
  atomic_store (&g.n, 0);
  rpc_channel_destroy (g.nowhere);
  g.nowhere = NULL;
}

rpc_channel_t *
members_route (const char *id)
{
  uint64_t idh = hash_text (id != NULL ? id : "");
  uint64_t w[MEMBERS_MAX];
  bool listed[MEMBERS_MAX];
  member_state_t states[MEMBERS_MAX];
  int n = atomic_load (&g.n);
  for (int i = 0; i < n; i++)
    {
      member_t *m = &g.table[i];
      listed[i] = atomic_load (&m->listed);
      states[i] = (member_state_t) atomic_load (&m->state);
      w[i] = weight (m->hash, idh);
    }
  bool failover = false;
  int k = members_choose (w, listed, states, (size_t) n, &failover);
  if (k < 0)
    {
      atomic_fetch_add (&g.routed_nowhere, 1);
      return g.nowhere;
    }
  member_t *live = &g.table[k];
  atomic_fetch_add (&live->routed, 1);
  if (failover)
    atomic_fetch_add (&live->failovers, 1);
  return live->ch;
}

size_t
members_serving (rpc_channel_t **chs, const char **names, size_t cap)
{
  size_t k = 0;
  int n = atomic_load (&g.n);
  for (int i = 0; i < n && k < cap; i++)
    {
      member_t *m = &g.table[i];
      if (!atomic_load (&m->listed) || atomic_load (&m->state) == MEMBER_DOWN)
        continue;
      chs[k] = m->ch;
      names[k] = m->name;
      k++;
    }
  return k;
}

bool
members_routing (void)
{
  return g.routing;
}

void
members_render_metrics (FILE *f)
{
  int n = atomic_load (&g.n);
  fputs ("# HELP shim_gateway_up Whether a gateway of the set is up (1), draining (0.5) or down (0).\n"
         "# TYPE shim_gateway_up gauge\n",
         f);
  int listed = 0, up = 0;
  for (int i = 0; i < n; i++)
    {
      member_t *m = &g.table[i];
      if (!atomic_load (&m->listed))
        continue;
      int s = atomic_load (&m->state);
      listed++;
      up += s == MEMBER_UP;
      fprintf (f, "shim_gateway_up{gateway=\"%s\"} %s\n", m->name,
               s == MEMBER_UP         ? "1"
               : s == MEMBER_DRAINING ? "0.5"
                                      : "0");
    }
  fputs ("# HELP shim_gateway_calls_routed_total Gateway calls routed to each gateway by sandbox id.\n"
         "# TYPE shim_gateway_calls_routed_total counter\n",
         f);
  for (int i = 0; i < n; i++)
    fprintf (f, "shim_gateway_calls_routed_total{gateway=\"%s\"} %llu\n", g.table[i].name,
             atomic_load (&g.table[i].routed));
  fputs ("# HELP shim_gateway_failovers_total Calls routed to a gateway because the id's first choice was down.\n"
         "# TYPE shim_gateway_failovers_total counter\n",
         f);
  for (int i = 0; i < n; i++)
    fprintf (f, "shim_gateway_failovers_total{gateway=\"%s\"} %llu\n", g.table[i].name,
             atomic_load (&g.table[i].failovers));
  fprintf (f,
           "# HELP shim_gateway_members Gateways listed in the set.\n# TYPE shim_gateway_members gauge\n"
           "shim_gateway_members %d\n"
           "# HELP shim_gateway_members_up Gateways of the set that are up.\n# TYPE shim_gateway_members_up gauge\n"
           "shim_gateway_members_up %d\n"
           "# HELP shim_gateway_unrouted_total Calls made while no gateway was listed (they fail: 502).\n"
           "# TYPE shim_gateway_unrouted_total counter\n"
           "shim_gateway_unrouted_total %llu\n",
           listed, up, atomic_load (&g.routed_nowhere));
}
