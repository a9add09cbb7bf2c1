/* metrics: atomic counters and their Prometheus rendering (see metrics.h). */
#include "shim/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Label values come from fixed sets (methods below, route templates, the
 * statuses the shim answers; a sandbox server's statuses by class only),
 * so the series are few; should they ever fill
 * the table, the rest is counted in the last slot ({route="overflow"})
 * rather than dropped. */
#define MAX_SERIES 1024

typedef struct series_s
{
  char method[8];
  char route[64]; /* the longest template is 38 characters */
  char status[8]; /* "404", or a class: "2xx" */
  atomic_ullong count;
  atomic_ullong micros;
  atomic_bool used;
} series_t;

static series_t series[MAX_SERIES];
static atomic_int n_series;
static pthread_mutex_t series_mu = PTHREAD_MUTEX_INITIALIZER;

static const double exec_bounds[] = {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800, 3600};
#define N_BOUNDS (sizeof exec_bounds / sizeof exec_bounds[0])
static atomic_ullong exec_buckets[N_BOUNDS + 1];
static atomic_ullong exec_count, exec_micros;
static atomic_ullong bytes_up, bytes_down;
static atomic_ullong gateway_errors[17];
static const char *const miss_outcomes[] = {"restored", "absent", "failed"};
#define N_MISS (sizeof miss_outcomes / sizeof miss_outcomes[0])
static atomic_ullong misses[N_MISS];

static series_t *
find_series (int n, const char *method, const char *route, const char *status)
{
  for (int i = 0; i < n; i++)
    if (strcmp (series[i].status, status) == 0 && strcmp (series[i].route, route) == 0
        && strcmp (series[i].method, method) == 0)
      return &series[i];
  return NULL;
}

/* The status label: the number, or for a foreign status its class. */
static void
status_label (unsigned status, bool foreign, char out[8])
{
  if (!foreign)
    snprintf (out, 8, "%u", status % 1000);
  else if (status >= 100 && status < 600)
    snprintf (out, 8, "%uxx", status / 100);
  else
    snprintf (out, 8, "other");
}

/* A method as a label: one of the methods HTTP defines, else "other" (a
 * request line's method is whatever the client wrote). */
static const char *
method_label (const char *method)
{
  static const char *const known[] = {"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"};
  for (size_t i = 0; method != NULL && i < sizeof known / sizeof known[0]; i++)
    if (strcmp (method, known[i]) == 0)
      return known[i];
  return "other";
}

void
metrics_request (const char *method, const char *route, unsigned code, bool foreign, double seconds)
{
  method = method_label (method);
  if (route == NULL || route[0] != '/')
    route = "other"; /* no route matched: one series, whatever the path */
  char status[8];
  status_label (code, foreign, status);
  series_t *s = find_series (atomic_load (&n_series), method, route, status);
  if (s == NULL)
    {
      /* New series are rare (routes × statuses): create them under a lock. */
      pthread_mutex_lock (&series_mu);
      int n = atomic_load (&n_series);
      s = find_series (n, method, route, status);
      if (s == NULL)
        {
          bool full = n >= MAX_SERIES - 1;
          s = &series[full ? MAX_SERIES - 1 : n];
          if (!atomic_load (&s->used))
            {
              snprintf (s->method, sizeof s->method, "%s", full ? "other" : method);
              snprintf (s->route, sizeof s->route, "%s", full ? "overflow" : route);
              snprintf (s->status, sizeof s->status, "%s", full ? "0" : status);
              atomic_store (&s->used, true);
              atomic_store (&n_series, full ? MAX_SERIES : n + 1);
            }
        }
      pthread_mutex_unlock (&series_mu);
    }
  atomic_fetch_add (&s->count, 1);
  atomic_fetch_add (&s->micros, (unsigned long long) (seconds * 1e6));
}

void
metrics_exec_duration (double seconds)
{
  size_t b = 0;
  while (b < N_BOUNDS && seconds > exec_bounds[b])
    b++;
  atomic_fetch_add (&exec_buckets[b], 1);
  atomic_fetch_add (&exec_count, 1);
  atomic_fetch_add (&exec_micros, (unsigned long long) (seconds * 1e6));
}

void
metrics_bytes (bool upload, uint64_t n)
{
  atomic_fetch_add (upload ? &bytes_up : &bytes_down, n);
}

void
metrics_restore_on_miss (const char *outcome)
{
  for (size_t i = 0; i < N_MISS; i++)
    if (strcmp (outcome, miss_outcomes[i]) == 0)
      atomic_fetch_add (&misses[i], 1);
}

void
metrics_gateway_error (grpc_status_code code)
{
  if ((unsigned) code < 17)
    atomic_fetch_add (&gateway_errors[code], 1);
}

void
metrics_render (FILE *f)
{
  fputs ("# HELP shim_requests_total HTTP requests by method, route and status.\n"
         "# TYPE shim_requests_total counter\n",
         f);
  int n = atomic_load (&n_series);
  for (int i = 0; i < n && i < MAX_SERIES; i++)
    if (atomic_load (&series[i].used))
      fprintf (f, "shim_requests_total{method=\"%s\",route=\"%s\",status=\"%s\"} %llu\n", series[i].method,
               series[i].route, series[i].status, atomic_load (&series[i].count));
  fputs ("# HELP shim_request_seconds_total Time spent serving requests.\n"
         "# TYPE shim_request_seconds_total counter\n",
         f);
  for (int i = 0; i < n && i < MAX_SERIES; i++)
    if (atomic_load (&series[i].used))
      fprintf (f, "shim_request_seconds_total{method=\"%s\",route=\"%s\",status=\"%s\"} %.6f\n", series[i].method,
               series[i].route, series[i].status, atomic_load (&series[i].micros) / 1e6);
  fputs ("# HELP shim_exec_duration_seconds Duration of execs.\n# TYPE shim_exec_duration_seconds histogram\n", f);
  unsigned long long cum = 0;
  for (size_t b = 0; b < N_BOUNDS; b++)
    {
      cum += atomic_load (&exec_buckets[b]);
      fprintf (f, "shim_exec_duration_seconds_bucket{le=\"%g\"} %llu\n", exec_bounds[b], cum);
    }
  cum += atomic_load (&exec_buckets[N_BOUNDS]);
  fprintf (f, "shim_exec_duration_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
  fprintf (f, "shim_exec_duration_seconds_sum %.6f\n", atomic_load (&exec_micros) / 1e6);
  fprintf (f, "shim_exec_duration_seconds_count %llu\n", atomic_load (&exec_count));
  fputs ("# HELP shim_bytes_streamed_total Bytes streamed through the shim.\n"
         "# TYPE shim_bytes_streamed_total counter\n",
         f);
  fprintf (f, "shim_bytes_streamed_total{direction=\"upload\"} %llu\n", atomic_load (&bytes_up));
  fprintf (f, "shim_bytes_streamed_total{direction=\"download\"} %llu\n", atomic_load (&bytes_down));
  fputs ("# HELP shim_gateway_errors_total Failed gateway calls by gRPC status.\n"
         "# TYPE shim_gateway_errors_total counter\n",
         f);
  for (int c = 1; c < 17; c++)
    fprintf (f, "shim_gateway_errors_total{code=\"%s\"} %llu\n", rpc_status_name ((grpc_status_code) c),
             atomic_load (&gateway_errors[c]));
  fputs ("# HELP shim_restores_on_miss_total Sandboxes their gateway did not hold, restored from the store first "
         "(SHIM_RESTORE_ON_MISS), by outcome.\n"
         "# TYPE shim_restores_on_miss_total counter\n",
         f);
  for (size_t i = 0; i < N_MISS; i++)
    fprintf (f, "shim_restores_on_miss_total{outcome=\"%s\"} %llu\n", miss_outcomes[i], atomic_load (&misses[i]));
}
