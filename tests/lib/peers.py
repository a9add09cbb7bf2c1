"""What sandboxes and the gateway talk to in the tests: TCP servers on the
host, a network namespace behind a veth pair, tests/gcs/fake_gcs.py; and
probing them from inside a sandbox (`connect`)."""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import socket
import subprocess
import threading
import time
from typing import Iterator, Optional

from tests.lib.procs import REPO_ROOT, run


# --- from inside a sandbox -------------------------------------------------------

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


def connect(client, sid: str, host: str, port: int, timeout: float = 3.0) -> str:
    """Tries a TCP connection from sandbox `sid` (through `client`, a
    SandboxClient): "OK <what the server sent>" or "ERR <errno name>"."""
    res = client.exec(sid, connect_argv(host, port, timeout), timeout_seconds=30)
    assert res.code == 0, res.describe()
    return res.out.strip()


# --- on the host -------------------------------------------------------------------

@contextlib.contextmanager
def answering_server(host: str, reply: bytes) -> Iterator[int]:
    """A TCP server on `host` (port picked by the kernel) that sends `reply`
    to every connection and closes it; yields the port, stops on exit."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            with c:
                c.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        srv.close()


FAKE_GCS = REPO_ROOT / "tests" / "gcs" / "fake_gcs.py"


class FakeGcs:
    """tests/gcs/fake_gcs.py running on loopback: `host` ("127.0.0.1:port",
    for STORAGE_EMULATOR_HOST), its fault-injection control endpoint, and
    reading an object back."""

    def __init__(self):
        self.proc = subprocess.Popen(["/usr/bin/python3", str(FAKE_GCS)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.host = f"127.0.0.1:{int(self.proc.stdout.readline().strip())}"

    def control(self, path: str, body: Optional[dict] = None) -> dict:
        import urllib.request
        req = urllib.request.Request(f"http://{self.host}{path}", method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"{}")

    def object_bytes(self, bucket: str, name: str) -> bytes:
        """The object's bytes; urllib.error.HTTPError (404) when absent."""
        import urllib.parse
        import urllib.request
        quoted = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(f"http://{self.host}/storage/v1/b/{bucket}/o/{quoted}?alt=media",
                                    timeout=30) as r:
            return r.read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_fake_gcs() -> Iterator[FakeGcs]:
    g = FakeGcs()
    try:
        yield g
    finally:
        g.stop()


# The server of a Netns, run inside it: answers argv[3] to every connection.
NS_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[3].encode()); c.close()
"""


class Netns:
    """A network namespace with a veth pair to the host and a TCP server."""

    def __init__(self):
        used = run(["ip", "-4", "-o", "addr", "show"]).stdout
        for _ in range(50):
            self.x = random.randint(1, 254)
            if f"10.231.{self.x}." not in used:
                break
        tag = secrets.token_hex(3)
        self.name = f"sgwt-{tag}"
        self.host_if, self.ns_if = f"sgwt{tag}h", f"sgwt{tag}n"
        self.host_ip, self.ns_ip = f"10.231.{self.x}.1", f"10.231.{self.x}.2"
        self.port = 18000 + random.randint(0, 999)
        self.token = "hello-" + secrets.token_hex(4)
        self.server = None

    def setup(self):
        ns = ["ip", "netns", "exec", self.name]
        run(["ip", "netns", "add", self.name])
        run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if])
        run(["ip", "link", "set", self.ns_if, "netns", self.name])
        run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if])
        run(["ip", "link", "set", self.host_if, "up"])
        run(ns + ["ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if])
        run(ns + ["ip", "link", "set", self.ns_if, "up"])
        run(ns + ["ip", "link", "set", "lo", "up"])
        self.server = subprocess.Popen(ns + ["/usr/bin/python3", "-c", NS_SERVER, self.ns_ip, str(self.port),
                                             self.token], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True)
        line = self.server.stdout.readline()
        assert line.strip() == "ready", (line, self.server.stderr.read() if self.server.poll() else "")
        # The host reaches it (so a failure below is the sandbox's).
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((self.ns_ip, self.port), timeout=2) as c:
                    assert c.recv(100).decode() == self.token
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def teardown(self):
        if self.server is not None:
            self.server.kill()
            self.server.wait(10)
        run(["ip", "netns", "del", self.name], check=False)
        run(["ip", "link", "del", self.host_if], check=False)


@contextlib.contextmanager
def running_netns() -> Iterator[Netns]:
    """A set-up `Netns` for the `with` block, removed at its end (and
    checked to be gone)."""
    n = Netns()
    try:
        n.setup()
        yield n
    finally:
        n.teardown()
    assert n.name not in run(["ip", "netns", "list"]).stdout
