"""sandbox-gateway under test: starting it, groups of processes a test
starts (gateways and shims), and the host's view of a gateway's sandboxes.

Each gateway listens on a port picked by the kernel (SANDBOX_LISTEN=
127.0.0.1:0; the port is read from the JSON log line {"message":
"listening", "port": N}) and has a private state directory and cgroup
group, so that gateways of concurrent tests never touch each other's
sandboxes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional

from tests.lib.client import SandboxClient, sandbox_client
from tests.lib.procs import (DEFAULT_GRACE_S, EXIT_MARGIN_S, START_TIMEOUT_S, ManagedProcess,
                             ProcessStartError, base_env, require_gateway_binary, stop_checked)
from tests.lib.shim import Shim, start_shim


# The gateway's spare memory cgroups (gateway/runtime/cgroup.h, internal.h).
SPARE_PREFIX = ".spare-"
SPARE_MEMCGS = 16
# The memory cgroup of the gateway's sandboxes' pid 1s (cgroup v1; made
# with the gateway's group, removed at shutdown).
HOLDERS_MEMCG = ".holders"
# The placeholder names of warm-pool sandboxes (SANDBOX_WARM_POOL), made
# ahead of launches: the gateway's own while it runs, gone when it stops.
POOL_PREFIX = "_pool-"


def _is_listening(rec: dict) -> bool:
    port = rec.get("port")
    return (rec.get("message") == "listening" and isinstance(port, int)
            and not isinstance(port, bool))


class Gateway(ManagedProcess):
    """A running sandbox-gateway. `port`, `target` are set once it listens."""

    def __init__(self, env: Mapping[str, str], args: Iterable[str] = (),
                 binary: Optional[Path] = None, name: str = "sandbox-gateway"):
        binary = binary or require_gateway_binary()
        grace = float(env.get("SANDBOX_SHUTDOWN_GRACE_SECONDS") or DEFAULT_GRACE_S)
        super().__init__([str(binary), *args], env, name=name,
                         stop_timeout=grace + EXIT_MARGIN_S)
        self.grace_seconds = grace
        self.secret = env.get("CLOUD_RUN_SANDBOX_GATEWAY_SECRET")
        self.port: Optional[int] = None
        self.host = "127.0.0.1"
        self.state_dir: Optional[str] = env.get("SANDBOX_STATE_DIR")
        self.cgroup_group: Optional[str] = env.get("SANDBOX_CGROUP_GROUP")
        self.listening_record: Optional[dict] = None
        self._channels: list = []
        self.on_stop(self.close_channels)
        self.after_stop(self.remove_state)

    @property
    def target(self) -> str:
        if self.port is None:
            raise RuntimeError("the gateway has not reported its port")
        return f"{self.host}:{self.port}"

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> int:
        rec = self.logs.wait_for(_is_listening, timeout, alive=self.alive)
        if rec is None:
            why = ("exited before listening" if not self.alive()
                   else f"did not log a \"listening\" line with a port within {timeout}s")
            detail = self.describe()
            self.stop(timeout=5.0)
            raise ProcessStartError(f"sandbox-gateway {why}\n{detail}")
        self.listening_record = rec
        self.port = rec["port"]
        return self.port

    def wait_accepting(self, port: int, timeout: float = START_TIMEOUT_S) -> int:
        """For a gateway started on a known port whose listening line may be
        hidden (e.g. SANDBOX_LOG_LEVEL=error): waits until the port accepts
        TCP connections, failing early if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise ProcessStartError(f"sandbox-gateway exited before accepting on port {port}\n"
                                        f"{self.describe()}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                if s.connect_ex((self.host, port)) == 0:
                    self.port = port
                    return port
            if time.monotonic() >= deadline:
                detail = self.describe()
                self.stop(timeout=5.0)
                raise ProcessStartError(f"sandbox-gateway did not accept on port {port} "
                                        f"within {timeout}s\n{detail}")
            time.sleep(0.05)

    # --- clients -------------------------------------------------------------
    def channel(self, options: Optional[list] = None):
        """An insecure channel to the gateway, closed when the gateway stops."""
        import grpc
        ch = grpc.insecure_channel(self.target, options=options or [])
        self._channels.append(ch)
        return ch

    def secure_channel(self, root_certificates: bytes, private_key: Optional[bytes] = None,
                       certificate_chain: Optional[bytes] = None,
                       server_name: str = "localhost", options: Optional[list] = None):
        """A TLS channel (optionally with a client certificate)."""
        import grpc
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates,
                                             private_key=private_key,
                                             certificate_chain=certificate_chain)
        opts = [("grpc.ssl_target_name_override", server_name)] + (options or [])
        ch = grpc.secure_channel(self.target, creds, options=opts)
        self._channels.append(ch)
        return ch

    def auth_metadata(self, token: Optional[str] = None) -> list[tuple[str, str]]:
        """`authorization: Bearer <token>` (the configured secret by default)."""
        token = self.secret if token is None else token
        return [("authorization", f"Bearer {token}")]

    def leftovers(self) -> list[str]:
        """Mounts below the state directory and cgroups of this instance that
        still exist: after a clean delete or shutdown there are none. While
        it runs, its spare memory cgroups (made ahead of launches, at most
        SPARE_MEMCGS, and holding no process), its holders' memory cgroup
        and its warm pool's sandboxes are its own, not leftovers."""
        found = []
        spares = []
        if self.state_dir:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mp = line.split()[4]
                    if mp.startswith(self.state_dir + "/"):
                        found.append(f"mount {mp}")
        if self.cgroup_group:
            for root in Path("/sys/fs/cgroup").iterdir():
                g = root / self.cgroup_group
                if g.is_dir():
                    for p in g.iterdir():
                        if p.is_dir() and self.alive() and p.name.startswith(SPARE_PREFIX):
                            spares.append(p)
                        elif p.is_dir() and self.alive() and p.name == HOLDERS_MEMCG:
                            continue
                        elif p.is_dir() and self.alive() and p.name.startswith(POOL_PREFIX):
                            continue
                        elif p.is_dir():
                            found.append(f"cgroup {p}")
        assert len(spares) <= SPARE_MEMCGS, spares
        for p in spares:
            with contextlib.suppress(FileNotFoundError):  # taken by a launch meanwhile
                assert (p / "cgroup.procs").read_text() == "", f"a spare memory cgroup holds processes: {p}"
        return found

    def remove_state(self) -> None:
        """Removes the private state directory and cgroup group (after the
        process has exited), unmounting anything a crash left."""
        if self.alive():
            return
        if self.state_dir and os.path.isdir(self.state_dir):
            with open("/proc/self/mountinfo") as f:
                mounts = [line.split()[4] for line in f
                          if line.split()[4].startswith(self.state_dir + "/")]
            for mp in sorted(mounts, key=len, reverse=True):
                subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.cgroup_group:
            for root in Path("/sys/fs/cgroup").iterdir():
                g = root / self.cgroup_group
                if g.is_dir():
                    for sub in sorted(g.rglob("*"), key=lambda p: len(str(p)), reverse=True):
                        if sub.is_dir():
                            with contextlib.suppress(OSError):
                                sub.rmdir()
                    with contextlib.suppress(OSError):
                        g.rmdir()

    def close_channels(self) -> None:
        channels, self._channels = self._channels, []
        for ch in channels:
            with contextlib.suppress(Exception):
                ch.close()


_instance_counter = itertools.count(1)

# Test gateways' uid blocks (SANDBOX_UID_BASE, SANDBOX_UID_SLOTS): each its
# own, since the gateway refuses to start on a block another running
# gateway of the machine holds, and tests of several checkouts run at once.
# Blocks of whole units in the upper half of the uid space, away from the
# default (1000000); a random start, skipping the blocks claimed in the
# lock directory and the ones this process gave out recently.
UID_RANGE = 65536
UID_LOCK_DIR = "/run/sandbox-gateway/uid-blocks"
_UID_UNIT_SLOTS = 64
# A gateway's slots when the test sets neither SANDBOX_UID_SLOTS nor SANDBOX_MAX.
_UID_DEFAULT_SLOTS = 1024
# Blocks this process gave out lately, kept out of the next choices (a
# gateway just started may not hold its claim yet).
_UID_RECENT = 8
_UID_FIRST = 1 << 31
_uid_recent: list[tuple[int, int]] = []


def _claimed_blocks() -> list[tuple[int, int]]:
    out = []
    with contextlib.suppress(OSError):
        for name in os.listdir(UID_LOCK_DIR):
            first, _, last = name.partition("-")
            if first.isdigit() and last.isdigit():
                out.append((int(first), int(last)))
    return out


def free_uid_block(slots: int = _UID_UNIT_SLOTS) -> int:
    """A SANDBOX_UID_BASE for `slots` ranges that no gateway of this machine
    claims now (nor one this process started recently)."""
    unit = _UID_UNIT_SLOTS * UID_RANGE
    units = -(-slots // _UID_UNIT_SLOTS)
    n = (4294967295 - _UID_FIRST) // unit - units + 1
    taken = _claimed_blocks() + list(_uid_recent)
    start = int.from_bytes(os.urandom(4), "little") % n
    for i in range(n):
        base = _UID_FIRST + (((start + i) % n) // units * units) * unit  # aligned: same-size blocks never overlap in part
        last = base + slots * UID_RANGE - 1
        if not any(base <= t_last and t_first <= last for t_first, t_last in taken):
            _uid_recent.append((base, last))
            del _uid_recent[:-_UID_RECENT]
            return base
    raise RuntimeError(f"no free uid block for {slots} ranges under {UID_LOCK_DIR}")




def gateway_env(env: Optional[Mapping[str, Optional[str]]] = None,
                secret: Optional[str] = None) -> dict:
    """Environment for a gateway on 127.0.0.1:0 with a private state
    directory, cgroup group and uid block (so gateways of concurrent tests
    never touch each other's sandboxes): `secret` (when given) as
    CLOUD_RUN_SANDBOX_GATEWAY_SECRET, then `env` on top (None removes)."""
    n = next(_instance_counter)
    extra: dict = {
        "SANDBOX_LISTEN": "127.0.0.1:0",
        # A fresh path, made by the gateway itself (nothing to clean up when
        # the gateway never starts, e.g. --help).
        "SANDBOX_STATE_DIR": os.path.join(tempfile.gettempdir(),
                                          f"sgw-state-{os.getpid()}-{n}-{os.urandom(4).hex()}"),
        "SANDBOX_CGROUP_GROUP": f"sgw-test-{os.getpid()}-{n}",
    }
    if secret is not None:
        extra["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"] = secret
    extra.update(env or {})
    if "SANDBOX_UID_BASE" not in extra:
        # A small block of its own; as many ranges as SANDBOX_MAX asks.
        slots = extra.get("SANDBOX_UID_SLOTS")
        if slots is None:
            # Without SANDBOX_MAX the gateway sizes it from memory, capped
            # by the pool: room for what tests launch on one gateway.
            wanted = extra.get("SANDBOX_MAX") or str(_UID_DEFAULT_SLOTS)
            slots = str(max(_UID_UNIT_SLOTS, int(wanted) if wanted.isdigit() else 0))
            extra["SANDBOX_UID_SLOTS"] = slots
        if slots.isdigit() and int(slots) > 0:
            extra["SANDBOX_UID_BASE"] = str(free_uid_block(int(slots)))
    return base_env(extra)


def start_gateway(env: Optional[Mapping[str, Optional[str]]] = None, *,
                  secret: Optional[str] = None, args: Iterable[str] = (),
                  wait: bool = True, timeout: float = START_TIMEOUT_S) -> Gateway:
    """Starts the gateway; with `wait`, returns once it logged its port.
    The caller must stop() it (or use `running_gateway`)."""
    gw = Gateway(gateway_env(env, secret), args=args)
    if wait:
        gw.wait_listening(timeout)
    return gw


@contextlib.contextmanager
def running_gateway(env: Optional[Mapping[str, Optional[str]]] = None, *,
                    secret: Optional[str] = None, args: Iterable[str] = (),
                    check: bool = False, check_leftovers: bool = False) -> Iterator[Gateway]:
    """A gateway for the `with` block, stopped at its end. With `check`, the
    stop is `stop_checked` (a gateway that died or did not exit 0 on
    SIGTERM fails the test); `check_leftovers` also fails on mounts and
    cgroups left behind."""
    gw = start_gateway(env, secret=secret, args=args)
    try:
        yield gw
    finally:
        if check or check_leftovers:
            stop_checked(gw, check_leftovers=check_leftovers)
        else:
            gw.stop()


@contextlib.contextmanager
def gateway_client(env: Optional[Mapping[str, Optional[str]]] = None, *, secret: Optional[str] = None,
                   check_leftovers: bool = False) -> Iterator[SandboxClient]:
    """A gateway of its own and a client of it, for the `with` block: at the
    end the client's sandboxes are deleted and the gateway is stopped as by
    `running_gateway(check=True)`."""
    with running_gateway(env, secret=secret, check=True, check_leftovers=check_leftovers) as gw, \
            sandbox_client(gw) as client:
        yield client


# Marks "use the group's secret" in ProcessGroup.gateway().
_GROUP_SECRET = object()


class ProcessGroup:
    """Gateways and shims started by one test, all stopped at teardown
    (`stop_checked`, last started first). Pytest fixtures return one as a
    factory: `group.gateway(env, secret=...)`, `group.shim(gw, env=...)`.
    `secret` is what `gateway()` uses unless told otherwise."""

    def __init__(self, secret: Optional[str] = None):
        self.secret = secret
        self.processes: list[ManagedProcess] = []

    def add(self, proc: ManagedProcess) -> ManagedProcess:
        self.processes.append(proc)
        return proc

    def gateway(self, env: Optional[Mapping[str, Optional[str]]] = None, *,
                secret=_GROUP_SECRET, args: Iterable[str] = (), wait: bool = True) -> Gateway:
        secret = self.secret if secret is _GROUP_SECRET else secret
        gw = Gateway(gateway_env(env, secret), args=args)
        self.add(gw)
        if wait:
            gw.wait_listening()
        return gw

    def shim(self, gateway: Optional[Gateway] = None, **kw) -> Shim:
        return self.add(start_shim(gateway, **kw))

    def stop_all(self) -> list[tuple[ManagedProcess, int]]:
        return [(p, p.stop()) for p in reversed(self.processes)]

    def stop_checked(self) -> None:
        stop_checked(*reversed(self.processes))

    def report_sections(self) -> list[tuple[str, str]]:
        return [(f"{p.name} #{i + 1}", p.describe()) for i, p in enumerate(self.processes)]


class GatewaySet(dict):
    """Named gateways; attaches their output to a failing test's report."""

    def report_sections(self) -> list[tuple[str, str]]:
        return [(f"gateway {name}", g.describe()) for name, g in self.items()]


# --- the host's view of a gateway's sandboxes ------------------------------------

def leftovers_of(gw: Gateway, sid: str) -> list[str]:
    """What of sandbox `sid` is still on the host: mounts below its state
    directory, its cgroups, its state directory."""
    found = []
    state = f"{gw.state_dir}/sandboxes/{sid}"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp == state or mp.startswith(state + "/"):
                found.append(f"mount {mp}")
    for root in Path("/sys/fs/cgroup").iterdir():
        g = root / gw.cgroup_group / sid
        if g.is_dir():
            found.append(f"cgroup {g}")
    if os.path.lexists(state):
        found.append(f"state directory {state}")
    return found


def _pids_below(root: Path) -> set[int]:
    """Pids in every cgroup below `root`. Groups come and go while it reads
    (an exec's group is removed when its command ends): a walk that meets a
    vanished group starts over."""
    for _ in range(10):
        pids: set[int] = set()
        try:
            if root.is_dir():
                for procs in root.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in procs.read_text().split())
            return pids
        except FileNotFoundError:
            continue
    return pids


def cgroup_pids(gw: Gateway, sid: str) -> set[int]:
    """Host pids of every process in sandbox `sid` (pids hierarchy)."""
    return _pids_below(Path("/sys/fs/cgroup/pids") / gw.cgroup_group / sid)


def processes_in_group(group: Optional[str]) -> list[int]:
    """Host pids of every process in a gateway's cgroup group (any
    hierarchy)."""
    if not group:
        return []
    pids: set[int] = set()
    for root in Path("/sys/fs/cgroup").iterdir():
        pids |= _pids_below(root / group)
    return sorted(pids)


def gateway_leftovers(gw: Gateway) -> list[str]:
    """`gw.leftovers()` (mounts below the state dir, cgroups of the group),
    and processes whose cgroup is in the group."""
    found = gw.leftovers()
    found += [f"process {pid}" for pid in processes_in_group(gw.cgroup_group)]
    return found


def commands_in(gw: Gateway, sid: str) -> list[str]:
    """`comm` of every process of the sandbox but its holder."""
    out = []
    for pid in cgroup_pids(gw, sid):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name != "sandbox-helper":
            out.append(name)
    return out


def holder_pids(gw: Gateway, expect: Optional[str] = None, timeout: float = 10.0) -> dict[str, int]:
    """sandbox id -> host pid of its holder, from the gateway's log. With
    `expect`, waits until that sandbox's launch record has been read (the
    log is read by another thread, which may lag behind the call)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {r["sandbox_id"]: r["holder_pid"]
                 for r in gw.logs.find(lambda r: r.get("message") == "sandbox launched")}
        if expect is None or expect in found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def freezer_state(gw: Gateway, sandbox_id: str) -> Optional[str]:
    path = Path("/sys/fs/cgroup/freezer") / gw.cgroup_group / sandbox_id / "freezer.state"
    try:
        return path.read_text().strip()
    except OSError:
        return None


