"""ListPorts against a sandbox that attacks the search for a port's owner.

The gateway finds the process that owns a listening socket from the host's
side: it lists the sandbox's processes from its cgroups and reads the links
in their /proc/<pid>/fd, never following them, within a bound (4096
processes and 65536 descriptors a call; gateway/runtime/ports.c). Code in
the sandbox controls how many processes and descriptors there are, what
its descriptors are and are named, how fast they come and go, and what its
/proc/<pid>/status holds. Each test asserts that ListPorts still answers
(OK, within a 30 s deadline) with the real listening ports, each owner's
pid right or, where the bounds leave it unknown, 0 — never a wrong one —
while another sandbox's ListPorts and Exec go on, and that the gateway's
memory stays flat.
"""

from __future__ import annotations

import time
from typing import Optional

import grpc
import pytest

from tests.lib.client import SandboxClient, pb
from tests.lib.gateway import cgroup_pids, gateway_client
from tests.lib.ports import start_detached, start_server
from tests.lib.procs import RssSampler
from tests.lib.security import Bystander

# 1000 children of an attacker, a server, pid 1 and the commands around.
PIDS_MAX = 1200
SERVER_PORT = 8000
LIST_DEADLINE_S = 30

# The attacker, compiled inside the sandbox (gcc comes with the lower layer):
#   hold PORT PROCS FDS READY   PROCS children each dup a listening socket
#                               FDS times and sleep; READY is made then
#   churn PORT SECONDS WORKERS  WORKERS loops that fork children (which dup
#                               a listening socket and exit) and open and
#                               close sockets, dups and eventfds, for SECONDS
#   decoy PORT READY            a listening socket held only in flight (in an
#                               SCM_RIGHTS message never received), and
#                               descriptors whose links read like its
#                               `socket:[inode]`: a memfd, files, a directory,
#                               a symlink, a name with a newline, a deleted
#                               file, a path too long for the gateway's read
WALK_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int listen_on (int port)
{
  int s = socket (AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons (port)};
  a.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
  setsockopt (s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (s < 0 || bind (s, (struct sockaddr *) &a, sizeof a) < 0 || listen (s, 16) < 0)
    {
      perror ("listen");
      exit (1);
    }
  return s;
}

static void ready (const char *path)
{
  close (open (path, O_CREAT | O_WRONLY | O_TRUNC, 0644));
}

static void hold (int port, int procs, int fds, const char *path)
{
  int l = listen_on (port), p[2];
  if (pipe (p) < 0)
    exit (1);
  for (int i = 0; i < procs; i++)
    {
      pid_t c = fork ();
      if (c < 0)
        {
          perror ("fork");
          exit (1);
        }
      if (c == 0)
        {
          for (int k = 0; k < fds && dup (l) >= 0; k++)
            ;
          if (write (p[1], "x", 1) != 1)
            _exit (1);
          for (;;)
            pause ();
        }
    }
  close (p[1]);
  char b;
  for (int got = 0; got < procs && read (p[0], &b, 1) == 1; got++)
    ;
  ready (path);
  for (;;)
    pause ();
}

static void churn (int port, int seconds, int workers)
{
  int l = listen_on (port);
  for (int w = 1; w < workers; w++)
    if (fork () == 0)
      break;
  time_t end = time (NULL) + seconds;
  while (time (NULL) < end)
    {
      pid_t c = fork ();
      if (c == 0)
        {
          for (int k = 0; k < 50; k++)
            dup (l);
          _exit (0);
        }
      int fd[64];
      for (int k = 0; k < 64; k++)
        fd[k] = k % 3 == 0 ? socket (AF_INET, SOCK_STREAM, 0) : k % 3 == 1 ? dup (l) : eventfd (0, 0);
      for (int k = 0; k < 64; k++)
        close (fd[k]);
      if (c > 0)
        waitpid (c, NULL, 0);
    }
}

static void decoy (int port, const char *path)
{
  int l = listen_on (port), sv[2];
  struct stat st;
  if (fstat (l, &st) < 0 || socketpair (AF_UNIX, SOCK_STREAM, 0, sv) < 0)
    exit (1);
  char ctl[CMSG_SPACE (sizeof (int))] = {0}, one = 'x';
  struct iovec iov = {.iov_base = &one, .iov_len = 1};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *cm = CMSG_FIRSTHDR (&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN (sizeof (int));
  memcpy (CMSG_DATA (cm), &l, sizeof (int));
  if (sendmsg (sv[0], &mh, 0) != 1)
    exit (1);
  close (l); /* in flight only, from here on */
  char name[64], p[512];
  snprintf (name, sizeof name, "socket:[%lu]", (unsigned long) st.st_ino);
  if (memfd_create (name, 0) < 0 || chdir ("/tmp") < 0)
    exit (1);
  open (name, O_CREAT | O_RDWR, 0600);
  snprintf (p, sizeof p, "x\n%s", name);
  open (p, O_CREAT | O_RDWR, 0600);
  mkdir ("d", 0700);
  snprintf (p, sizeof p, "d/%s", name);
  mkdir (p, 0700);
  open (p, O_RDONLY | O_DIRECTORY);
  snprintf (p, sizeof p, "l-%s", name);
  symlink (name, p);
  open (p, O_PATH | O_NOFOLLOW);
  snprintf (p, sizeof p, "gone-%s", name);
  open (p, O_CREAT | O_RDWR, 0600);
  unlink (p);
  snprintf (p, sizeof p, "%0100d", 0);
  mkdir (p, 0700);
  snprintf (p + 100, sizeof p - 100, "/%s", name);
  open (p, O_CREAT | O_RDWR, 0600);
  int e[2];
  if (pipe (e) < 0 || eventfd (0, 0) < 0 || open ("/proc/self/ns/net", O_RDONLY) < 0)
    exit (1);
  ready (path);
  for (;;)
    pause ();
}

int main (int argc, char **argv)
{
  signal (SIGCHLD, SIG_DFL);
  if (argc == 6 && strcmp (argv[1], "hold") == 0)
    hold (atoi (argv[2]), atoi (argv[3]), atoi (argv[4]), argv[5]);
  else if (argc == 5 && strcmp (argv[1], "churn") == 0)
    churn (atoi (argv[2]), atoi (argv[3]), atoi (argv[4]));
  else if (argc == 4 && strcmp (argv[1], "decoy") == 0)
    decoy (atoi (argv[2]), argv[3]);
  else
    return 2;
  return 0;
}
"""

# A server whose supplementary groups and name the test sets (through the
# file PATH: "<groups> <name>"; it answers in PATH.ack): they are what comes
# before the NSpid line in its /proc/<pid>/status, so they move that line.
GROUPS_SERVER = r"""
import ctypes, os, socket, sys, time
port, path = int(sys.argv[1]), sys.argv[2]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(8)
libc = ctypes.CDLL(None, use_errno=True)
last = None
while True:
    try:
        with open(path) as f:
            ctl = f.read().split()
    except OSError:
        ctl = []
    if len(ctl) == 2 and ctl != last:
        os.setgroups(list(range(1, int(ctl[0]) + 1)))
        libc.prctl(15, ctl[1].encode(), 0, 0, 0)
        with open(path + ".ack", "w") as f:
            f.write(" ".join(ctl))
        last = ctl
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def walked(gateway_secret):
    with gateway_client({"SANDBOX_PIDS_MAX": str(PIDS_MAX)}, secret=gateway_secret,
                        check_leftovers=True) as client:
        yield client


@pytest.fixture(scope="module")
def bystander(walked):
    sid = walked.launch().sandbox_id
    start_server(walked, sid, SERVER_PORT)
    return sid


@pytest.fixture
def victim(walked):
    """A sandbox with a server on SERVER_PORT and the attacker compiled at
    /tmp/walk; deleted at the end (with everything the attack started)."""
    sid = walked.launch().sandbox_id
    try:
        if walked.sh(sid, "command -v gcc").code != 0:
            pytest.skip("no gcc in the sandbox's image")
        res = walked.exec(sid, ["sh", "-c", "cat > /tmp/walk.c && gcc -O1 -o /tmp/walk /tmp/walk.c"],
                          stdin=WALK_C.encode(), timeout_seconds=120)
        assert res.code == 0, res.describe()
        start_server(walked, sid, SERVER_PORT)
        yield sid
    finally:
        walked.delete(sid)


def _list(client: SandboxClient, sid: str) -> dict[int, int]:
    """ListPorts of `sid` under a deadline: port -> pid (0: not known)."""
    resp = client.stub.ListPorts(pb.ListPortsRequest(sandbox_id=sid), metadata=client.md, timeout=LIST_DEADLINE_S)
    return {p.port: p.pid for p in resp.ports}


def _processes(client: SandboxClient, sid: str, *words: str) -> dict[int, int]:
    """Host pid -> pid inside the sandbox, of the sandbox's processes whose
    command line holds every one of `words` (read in full on the host)."""
    out = {}
    for host in cgroup_pids(client.gw, sid):
        try:
            with open(f"/proc/{host}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{host}/status") as f:
                status = f.read()
        except OSError:
            continue
        if all(w.encode() in argv for w in words):
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            out[host] = int(nspid.split()[-1])
    return out


def _server_pid(client: SandboxClient, sid: str) -> int:
    """The pid inside `sid` of its server on SERVER_PORT (tests/lib/ports)."""
    found = list(_processes(client, sid, str(SERVER_PORT), "echo").values())
    assert len(found) == 1, found
    return found[0]


def _wait_file(client: SandboxClient, sid: str, path: str, timeout: float = 60.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.read_file(sid, path)[0]
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _bystander_listed(client: SandboxClient, sid: str) -> Optional[str]:
    return None if SERVER_PORT in _list(client, sid) else "the bystander's server is not listed"


def _bystander(client: SandboxClient, sid: str) -> Bystander:
    """Another sandbox's ListPorts (its server listed) and an Exec in it,
    every 0.3 s while an attack runs; every one must succeed."""
    return Bystander(client, sid, interval=0.3, check=_bystander_listed)


def test_a_thousand_processes_of_a_thousand_descriptors(walked, victim, bystander):
    """1000 processes each holding 1000 dups of one listening socket (a
    million descriptors, 15 times the walk's bound): ListPorts answers,
    lists the server and the attacker's port, the latter owned by one of
    the attacker's processes, the server by its own process or unknown
    (the bound may be spent before the walk reaches it) — never by
    another."""
    server = _server_pid(walked, victim)
    start_detached(walked, victim, ["/tmp/walk", "hold", "9001", "1000", "1000", "/tmp/hold-ready"])
    _wait_file(walked, victim, "/tmp/hold-ready")
    attackers = set(_processes(walked, victim, "/tmp/walk", "hold").values())
    assert len(attackers) == 1001, len(attackers)
    with _bystander(walked, bystander), RssSampler(walked.gw) as rss:
        for _ in range(5):
            ports = _list(walked, victim)
            assert ports.get(SERVER_PORT) in (server, 0), (ports, server)
            assert ports.get(9001) in attackers, ports
    assert rss.growth_mib < 64, f"the gateway grew by {rss.growth_mib:.0f} MiB"


def test_processes_and_descriptors_churning_during_the_walk(walked, victim, bystander):
    """Two loops forking children (which dup a listening socket and exit)
    and opening and closing sockets, dups and eventfds as fast as they can,
    for 8 s: every ListPorts meanwhile answers with the server owned by its
    own process."""
    server = _server_pid(walked, victim)
    start_detached(walked, victim, ["/tmp/walk", "churn", "9003", "8", "2"])
    calls = 0
    with _bystander(walked, bystander), RssSampler(walked.gw) as rss:
        end = time.monotonic() + 6
        while time.monotonic() < end:
            ports = _list(walked, victim)
            assert ports.get(SERVER_PORT) == server, (ports, server)
            calls += 1
    assert calls > 0
    assert rss.growth_mib < 64, f"the gateway grew by {rss.growth_mib:.0f} MiB"


def test_descriptors_named_like_a_socket_are_not_taken_for_it(walked, victim, bystander):
    """A listening socket that no process holds (it is in flight, in a
    message never received) is listed with no owner, though a process
    holds a memfd, files, a directory, a symlink and a deleted file all
    named `socket:[<its inode>]` (and a file whose name has a newline
    before that, one under a path too long for the gateway's read, a
    pipe, an eventfd, a namespace): their links are not socket links. The
    server is still owned by its own process."""
    server = _server_pid(walked, victim)
    start_detached(walked, victim, ["/tmp/walk", "decoy", "9002", "/tmp/decoy-ready"])
    _wait_file(walked, victim, "/tmp/decoy-ready")
    decoys = set(_processes(walked, victim, "/tmp/walk", "decoy").values())
    assert len(decoys) == 1, decoys
    with _bystander(walked, bystander):
        ports = _list(walked, victim)
    assert ports.get(9002) == 0, ports
    assert ports.get(SERVER_PORT) == server, (ports, server)
    assert not decoys & set(ports.values()), (ports, decoys)


def _nspid_end(host_pid: int) -> int:
    """Where the host's pid ends in the NSpid line of `host_pid`'s status,
    as the gateway reads it (the status is the same to both: root in the
    host's namespaces)."""
    with open(f"/proc/{host_pid}/status") as f:
        status = f.read()
    return status.index("\nNSpid:\t") + len("\nNSpid:\t") + len(str(host_pid))


def _set_groups(client: SandboxClient, sid: str, groups: int, name: str) -> None:
    ctl = f"{groups} {name}"
    client.write_file(sid, "/tmp/groups", ctl.encode())
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.read_file(sid, "/tmp/groups.ack")[0].decode() == ctl:
                return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
        assert time.monotonic() < deadline, "the server did not take its groups"
        time.sleep(0.05)


@pytest.mark.finding("F7")
@pytest.mark.parametrize("placement", ["cut-after-the-hosts-pid", "past-4-KiB"])
def test_a_server_cannot_misplace_its_pid_line(walked, victim, bystander, placement):
    """A process's /proc/<pid>/status grows with its supplementary groups
    (up to 65536 of them, its own to set in its user namespace) ahead of the
    NSpid line the pid inside the sandbox came from. Placed so that a 4 KiB
    read of it ends just after the host's pid (then that pid was reported:
    a host pid, the owner's in no namespace the sandbox knows), or pushed
    past the first 4 KiB (then no pid at all): the owner's pid is still the
    one it has in the sandbox."""
    start_detached(walked, victim, ["python3", "-c", GROUPS_SERVER, "9004", "/tmp/groups"])
    _set_groups(walked, victim, 0, "aaaa")
    found = _processes(walked, victim, "9004", "/tmp/groups")
    assert len(found) == 1, found
    [(host, inner)] = found.items()
    if placement == "past-4-KiB":
        _set_groups(walked, victim, 60000, "aaaa")
        assert _nspid_end(host) > 4096 * 64
    else:
        # A group is its host gid and a space in the Groups line (the
        # width of the sandbox's ids on the host), a name byte is 1.
        with open(f"/proc/{host}/status") as f:
            gid = next(int(line.split()[1]) for line in f if line.startswith("Gid:"))
        per = len(str(gid + 1)) + 1
        groups, name = 0, 4
        for _ in range(4):
            gap = 4095 - _nspid_end(host)  # the bytes a read of 4095 leaves past the pid
            if gap == 0:
                break
            more, extra = divmod(gap, per)
            groups, name = groups + more, name + extra
            if name > 15:
                groups, name = groups + 1, name - per
            _set_groups(walked, victim, groups, "a" * name)
        assert _nspid_end(host) == 4095, "could not place the NSpid line"
    with _bystander(walked, bystander), RssSampler(walked.gw) as rss:
        ports = _list(walked, victim)
    assert ports.get(9004) == inner, (ports, inner, host)
    assert rss.growth_mib < 64, f"the gateway grew by {rss.growth_mib:.0f} MiB"
