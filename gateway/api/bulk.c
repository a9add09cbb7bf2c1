/* api/bulk: a call that reads every sandbox (List) runs its thread at a
 * lower CPU priority, API_BULK_NICE, for as long as it builds its answer:
 * on a loaded machine it then yields to the calls whose latency matters
 * (Exec, file calls), which it no longer blocks on the registry lock either.
 * Only when the gateway may raise the priority back afterwards (it holds
 * CAP_SYS_NICE, as the root of a privileged container does): otherwise the
 * server thread would stay slow for the calls it runs next, and bulk calls
 * run at normal priority. Thread-safe: a thread changes only its own
 * priority. */
#include <errno.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "gateway/api/internal.h"

static bool
may_raise_priority (void)
{
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2] = {{0}};
  if (syscall (SYS_capget, &hdr, data) < 0)
    return false;
  return (data[CAP_SYS_NICE / 32].effective & (1u << (CAP_SYS_NICE % 32))) != 0;
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool bulk_allowed;

static void
probe (void)
{
  bulk_allowed = may_raise_priority ();
  if (!bulk_allowed)
    log_msg (SEV_INFO, "api: without CAP_SYS_NICE, List runs at normal CPU priority");
}

void
api_bulk_enter (api_bulk_t *b)
{
  b->lowered = false;
  pthread_once (&probe_once, probe);
  if (!bulk_allowed)
    return;
  pid_t tid = (pid_t) syscall (SYS_gettid);
  errno = 0;
  int prev = getpriority (PRIO_PROCESS, (id_t) tid);
  if (errno != 0 || prev >= API_BULK_NICE)
    return;
  if (setpriority (PRIO_PROCESS, (id_t) tid, API_BULK_NICE) == 0)
    {
      b->prev = prev;
      b->lowered = true;
    }
}

void
api_bulk_leave (api_bulk_t *b)
{
  if (!b->lowered)
    return;
  pid_t tid = (pid_t) syscall (SYS_gettid);
  if (setpriority (PRIO_PROCESS, (id_t) tid, b->prev) < 0)
    log_msg (SEV_WARNING, "api: cannot restore a server thread's CPU priority to %d: %m", b->prev);
  b->lowered = false;
}
