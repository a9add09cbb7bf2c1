"""The container image, run the way a platform runs it.

`bazel build //deploy:image` must have run (scripts/test.sh does it). The
image layout bazel-bin/deploy/image (or $SANDBOX_IMAGE_DIR) is unpacked
into an OCI runtime bundle with `umoci unpack`, its config.json is edited
the way deploy/kubernetes asks a cluster to run it, and `crun` runs it as
root:

- capabilities: exactly MINIMAL_CAPS (docs/deploy.md says why each is
  needed; SANDBOX_DEPLOY_TEST_CAPS=CAP_A,CAP_B overrides, to find the
  minimal set again), no seccomp profile, no AppArmor profile;
- the host's network namespace (the shim and the gateway listen on free
  loopback ports of this machine);
- a writable cgroup hierarchy: /sys/fs/cgroup of the host bound in, the
  gateway's group named uniquely per run (removed afterwards);
- crun's own cgroup handling off (`--cgroup-manager=disabled`): crun
  rejects this machine's hybrid v1/v2 layout, and the container needs no
  limits of its own here.

Then, from the host over loopback: /health, the agent-turn cycle through the
shim (numpy in the image), grpc.health.v1.Health/Check on the gateway's
port, the shared libraries seen from inside, SIGTERM (clean exit 0), a
container without the secret (refuses to start), and one whose shim dies
(the container exits non-zero). Every container is killed and deleted, and
every bundle, crun state directory and cgroup removed, on failure too.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.lib.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
# bazel-out/k8-fastbuild, not bazel-bin: bazel-bin follows the last --config
# (scripts/test.sh also builds under --config=asan).
IMAGE_DIR = Path(os.environ.get("SANDBOX_IMAGE_DIR", ROOT / "bazel-out" / "k8-fastbuild" / "bin" / "deploy" / "image"))
IMAGE_TAG = os.environ.get("SANDBOX_IMAGE_TAG", "latest")

# The capabilities the container gets, found by removing each in turn from
# Docker's default set without CAP_NET_RAW, plus CAP_SYS_ADMIN and CAP_NET_ADMIN: without any one
# of these a step of this test fails (see docs/deploy.md for why). Not
# needed: CAP_MKNOD (overlay whiteouts are 0/0 character devices, which
# Linux >= 5.8 lets anyone create) and CAP_AUDIT_WRITE.
MINIMAL_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_ADMIN",
    "CAP_SYS_CHROOT",
]

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _caps() -> list[str]:
    override = os.environ.get("SANDBOX_DEPLOY_TEST_CAPS")
    if override is not None:
        return [c for c in override.split(",") if c]
    return list(MINIMAL_CAPS)


def _free_port() -> int:
    return free_port()


def _crun_argv(*args: str) -> list[str]:
    """crun in a private mount namespace without the hybrid layout's cgroup2
    mount: crun refuses hybrid v1/v2 machines ("cgroups in hybrid mode not
    supported, drop all controllers from cgroupv2"), --cgroup-manager=disabled
    or not. The container's v1 hierarchies are bound in by config.json."""
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
            'umount /sys/fs/cgroup/unified 2>/dev/null; exec "$@"', "sh",
            "crun", "--cgroup-manager=disabled", *args]


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<{self.status} {self.body[:500]!r}>"


class Unpacked:
    """The image unpacked once (umoci unpack) and shared, read-only, by the
    containers of this module."""

    def __init__(self, bundle: Path):
        self.rootfs = bundle / "rootfs"
        self.config = json.loads((bundle / "config.json").read_text())


class Container:
    """One container of the image run by crun, with its own bundle, crun
    state directory and cgroup group; `close()` removes all of them."""

    def __init__(self, workdir: Path, image: "Unpacked", env: dict[str, str], caps: list[str],
                 mode: Optional[str] = None, uid: int = 0,
                 writable: tuple[tuple[str, str], ...] = (("/var/lib/sandbox-gateway", "0700"), ("/tmp", "1777"))):
        self.id = f"sgw-deploy-{secrets.token_hex(4)}"
        self.dir = workdir / self.id
        self.bundle = self.dir / "bundle"
        self.state = self.dir / "crun-state"
        self.log_path = self.dir / "container.log"
        self.cgroup_group = self.id
        self.image = image
        self.env = env
        self.caps = caps
        self.mode = mode  # the entrypoint's argument; None: the image's (all)
        self.uid = uid  # also the gid; not 0: no_new_privs, as allowPrivilegeEscalation: false
        self.writable = writable  # tmpfs mounts (destination, mode) on the read-only root
        self.proc: Optional[subprocess.Popen] = None
        self._log = None
        self.bundle.mkdir(parents=True)
        self.state.mkdir()

    # ---- setup -------------------------------------------------------------
    def configure(self) -> None:
        """config.json from the image's (umoci's), for a bundle whose rootfs
        is the shared, read-only unpacked image."""
        cfg = json.loads(json.dumps(self.image.config))
        cfg["root"] = {"path": str(self.image.rootfs), "readonly": True}
        process = cfg["process"]
        process["terminal"] = False
        if self.mode is not None:
            process["args"] = [process["args"][0], self.mode]
        process["user"] = {"uid": self.uid, "gid": self.uid}
        process["capabilities"] = {k: list(self.caps) for k in ("bounding", "effective", "permitted")}
        process["capabilities"]["inheritable"] = []
        process["capabilities"]["ambient"] = []
        process["noNewPrivileges"] = self.uid != 0
        process.pop("apparmorProfile", None)
        process.pop("selinuxLabel", None)
        env = [e for e in process.get("env", []) if e.split("=", 1)[0] not in self.env]
        env += [f"{k}={v}" for k, v in self.env.items()]
        process["env"] = env
        process.pop("rlimits", None)  # the runtime's own limits (raising them needs CAP_SYS_RESOURCE)

        linux = cfg.setdefault("linux", {})
        # The host's network namespace: ports on this machine's loopback.
        linux["namespaces"] = [n for n in linux.get("namespaces", [])
                               if n["type"] not in ("network", "user", "cgroup")]
        for key in ("seccomp", "uidMappings", "gidMappings", "resources", "cgroupsPath"):
            linux.pop(key, None)
        mounts = [m for m in cfg.get("mounts", []) if not m["destination"].startswith("/sys")]
        mounts.append({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                       "options": ["nosuid", "noexec", "nodev", "ro"]})
        # The cgroup hierarchy: the host's, bound in (each v1 hierarchy, or
        # the v2 tree) read-only, as container runtimes mount it for
        # unprivileged containers; the entrypoint remounts it read-write.
        if (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
            mounts.append({"destination": "/sys/fs/cgroup", "type": "bind", "source": "/sys/fs/cgroup",
                           "options": ["rbind", "ro", "nosuid", "noexec", "nodev"]})
        else:
            mounts.append({"destination": "/sys/fs/cgroup", "type": "tmpfs", "source": "tmpfs",
                           "options": ["nosuid", "noexec", "nodev", "mode=755"]})
            for hier in sorted(Path("/sys/fs/cgroup").iterdir()):
                if hier.name == "unified":  # the hybrid layout's controller-less v2
                    continue
                if hier.is_dir() and not hier.is_symlink() and (hier / "cgroup.procs").exists():
                    mounts.append({"destination": str(hier), "type": "bind", "source": str(hier),
                                   "options": ["rbind", "ro", "nosuid", "noexec", "nodev"]})
        # Writable places of a read-only root (Kubernetes: emptyDir volumes).
        for dest, mode in self.writable:
            mounts.append({"destination": dest, "type": "tmpfs", "source": "tmpfs",
                           "options": ["nosuid", "nodev", f"mode={mode}"]})
        cfg["mounts"] = mounts
        cfg["hostname"] = self.id
        (self.bundle / "config.json").write_text(json.dumps(cfg, indent=2))

    def start(self) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            _crun_argv("--root", str(self.state), "run", "--bundle", str(self.bundle), self.id),
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)

    # ---- running -----------------------------------------------------------
    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def crun(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return _run(_crun_argv("--root", str(self.state), *args), timeout=timeout)

    def init_pid(self) -> int:
        r = self.crun("state", self.id)
        assert r.returncode == 0, r.stderr
        return int(json.loads(r.stdout)["pid"])

    def descendants(self) -> dict[int, str]:
        """pid -> command name of every process of the container."""
        found: dict[int, str] = {}
        todo = [self.init_pid()]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                found[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
        return found

    def wait(self, timeout: float) -> Optional[int]:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- teardown ----------------------------------------------------------
    def close(self) -> None:
        """Kills and deletes the container and removes everything it left."""
        try:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.crun("kill", self.id, "KILL")
                    try:
                        self.proc.wait(timeout=STOP_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait(timeout=10)
                self.crun("delete", "-f", self.id)
        finally:
            if self._log is not None:
                self._log.close()
            _remove_cgroups(self.cgroup_group)
            shutil.rmtree(self.dir, ignore_errors=True)


def _remove_cgroups(group: str) -> None:
    """Removes <hierarchy>/<group> and everything below it (bottom-up), on
    every hierarchy of the host."""
    roots = [Path("/sys/fs/cgroup") / group]
    with contextlib.suppress(OSError):
        roots += [h / group for h in Path("/sys/fs/cgroup").iterdir() if h.is_dir()]
    for root in roots:
        if not root.is_dir():
            continue
        dirs = sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True)
        for d in dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _http(port: int, method: str, path: str, body: Any = None, token: Optional[str] = None,
          headers: Optional[dict] = None, timeout: float = 120.0) -> Response:
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def _grpc_health(port: int, timeout: float = 5.0) -> int:
    """grpc.health.v1.Health/Check with an empty service name; returns the
    serving status (1 = SERVING). The messages are tiny: encoded by hand."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
        reply = check(b"", timeout=timeout)
    # HealthCheckResponse { ServingStatus status = 1; }: tag 0x08, varint.
    if reply == b"":
        return 0
    assert reply[0] == 0x08, reply
    return reply[1]


# ---- fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def prerequisites() -> None:
    if os.geteuid() != 0:
        pytest.skip("runs containers with crun: needs root")
    for tool in ("umoci", "crun"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: scripts/install-deps.sh installs it")
    if not (IMAGE_DIR / "index.json").is_file():
        pytest.fail(f"no OCI image at {IMAGE_DIR}: build it with `bazel build //deploy:image`")


@pytest.fixture(scope="module")
def workdir(prerequisites) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sgw-deploy-test-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _env(secret: Optional[str], shim_port: int, gateway_port: int, group: str) -> dict[str, Optional[str]]:
    return {
        "CLOUD_RUN_SANDBOX_GATEWAY_SECRET": secret,
        "PORT": str(shim_port),
        "SANDBOX_LISTEN": f"127.0.0.1:{gateway_port}",
        "SANDBOX_CGROUP_GROUP": group,
        "SANDBOX_SHUTDOWN_GRACE_SECONDS": "2",
    }


@pytest.fixture(scope="module")
def image(workdir) -> Unpacked:
    bundle = workdir / "image"
    r = _run(["umoci", "unpack", "--image", f"{IMAGE_DIR}:{IMAGE_TAG}", str(bundle)])
    assert r.returncode == 0, f"umoci unpack failed: {r.stderr}"
    return Unpacked(bundle)


def _new_container(workdir: Path, image: Unpacked, secret: Optional[str]) -> tuple[Container, int, int]:
    shim_port, gateway_port = _free_port(), _free_port()
    c = Container(workdir, image, {}, _caps())
    c.env = {k: v for k, v in _env(secret, shim_port, gateway_port, c.cgroup_group).items() if v is not None}
    c.configure()
    return c, shim_port, gateway_port


def _wait_healthy(c: Container, shim_port: int) -> Response:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Any = None
    while time.monotonic() < deadline:
        assert c.alive(), f"the container exited ({c.proc.returncode}):\n{c.log()}"
        try:
            last = _http(shim_port, "GET", "/health", timeout=5)
            if last.status == 200 and last.json().get("cli_mounted") is True:
                return last
        except OSError as e:
            last = e
        time.sleep(0.2)
    pytest.fail(f"not healthy within {START_TIMEOUT_S} s (last: {last!r}):\n{c.log()}")


@pytest.fixture(scope="module")
def running(workdir, image) -> Iterator[tuple[Container, int, int, str]]:
    """The image in its default mode (`all`), healthy."""
    secret = secrets.token_hex(24)
    c, shim_port, gateway_port = _new_container(workdir, image, secret)
    try:
        c.start()
        _wait_healthy(c, shim_port)
        yield c, shim_port, gateway_port, secret
    finally:
        c.close()


# ---- the image -------------------------------------------------------------------


def test_image_config(prerequisites):
    index = json.loads((IMAGE_DIR / "index.json").read_text())
    blobs = IMAGE_DIR / "blobs" / "sha256"
    [desc] = [m for m in index["manifests"]
              if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == IMAGE_TAG]
    manifest = json.loads((blobs / desc["digest"].split(":")[1]).read_text())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_text())
    cfg = config["config"]
    assert cfg["Entrypoint"] == ["/usr/local/bin/sandbox-entrypoint"], cfg
    assert cfg["Cmd"] == ["all"], cfg
    assert set(cfg["ExposedPorts"]) == {"8080/tcp", "50051/tcp"}, cfg
    assert cfg["User"] in ("0:0", "root", "0"), cfg
    labels = cfg["Labels"]
    for key in ("version", "revision", "source"):
        assert labels.get(f"org.opencontainers.image.{key}"), labels
    # A commit of this repository; HEAD itself when Bazel's workspace status
    # names it (deploy/workspace_status.sh: then a new commit re-runs the
    # image action; without it the label is the commit of the last build
    # whose inputs changed).
    revision = labels["org.opencontainers.image.revision"]
    r = _run(["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"])
    assert r.returncode == 0, f"revision label {revision} is not a commit here"
    status = ROOT / "bazel-out" / "stable-status.txt"
    if status.is_file() and "STABLE_GIT_COMMIT " in status.read_text():
        head = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()
        assert revision == head, labels
    # Two layers: the cached Debian base and the app layer.
    assert len(manifest["layers"]) == 2, manifest["layers"]


# ---- the running container ---------------------------------------------------------


def test_health(running):
    c, shim_port, _, _ = running
    r = _http(shim_port, "GET", "/health")
    assert r.status == 200 and r.json() == {"cli_mounted": True, "allow_egress": False}, r


def test_entrypoint_made_the_cgroups_writable(running):
    c, _, _, _ = running
    assert "sandbox-entrypoint: remounted /sys/fs/cgroup/pids read-write" in c.log(), c.log()


def test_bearer_required(running):
    c, shim_port, _, secret = running
    r = _http(shim_port, "POST", "/sandboxes", {"sandbox_id": "nope"})
    assert r.status == 401, r
    r = _http(shim_port, "POST", "/sandboxes", {"sandbox_id": "nope"}, token=secret + "x")
    assert r.status == 401, r


def _exec(shim_port: int, secret: str, sid: str, argv: list[str]) -> dict:
    r = _http(shim_port, "POST", f"/sandboxes/{sid}/exec", {"argv": argv}, token=secret)
    assert r.status == 200, r
    body = r.json()
    body["stdout"] = base64.b64decode(body["stdout_b64"]).decode(errors="replace")
    body["stderr"] = base64.b64decode(body["stderr_b64"]).decode(errors="replace")
    return body


def test_agent_turn_cycle(running):
    """launch → exec (numpy from the image) → GET tar → DELETE → restore
    from that tar → exec → DELETE, through the shim."""
    c, port, _, secret = running
    sid = f"deploy-{secrets.token_hex(4)}"
    created = False
    try:
        r = _http(port, "POST", "/sandboxes", {"sandbox_id": sid}, token=secret)
        assert r.status == 201 and r.json() == {"sandbox_id": sid}, f"{r!r}\n{c.log()}"
        created = True
        body = _exec(port, secret, sid, ["python3", "-c", "import numpy; print(numpy.__version__)"])
        assert body["exit_code"] == 0, body
        assert body["stdout"].strip().split(".")[0].isdigit(), body
        body = _exec(port, secret, sid, [
            "python3", "-c",
            "import pandas, matplotlib, openpyxl, requests, numpy\n"
            "matplotlib.use('Agg')\n"
            "import matplotlib.pyplot as plt\n"
            "df = pandas.DataFrame({'x': [1, 2, 3]})\n"
            "df.to_excel('/tmp/t.xlsx')\n"
            "plt.plot(df.x); plt.savefig('/tmp/p.png')\n"
            "open('/tmp/f', 'w').write('turn one\\n')\n"
            "import os; os.remove('/etc/issue.net')\n"
            "print(int(df.x.sum()))\n"])
        assert body["exit_code"] == 0 and body["stdout"] == "6\n", body

        r = _http(port, "GET", f"/sandboxes/{sid}/tar", token=secret)
        assert r.status == 200 and r.headers["content-type"] == "application/x-tar", r
        archive = r.body
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as t:
            assert t.extractfile(t.getmember("tmp/f")).read() == b"turn one\n"

        r = _http(port, "DELETE", f"/sandboxes/{sid}", token=secret)
        assert r.status == 204, r
        created = False
        r = _http(port, "POST", f"/sandboxes/{sid}/exec", {"argv": ["true"]}, token=secret)
        assert r.status == 404, r

        r = _http(port, "POST", f"/sandboxes/{sid}/restore", archive, token=secret,
                  headers={"Content-Type": "application/x-tar"})
        assert r.status == 201 and r.json() == {"sandbox_id": sid}, r
        created = True
        # The deletion of an image file comes back too (a whiteout: mknod).
        body = _exec(port, secret, sid, ["sh", "-c", "cat /tmp/f && test -s /tmp/t.xlsx && test -s /tmp/p.png"
                                                     " && test ! -e /etc/issue.net"])
        assert body["exit_code"] == 0 and body["stdout"] == "turn one\n", body

        r = _http(port, "DELETE", f"/sandboxes/{sid}", token=secret)
        assert r.status == 204, r
        created = False
    finally:
        if created:
            with contextlib.suppress(Exception):
                _http(port, "DELETE", f"/sandboxes/{sid}", token=secret)


def test_shared_libraries_resolve_inside(running):
    """ldd of every program, run inside a sandbox (whose root is the image's
    own filesystem): nothing missing."""
    c, port, _, secret = running
    sid = f"ldd-{secrets.token_hex(4)}"
    r = _http(port, "POST", "/sandboxes", {"sandbox_id": sid}, token=secret)
    assert r.status == 201, r
    try:
        body = _exec(port, secret, sid, ["sh", "-c",
                                         "for b in /usr/local/bin/sandbox-gateway /usr/local/bin/sandbox-unpack "
                                         "/usr/local/bin/sandbox-shim; do ldd $b || exit 1; done"])
        assert body["exit_code"] == 0, body
        assert "not found" not in body["stdout"], body["stdout"]
        assert "libgrpc.so.29" in body["stdout"], body["stdout"]
    finally:
        _http(port, "DELETE", f"/sandboxes/{sid}", token=secret)


def test_grpc_health_on_the_gateway_port(running):
    _, _, gateway_port, _ = running
    assert _grpc_health(gateway_port) == 1  # SERVING


def test_processes_and_sigterm(running):
    """tini is pid 1, the entrypoint its child, the gateway and the shim the
    entrypoint's; SIGTERM stops both and the container exits 0. Runs last
    in this module: it stops the shared container."""
    c, _, _, _ = running
    procs = c.descendants()
    names = sorted(procs.values())
    assert procs[c.init_pid()] == "tini", procs
    for name in ("sandbox-gateway", "sandbox-shim", "sandbox-entrypo"):
        assert name in names, procs
    r = c.crun("kill", c.id, "TERM")
    assert r.returncode == 0, r.stderr
    rc = c.wait(STOP_TIMEOUT_S)
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{c.log()}"
    assert "stopping the gateway and the shim" in c.log(), c.log()


# ---- failure modes -------------------------------------------------------------------


def test_refuses_to_start_without_the_secret(workdir, image):
    c, shim_port, _ = _new_container(workdir, image, None)
    try:
        c.start()
        rc = c.wait(STOP_TIMEOUT_S)
        assert rc == 78, f"exit status {rc}:\n{c.log()}"
        assert "CLOUD_RUN_SANDBOX_GATEWAY_SECRET is not set" in c.log(), c.log()
        with pytest.raises(OSError):
            _http(shim_port, "GET", "/health", timeout=2)
    finally:
        c.close()


def test_container_exits_when_the_shim_dies(workdir, image):
    c, shim_port, gateway_port = _new_container(workdir, image, secrets.token_hex(16))
    try:
        c.start()
        _wait_healthy(c, shim_port)
        [shim_pid] = [p for p, name in c.descendants().items() if name == "sandbox-shim"]
        os.kill(shim_pid, 9)
        rc = c.wait(STOP_TIMEOUT_S)
        assert rc not in (None, 0), f"exit status {rc}:\n{c.log()}"
        assert "the shim exited" in c.log(), c.log()
    finally:
        c.close()


# ---- the scaled topology's containers ------------------------------------------------


def test_gateway_mode_and_shim_mode_as_nobody(workdir, image):
    """deploy/kubernetes/scaled: the gateway alone (mode `gateway`, root,
    the 13 capabilities) and, in another container, the shim alone (mode
    `shim`) as nobody (65534) with no capability, no_new_privs, a read-only
    root and no writable mount at all, pointed at the gateway. The shim is
    ready, a sandbox runs a command through it, and SIGTERM stops each
    container with status 0."""
    secret = secrets.token_hex(24)
    shim_port, gateway_port = _free_port(), _free_port()
    gw = Container(workdir, image, {}, _caps(), mode="gateway")
    gw.env = {
        "CLOUD_RUN_SANDBOX_GATEWAY_SECRET": secret,
        "SANDBOX_LISTEN": f"127.0.0.1:{gateway_port}",
        "SANDBOX_CGROUP_GROUP": gw.cgroup_group,
        "SANDBOX_SHUTDOWN_GRACE_SECONDS": "2",
    }
    shim = Container(workdir, image, {
        "CLOUD_RUN_SANDBOX_GATEWAY_SECRET": secret,
        "PORT": str(shim_port),
        "SHIM_GATEWAY_TARGET": f"127.0.0.1:{gateway_port}",
    }, [], mode="shim", uid=65534, writable=())
    sid = f"split-{secrets.token_hex(4)}"
    try:
        gw.configure()
        shim.configure()
        gw.start()
        shim.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Any = None
        while time.monotonic() < deadline:
            assert gw.alive(), f"the gateway container exited ({gw.proc.returncode}):\n{gw.log()}"
            assert shim.alive(), f"the shim container exited ({shim.proc.returncode}):\n{shim.log()}"
            with contextlib.suppress(OSError):
                last = _http(shim_port, "GET", "/ready", timeout=5)
                if last.status == 200:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"the shim is not ready (last: {last!r}):\n{shim.log()}\n{gw.log()}")

        # The shim runs as nobody, without capabilities; the gateway as root.
        procs = {name: pid for pid, name in shim.descendants().items()}
        status = Path(f"/proc/{procs['sandbox-shim']}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == ["65534"] * 4, uid_line
        cap_eff = next(line for line in status.splitlines() if line.startswith("CapEff:"))
        assert int(cap_eff.split()[1], 16) == 0, cap_eff

        r = _http(shim_port, "POST", "/sandboxes", {"sandbox_id": sid}, token=secret)
        assert r.status == 201, f"{r!r}\n{gw.log()}"
        body = _exec(shim_port, secret, sid, ["sh", "-c", "echo split"])
        assert body["exit_code"] == 0 and body["stdout"] == "split\n", body
        r = _http(shim_port, "DELETE", f"/sandboxes/{sid}", token=secret)
        assert r.status == 204, r

        for c in (shim, gw):
            r = c.crun("kill", c.id, "TERM")
            assert r.returncode == 0, r.stderr
            rc = c.wait(STOP_TIMEOUT_S)
            assert rc == 0, f"exit status {rc} after SIGTERM:\n{c.log()}"
    finally:
        shim.close()
        gw.close()
