"""Cross-checks of the C GCS store (gateway/gcs, through tests/gcs/gcs_cli)
with Google's official Node.js client (@google-cloud/storage, pinned in
tests/gcs/node/package.json), both talking to fake_gcs.py on loopback:
what one writes, the other reads back byte-identical, with each side's
CRC32C checks on.

Needs gcs_cli built (`bazel build //tests/gcs:gcs_cli`; GCS_CLI_BIN
overrides the path) and the Node client installed: the fixture runs
`npm ci` in tests/gcs/node when node_modules is missing, and fails (with
npm's reason) only when that cannot work.
"""

import json
import os
import shutil
import subprocess
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NODE_DIR = os.path.join(HERE, "node")
BUCKET = "crosscheck-bucket"
CHUNK = 256 * 1024
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")


@pytest.fixture(scope="session")
def node_client():
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node or npm is not installed")
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@google-cloud", "storage")):
        try:
            r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True,
                               text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail("npm ci in tests/gcs/node timed out")
        if r.returncode != 0:
            pytest.fail("npm ci in tests/gcs/node failed: " + (r.stderr or r.stdout)[-800:])
    return node


@pytest.fixture(scope="session")
def gcs_cli():
    path = os.environ.get("GCS_CLI_BIN") or os.path.join(REPO, "bazel-out", "k8-fastbuild", "bin", "tests", "gcs", "gcs_cli")
    if not os.access(path, os.X_OK):
        pytest.fail(f"gcs_cli not found at {path}: run `bazel build //tests/gcs:gcs_cli` (or set GCS_CLI_BIN)")
    return path


@pytest.fixture
def fake():
    """A fresh fake_gcs.py; yields its port."""
    proc = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "fake_gcs.py")], stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(proc.stdout.readline())
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def control(port, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return json.loads(resp.read())


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_HOST"):
        env.pop(k, None)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


def cli(gcs_cli, port, *args, stdin=None):
    # STORAGE_EMULATOR_HOST as host:port (no scheme), as Google's libraries accept it.
    env = clean_env(STORAGE_EMULATOR_HOST=f"127.0.0.1:{port}", CLOUD_RUN_SANDBOX_GCS_BUCKET=BUCKET)
    r = subprocess.run([gcs_cli, "--chunk-size", str(CHUNK), *args], input=stdin, capture_output=True, env=env,
                       timeout=120, check=False)
    assert r.returncode == 0, f"gcs_cli {' '.join(args)} failed: {r.stderr.decode(errors='replace')}"
    return r.stdout


def node_xfer(node, port, *args):
    r = subprocess.run([node, os.path.join(NODE_DIR, "xfer.js"), f"http://127.0.0.1:{port}", *args],
                       capture_output=True, text=True, env=clean_env(), timeout=120, check=False)
    assert r.returncode == 0, f"node xfer.js {' '.join(args)} failed: {r.stderr[-2000:]}"


def test_object_written_by_gcs_cli_reads_back_identical_with_node(node_client, gcs_cli, fake, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 12345)
    cli(gcs_cli, fake, "put", "sandbox-snapshots/from-c.tar", stdin=data)
    assert control(fake, "/_control/stats")["chunk_puts"] >= 13
    out = tmp_path / "from-c.tar"
    node_xfer(node_client, fake, "download", BUCKET, "sandbox-snapshots/from-c.tar", str(out))
    assert out.read_bytes() == data


def test_object_written_by_node_reads_back_identical_with_gcs_cli(node_client, gcs_cli, fake, tmp_path):
    data = os.urandom(2 * 1024 * 1024 + 777)
    src = tmp_path / "from-node.tar"
    src.write_bytes(data)
    node_xfer(node_client, fake, "upload", BUCKET, "sandbox-snapshots/from-node.tar", str(src), str(CHUNK))
    stats = control(fake, "/_control/stats")
    assert stats["uploads_finished"] == 1
    assert stats["chunk_puts"] >= 9  # a resumable upload in 256 KiB chunks
    assert cli(gcs_cli, fake, "get", "sandbox-snapshots/from-node.tar") == data


def test_object_gcs_cli_wrote_through_faults_reads_back_identical_with_node(node_client, gcs_cli, fake, tmp_path):
    control(fake, "/_control/fault", {"kind": "drop", "count": 1, "methods": ["PUT"], "path": "upload_id=",
                                      "fraction": 0.5})
    control(fake, "/_control/fault", {"kind": "status", "code": 503, "count": 2, "methods": ["PUT"]})
    data = os.urandom(1024 * 1024 + 3)
    cli(gcs_cli, fake, "put", "faulty.tar", stdin=data)
    assert control(fake, "/_control/stats")["faults_pending"] == 0
    out = tmp_path / "faulty.tar"
    node_xfer(node_client, fake, "download", BUCKET, "faulty.tar", str(out))
    assert out.read_bytes() == data


def test_empty_object_round_trips_between_the_clients(node_client, gcs_cli, fake, tmp_path):
    cli(gcs_cli, fake, "put", "empty.tar", stdin=b"")
    out = tmp_path / "empty.tar"
    node_xfer(node_client, fake, "download", BUCKET, "empty.tar", str(out))
    assert out.read_bytes() == b""
