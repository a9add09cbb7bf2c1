"""Host volumes (SANDBOX_VOLUME_MOUNTS) attacked from inside a sandbox.

A volume is a host directory: whatever a sandbox leaves there is a host
file. These tests are the attacks: set-id binaries and file capabilities
planted for host users to run, chown to host ids, a symlink planted where a
nested volume's host path was, a volume overlapping the gateway's own
state. Each asserts what the host sees, from the host's side.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import struct
from pathlib import Path

import grpc
import pytest

from tests.lib.gateway import gateway_client, gateway_env
from tests.lib.procs import require_gateway_binary, run_to_completion
from tests.lib.security import sh

RANGE = 65536
# An unprivileged host id for the owner mapping, below every uid block.
OWNER = 4242




def sandbox_base(sbx, sid: str) -> int:
    inside, outside, count = (int(x) for x in sbx.sh_out(sid, "cat /proc/self/uid_map").split())
    assert (inside, count) == (0, RANGE)
    return outside


def capability_rootid(path: Path):
    """The file capability xattr of `path` on the host: None, or (version,
    rootid) where v2 has no rootid (it is host root's: effective on the
    host)."""
    try:
        raw = os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError:
        return None
    magic = struct.unpack_from("<I", raw)[0] & 0xFF000000
    if magic == 0x03000000:
        return 3, struct.unpack_from("<I", raw, 20)[0]
    return magic >> 24, 0


def assert_host_safe(path: Path, base: int) -> None:
    st = path.lstat()
    assert st.st_uid != 0 and st.st_gid != 0, (path, st.st_uid, st.st_gid)
    assert base <= st.st_uid < base + RANGE, (path, st.st_uid, base)
    assert base <= st.st_gid < base + RANGE, (path, st.st_gid, base)
    assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), (path, oct(st.st_mode))
    cap = capability_rootid(path)
    assert cap is None or (cap[0] == 3 and cap[1] != 0), (path, cap)


SETID_ATTACK = r"""
cp /usr/bin/id /shared/id
chmod 6755 /shared/id; echo "chmod=$?"
chmod u+s /shared/id; echo "chmod-u=$?"
chmod g+s /shared/id; echo "chmod-g=$?"
install -m 4755 /usr/bin/id /shared/installed; echo "install=$?"
python3 - <<'EOF'
import os
for name, mode in (("open", 0o4755), ("open-g", 0o2755)):
    try:
        fd = os.open("/shared/" + name, os.O_CREAT | os.O_WRONLY, mode)
        os.close(fd)
        print(name, "made")
    except OSError as e:
        print(name, e.errno)
try:
    os.mknod("/shared/node", 0o104755)
    print("mknod made")
except OSError as e:
    print("mknod", e.errno)
os.mkdir("/shared/dir")
try:
    os.chmod("/shared/dir", 0o2775)
    print("dir made")
except OSError as e:
    print("dir", e.errno)
EOF
cp /bin/cat /shared/cat
python3 -c 'import os; os.setxattr("/shared/cat", "security.capability", bytes.fromhex("010000020400000000000000000000000000"))'
echo "setcap=$?"
touch /shared/chowned; chown 42:42 /shared/chowned; echo "chown=$?"
chown 0:0 /shared/id; echo "chown0=$?"
"""


def test_what_a_sandbox_writes_in_a_volume_is_never_host_root_or_set_id(shared, gateway_secret):
    """The attack: sandbox root plants a setuid/setgid copy of `id`, a
    `cat` with a file capability, and files chowned to low ids, by every
    call that sets a mode. On the host every file there is owned inside the
    sandbox's own range, carries no set-id bit and no capability effective
    in the host's namespace."""
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared"}, secret=gateway_secret) as sbx:
        sid = sbx.launch().sandbox_id
        base = sandbox_base(sbx, sid)
        out = sbx.sh_out(sid, SETID_ATTACK)
        assert "chmod=1" in out and "chmod-u=1" in out and "chmod-g=1" in out, out
        assert "open made" not in out and "open-g made" not in out and "mknod made" not in out, out
        assert (shared / "id").exists() and (shared / "cat").exists(), out
        for f in shared.rglob("*"):
            assert_host_safe(f, base)
        # chown inside the range lands inside it on the host.
        assert (shared / "chowned").stat().st_uid == base + 42, out
        # The sandbox still works with its files there.
        assert sbx.sh_out(sid, "echo hi > /shared/plain; cat /shared/plain; stat -c %u /shared/plain") == "hi\n0\n"


def test_host_root_files_in_a_volume_are_nobody_s_inside(shared, gateway_secret):
    """Without an owner a volume is not idmapped: host root's files are
    not root's inside, so sandbox root cannot change them."""
    (shared / "by-root").write_text("host")
    (shared / "by-root").chmod(0o644)
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared"}, secret=gateway_secret) as sbx:
        sid = sbx.launch().sandbox_id
        r = sh(sbx, sid, "stat -c %u /shared/by-root; echo x >> /shared/by-root; echo rc=$?; "
                         "chmod 666 /shared/by-root; echo chmod=$?")
        assert r.out.splitlines()[0] == "65534", r.describe()
        assert "rc=0" not in r.out and "chmod=1" in r.out, r.describe()
    assert (shared / "by-root").read_text() == "host"
    assert stat.S_IMODE((shared / "by-root").stat().st_mode) == 0o644


def test_an_owned_volume_is_shared_by_sandboxes_of_different_ranges(gateway_secret):
    """`:uid=N`: every sandbox's root is host id N there, so two sandboxes
    (different ranges) read and write each other's files, and the host
    sees N, never root, never a sandbox's range; still no set-id bit."""
    vol = Path(f"/tmp/sgw-owned-{secrets.token_hex(6)}")
    vol.mkdir(mode=0o755)
    os.chown(vol, OWNER, OWNER)
    try:
        env = {"SANDBOX_VOLUME_MOUNTS": f"{vol}:/shared:uid={OWNER}"}
        with gateway_client(env, secret=gateway_secret) as sbx:
            a, b = sbx.launch().sandbox_id, sbx.launch().sandbox_id
            assert sandbox_base(sbx, a) != sandbox_base(sbx, b)
            assert sbx.sh_out(a, "echo one > /shared/f; chmod 600 /shared/f; stat -c %u:%g /shared") == "0:0\n"
            assert sbx.sh_out(b, "echo two >> /shared/f; cat /shared/f") == "one\ntwo\n"
            r = sh(sbx, b, "cp /usr/bin/id /shared/id; chmod 4755 /shared/id; echo chmod=$?; "
                           "chown 1000 /shared/f; echo chown=$?")
            assert "chmod=1" in r.out and "chown=1" in r.out, r.describe()
        for f in vol.rglob("*"):
            st = f.lstat()
            assert (st.st_uid, st.st_gid) == (OWNER, OWNER), (f, st.st_uid, st.st_gid)
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), (f, oct(st.st_mode))
    finally:
        shutil.rmtree(vol, ignore_errors=True)


def refused_at_start(env: dict, *names: str) -> str:
    full = gateway_env(env, secret="s")
    try:
        result = run_to_completion([require_gateway_binary()], full, timeout=30)
    finally:
        shutil.rmtree(full["SANDBOX_STATE_DIR"], ignore_errors=True)
    assert result.returncode != 0, result.stderr
    for name in names:
        assert name in result.stderr, result.stderr
    return result.stderr


def test_nested_volumes_are_refused_at_start(shared):
    """Sandbox 1 could replace the inner volume's host path (inside the
    outer one) with a symlink to /etc; so the layout is refused."""
    (shared / "tools").mkdir()
    err = refused_at_start({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared,{shared}/tools:/tools"},
                           "SANDBOX_VOLUME_MOUNTS", "nested")
    assert str(shared / "tools") in err
    refused_at_start({"SANDBOX_VOLUME_MOUNTS": f"{shared}/tools:/tools,{shared}:/shared"}, "nested")


def test_a_volume_path_replaced_by_a_symlink_is_never_followed(shared, gateway_secret):
    """The host path is opened once, at start: after it is renamed away
    and a symlink to /etc put in its place (what a sandbox did through an
    outer volume), later sandboxes still get the directory the gateway
    opened, never /etc."""
    vol = shared / "data"
    vol.mkdir(mode=0o1777)
    (vol / "marker").write_text("the volume")
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{vol}:/data"}, secret=gateway_secret) as sbx:
        first = sbx.launch().sandbox_id
        assert sbx.sh_out(first, "cat /data/marker") == "the volume"
        vol.rename(shared / "moved")
        vol.symlink_to("/etc")
        second = sbx.launch().sandbox_id
        assert sbx.sh_out(second, "cat /data/marker; test -e /data/shadow && echo SHADOW || true") == "the volume"


def test_a_volume_deleted_on_the_host_fails_only_that_launch_clearly(shared, gateway_secret):
    vol = shared / "gone"
    vol.mkdir()
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{vol}:/gone"}, secret=gateway_secret) as sbx:
        assert sbx.sh_out(sbx.launch().sandbox_id, "echo ok") == "ok\n"
        vol.rmdir()
        try:
            sid = sbx.launch().sandbox_id
        except grpc.RpcError as e:
            assert "gone" in e.details(), e.details()
        else:
            # The kernel may still bind a deleted directory: then it is empty
            # and unlinked, never something else.
            assert sbx.sh_out(sid, "ls -A /gone | wc -l") == "0\n"


@pytest.mark.parametrize("variable", ["SANDBOX_STATE_DIR", "SANDBOX_SNAPSHOT_DIR"])
def test_a_volume_over_the_gateway_s_own_paths_is_refused(shared, variable):
    """The masks cover the state and snapshot directories by their path in
    the image only: through a volume holding them a sandbox would see them.
    Refused at start, naming both variables."""
    inner = shared / "inner"
    refused_at_start({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared", variable: str(inner)},
                     "SANDBOX_VOLUME_MOUNTS", variable)
    # The other way round: a volume inside the state directory.
    if variable == "SANDBOX_STATE_DIR":
        (shared / "sub").mkdir()
        refused_at_start({"SANDBOX_VOLUME_MOUNTS": f"{shared}/sub:/sub", variable: str(shared)},
                         "SANDBOX_VOLUME_MOUNTS", variable)


@pytest.mark.parametrize("option", ["uid=0", "uid=0:gid=5", "uid=5:gid=0", "uid=-1", "uid=x", "gid=5"])
def test_a_volume_owned_by_host_root_or_malformed_is_refused(shared, option):
    refused_at_start({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared:{option}"}, "SANDBOX_VOLUME_MOUNTS")


def test_a_volume_owner_inside_the_sandboxes_id_block_is_refused(shared):
    base = int(gateway_env(secret="s")["SANDBOX_UID_BASE"])
    refused_at_start({"SANDBOX_UID_BASE": str(base), "SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared:uid={base + 70000}"},
                     "SANDBOX_VOLUME_MOUNTS", "SANDBOX_UID_BASE")


SETID_ELSEWHERE = ("cp /usr/bin/id /tmp/id; chmod 4755 /tmp/id; echo $?; chmod 755 /tmp/id; echo $?; "
                   "mkdir /tmp/d; chmod 1777 /tmp/d; echo $?; stat -c %a /tmp/id /tmp/d")


def test_with_a_writable_volume_no_call_makes_a_set_id_file_anywhere(shared, gateway_secret):
    """seccomp sees no paths: with a writable volume the rule holds in the
    whole sandbox (set-id bits are dead inside anyway); ordinary modes
    still work. Without one, or with read-only volumes only, set-id files
    in the sandbox's own layer are allowed (package installers make them)."""
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared"}, secret=gateway_secret) as sbx:
        out = sbx.sh_out(sbx.launch().sandbox_id, SETID_ELSEWHERE)
        assert out == "1\n0\n0\n755\n1777\n", out
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared:ro"}, secret=gateway_secret) as sbx:
        out = sbx.sh_out(sbx.launch().sandbox_id, SETID_ELSEWHERE)
        assert out == "0\n0\n0\n755\n1777\n", out
