/* runtime/cgroup: the cgroups of sandboxes, on cgroup v2 or v1.
 *
 * Layout, below every hierarchy we use (v2: the unified one; v1: pids,
 * memory, cpu and freezer):
 *
 *     <root>/<group>/<id>/          limits of the sandbox, and its pid 1
 *     <root>/<group>/<id>/exec-<n>  what exec number n started (tracking
 *                                   hierarchy only)
 *
 * <group> is one gateway instance's (SANDBOX_CGROUP_GROUP, by default
 * "sandbox-gateway"), so instances sharing a machine never touch each
 * other's sandboxes.
 *
 * One group per exec lets a timeout kill everything that exec started,
 * background children included, without touching the rest of the sandbox.
 * Limits are hierarchical, so they bind the whole sandbox.
 *
 * Creation, limits and joining happen in the single-threaded helper; the
 * gateway reads counters, kills, and changes the limits of a claimed
 * pooled sandbox before it runs anything (sbx_cg_update). No state beyond the detected
 * layout, which is computed once (sbx_cg_detect) and read-only after.
 */
#ifndef SBX_GATEWAY_CGROUP_H
#define SBX_GATEWAY_CGROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define SBX_CG_MAX_HIER 4

typedef struct sbx_cg_layout_s
{
  bool v2;
  /* Hierarchy roots of our group, e.g. /sys/fs/cgroup/pids/sandbox-gateway.
   * Index 0 is the tracking hierarchy (pids on v1): processes are listed
   * and counted there. */
  char roots[SBX_CG_MAX_HIER][192];
  size_t n;
  int freezer; /* index of the hierarchy with the freezer, -1 none */
  int memory;  /* index of the memory hierarchy, -1 none */
  int cpu;     /* index of the cpu hierarchy, -1 none */
} sbx_cg_layout_t;

/* The longest name below a root the module puts in a path (a sandbox id,
 * a sub-group, a file), and so the longest path it builds; a path that
 * does not fit fails (ENAMETOOLONG), never cut. */
#define SBX_CG_NAME_MAX 64
#define SBX_CG_PATH_MAX (sizeof (((sbx_cg_layout_t *) 0)->roots[0]) + 3 * (SBX_CG_NAME_MAX + 1))
/* A path below a group found in a walk (any name the kernel allows). */
#define SBX_CG_TREE_PATH_MAX 4096

/* Path builders. root[/id][/sub][/file] (NULL parts left out) into out
 * (cap bytes): its length, or -1 with *err (ENAMETOOLONG; err may be NULL)
 * and out "" when it does not fit. */
int sbx_cg_path (char *out, size_t cap, const char *root, const char *id, const char *sub, const char *file,
                 err_t *err);
/* Spare memory group n's directory (see below), as sbx_cg_path. */
int sbx_cg_spare_path (const sbx_cg_layout_t *l, unsigned n, char *path, size_t cap, err_t *err);

/* Limits of one sandbox. 0 means unlimited. */
typedef struct sbx_cg_limits_s
{
  long pids_max;
  long memory_mb;
  long cpu_millis; /* 1000 = one CPU */
} sbx_cg_limits_t;

/* Finds the hierarchies under `mount` (normally /sys/fs/cgroup) and names
 * `group` (a single path component) as this instance's. On v1 the cpu
 * hierarchy is used only when `cpu` (a CPU limit may be set): every
 * hierarchy costs a (slow) cgroup move per launch. The helper detects it
 * only for a sandbox that has a CPU limit; the gateway whenever one may
 * have: a sandbox without one has no group there, which the gateway's
 * removal, renaming and attaching allow for. */
int sbx_cg_detect (const char *mount, const char *group, bool cpu, sbx_cg_layout_t *out, err_t *err);

/* Creates <root>/<group> (and on v2 enables the controllers; on v1 makes
 * the holders' group, below). */
int sbx_cg_prepare (const sbx_cg_layout_t *l, err_t *err);

/* Creates the sandbox's group with its limits. `spare` (or NULL): the name
 * of a spare memory group (below) to take as the sandbox's, by renaming it;
 * when that fails, one is made as in the other hierarchies. */
int sbx_cg_create (const sbx_cg_layout_t *l, const char *id, const char *spare, const sbx_cg_limits_t *lim,
                   err_t *err);

/* Changes the limits of sandbox `id`'s existing groups from `from` (what
 * they were made with) to `to`, writing only what differs (a claimed
 * pooled sandbox: the gateway's threads, no process of the sandbox's has
 * run yet). A CPU limit needs the sandbox's group in the cpu hierarchy
 * (on v1, made with one: helper --cpu-group). Any failed write fails. */
int sbx_cg_update (const sbx_cg_layout_t *l, const char *id, const sbx_cg_limits_t *from, const sbx_cg_limits_t *to,
                   err_t *err);

/* Spare memory groups, <memory root>/<group>/.spare-<n>, made ahead of
 * launches by the gateway (cgroup v1 only: v2 cannot rename a group).
 * Bringing a memory cgroup online costs the kernel an allocation for every
 * shrinker the machine has had (each superblock registers one, so it grows
 * with live sandboxes); made ahead, that is not in a launch's time. Names
 * start with a dot: never a sandbox id. */
#define SBX_CG_SPARE_PREFIX ".spare-"
bool sbx_cg_spares_possible (const sbx_cg_layout_t *l);
int sbx_cg_spare_make (const sbx_cg_layout_t *l, unsigned n, err_t *err);
/* Removes spare group n. */
void sbx_cg_spare_remove (const sbx_cg_layout_t *l, unsigned n);
/* Removes every spare group, and the holders' group (below) when no holder
 * is left in it (at start-up and shutdown). */
void sbx_cg_spares_remove (const sbx_cg_layout_t *l);

/* The holders' memory group, <memory root>/<group>/.holders (cgroup v1
 * only: v2 places a process in all controllers at once). Every sandbox's
 * pid 1 moves there once its set-up is done, and every process it starts
 * moves into the sandbox's own memory group before it runs anything of the
 * sandbox's: the OOM killer of a sandbox's memory limit chooses among the
 * processes of its group, so a sandbox out of memory loses its own
 * processes, never its pid 1 (which would end the sandbox). Made by
 * sbx_cg_prepare; the name starts with a dot: never a sandbox id. What is
 * charged there is each holder's own memory after its set-up (its heap,
 * the stack a command runs on until its exec) and the kernel's records of
 * the processes it starts directly; see docs/runtime.md. */
#define SBX_CG_HOLDERS ".holders"
bool sbx_cg_holders_possible (const sbx_cg_layout_t *l);
/* For sandbox `id`: opens the file that moves a process into the sandbox's
 * memory group (*into_sandbox: write a pid, or "0" for the writer) and the
 * one that moves the writer into the holders' group (*into_holders), both
 * `tasks` (the movers are single-threaded) and O_CLOEXEC. Both -1 (and 0
 * returned) when the layout has no holders' group. */
int sbx_cg_open_holder_moves (const sbx_cg_layout_t *l, const char *id, int *into_sandbox, int *into_holders,
                              err_t *err);
/* As sbx_cg_remove (sub NULL), but the sandbox's memory group becomes
 * spare n instead of going: taking a memory cgroup offline costs the
 * kernel a walk over every memory-aware list on the machine (two per
 * superblock, so it grows with live sandboxes), and a new one an
 * allocation per shrinker. Only once every other group is gone, which
 * says no process is left in it. 1 kept as spare n, 0 removed, -1 *err. */
int sbx_cg_remove_to_spare (const sbx_cg_layout_t *l, const char *id, unsigned n, err_t *err);

/* Creates <id>/<sub> in every hierarchy. */
int sbx_cg_create_sub (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err);

/* Creates <id>/<sub> in the tracking hierarchy only and opens the file that
 * moves its writer (*fd, O_CLOEXEC; write "0"): cgroup.procs on v2, tasks
 * on v1 (the writer must be single-threaded).
 * An exec's group needs no more: its processes keep pid 1's groups in
 * the other hierarchies (under the sandbox's limits), and one move is all a
 * command start costs (moves are slow on cgroup v1). */
int sbx_cg_open_track (const sbx_cg_layout_t *l, const char *id, const char *sub, int *fd, err_t *err);

/* Moves process `pid` (and its threads) into sandbox `id`'s groups. */
int sbx_cg_attach (const sbx_cg_layout_t *l, const char *id, pid_t pid, err_t *err);

/* Moves the calling process into <id>/<sub> in every hierarchy. */
int sbx_cg_join (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err);

/* Kills every process in <id>/<sub> (sub NULL: the whole sandbox), freezing
 * the group first so nothing forks away, until none is left (bounded). */
int sbx_cg_kill (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err);

/* Removes <id>/<sub> (sub NULL: the sandbox and all its sub-groups) in every
 * hierarchy. Groups that still hold processes are left (EBUSY). */
int sbx_cg_remove (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err);

/* The sub-group of a sandbox where processes an exec left running live on. */
#define SBX_CG_BACKGROUND "background"

/* Moves every process of sub-group `sub` of sandbox `id` (tracking
 * hierarchy: the only one where sub-groups exist) into sub-group `to`
 * (made when missing), so that `sub` can be removed while they live on.
 * Repeats while a fork races it, a bounded number of times; EBUSY when
 * `sub` still has processes then. */
int sbx_cg_move_all (const sbx_cg_layout_t *l, const char *id, const char *sub, const char *to, err_t *err);

/* Freezes (true) or thaws (false) the whole sandbox. */
int sbx_cg_freeze (const sbx_cg_layout_t *l, const char *id, bool frozen, err_t *err);

/* Number of processes in the sandbox (or in <id>/<sub>). */
long sbx_cg_count (const sbx_cg_layout_t *l, const char *id, const char *sub);

/* Counters that say a limit was hit: times the pids limit refused a fork,
 * and processes the memory limit killed. */
typedef struct sbx_cg_events_s
{
  long pids_max_hits;
  long oom_kills;
} sbx_cg_events_t;

/* The counter files of a sandbox and of one of its sub-groups (an
 * exec's), opened ahead: an exec opens them while its command starts and
 * reads them again (pread) once it has ended, instead of looking the paths
 * up then. Other sub-groups are read by path. */
typedef struct sbx_cg_counters_s
{
  char sub[32];
  int fds[2][2]; /* [pids, memory][the sandbox's group, the sub-group]; -1: not open */
} sbx_cg_counters_t;

void sbx_cg_counters_open (const sbx_cg_layout_t *l, const char *id, const char *sub, sbx_cg_counters_t *c);

/* The counters of the sandbox, or with `of_sub` of its group
 * <id>/<c->sub>, each summed over the group and its sub-groups. */
void sbx_cg_counters_read (const sbx_cg_layout_t *l, const char *id, const sbx_cg_counters_t *c, bool of_sub,
                           sbx_cg_events_t *out);

void sbx_cg_counters_close (sbx_cg_counters_t *c);

/* Ids of sandbox groups found under our roots (to clean after a crash).
 * Returns a NULL-terminated array the caller frees (each entry and it). */
char **sbx_cg_list (const sbx_cg_layout_t *l);

#endif
