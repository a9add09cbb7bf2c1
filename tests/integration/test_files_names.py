"""Names that are not valid UTF-8: a sandbox names its files with any bytes
but NUL and `/`, and a proto3 `string` must hold UTF-8. Every answer still
decodes for protobuf clients (the string holds the name with U+FFFD for each
invalid byte), the exact bytes come in the `*_bytes` twin, and requests name
such a path back with `path_bytes`."""

from __future__ import annotations

import threading

import grpc
import pytest

from tests.integration.test_runtime_processes import processes
from tests.lib.client import pb, sandbox_client

MAKE = r"""
import os
os.makedirs(b"/tmp/nm/dir\xfe", exist_ok=True)
with open(b"/tmp/nm/bad\xff", "wb") as f:
    f.write(b"contents of a badly named file")
with open(b"/tmp/nm/good-\xc3\xa9", "wb") as f:
    f.write(b"ok")
os.symlink(b"target-\xc0\x80", b"/tmp/nm/link\xed\xa0\x80")
"""


@pytest.fixture(scope="module")
def client(gateway):
    with sandbox_client(gateway) as c:
        yield c


@pytest.fixture(scope="module")
def sid(client):
    sid = client.launch().sandbox_id
    res = client.py(sid, MAKE)
    assert res.code == 0, res.describe()
    return sid


def exact(text: str, raw: bytes) -> bytes:
    """What a client does: the bytes twin when set, else the string."""
    return raw or text.encode()


def test_a_listing_with_names_that_are_not_utf8_decodes_and_keeps_the_bytes(client, sid):
    entries = client.list_dir(sid, "/tmp/nm")
    by_name = {exact(e.name, e.name_bytes): e for e in entries}
    assert sorted(by_name) == [b"bad\xff", b"dir\xfe", b"good-\xc3\xa9", b"link\xed\xa0\x80"], sorted(by_name)
    bad = by_name[b"bad\xff"]
    assert bad.name == "bad\ufffd" and bad.path == "/tmp/nm/bad\ufffd"
    assert bad.path_bytes == b"/tmp/nm/bad\xff" and bad.type == pb.FILE_TYPE_FILE
    # Valid UTF-8 travels as the string alone.
    good = by_name[b"good-\xc3\xa9"]
    assert good.name == "good-\u00e9" and good.name_bytes == b"" and good.path_bytes == b""
    # An overlong form and a surrogate are not UTF-8 either.
    link = by_name[b"link\xed\xa0\x80"]
    assert link.name == "link\ufffd\ufffd\ufffd" and link.type == pb.FILE_TYPE_SYMLINK
    assert link.symlink_target == "target-\ufffd\ufffd" and link.symlink_target_bytes == b"target-\xc0\x80"
    # Below a directory so named, too.
    deep = [exact(e.path, e.path_bytes) for e in client.list_dir(sid, "/tmp/nm", depth=2)]
    assert b"/tmp/nm/dir\xfe" in deep


def test_such_a_name_is_named_back_with_path_bytes(client, sid):
    md = client.md
    info = client.stub.Stat(pb.StatRequest(sandbox_id=sid, path_bytes=b"/tmp/nm/bad\xff"), metadata=md, timeout=30)
    assert info.path_bytes == b"/tmp/nm/bad\xff" and info.size == len(b"contents of a badly named file")
    chunks = list(client.stub.ReadFile(pb.ReadFileRequest(sandbox_id=sid, path_bytes=b"/tmp/nm/bad\xff"),
                                       metadata=md, timeout=30))
    assert b"".join(c.data for c in chunks) == b"contents of a badly named file"
    # The string form names another file (U+FFFD is a name of its own).
    with pytest.raises(grpc.RpcError) as e:
        client.stat(sid, "/tmp/nm/bad\ufffd")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # Write, rename, list and remove by bytes.
    hdr = pb.WriteFileHeader(sandbox_id=sid, path_bytes=b"/tmp/nm/dir\xfe/new\x80")
    client.stub.WriteFile(iter([pb.WriteFileRequest(header=hdr), pb.WriteFileRequest(data=b"x")]),
                          metadata=md, timeout=30)
    moved = client.stub.Rename(pb.RenameRequest(sandbox_id=sid, from_bytes=b"/tmp/nm/dir\xfe/new\x80",
                                                to_bytes=b"/tmp/nm/dir\xfe/moved\x81"), metadata=md, timeout=30)
    assert moved.path_bytes == b"/tmp/nm/dir\xfe/moved\x81"
    listed = client.stub.ListDir(pb.ListDirRequest(sandbox_id=sid, path_bytes=b"/tmp/nm/dir\xfe"),
                                 metadata=md, timeout=30).entries
    assert [e.name_bytes for e in listed] == [b"moved\x81"]
    client.stub.Remove(pb.RemoveRequest(sandbox_id=sid, path_bytes=b"/tmp/nm/dir\xfe/moved\x81"),
                       metadata=md, timeout=30)
    # A NUL byte is refused as in a string.
    with pytest.raises(grpc.RpcError) as e:
        client.stub.Stat(pb.StatRequest(sandbox_id=sid, path_bytes=b"/tmp/a\0b"), metadata=md, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_events_for_such_names_decode(client, sid):
    call = client.watch(sid, "/tmp/nm")
    got = []

    def read():
        for ev in call:
            got.append(ev)
            if ev.kind == pb.FileEvent.KIND_CREATED:
                return

    t = threading.Thread(target=read)
    t.start()
    try:
        for _ in range(100):  # until the watch is in place
            if got:
                break
            threading.Event().wait(0.05)
        client.py(sid, 'open(b"/tmp/nm/ev\\xfd", "w").close()')
        t.join(30)
    finally:
        call.cancel()
    created = [e for e in got if e.kind == pb.FileEvent.KIND_CREATED]
    assert created and created[0].path_bytes == b"/tmp/nm/ev\xfd" and created[0].path == "/tmp/nm/ev\ufffd", got


def test_a_process_whose_argv_is_not_utf8_is_still_listed(client, sid):
    # A conforming client cannot put such bytes in a string: send the
    # message hand-made (same length as the placeholder it replaces).
    start = pb.ProcessInput(start=pb.ProcessStart(sandbox_id=sid, argv=["sh", "-c", "sleep 30", "ZZZZ"], detach=True,
                                                  process_id="badargv"))
    raw = start.SerializeToString().replace(b"ZZZZ", b"\xff\xfe#x")
    run = client.channel.stream_stream("/sandbox.v1.Sandbox/Run", request_serializer=lambda m: m,
                                       response_deserializer=pb.ProcessEvent.FromString)
    call = run(iter([raw]), metadata=client.md, timeout=30)
    first = next(call)
    assert first.started.argv_bytes == [b"sh", b"-c", b"sleep 30", b"\xff\xfe#x"], first
    call.cancel()
    info = processes(client, sid)["badargv"]
    assert list(info.argv) == ["sh", "-c", "sleep 30", "\ufffd\ufffd#x"] and info.argv_bytes[3] == b"\xff\xfe#x"
    client.stub.SignalProcess(pb.SignalProcessRequest(sandbox_id=sid, process_id="badargv", signal=9),
                              metadata=client.md, timeout=30)
