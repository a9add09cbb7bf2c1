"""Shared helpers of the sandbox runtime tests (test_runtime_*.py).

This module holds no tests. `Sandboxes` is a thin client of
sandbox.v1.Sandbox bound to one gateway: every call carries the bearer token
and a deadline, and every sandbox it launches is remembered so that
`cleanup()` can delete what a failing test left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional

import grpc

from gateway_fixture import RPC_TIMEOUT_S, Gateway
from grpc_clients import sandbox_modules

pb, pb_grpc = sandbox_modules()

# Deadline of an Exec call unless a test says otherwise: generous, since
# the command's own timeout_seconds is what a test normally relies on.
EXEC_RPC_TIMEOUT_S = 60.0


def new_id(prefix: str = "t") -> str:
    """A fresh, valid sandbox id."""
    return f"{prefix}-{secrets.token_hex(6)}"


@dataclass
class ExecResult:
    events: list
    stdout: bytes = b""
    stderr: bytes = b""
    exit: Optional[object] = None  # sandbox.v1.ExitStatus

    @property
    def code(self) -> int:
        return self.exit.exit_code

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def describe(self) -> str:
        return (f"exit={self.exit!r}\nstdout={self.stdout[-4000:]!r}\n"
                f"stderr={self.stderr[-4000:]!r}")


def collect(events: Iterable) -> ExecResult:
    """Gathers an Exec stream; checks that exactly one exit event ends it."""
    res = ExecResult(events=[])
    out, err = [], []
    for ev in events:
        kind = ev.WhichOneof("event")
        assert res.exit is None, f"an event ({kind}) came after the exit event"
        res.events.append(ev)
        if kind == "stdout":
            out.append(ev.stdout)
        elif kind == "stderr":
            err.append(ev.stderr)
        elif kind == "exit":
            res.exit = ev.exit
        else:
            raise AssertionError(f"unknown event {ev!r}")
    res.stdout, res.stderr = b"".join(out), b"".join(err)
    assert res.exit is not None, f"the stream ended without an exit event\n{res.describe()}"
    return res


class Sandboxes:
    """Client of one gateway's sandbox.v1.Sandbox service."""

    def __init__(self, gw: Gateway, channel=None):
        self.gw = gw
        self.channel = channel or gw.channel()
        self.stub = pb_grpc.SandboxStub(self.channel)
        self.md = gw.auth_metadata()
        self.launched: list[str] = []

    # --- unary calls -------------------------------------------------------
    def launch(self, sid: Optional[str] = None, allow_egress: bool = False,
               timeout: float = RPC_TIMEOUT_S):
        sid = new_id() if sid is None else sid
        info = self.stub.Launch(pb.LaunchRequest(sandbox_id=sid, allow_egress=allow_egress),
                                metadata=self.md, timeout=timeout)
        self.launched.append(sid)
        return info

    def delete(self, sid: str, timeout: float = 30.0):
        return self.stub.Delete(pb.DeleteRequest(sandbox_id=sid), metadata=self.md, timeout=timeout)

    def get(self, sid: str, timeout: float = RPC_TIMEOUT_S):
        return self.stub.Get(pb.GetRequest(sandbox_id=sid), metadata=self.md, timeout=timeout)

    def list(self, timeout: float = RPC_TIMEOUT_S):
        return list(self.stub.List(pb.ListRequest(), metadata=self.md, timeout=timeout).sandboxes)

    def ids(self) -> list[str]:
        return [s.sandbox_id for s in self.list()]

    # --- exec ----------------------------------------------------------------
    def exec_call(self, sid: str, argv: list[str], *, stdin: bytes = b"",
                  env: Optional[Mapping[str, str]] = None, cwd: str = "",
                  timeout_seconds: int = 0, rpc_timeout: float = EXEC_RPC_TIMEOUT_S):
        """The streaming call itself (an iterator of ExecEvents that can be
        cancelled)."""
        req = pb.ExecRequest(sandbox_id=sid, argv=argv, stdin=stdin, env=dict(env or {}),
                             cwd=cwd, timeout_seconds=timeout_seconds)
        return self.stub.Exec(req, metadata=self.md, timeout=rpc_timeout)

    def exec(self, sid: str, argv: list[str], **kw) -> ExecResult:
        return collect(self.exec_call(sid, argv, **kw))

    def sh(self, sid: str, script: str, **kw) -> ExecResult:
        return self.exec(sid, ["sh", "-c", script], **kw)

    def ok(self, sid: str, script: str, **kw) -> ExecResult:
        """Runs a shell script that must exit 0."""
        res = self.sh(sid, script, **kw)
        assert res.code == 0 and res.exit.signal == 0, f"`{script}` failed\n{res.describe()}"
        return res

    # --- clean-up ------------------------------------------------------------
    def delete_many(self, ids: Iterable[str], ignore_missing: bool = False) -> None:
        """Deletes sandboxes concurrently (a delete waits for the sandbox's
        processes to be gone, which takes a while each)."""
        ids = list(ids)
        if not ids:
            return
        errors = []

        def one(sid):
            try:
                self.delete(sid)
            except grpc.RpcError as e:
                if not (ignore_missing and e.code() == grpc.StatusCode.NOT_FOUND):
                    errors.append((sid, e))

        with ThreadPoolExecutor(max_workers=min(len(ids), 32)) as pool:
            list(pool.map(one, ids))
        if errors:
            raise errors[0][1]

    def cleanup(self) -> None:
        """Deletes every sandbox this client launched that still exists."""
        launched, self.launched = self.launched, []
        with contextlib.suppress(grpc.RpcError):
            self.delete_many(dict.fromkeys(launched), ignore_missing=True)


def rpc_code(excinfo) -> grpc.StatusCode:
    return excinfo.value.code()


# --- host-side views -----------------------------------------------------------

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


def cgroup_pids(gw: Gateway, sid: str) -> set[int]:
    """Host pids of every process in sandbox `sid` (pids hierarchy)."""
    root = Path("/sys/fs/cgroup/pids") / gw.cgroup_group / sid
    pids: set[int] = set()
    if root.is_dir():
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (a zombie is dead; reaping
    it is its parent's business)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def holder_pids(gw: Gateway) -> dict[str, int]:
    """sandbox id -> host pid of its holder, from the gateway's log."""
    return {r["sandbox_id"]: r["holder_pid"]
            for r in gw.logs.find(lambda r: r.get("message") == "sandbox launched")}


def wait_for(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def run(argv: list[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


# A Python snippet run inside sandboxes: tries a TCP connection and prints
# "OK <first bytes>" or "ERR <errno name>" (exit 0 either way).
PY_CONNECT = r"""
import errno, socket, sys
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket()
s.settimeout(timeout)
try:
    s.connect((host, port))
    data = b""
    try:
        data = s.recv(100)
    except OSError:
        pass
    print("OK", data.decode(errors="replace"))
except socket.timeout:
    print("ERR TIMEOUT")
except OSError as e:
    print("ERR", errno.errorcode.get(e.errno, str(e.errno)))
"""


def connect_argv(host: str, port: int, timeout: float = 3.0) -> list[str]:
    return ["python3", "-c", PY_CONNECT, host, str(port), str(timeout)]
