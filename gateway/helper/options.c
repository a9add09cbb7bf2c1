/* helper/options: what sandbox-helper reads from its command line and the
 * option strings it hands the kernel — the launch options (--id, --state,
 * limits, lists), volume specs ("host:sandbox[:ro][:uid=N:gid=M]") and
 * user-namespace id maps ("inside outside count"). Pure: no I/O, no
 * state; tests/unit/gateway/helper covers it. Single-threaded (getopt). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/helper/helper.h"

static long
num (const char *s)
{
  return strtol (s, NULL, 10);
}

/* Defaults for what the command line leaves out, and the memory group
 * spare only when it is one of the gateway's. */
static void
opts_finish (helper_opts_t *o)
{
  if (o->memcg_spare != NULL
      && (strncmp (o->memcg_spare, SBX_CG_SPARE_PREFIX, strlen (SBX_CG_SPARE_PREFIX)) != 0
          || strchr (o->memcg_spare, '/') != NULL))
    o->memcg_spare = NULL; /* not one of the gateway's spares: make a group */
  if (o->max_entries <= 0)
    o->max_entries = HELPER_DEFAULT_MAX_ENTRIES;
  if (o->disk_inodes <= 0)
    o->disk_inodes = o->disk_mb * HELPER_DEFAULT_INODES_PER_MB;
}

int
helper_opts_parse (int argc, char **argv, helper_opts_t *o)
{
  o->cgroup_mount = "/sys/fs/cgroup";
  o->cgroup_group = "sandbox-gateway";
  o->lower = "/";
  o->disk_mb = HELPER_DEFAULT_DISK_MB;
  static const struct option longopts[] = {
      {"id", required_argument, NULL, 'i'},
      {"state", required_argument, NULL, 's'},
      {"lower", required_argument, NULL, 'l'},
      {"cgroup-mount", required_argument, NULL, 'c'},
      {"disk-mb", required_argument, NULL, 'd'},
      {"disk-inodes", required_argument, NULL, 'n'},
      {"pids", required_argument, NULL, 'p'},
      {"memory-mb", required_argument, NULL, 'm'},
      {"cpu-millis", required_argument, NULL, 'u'},
      {"cpu-group", no_argument, NULL, 'C'}, /* a cpu group without a limit: helper.h */
      {"volume", required_argument, NULL, 'v'},
      {"hostname", required_argument, NULL, 'h'},
      {"egress", no_argument, NULL, 'e'},
      {"cgroup-group", required_argument, NULL, 'G'},
      {"restore", no_argument, NULL, 'R'},
      {"max-entries", required_argument, NULL, 'E'},
      {"unpacker", required_argument, NULL, 'U'},
      {"mask", required_argument, NULL, 'M'},
      {"block", required_argument, NULL, 'B'},
      {"uid-base", required_argument, NULL, 'b'},
      {"uid-range", required_argument, NULL, 'r'},
      {"memcg-spare", required_argument, NULL, 'S'},
      {"layers", required_argument, NULL, 'L'},
      {"layer-uid", required_argument, NULL, 'O'},
      {"max-mb", required_argument, NULL, 'X'},
      {NULL, 0, NULL, 0},
  };
  /* Options start after the subcommand: argv[1] stands in for the
   * program's name, and optind 0 makes getopt start afresh each call. */
  optind = 0;
  int c;
  while ((c = getopt_long (argc - 1, argv + 1, "+", longopts, NULL)) != -1)
    switch (c)
      {
      case 'i': o->id = optarg; break;
      case 's': o->state = optarg; break;
      case 'l': o->lower = optarg; break;
      case 'c': o->cgroup_mount = optarg; break;
      case 'd': o->disk_mb = num (optarg); break;
      case 'n': o->disk_inodes = num (optarg); break;
      case 'p': o->limits.pids_max = num (optarg); break;
      case 'm': o->limits.memory_mb = num (optarg); break;
      case 'u': o->limits.cpu_millis = num (optarg); break;
      case 'C': o->cpu_group = true; break;
      case 'h': o->hostname = optarg; break;
      case 'e': o->egress = true; break;
      case 'G': o->cgroup_group = optarg; break;
      case 'R': o->restore = true; break;
      case 'E': o->max_entries = num (optarg); break;
      case 'X': o->max_mb = num (optarg); break;
      case 'U': o->unpacker = optarg; break;
      case 'M': o->masks[o->n_masks++] = optarg; break;
      case 'B': o->blocked[o->n_blocked++] = optarg; break;
      case 'v': o->volumes[o->n_volumes++] = optarg; break;
      case 'b': o->uid_base = strtoul (optarg, NULL, 10); break;
      case 'r': o->uid_range = strtoul (optarg, NULL, 10); break;
      case 'S': o->memcg_spare = optarg; break;
      case 'L': o->layers = optarg; break;
      case 'O': o->layer_uid = strtoul (optarg, NULL, 10); break;
      default: return -1;
      }
  opts_finish (o);
  return 0;
}

void
helper_parse_volume (const char *in, helper_volume_t *v)
{
  snprintf (v->spec, sizeof v->spec, "%s", in);
  v->host = v->spec;
  v->dst = strchr (v->spec, ':');
  v->ro = false;
  v->uid = v->gid = -1;
  if (v->dst == NULL)
    {
      v->dst = v->spec + strlen (v->spec);
      return;
    }
  *v->dst++ = '\0';
  char *opt = strchr (v->dst, ':');
  if (opt != NULL)
    *opt++ = '\0';
  for (char *next = NULL; opt != NULL; opt = next)
    {
      next = strchr (opt, ':');
      if (next != NULL)
        *next++ = '\0';
      if (strcmp (opt, "ro") == 0)
        v->ro = true;
      else if (strncmp (opt, "uid=", 4) == 0)
        v->uid = strtol (opt + 4, NULL, 10);
      else if (strncmp (opt, "gid=", 4) == 0)
        v->gid = strtol (opt + 4, NULL, 10);
    }
}

int
helper_id_map_line (char *buf, size_t cap, long inside, unsigned long outside, unsigned long count)
{
  int n = snprintf (buf, cap, "%ld %lu %lu\n", inside, outside, count);
  return n < 0 || (size_t) n >= cap ? -1 : n;
}
