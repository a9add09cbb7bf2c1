/* helper/netns: the sandbox's network namespace as its pid 1 sets it up —
 * loopback up and, with egress, unreachable routes to the host's own
 * addresses and link-local space (netlink). Single-threaded. */
#include <arpa/inet.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

int
helper_loopback_up (err_t *err)
{
  cleanup_close int s = socket (AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return err_make_sys (err, errno, "socket");
  struct ifreq ifr;
  memset (&ifr, 0, sizeof ifr);
  snprintf (ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  if (ioctl (s, SIOCGIFFLAGS, &ifr) < 0)
    return err_make_sys (err, errno, "get flags of lo");
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl (s, SIOCSIFFLAGS, &ifr) < 0)
    return err_make_sys (err, errno, "bring lo up");
  return 0;
}

/* Makes `dst`/`len` (IPv4) unreachable inside the sandbox, whose root
 * cannot change routes (no CAP_NET_ADMIN). */
static int
block_route (const unsigned char dst[4], int len, err_t *err)
{
  cleanup_close int nl = socket (AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (nl < 0)
    return err_make_sys (err, errno, "netlink socket");
  struct
  {
    struct nlmsghdr nh;
    struct rtmsg rt;
    char attrs[64];
  } req;
  memset (&req, 0, sizeof req);
  req.nh.nlmsg_type = RTM_NEWROUTE;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
  req.rt.rtm_family = AF_INET;
  req.rt.rtm_dst_len = (unsigned char) len;
  req.rt.rtm_table = RT_TABLE_MAIN;
  req.rt.rtm_protocol = RTPROT_STATIC;
  req.rt.rtm_scope = RT_SCOPE_NOWHERE;
  req.rt.rtm_type = RTN_UNREACHABLE;
  struct rtattr *rta = (struct rtattr *) req.attrs;
  rta->rta_type = RTA_DST;
  rta->rta_len = RTA_LENGTH (4);
  memcpy (RTA_DATA (rta), dst, 4);
  req.nh.nlmsg_len = NLMSG_LENGTH (sizeof req.rt) + RTA_ALIGN (rta->rta_len);
  if (send (nl, &req, req.nh.nlmsg_len, 0) < 0)
    return err_make_sys (err, errno, "netlink send");
  char buf[512];
  ssize_t n = recv (nl, buf, sizeof buf, 0);
  if (n < (ssize_t) NLMSG_LENGTH (sizeof (struct nlmsgerr)))
    return err_make (err, EIO, "netlink: short answer");
  struct nlmsghdr *h = (struct nlmsghdr *) buf;
  if (h->nlmsg_type == NLMSG_ERROR)
    {
      struct nlmsgerr *e = NLMSG_DATA (h);
      if (e->error != 0 && e->error != -EEXIST)
        return err_make_sys (err, -e->error, "make %u.%u.%u.%u/%d unreachable", dst[0], dst[1], dst[2], dst[3], len);
    }
  return 0;
}

/* With egress, slirp4netns connects out from the host: the link-local range
 * (the cloud metadata server) and the host's own addresses (given with
 * --block; its loopback slirp4netns refuses itself) must stay out of reach. */
int
helper_block_egress_routes (const helper_opts_t *o, err_t *err)
{
  static const unsigned char link_local[4] = {169, 254, 0, 0};
  if (block_route (link_local, 16, err) < 0)
    return -1;
  for (size_t i = 0; i < o->n_blocked; i++)
    {
      struct in_addr a;
      if (inet_pton (AF_INET, o->blocked[i], &a) != 1)
        continue;
      if (block_route ((const unsigned char *) &a.s_addr, 32, err) < 0)
        return -1;
    }
  return 0;
}

/* Hides host paths the sandbox's image would otherwise show (the lower
 * layer is often the host's or the container's own root): the gateway's
 * state and snapshot directories, key and credential files. A directory
 * gets an empty read-only tmpfs over it, a file /dev/null. */
