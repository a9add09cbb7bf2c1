"""The file API: ReadFile, WriteFile, ListDir, Stat, Remove, Rename, MakeDir
work inside the sandbox, as a process there would — contents round-trip
byte for byte, replacement is atomic, errors carry clear statuses, the disk
quota leaves the old file intact, and no hostile path reaches the host."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.lib.client import pb, sandbox_client

MiB = 1 << 20


@pytest.fixture(scope="module")
def client(gateway):
    with sandbox_client(gateway) as c:
        yield c


@pytest.fixture(scope="module")
def sid(client):
    return client.launch().sandbox_id


def code_of(fn, *a, **kw) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn(*a, **kw)
    return e.value.code()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- round trips -------------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"x", bytes(range(256))], ids=["empty", "one-byte", "all-byte-values"])
def test_small_files_round_trip(client, sid, data):
    info = client.write_file(sid, f"/tmp/rt-{len(data)}", data)
    assert info.size == len(data) and info.type == pb.FILE_TYPE_FILE
    got, first = client.read_file(sid, f"/tmp/rt-{len(data)}")
    assert got == data
    assert first.size == len(data) and first.path == f"/tmp/rt-{len(data)}"
    # The sandbox's own processes see the same bytes.
    assert client.exec(sid, ["sha256sum", f"/tmp/rt-{len(data)}"]).out.split()[0] == sha(data)


def test_a_100_mib_file_round_trips(client, sid):
    data = os.urandom(100 * MiB)
    info = client.write_file(sid, "/root/big.bin", data, chunk=3 * MiB + 17)
    assert info.size == len(data)
    got, _ = client.read_file(sid, "/root/big.bin")
    assert sha(got) == sha(data)
    assert client.exec(sid, ["sha256sum", "/root/big.bin"]).out.split()[0] == sha(data)
    client.remove(sid, "/root/big.bin")


def test_relative_paths_are_taken_from_root(client, sid):
    client.write_file(sid, "rel.txt", b"relative")
    assert client.exec(sid, ["cat", "/root/rel.txt"]).out == "relative"
    assert client.stat(sid, "rel.txt").path == "/root/rel.txt"


def test_append_adds_to_the_end(client, sid):
    client.write_file(sid, "/tmp/app", b"one,")
    client.write_file(sid, "/tmp/app", b"two,", append=True)
    info = client.write_file(sid, "/tmp/app", b"three", append=True)
    assert info.size == len(b"one,two,three")
    assert client.read_file(sid, "/tmp/app")[0] == b"one,two,three"
    # Append makes a missing file.
    client.write_file(sid, "/tmp/app-new", b"fresh", append=True)
    assert client.read_file(sid, "/tmp/app-new")[0] == b"fresh"


def test_offset_and_length_read_a_window(client, sid):
    data = bytes(range(256)) * 4096  # 1 MiB
    client.write_file(sid, "/tmp/win", data)
    assert client.read_file(sid, "/tmp/win", offset=1000)[0] == data[1000:]
    assert client.read_file(sid, "/tmp/win", offset=1000, length=300000)[0] == data[1000:301000]
    assert client.read_file(sid, "/tmp/win", offset=len(data) + 5)[0] == b""
    assert client.read_file(sid, "/tmp/win", length=1)[0] == data[:1]


def test_make_parents_creates_missing_directories(client, sid):
    assert code_of(client.write_file, sid, "/tmp/a/b/c/f", b"x") == grpc.StatusCode.NOT_FOUND
    client.write_file(sid, "/tmp/a/b/c/f", b"deep", make_parents=True)
    assert client.exec(sid, ["cat", "/tmp/a/b/c/f"]).out == "deep"
    assert client.stat(sid, "/tmp/a/b").mode == 0o755


def test_modes_and_owners_are_as_seen_inside(client, sid):
    info = client.write_file(sid, "/tmp/modes", b"m", mode=0o600)
    assert info.mode == 0o600 and info.uid == 0 and info.gid == 0
    client.ok(sid, "chown 1234:2345 /tmp/modes && chmod 0640 /tmp/modes")
    st = client.stat(sid, "/tmp/modes")
    assert (st.uid, st.gid, st.mode) == (1234, 2345, 0o640)
    # A replacement keeps the owner and, without a mode, the mode.
    info = client.write_file(sid, "/tmp/modes", b"again")
    assert (info.uid, info.gid, info.mode) == (1234, 2345, 0o640)
    assert client.exec(sid, ["stat", "-c", "%u %g %a", "/tmp/modes"]).out.strip() == "1234 2345 640"
    # Image files look root-owned inside.
    st = client.stat(sid, "/etc/passwd")
    assert (st.uid, st.gid, st.type) == (0, 0, pb.FILE_TYPE_FILE)


def test_atomic_replace_never_shows_a_torn_file(client, sid):
    a, b = b"a" * (4 * MiB), b"b" * (4 * MiB)
    client.write_file(sid, "/tmp/atomic", a)
    seen: list[str] = []

    def reader():
        r = client.sh(sid, "for i in $(seq 300); do sha256sum /tmp/atomic | cut -c1-64; done", timeout_seconds=120)
        seen.extend(r.out.split())

    t = threading.Thread(target=reader)
    t.start()
    while t.is_alive():
        client.write_file(sid, "/tmp/atomic", b, chunk=64 * 1024)
        client.write_file(sid, "/tmp/atomic", a, chunk=64 * 1024)
    t.join()
    assert len(seen) == 300
    assert set(seen) <= {sha(a), sha(b)}, set(seen) - {sha(a), sha(b)}
    # No temporary file is left behind.
    assert client.exec(sid, ["ls", "-A", "/tmp"]).out.count("sbx-tmp") == 0


def test_stat_list_mkdir_rename_remove(client, sid):
    client.mkdir(sid, "/tmp/tree/sub/deeper", parents=True)
    client.write_file(sid, "/tmp/tree/b.txt", b"bb")
    client.write_file(sid, "/tmp/tree/a.txt", b"a")
    client.write_file(sid, "/tmp/tree/sub/c.txt", b"ccc")
    client.ok(sid, "ln -s a.txt /tmp/tree/link")
    names = [e.name for e in client.list_dir(sid, "/tmp/tree")]
    assert names == ["a.txt", "b.txt", "link", "sub"]
    link = [e for e in client.list_dir(sid, "/tmp/tree") if e.name == "link"][0]
    assert link.symlink_target == "a.txt" and link.type == 3
    deep = [e.path for e in client.list_dir(sid, "/tmp/tree", depth=3)]
    assert deep == ["/tmp/tree/a.txt", "/tmp/tree/b.txt", "/tmp/tree/link", "/tmp/tree/sub",
                    "/tmp/tree/sub/c.txt", "/tmp/tree/sub/deeper"]
    st = client.stat(sid, "/tmp/tree/sub/c.txt")
    assert (st.name, st.size, st.type) == ("c.txt", 3, 1)
    made = client.mkdir(sid, "/tmp/tree/m", mode=0o700)
    assert made.type == 2 and made.mode == 0o700
    moved = client.rename(sid, "/tmp/tree/a.txt", "/tmp/tree/z.txt")
    assert moved.path == "/tmp/tree/z.txt" and moved.size == 1
    client.rename(sid, "/tmp/tree/z.txt", "/tmp/tree/b.txt", overwrite=True)
    assert client.read_file(sid, "/tmp/tree/b.txt")[0] == b"a"
    client.remove(sid, "/tmp/tree/b.txt")
    client.remove(sid, "/tmp/tree/m")
    client.remove(sid, "/tmp/tree", recursive=True)
    assert code_of(client.stat, sid, "/tmp/tree") == grpc.StatusCode.NOT_FOUND


# --- errors ------------------------------------------------------------------

def test_error_statuses(client, sid):
    C = grpc.StatusCode
    client.mkdir(sid, "/tmp/err/full", parents=True)
    client.write_file(sid, "/tmp/err/full/f", b"f")
    cases = [
        (client.read_file, (sid, "/tmp/err/missing"), C.NOT_FOUND),
        (client.stat, (sid, "/tmp/err/missing"), C.NOT_FOUND),
        (client.remove, (sid, "/tmp/err/missing"), C.NOT_FOUND),
        (client.read_file, ("no-such-sandbox", "/etc/hostname"), C.NOT_FOUND),
        (client.mkdir, (sid, "/tmp/err/full"), C.ALREADY_EXISTS),
        (client.rename, (sid, "/tmp/err/full/f", "/tmp/err/full"), C.ALREADY_EXISTS),
        (client.read_file, (sid, "/tmp/err"), C.FAILED_PRECONDITION),
        (client.write_file, (sid, "/tmp/err", b"x"), C.FAILED_PRECONDITION),
        (client.list_dir, (sid, "/tmp/err/full/f"), C.FAILED_PRECONDITION),
        (client.write_file, (sid, "/tmp/err/full/f/x", b"x"), C.FAILED_PRECONDITION),
        (client.remove, (sid, "/tmp/err/full"), C.FAILED_PRECONDITION),
        (client.read_file, (sid, "/proc/1/environ"), C.PERMISSION_DENIED),
        (client.write_file, (sid, "/proc/sys/kernel/hostname", b"x"), C.PERMISSION_DENIED),
        (client.read_file, (sid, ""), C.INVALID_ARGUMENT),
        (client.write_file, (sid, "", b"x"), C.INVALID_ARGUMENT),
        (client.stat, (sid, "/etc/pass\0wd"), C.INVALID_ARGUMENT),
        (client.write_file, (sid, "/tmp/nul\0x", b"x"), C.INVALID_ARGUMENT),
        (client.rename, (sid, "/tmp/err/full/f", ""), C.INVALID_ARGUMENT),
        (client.list_dir, (sid, "/tmp", 1000), C.INVALID_ARGUMENT),
    ]
    for fn, args, want in cases:
        assert code_of(fn, *args) == want, (fn.__name__, args, want)
    # Nothing was written under a truncated name.
    assert code_of(client.stat, sid, "/tmp/nul") == C.NOT_FOUND


def test_the_disk_quota_keeps_the_old_file_and_leaves_no_temporary(gateways, gateway_secret):
    gw = gateways.gateway(env={"SANDBOX_DISK_MB": "24"}, secret=gateway_secret)
    with sandbox_client(gw) as c:
        sid = c.launch().sandbox_id
        old = os.urandom(8 * MiB)
        c.write_file(sid, "/root/q/keep.bin", old, make_parents=True)
        with pytest.raises(grpc.RpcError) as e:
            c.write_file(sid, "/root/q/keep.bin", os.urandom(32 * MiB))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        assert sha(c.read_file(sid, "/root/q/keep.bin")[0]) == sha(old)
        assert c.exec(sid, ["ls", "-A", "/root/q"]).out.split() == ["keep.bin"]
        # The space is back: a file that fits is written.
        c.write_file(sid, "/root/q/fits.bin", os.urandom(8 * MiB))


# --- hostile paths -------------------------------------------------------------

@pytest.fixture
def decoy(gateway):
    """A host directory with a file no sandbox may read or change: in the
    gateway's state directory (beside the sandboxes' disks), which the image
    sandboxes see (the host's own root here) masks."""
    path = Path(f"{gateway.state_dir}/sgw-files-decoy-{secrets.token_hex(6)}")
    path.mkdir()
    (path / "secret").write_bytes(b"host secret")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def host_untouched(decoy: Path) -> None:
    assert sorted(p.name for p in decoy.iterdir()) == ["secret"]
    assert (decoy / "secret").read_bytes() == b"host secret"


def test_hostile_paths_never_reach_the_host(client, sid, decoy):
    secret = f"{decoy}/secret"
    # The sandbox's own processes do not see it either.
    assert client.exec(sid, ["cat", secret]).code != 0
    client.ok(sid, f"mkdir -p /root/h && ln -sfn /proc/1/root{decoy} /root/h/via-proc1 "
                   f"&& ln -sfn /proc/self/root/../../..{decoy} /root/h/via-self")
    reads = ["../../../../.." + secret, f"/proc/1/root{secret}", f"/proc/self/root/../..{secret}",
             "/root/h/via-proc1/secret", "/root/h/via-self/secret", f"/proc/1/cwd/../../..{secret}"]
    for p in reads:
        try:
            data, _ = client.read_file(sid, p)
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED), (p, e.details())
        else:
            pytest.fail(f"{p} read {data!r}")
    for p in reads:
        try:
            client.write_file(sid, p, b"planted", make_parents=True)
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.FAILED_PRECONDITION), (p, e.details())
    host_untouched(decoy)
    # ../../etc/passwd is the sandbox's own /etc/passwd.
    data, info = client.read_file(sid, "../../etc/passwd")
    assert b"root:" in data and info.path == "/root/../../etc/passwd"
    probe = f"/etc/sgw-files-probe-{secrets.token_hex(4)}"
    client.write_file(sid, "../.." + probe, b"inside")
    assert not os.path.exists(probe)
    assert client.exec(sid, ["cat", probe]).out == "inside"


def test_a_symlink_swapped_during_writes_stays_inside(client, sid, decoy):
    client.ok(sid, f"mkdir -p /root/race/real && ln -sfn /root/race/real /root/race/dir")
    stop = threading.Event()

    def swapper():
        client.sh(sid, f"for i in $(seq 2000); do ln -sfn /proc/1/root{decoy} /root/race/dir; "
                       "ln -sfn /root/race/real /root/race/dir; done", timeout_seconds=120)
        stop.set()

    t = threading.Thread(target=swapper)
    t.start()
    n = 0
    while not stop.is_set() and n < 400:
        n += 1
        for p in ("/root/race/dir/secret", "/root/race/dir/new"):
            try:
                client.write_file(sid, p, b"raced")
                client.read_file(sid, p)
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                                    grpc.StatusCode.PERMISSION_DENIED), e.details()
    t.join()
    host_untouched(decoy)


def test_a_cancelled_write_leaves_no_temporary_and_the_old_file(client, sid):
    client.write_file(sid, "/tmp/cancel", b"old")
    gate = threading.Event()

    def pieces():
        yield b"x" * MiB
        gate.wait(10)

    call = client.stub.WriteFile.future(_requests(sid, "/tmp/cancel", pieces()), metadata=client.md, timeout=30)
    time.sleep(0.5)
    call.cancel()
    gate.set()
    time.sleep(0.5)
    assert client.read_file(sid, "/tmp/cancel")[0] == b"old"
    assert "sbx-tmp" not in client.exec(sid, ["ls", "-A", "/tmp"]).out


def _requests(sid, path, pieces):
    yield pb.WriteFileRequest(header=pb.WriteFileHeader(sandbox_id=sid, path=path))
    for p in pieces:
        yield pb.WriteFileRequest(data=p)


def test_files_work_while_a_command_runs_and_with_egress(client):
    sid = client.launch(allow_egress=True).sandbox_id
    call = client.exec_call(sid, ["sleep", "30"])
    try:
        client.write_file(sid, "/tmp/busy", b"ok")
        assert client.read_file(sid, "/tmp/busy")[0] == b"ok"
    finally:
        call.cancel()
        client.delete(sid)


def test_a_gigabyte_moves_both_ways_with_flat_gateway_memory(client, sid, gateway):
    """Streams are bounded chunks with flow control both ways: 1 GiB written
    and read back (the reader pausing now and then) moves through a gateway
    whose resident memory stays within a small bound of where it started."""
    from tests.lib.procs import vm_rss_kib
    size, piece = 1024 * MiB, os.urandom(MiB)
    base = vm_rss_kib(gateway.pid)
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], vm_rss_kib(gateway.pid))
            time.sleep(0.02)

    t = threading.Thread(target=sample)
    t.start()
    try:
        info = client.write_file(sid, "/root/gig.bin", (piece for _ in range(size // MiB)))
        assert info.size == size
        h, got = hashlib.sha256(), 0
        for i, chunk in enumerate(client.read_file_chunks(sid, "/root/gig.bin")):
            h.update(chunk.data)
            got += len(chunk.data)
            if i % 256 == 255:
                time.sleep(0.2)  # a slow reader: the gateway must wait, not buffer
        assert got == size
        want = hashlib.sha256()
        for _ in range(size // MiB):
            want.update(piece)
        assert h.hexdigest() == want.hexdigest()
    finally:
        done.set()
        t.join()
        client.remove(sid, "/root/gig.bin")
    assert peak[0] - base < 96 * 1024, (base, peak[0])


def test_files_in_a_volume_and_links_planted_in_it_stay_inside(gateway_secret):
    """A volume's files are reached as the sandbox sees them: written and
    read through /data; a link planted in the volume on the host, pointing
    at a host file outside it, resolves inside the sandbox (where that path
    is masked, or the sandbox's own), so the host file is never read or
    changed through the file API."""
    from tests.lib.gateway import gateway_client
    src = Path(f"/tmp/sgw-files-volume-{secrets.token_hex(6)}")
    src.mkdir()
    src.chmod(0o1777)  # a sandbox writes a volume as its own host ids
    try:
        with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{src}:/data"}, secret=gateway_secret) as c:
            outside = Path(c.gw.state_dir) / f"sgw-files-outside-{secrets.token_hex(6)}"
            outside.write_bytes(b"host secret")
            (src / "escape").symlink_to(outside)
            sid = c.launch().sandbox_id
            info = c.write_file(sid, "/data/made.txt", b"from the file API")
            assert info.size == 17
            assert (src / "made.txt").read_bytes() == b"from the file API"  # a volume is the host directory
            got, _ = c.read_file(sid, "/data/made.txt")
            assert got == b"from the file API"
            code = None
            try:
                got, _ = c.read_file(sid, "/data/escape")
            except grpc.RpcError as e:
                code = e.code()
            assert code is not None or got != b"host secret"
            try:
                c.write_file(sid, "/data/escape", b"overwritten")
            except grpc.RpcError:
                pass
            assert outside.read_bytes() == b"host secret"
            outside.unlink()
    finally:
        shutil.rmtree(src, ignore_errors=True)
