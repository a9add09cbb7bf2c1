"""`SandboxClient`: a thin client of sandbox.v1.Sandbox bound to one gateway.

Every call carries the bearer token and a deadline, and every sandbox the
client creates (launch, restore, connect) is remembered so that `cleanup()`
can delete what a failing test left behind. Exec streams are gathered by
`collect()`, which checks their shape; export streams are consumed piece by
piece (hashed as they arrive, optionally written to a file), never kept
whole unless a test asks for the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator, Mapping, Optional

import grpc

from tests.lib.grpc_clients import RPC_TIMEOUT_S, sandbox_modules

if TYPE_CHECKING:
    from tests.lib.gateway import Gateway

pb, pb_grpc = sandbox_modules()

# Deadline of an Exec call unless a test says otherwise: generous, since
# the command's own timeout_seconds is what a test normally relies on.
EXEC_RPC_TIMEOUT_S = 60.0
# The command timeout of `sh_out` / `py_out` unless a test says otherwise.
SLOW_EXEC_S = 120
# Deadlines of Launch and Delete, and of the calls that move a whole snapshot
# (generous: the 1 GiB test moves a lot of data on a small machine).
LAUNCH_TIMEOUT_S = 60.0
STREAM_TIMEOUT_S = 300.0
# What a SandboxClient's channel lets through each way: more than the
# gateway's own limit (SANDBOX_MAX_MESSAGE_MB, 16 by default), so that
# oversized requests reach the gateway and big answers reach the test.
MAX_MESSAGE = 64 * 1024 * 1024


def new_id(prefix: str = "t") -> str:
    """A fresh, valid sandbox id."""
    return f"{prefix}-{secrets.token_hex(6)}"


@dataclass
class ExecResult:
    events: list = field(default_factory=list)
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
    res = ExecResult()
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


@dataclass
class Export:
    """What an ExportSnapshot stream delivered."""
    chunks: int = 0
    received_bytes: int = 0
    sha256: str = ""            # computed over the data received
    last: Optional[object] = None  # the final SnapshotChunk
    data: Optional[bytes] = None   # only when kept
    messages_after_last: int = 0


def restore_requests(sandbox_id: str, pieces: Iterable[bytes], allow_egress: bool = False):
    yield pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id=sandbox_id, allow_egress=allow_egress))
    for piece in pieces:
        yield pb.RestoreRequest(tar_chunk=piece)


class SandboxClient:
    """Client of one gateway's sandbox.v1.Sandbox service. `channel`
    defaults to a fresh one allowing 64 MiB messages."""

    def __init__(self, gw: Gateway, channel=None):
        self.gw = gw
        self.channel = channel or gw.channel(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ])
        self.stub = pb_grpc.SandboxStub(self.channel)
        self.md = gw.auth_metadata()
        # Every id this client launched, restored or connected (a delete
        # does not remove it: cleanup ignores sandboxes already gone).
        self.created: list[str] = []

    # --- unary calls -------------------------------------------------------
    def launch(self, sid: Optional[str] = None, allow_egress: bool = False,
               timeout: float = LAUNCH_TIMEOUT_S):
        sid = new_id() if sid is None else sid
        self.created.append(sid)
        return self.stub.Launch(pb.LaunchRequest(sandbox_id=sid, allow_egress=allow_egress),
                                metadata=self.md, timeout=timeout)

    def connect(self, sid: str, timeout: float = STREAM_TIMEOUT_S, **kw):
        """Connect: renews a live sandbox, restores a stored snapshot (hence
        the long deadline), or launches."""
        self.created.append(sid)
        return self.stub.Connect(pb.ConnectRequest(sandbox_id=sid, **kw),
                                 metadata=self.md, timeout=timeout)

    def delete(self, sid: str, delete_snapshot: bool = False, timeout: float = LAUNCH_TIMEOUT_S):
        return self.stub.Delete(pb.DeleteRequest(sandbox_id=sid, delete_snapshot=delete_snapshot),
                                metadata=self.md, timeout=timeout)

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

    def py(self, sid: str, code: str, **kw) -> ExecResult:
        """Runs a Python program (given on stdin)."""
        return self.exec(sid, ["python3", "-"], stdin=code.encode(), **kw)

    def ok(self, sid: str, script: str, **kw) -> ExecResult:
        """Runs a shell script that must exit 0."""
        res = self.sh(sid, script, **kw)
        assert res.code == 0 and res.exit.signal == 0, f"`{script}` failed in {sid}\n{res.describe()}"
        return res

    def sh_out(self, sid: str, script: str, timeout_seconds: int = SLOW_EXEC_S) -> str:
        """Runs a shell script that must exit 0; returns its stdout (text)."""
        return self.ok(sid, script, timeout_seconds=timeout_seconds,
                       rpc_timeout=timeout_seconds + 30).out

    def py_out(self, sid: str, code: str, timeout_seconds: int = SLOW_EXEC_S) -> str:
        """Runs a Python program that must exit 0; returns its stdout (text)."""
        res = self.py(sid, code, timeout_seconds=timeout_seconds, rpc_timeout=timeout_seconds + 30)
        assert res.code == 0, f"python in {sid} failed\n{res.describe()}"
        return res.out

    # --- snapshots -------------------------------------------------------------
    def export_stream(self, sid: str, compression=pb.COMPRESSION_NONE,
                      timeout: float = STREAM_TIMEOUT_S, skip_sha256: bool = False):
        return self.stub.ExportSnapshot(
            pb.ExportSnapshotRequest(sandbox_id=sid, compression=compression, skip_sha256=skip_sha256),
            metadata=self.md, timeout=timeout)

    def export(self, sid: str, compression=pb.COMPRESSION_NONE, keep: bool = True,
               sink: Optional[BinaryIO] = None, timeout: float = STREAM_TIMEOUT_S,
               skip_sha256: bool = False) -> Export:
        """Consumes a whole export: hashes every piece, writes it to `sink`
        when given, keeps the bytes when `keep`. Checks the stream's shape:
        data chunks, then one last chunk with no data."""
        ex = Export()
        h = hashlib.sha256()
        kept = [] if keep else None
        for chunk in self.export_stream(sid, compression, timeout, skip_sha256):
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

    def restore(self, sid: str, pieces: Iterable[bytes], timeout: float = STREAM_TIMEOUT_S,
                allow_egress: bool = False):
        self.created.append(sid)
        return self.stub.Restore(restore_requests(sid, pieces, allow_egress),
                                 metadata=self.md, timeout=timeout)

    def persist(self, sid: str, timeout: float = STREAM_TIMEOUT_S) -> list:
        return list(self.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid),
                                              metadata=self.md, timeout=timeout))

    # --- clean-up ------------------------------------------------------------
    # --- the file API ------------------------------------------------------
    def write_file(self, sid: str, path: str, data: bytes | Iterable[bytes] = b"", *, mode: int = 0,
                   make_parents: bool = False, append: bool = False, chunk: int = 1 << 20,
                   timeout: float = STREAM_TIMEOUT_S):
        """WriteFile: `data` as bytes (sent in `chunk`-sized pieces) or as
        an iterable of pieces. The FileInfo."""
        def requests():
            yield pb.WriteFileRequest(header=pb.WriteFileHeader(
                sandbox_id=sid, path=path, mode=mode, make_parents=make_parents, append=append))
            if isinstance(data, (bytes, bytearray, memoryview)):
                for i in range(0, len(data), chunk):
                    yield pb.WriteFileRequest(data=bytes(data[i:i + chunk]))
            else:
                for piece in data:
                    yield pb.WriteFileRequest(data=piece)
        return self.stub.WriteFile(requests(), metadata=self.md, timeout=timeout)

    def read_file_chunks(self, sid: str, path: str, offset: int = 0, length: int = 0,
                         timeout: float = STREAM_TIMEOUT_S):
        return self.stub.ReadFile(pb.ReadFileRequest(sandbox_id=sid, path=path, offset=offset, length=length),
                                  metadata=self.md, timeout=timeout)

    def read_file(self, sid: str, path: str, offset: int = 0, length: int = 0,
                  timeout: float = STREAM_TIMEOUT_S) -> tuple[bytes, object]:
        """ReadFile: (the bytes, the FileInfo of the first chunk)."""
        info, parts = None, []
        for i, chunk in enumerate(self.read_file_chunks(sid, path, offset, length, timeout)):
            if i == 0:
                info = chunk.info
            parts.append(chunk.data)
        return b"".join(parts), info

    def stat(self, sid: str, path: str, timeout: float = RPC_TIMEOUT_S):
        return self.stub.Stat(pb.StatRequest(sandbox_id=sid, path=path), metadata=self.md, timeout=timeout)

    def list_dir(self, sid: str, path: str, depth: int = 1, timeout: float = RPC_TIMEOUT_S):
        return self.stub.ListDir(pb.ListDirRequest(sandbox_id=sid, path=path, depth=depth),
                                 metadata=self.md, timeout=timeout).entries

    def remove(self, sid: str, path: str, recursive: bool = False, timeout: float = RPC_TIMEOUT_S):
        return self.stub.Remove(pb.RemoveRequest(sandbox_id=sid, path=path, recursive=recursive),
                                metadata=self.md, timeout=timeout)

    def rename(self, sid: str, src: str, dst: str, overwrite: bool = False, timeout: float = RPC_TIMEOUT_S):
        return self.stub.Rename(pb.RenameRequest(sandbox_id=sid, to=dst, overwrite=overwrite, **{"from": src}),
                                metadata=self.md, timeout=timeout)

    def mkdir(self, sid: str, path: str, parents: bool = False, mode: int = 0, timeout: float = RPC_TIMEOUT_S):
        return self.stub.MakeDir(pb.MakeDirRequest(sandbox_id=sid, path=path, parents=parents, mode=mode),
                                 metadata=self.md, timeout=timeout)

    def watch(self, sid: str, path: str, recursive: bool = False, timeout: float = STREAM_TIMEOUT_S):
        """Watch: the streaming call (iterate it; cancel() ends it)."""
        return self.stub.Watch(pb.WatchRequest(sandbox_id=sid, path=path, recursive=recursive),
                               metadata=self.md, timeout=timeout)

    def delete_many(self, ids: Iterable[str], ignore_missing: bool = False,
                    delete_snapshot: bool = False) -> None:
        """Deletes sandboxes concurrently (a delete waits for the sandbox's
        processes to be gone, which takes a while each)."""
        ids = list(ids)
        if not ids:
            return
        errors = []

        def one(sid):
            try:
                self.delete(sid, delete_snapshot=delete_snapshot)
            except grpc.RpcError as e:
                if not (ignore_missing and e.code() == grpc.StatusCode.NOT_FOUND):
                    errors.append((sid, e))

        with ThreadPoolExecutor(max_workers=min(len(ids), 32)) as pool:
            list(pool.map(one, ids))
        if errors:
            raise errors[0][1]

    def cleanup(self, delete_snapshots: bool = False) -> None:
        """Deletes every sandbox this client created that still exists (and
        with `delete_snapshots` their stored snapshots too)."""
        created, self.created = self.created, []
        with contextlib.suppress(grpc.RpcError):
            self.delete_many(dict.fromkeys(created), ignore_missing=True,
                             delete_snapshot=delete_snapshots)

    def report_sections(self) -> list[tuple[str, str]]:
        return self.gw.report_sections()


@contextlib.contextmanager
def sandbox_client(gw: Gateway, channel=None, delete_snapshots: bool = False) -> Iterator[SandboxClient]:
    """A SandboxClient for the `with` block; its sandboxes (and with
    `delete_snapshots` their stored snapshots) are deleted at the end."""
    client = SandboxClient(gw, channel)
    try:
        yield client
    finally:
        client.cleanup(delete_snapshots=delete_snapshots)

