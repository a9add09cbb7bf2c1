/* runtime/egress: the egress policy, enforced outside every sandbox.
 *
 * slirp4netns makes each outside connection of an egress sandbox from the
 * host's network namespace (it is the sandbox's only way out). It runs in a
 * cgroup-v2 group of its own with two BPF programs attached (connect4 and
 * udp4 sendmsg) that refuse, with EPERM, every destination in 0.0.0.0/8,
 * 127.0.0.0/8, 169.254.0.0/16 (the cloud metadata server), 224.0.0.0/4
 * (multicast: the kernel loops a group's datagrams back to the host's own
 * services joined to it, LLMNR, mDNS, SSDP), 240.0.0.0/4 (reserved, with
 * the limited broadcast 255.255.255.255), the host's own addresses and the
 * broadcast addresses of its subnets (all-ones and all-zeros host part) — except DNS (port 53) to the host's
 * nameservers, which slirp4netns forwards the sandbox's queries to. The routes inside the
 * sandbox's namespace stay as a first line; this one is in the host's
 * kernel, where nothing the sandbox sends (however it is built) can change
 * it.
 *
 * Needs cgroup v2 (the unified hierarchy, or its mount beside v1 on a hybrid
 * layout) and BPF; without them the gateway says so at start and in Status.
 * The programs are loaded once, at start; read-only after. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/bpf.h>
#include <net/if.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* Most host addresses and nameservers a program checks. */
#define EGRESS_MAX_RULES 256
#define EGRESS_MAX_NS 16
/* Fixed ranges besides the host's addresses and broadcast addresses. */
#define EGRESS_FIXED 5

#define INSN(c, d, s, o, i) ((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})

typedef struct prog_s
{
  /* two loads, two jumps per nameserver, three instructions per blocked
   * range, two exits of two */
  struct bpf_insn insns[2 + 2 * EGRESS_MAX_NS + 3 * (EGRESS_MAX_RULES + EGRESS_FIXED) + 4];
  size_t n;
  size_t to_allow[EGRESS_MAX_NS], n_allow; /* jumps to patch */
  size_t to_deny[EGRESS_MAX_RULES + EGRESS_FIXED], n_deny;
} prog_t;

/* An address as the program loads it: user_ip4 holds network byte order. */
static int32_t
be32 (uint32_t host_order)
{
  uint32_t v = htonl (host_order);
  int32_t out;
  memcpy (&out, &v, sizeof out);
  return out;
}

static void
emit_blocked (prog_t *p, uint32_t net, uint32_t mask)
{
  p->insns[p->n++] = INSN (BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_4, BPF_REG_2, 0, 0);
  p->insns[p->n++] = INSN (BPF_ALU | BPF_AND | BPF_K, BPF_REG_4, 0, 0, be32 (mask));
  p->to_deny[p->n_deny++] = p->n;
  p->insns[p->n++] = INSN (BPF_JMP32 | BPF_JEQ | BPF_K, BPF_REG_4, 0, 0, be32 (net & mask));
}

/* The program: DNS to a nameserver passes; a blocked destination is
 * refused; anything else passes. */
static void
build (prog_t *p, const uint32_t *nameservers, size_t n_ns, const uint32_t *hosts, size_t n_hosts)
{
  memset (p, 0, sizeof *p);
  p->insns[p->n++]
      = INSN (BPF_LDX | BPF_MEM | BPF_W, BPF_REG_2, BPF_REG_1, offsetof (struct bpf_sock_addr, user_ip4), 0);
  p->insns[p->n++]
      = INSN (BPF_LDX | BPF_MEM | BPF_W, BPF_REG_3, BPF_REG_1, offsetof (struct bpf_sock_addr, user_port), 0);
  uint16_t dns = htons (53);
  for (size_t i = 0; i < n_ns; i++)
    {
      p->insns[p->n++] = INSN (BPF_JMP32 | BPF_JNE | BPF_K, BPF_REG_2, 0, 1, be32 (nameservers[i]));
      p->to_allow[p->n_allow++] = p->n;
      p->insns[p->n++] = INSN (BPF_JMP32 | BPF_JEQ | BPF_K, BPF_REG_3, 0, 0, dns);
    }
  emit_blocked (p, 0x00000000u, 0xff000000u); /* 0.0.0.0/8: "this host" */
  emit_blocked (p, 0x7f000000u, 0xff000000u); /* 127.0.0.0/8 */
  emit_blocked (p, 0xa9fe0000u, 0xffff0000u); /* 169.254.0.0/16 */
  emit_blocked (p, 0xe0000000u, 0xf0000000u); /* 224.0.0.0/4: multicast */
  emit_blocked (p, 0xf0000000u, 0xf0000000u); /* 240.0.0.0/4, 255.255.255.255 */
  for (size_t i = 0; i < n_hosts; i++)
    emit_blocked (p, hosts[i], 0xffffffffu);
  size_t allow = p->n;
  p->insns[p->n++] = INSN (BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 1);
  p->insns[p->n++] = INSN (BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
  size_t deny = p->n;
  p->insns[p->n++] = INSN (BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0);
  p->insns[p->n++] = INSN (BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
  for (size_t i = 0; i < p->n_allow; i++)
    p->insns[p->to_allow[i]].off = (int16_t) (allow - p->to_allow[i] - 1);
  for (size_t i = 0; i < p->n_deny; i++)
    p->insns[p->to_deny[i]].off = (int16_t) (deny - p->to_deny[i] - 1);
}

static int
load_once (const prog_t *p, enum bpf_attach_type type, char *log, size_t log_size)
{
  union bpf_attr attr;
  memset (&attr, 0, sizeof attr);
  attr.prog_type = BPF_PROG_TYPE_CGROUP_SOCK_ADDR;
  attr.expected_attach_type = type;
  attr.insns = (uint64_t) (uintptr_t) p->insns;
  attr.insn_cnt = (uint32_t) p->n;
  attr.license = (uint64_t) (uintptr_t) "GPL";
  if (log != NULL)
    {
      log[0] = '\0';
      attr.log_buf = (uint64_t) (uintptr_t) log;
      attr.log_size = (uint32_t) log_size;
      attr.log_level = 1;
    }
  return (int) syscall (SYS_bpf, BPF_PROG_LOAD, &attr, sizeof attr);
}

/* Loads without the verifier's log (its size grows with the program: a
 * short buffer alone fails the load with ENOSPC); on failure, again with
 * it, for the message. */
static int
load (const prog_t *p, enum bpf_attach_type type, err_t *err)
{
  static char log[4096];
  int fd = load_once (p, type, NULL, 0);
  if (fd >= 0)
    return fd;
  int saved = errno;
  load_once (p, type, log, sizeof log);
  return err_make_sys (err, saved, "load the egress filter (BPF): %.200s", log);
}

/* IPv4 nameservers of the host's /etc/resolv.conf (slirp4netns forwards
 * the sandbox's DNS there). */
static size_t
read_nameservers (uint32_t *out, size_t cap)
{
  FILE *f = fopen ("/etc/resolv.conf", "re");
  if (f == NULL)
    return 0;
  char line[256];
  size_t n = 0;
  while (n < cap && fgets (line, sizeof line, f) != NULL)
    {
      char addr[64];
      struct in_addr a;
      if (sscanf (line, " nameserver %63s", addr) == 1 && inet_pton (AF_INET, addr, &a) == 1)
        out[n++] = ntohl (a.s_addr);
    }
  fclose (f);
  return n;
}

/* Where cgroup v2 is mounted beside v1 (a hybrid layout), or "". */
static void
find_unified (char *out, size_t cap)
{
  out[0] = '\0';
  FILE *f = fopen ("/proc/self/mountinfo", "re");
  if (f == NULL)
    return;
  char line[4096];
  while (fgets (line, sizeof line, f) != NULL)
    {
      char *sep = strstr (line, " - ");
      char mnt[1024];
      if (sep != NULL && strncmp (sep, " - cgroup2 ", 11) == 0 && sscanf (line, "%*s %*s %*s %*s %1023s", mnt) == 1)
        {
          if (sbx_path_fmt (out, cap, NULL, "%s", mnt) < 0)
            log_msg (SEV_WARNING, "egress: the cgroup2 mount `%s` is too long a path: not used", mnt);
          break;
        }
    }
  fclose (f);
}

/* Groups a previous run left (their slirp4netns were killed with the
 * sandboxes' other groups). */
static void
remove_leftovers (const char *root)
{
  DIR *d = opendir (root);
  if (d == NULL)
    return;
  struct dirent *e;
  char path[PATH_MAX * 2];
  while ((e = readdir (d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.')
      {
        if (sbx_path_fmt (path, sizeof path, NULL, "%s/%s", root, e->d_name) >= 0)
          rmdir (path);
      }
  closedir (d);
}

/* The broadcast addresses of the host's IPv4 subnets, read now (as its
 * addresses are), after the n already in `out`: for each address of a
 * prefix shorter than /31, the subnet's all-ones and all-zeros host
 * addresses, which the kernel routes as broadcast whatever `brd` says. */
static int
add_broadcasts (uint32_t *out, size_t *n, err_t *err)
{
  struct ifaddrs *ifs = NULL;
  if (getifaddrs (&ifs) < 0)
    return err_make_sys (err, errno, "egress: list the host's addresses");
  int rc = 0;
  for (struct ifaddrs *i = ifs; i != NULL && rc == 0; i = i->ifa_next)
    {
      if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || i->ifa_netmask == NULL
          || (i->ifa_flags & IFF_LOOPBACK))
        continue;
      uint32_t addr = ntohl (((const struct sockaddr_in *) i->ifa_addr)->sin_addr.s_addr);
      uint32_t mask = ntohl (((const struct sockaddr_in *) i->ifa_netmask)->sin_addr.s_addr);
      if (~mask <= 1u)
        continue; /* /31, /32: no broadcast */
      if (*n + 2 > EGRESS_MAX_RULES)
        rc = err_make (err, E2BIG, "egress: the host has more than %d IPv4 addresses and broadcast addresses",
                       EGRESS_MAX_RULES);
      else
        {
          out[(*n)++] = addr | ~mask;
          out[(*n)++] = addr & mask;
        }
    }
  freeifaddrs (ifs);
  return rc;
}

int
sbx_egress_init (sbx_runtime_t *rt, err_t *err)
{
  rt->egress_progs[0] = rt->egress_progs[1] = -1;
  if (!rt->cfg.allow_egress)
    return 0;
  if (!rt->cg.v2)
    {
      char unified[1024];
      find_unified (unified, sizeof unified);
      if (unified[0] == '\0')
        {
          log_msg (SEV_WARNING,
                   "egress: no cgroup v2 mount, so no filter outside the sandboxes; egress sandboxes are "
                   "kept from the host and link-local addresses by routes in their own namespaces only");
          return 0;
        }
      snprintf (rt->egress_root, sizeof rt->egress_root, "%s/%s", unified, rt->cfg.cgroup_group);
      if (mkdir (rt->egress_root, 0755) < 0 && errno != EEXIST)
        {
          /* A cgroup v2 mount this process may not write (a container's,
           * read-only): as without one. */
          log_msg (SEV_WARNING,
                   "egress: cannot create `%s` (%s), so no filter outside the sandboxes; egress "
                   "sandboxes are kept from the host and link-local addresses by routes in their own "
                   "namespaces only",
                   rt->egress_root, strerror (errno));
          return 0;
        }
      remove_leftovers (rt->egress_root);
    }
  uint32_t ns[EGRESS_MAX_NS], hosts[EGRESS_MAX_RULES];
  size_t n_ns = read_nameservers (ns, EGRESS_MAX_NS), n_hosts = 0;
  for (size_t i = 0; rt->host_addrs[i] != NULL; i++)
    {
      struct in_addr a;
      if (n_hosts == EGRESS_MAX_RULES)
        return err_make (err, E2BIG, "egress: the host has more than %d IPv4 addresses", EGRESS_MAX_RULES);
      if (inet_pton (AF_INET, rt->host_addrs[i], &a) == 1)
        hosts[n_hosts++] = ntohl (a.s_addr);
    }
  if (add_broadcasts (hosts, &n_hosts, err) < 0)
    return -1;
  cleanup_free prog_t *p = malloc (sizeof *p);
  if (p == NULL)
    return err_make (err, ENOMEM, "out of memory");
  build (p, ns, n_ns, hosts, n_hosts);
  if ((rt->egress_progs[0] = load (p, BPF_CGROUP_INET4_CONNECT, err)) < 0
      || (rt->egress_progs[1] = load (p, BPF_CGROUP_UDP4_SENDMSG, err)) < 0)
    return err_wrap (err, "ALLOW_EGRESS");
  rt->egress_filtered = true;
  return 0;
}

/* The filtered group of sandbox `id`'s slirp4netns. */
static int
group_of (const sbx_runtime_t *rt, const char *id, char *out, size_t cap, err_t *err)
{
  if (rt->cg.v2)
    return sbx_path_fmt (out, cap, err, "%s/%s/egress", rt->cg.roots[0], id);
  return sbx_path_fmt (out, cap, err, "%s/%s", rt->egress_root, id);
}

int
sbx_egress_confine (sbx_runtime_t *rt, const char *id, pid_t pid, err_t *err)
{
  if (!rt->egress_filtered)
    return 0;
  char dir[PATH_MAX * 2], procs[PATH_MAX * 2 + 16], val[24];
  if (group_of (rt, id, dir, sizeof dir, err) < 0)
    return -1;
  if (mkdir (dir, 0755) < 0 && errno != EEXIST)
    return err_make_sys (err, errno, "create `%s`", dir);
  cleanup_close int fd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", dir);
  static const enum bpf_attach_type types[2] = {BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_UDP4_SENDMSG};
  for (int i = 0; i < 2; i++)
    {
      union bpf_attr attr;
      memset (&attr, 0, sizeof attr);
      attr.target_fd = (uint32_t) fd;
      attr.attach_bpf_fd = (uint32_t) rt->egress_progs[i];
      attr.attach_type = types[i];
      attr.attach_flags = BPF_F_ALLOW_MULTI;
      if (syscall (SYS_bpf, BPF_PROG_ATTACH, &attr, sizeof attr) < 0)
        return err_make_sys (err, errno, "attach the egress filter to `%s`", dir);
    }
  /* Only then does slirp4netns move in: it has made no connection yet (the
   * sandbox cannot send before its launch is answered). */
  if (sbx_path_fmt (procs, sizeof procs, err, "%s/cgroup.procs", dir) < 0)
    return -1;
  int len = snprintf (val, sizeof val, "%d", (int) pid);
  cleanup_close int pfd = open (procs, O_WRONLY | O_CLOEXEC);
  if (pfd < 0 || write (pfd, val, (size_t) len) != len)
    return err_make_sys (err, errno, "move slirp4netns into `%s`", dir);
  return 0;
}

void
sbx_egress_release (sbx_runtime_t *rt, const char *id)
{
  if (!rt->egress_filtered || rt->cg.v2)
    return; /* on v2 the group goes with the sandbox's own */
  char dir[PATH_MAX * 2];
  cleanup_err err_t perr = ERR_INIT;
  if (group_of (rt, id, dir, sizeof dir, &perr) < 0)
    err_warn_release (&perr, "egress");
  else if (rmdir (dir) < 0 && errno != ENOENT)
    log_msg (SEV_WARNING, "egress: remove `%s`: %s", dir, strerror (errno));
}

bool
sbx_egress_filtered (const sbx_runtime_t *rt)
{
  return rt->egress_filtered;
}
