"""scripts/run-local.sh checks that it runs as root before it installs or
builds anything, and installs only what running needs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run-local.sh"


def test_run_local_refuses_a_non_root_user_before_installing_anything(tmp_path):
    # A fake install-deps on PATH would not be reached anyway: the script
    # calls its own; what matters is that it stops before it.
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(SCRIPT)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "run this as root" in r.stderr
    assert "install-deps" not in r.stdout + r.stderr
    assert "bazel" not in r.stdout + r.stderr.replace("run-local", "")


def test_run_local_installs_only_what_running_needs():
    text = SCRIPT.read_text()
    assert "scripts/install-deps.sh --run" in text
    assert text.index("id -u") < text.index("install-deps.sh")
    listing = subprocess.run(["bash", "-c", f'source <(sed -n "/^RUN_PACKAGES=(/,/^)/p" {ROOT}/scripts/install-deps.sh);'
                              ' echo "${RUN_PACKAGES[@]}"'], capture_output=True, text=True, check=True).stdout.split()
    for tool in ["nodejs", "npm", "crun", "debootstrap", "umoci", "skopeo", "clang", "chromium", "python3-pytest"]:
        assert tool not in listing, tool
    assert "libgrpc-dev" in listing and "slirp4netns" in listing


LOCAL_ROOTFS = ROOT / "scripts" / "local-rootfs.sh"


def rootfs_choice(env: dict) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(["bash", str(LOCAL_ROOTFS)], capture_output=True, text=True, timeout=600,
                          env={**base, **env})


def test_run_local_shows_sandboxes_the_host_root_only_when_asked_by_name():
    r = rootfs_choice({"SANDBOX_LOCAL_ROOTFS": "host-root-exposes-host-files"})
    assert r.returncode == 0 and r.stdout == "/\n"
    assert "WARNING" in r.stderr and "snapshots" in r.stderr and "mTLS" in r.stderr
    r = rootfs_choice({"SANDBOX_LOCAL_ROOTFS": "yes"})
    assert r.returncode == 2 and r.stdout == ""
    r = rootfs_choice({"SANDBOX_ROOTFS": "/srv/image"})
    assert r.returncode == 0 and r.stdout == "/srv/image\n"
    assert "SANDBOX_ROOTFS" in SCRIPT.read_text() and "local-rootfs.sh" in SCRIPT.read_text()


def test_run_local_defaults_to_the_prepared_debian_base():
    r = rootfs_choice({})
    assert r.returncode == 0, r.stderr
    root = r.stdout.strip()
    assert root != "/" and os.path.isdir(os.path.join(root, "etc")) and "sandbox-gateway" in root
    # Nothing of this host's own state there.
    assert not os.path.exists(os.path.join(root, "var", "lib", "sandbox-gateway"))
