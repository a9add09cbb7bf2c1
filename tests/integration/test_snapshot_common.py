"""Shared helpers of the snapshot tests (test_snapshot_*.py).

This module holds no tests. `Snap` is a thin client of sandbox.v1.Sandbox
bound to one gateway: every call carries the bearer token and a deadline,
and every sandbox it creates is remembered so that `cleanup()` can delete
what a failing test left behind. Export streams are consumed piece by piece
(hashed as they arrive, optionally written to a file), never kept whole
unless a test asks for the bytes.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import secrets
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional

import grpc
import pytest

from gateway_fixture import RPC_TIMEOUT_S, Gateway
from grpc_clients import sandbox_modules

pb, pb_grpc = sandbox_modules()

SNAPSHOTS_DIR = Path(__file__).resolve().parents[1] / "snapshots"
HOSTILE_DIR = SNAPSHOTS_DIR / "hostile"

# Deadlines of the calls that move a whole snapshot (generous: the 1 GiB
# test moves a lot of data on a small machine).
STREAM_TIMEOUT_S = 300.0
EXEC_TIMEOUT_S = 120.0
# Restore pieces: the gateway's default SANDBOX_MAX_MESSAGE_MB is 16.
RESTORE_CHUNK = 1024 * 1024

COMPRESSIONS = {
    "none": pb.COMPRESSION_NONE,
    "gzip": pb.COMPRESSION_GZIP,
    "zstd": pb.COMPRESSION_ZSTD,
}


def new_id(prefix: str = "snap") -> str:
    """A fresh, valid sandbox id."""
    return f"{prefix}-{secrets.token_hex(6)}"


@dataclass
class ExecResult:
    stdout: bytes = b""
    stderr: bytes = b""
    exit: Optional[object] = None  # sandbox.v1.ExitStatus

    @property
    def code(self) -> int:
        return self.exit.exit_code

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def describe(self) -> str:
        return (f"exit={self.exit!r}\nstdout={self.stdout[-4000:]!r}\n"
                f"stderr={self.stderr[-4000:]!r}")


@dataclass
class Export:
    """What an ExportSnapshot stream delivered."""
    chunks: int = 0
    received_bytes: int = 0
    sha256: str = ""            # computed over the data received
    last: Optional[object] = None  # the final SnapshotChunk
    data: Optional[bytes] = None   # only when kept
    messages_after_last: int = 0


def decompress(data: bytes) -> bytes:
    """Plain tar bytes from a plain, gzip or zstd stream."""
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return subprocess.run(["zstd", "-d", "-q", "-c"], input=data, stdout=subprocess.PIPE,
                              check=True, timeout=60).stdout
    return data


def open_tar(data: bytes) -> tarfile.TarFile:
    """The stream as a tarfile (decompressing first); raises if unreadable."""
    return tarfile.open(fileobj=io.BytesIO(decompress(data)), mode="r:")


def chunks_of(data: bytes, size: int = RESTORE_CHUNK) -> Iterator[bytes]:
    for off in range(0, len(data), size):
        yield data[off:off + size]


def file_chunks(path: Path, size: int = RESTORE_CHUNK) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while True:
            b = f.read(size)
            if not b:
                return
            yield b


def restore_requests(sandbox_id: str, pieces: Iterable[bytes], allow_egress: bool = False):
    yield pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id=sandbox_id, allow_egress=allow_egress))
    for piece in pieces:
        yield pb.RestoreRequest(tar_chunk=piece)


class Snap:
    """A client of one gateway that remembers what it created."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.stub = pb_grpc.SandboxStub(gw.channel(options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ]))
        self.md = gw.auth_metadata()
        self.created: set[str] = set()

    # --- plain calls -----------------------------------------------------------
    def launch(self, sandbox_id: Optional[str] = None, **kw):
        sandbox_id = sandbox_id or new_id()
        self.created.add(sandbox_id)
        return self.stub.Launch(pb.LaunchRequest(sandbox_id=sandbox_id, **kw),
                                metadata=self.md, timeout=120)

    def delete(self, sandbox_id: str, delete_snapshot: bool = False):
        resp = self.stub.Delete(pb.DeleteRequest(sandbox_id=sandbox_id,
                                                 delete_snapshot=delete_snapshot),
                                metadata=self.md, timeout=60)
        self.created.discard(sandbox_id)
        return resp

    def list_ids(self) -> list[str]:
        resp = self.stub.List(pb.ListRequest(), metadata=self.md, timeout=RPC_TIMEOUT_S)
        return [s.sandbox_id for s in resp.sandboxes]

    def get(self, sandbox_id: str):
        return self.stub.Get(pb.GetRequest(sandbox_id=sandbox_id), metadata=self.md,
                             timeout=RPC_TIMEOUT_S)

    def connect(self, sandbox_id: str, **kw):
        self.created.add(sandbox_id)
        return self.stub.Connect(pb.ConnectRequest(sandbox_id=sandbox_id, **kw),
                                 metadata=self.md, timeout=120)

    def exec(self, sandbox_id: str, argv: list[str], stdin: bytes = b"",
             timeout: float = EXEC_TIMEOUT_S) -> ExecResult:
        res = ExecResult()
        out, err = [], []
        for ev in self.stub.Exec(pb.ExecRequest(sandbox_id=sandbox_id, argv=argv, stdin=stdin,
                                                timeout_seconds=int(timeout)),
                                 metadata=self.md, timeout=timeout + 30):
            kind = ev.WhichOneof("event")
            if kind == "stdout":
                out.append(ev.stdout)
            elif kind == "stderr":
                err.append(ev.stderr)
            elif kind == "exit":
                res.exit = ev.exit
        res.stdout, res.stderr = b"".join(out), b"".join(err)
        assert res.exit is not None, f"Exec stream ended without an exit event\n{res.describe()}"
        return res

    def sh(self, sandbox_id: str, script: str, timeout: float = EXEC_TIMEOUT_S) -> str:
        """Runs `sh -c script`, asserts exit 0, returns stdout as text."""
        res = self.exec(sandbox_id, ["sh", "-c", script], timeout=timeout)
        assert res.exit.exit_code == 0 and res.exit.signal == 0, \
            f"`{script}` failed in {sandbox_id}\n{res.describe()}"
        return res.out

    def py(self, sandbox_id: str, code: str, timeout: float = EXEC_TIMEOUT_S) -> str:
        res = self.exec(sandbox_id, ["python3", "-c", code], timeout=timeout)
        assert res.exit.exit_code == 0, f"python in {sandbox_id} failed\n{res.describe()}"
        return res.out

    # --- snapshots -------------------------------------------------------------
    def export_stream(self, sandbox_id: str, compression=pb.COMPRESSION_NONE,
                      timeout: float = STREAM_TIMEOUT_S):
        return self.stub.ExportSnapshot(
            pb.ExportSnapshotRequest(sandbox_id=sandbox_id, compression=compression),
            metadata=self.md, timeout=timeout)

    def export(self, sandbox_id: str, compression=pb.COMPRESSION_NONE, keep: bool = True,
               sink: Optional[BinaryIO] = None, timeout: float = STREAM_TIMEOUT_S) -> Export:
        """Consumes a whole export: hashes every piece, writes it to `sink`
        when given, keeps the bytes when `keep`. Checks the stream's shape:
        data chunks, then one last chunk with no data."""
        ex = Export()
        h = hashlib.sha256()
        kept = [] if keep else None
        for chunk in self.export_stream(sandbox_id, compression, timeout):
            if ex.last is not None:
                ex.messages_after_last += 1
                continue
            if chunk.last:
                ex.last = chunk
                assert chunk.data == b"", "the last chunk carries data"
                continue
            assert not chunk.total_bytes and not chunk.sha256, \
                "a chunk other than the last carries total_bytes/sha256"
            ex.chunks += 1
            ex.received_bytes += len(chunk.data)
            h.update(chunk.data)
            if sink is not None:
                sink.write(chunk.data)
            if kept is not None:
                kept.append(chunk.data)
        assert ex.last is not None, "the export stream ended without a last chunk"
        assert ex.messages_after_last == 0, "messages came after the last chunk"
        ex.sha256 = h.hexdigest()
        if kept is not None:
            ex.data = b"".join(kept)
        return ex

    def restore(self, sandbox_id: str, pieces: Iterable[bytes], timeout: float = STREAM_TIMEOUT_S,
                allow_egress: bool = False):
        self.created.add(sandbox_id)
        return self.stub.Restore(restore_requests(sandbox_id, pieces, allow_egress),
                                 metadata=self.md, timeout=timeout)

    def persist(self, sandbox_id: str, timeout: float = STREAM_TIMEOUT_S) -> list:
        return list(self.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sandbox_id),
                                              metadata=self.md, timeout=timeout))

    # --- teardown --------------------------------------------------------------
    def cleanup(self) -> None:
        for sid in list(self.created):
            with contextlib.suppress(grpc.RpcError):
                self.delete(sid)
        self.created.clear()


def rpc_error(fn, *args, **kw) -> grpc.RpcError:
    """Calls fn, expecting it to raise grpc.RpcError; returns the error."""
    try:
        result = fn(*args, **kw)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    except grpc.RpcError as e:
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} succeeded; an error was expected")


def freezer_state(gw: Gateway, sandbox_id: str) -> Optional[str]:
    path = Path("/sys/fs/cgroup/freezer") / gw.cgroup_group / sandbox_id / "freezer.state"
    try:
        return path.read_text().strip()
    except OSError:
        return None


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RssSampler:
    """Samples a process's VmRSS every `interval` seconds in a thread;
    `peak_kib` is the largest value seen."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid = pid
        self.interval = interval
        self.peak_kib = vm_rss_kib(pid)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.peak_kib = max(self.peak_kib, vm_rss_kib(self.pid))
                self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self.peak_kib = max(self.peak_kib, vm_rss_kib(self.pid))
        return False


def stop_checked(*gws: Gateway) -> None:
    """Stops the gateways (module fixtures' teardown): one that died during
    the tests, or did not exit 0 on SIGTERM, fails with its logs."""
    problems = []
    for g in gws:
        died = g.returncode is not None and not g.signalled
        rc = g.stop()
        if died:
            problems.append(f"the gateway ended during the tests (exit {rc})\n{g.describe()}")
        elif rc != 0:
            problems.append(f"the gateway exited {rc} on SIGTERM\n{g.describe()}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


class GatewaySet(dict):
    """Named gateways; attaches their output to a failing test's report."""

    def report_sections(self) -> list[tuple[str, str]]:
        return [(f"gateway {name}", g.describe()) for name, g in self.items()]
