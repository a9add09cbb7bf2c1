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
