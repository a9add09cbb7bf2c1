"""Test images and registries: tiny OCI images written by hand (tar +
SHA-256, no tool), pushed with `skopeo copy` to Debian's `docker-registry`
started on loopback, and a raw registry (`RawRegistry`) that serves
whatever manifests and blobs a hostile-image test gives it."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from tests.lib.procs import free_port

BUSYBOX = "/bin/busybox"
# The applets the test images link to busybox.
APPLETS = ("sh", "cat", "env", "pwd", "ls", "id", "echo", "test", "stat", "touch", "mkdir", "rm", "sleep")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_bytes(entries: list[tuple]) -> bytes:
    """A tar of `entries`: ("file", name, bytes[, mode]), ("dir", name),
    ("symlink", name, target), ("hardlink", name, target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            kind, name = e[0], e[1]
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            if kind == "file":
                data = e[2]
                info.size = len(data)
                info.mode = e[3] if len(e) > 3 else 0o644
                t.addfile(info, io.BytesIO(data))
                continue
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e[2], 0o777
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, e[2]
            t.addfile(info)
    return buf.getvalue()


def busybox_layer() -> bytes:
    """The base layer of the test images: a static busybox as /bin/sh & co."""
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    entries: list[tuple] = [("dir", "bin"), ("file", "bin/busybox", bb, 0o755)]
    entries += [("symlink", f"bin/{a}", "busybox") for a in APPLETS]
    entries += [("dir", "etc"), ("dir", "tmp"), ("dir", "root")]
    return gzip.compress(tar_bytes(entries), mtime=0)


@dataclass
class Image:
    """An image as blobs: its manifest (bytes), config and layers by digest."""
    manifest: bytes
    blobs: dict[str, bytes]
    media_type: str = OCI_MANIFEST

    @property
    def digest(self) -> str:
        return sha256(self.manifest)


def _diff_id(blob: bytes) -> str:
    """The digest of a layer's uncompressed tar (of the blob itself when it
    is not gzip)."""
    try:
        return sha256(gzip.decompress(blob))
    except OSError:
        return sha256(blob)


def make_image(layers: list[bytes], env: Optional[list[str]] = None, workdir: str = "",
               layer_type: str = LAYER_GZIP, user: str = "") -> Image:
    """An OCI image of compressed `layers` (base first) with config Env,
    WorkingDir and User."""
    cfg = {"architecture": "amd64", "os": "linux",
           "config": {"Env": env or ["PATH=/bin"], "WorkingDir": workdir, "User": user},
           "rootfs": {"type": "layers", "diff_ids": [_diff_id(l) for l in layers]}}
    cfg_b = json.dumps(cfg).encode()
    blobs = {sha256(cfg_b): cfg_b}
    descs = []
    for layer in layers:
        blobs[sha256(layer)] = layer
        descs.append({"mediaType": layer_type, "digest": sha256(layer), "size": len(layer)})
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": sha256(cfg_b), "size": len(cfg_b)},
                "layers": descs}
    return Image(json.dumps(manifest).encode(), blobs)


def write_layout(img: Image, path: str, tag: str) -> None:
    """`img` as an OCI image layout at `path` (for skopeo)."""
    os.makedirs(os.path.join(path, "blobs", "sha256"), exist_ok=True)
    for d, data in list(img.blobs.items()) + [(img.digest, img.manifest)]:
        with open(os.path.join(path, "blobs", "sha256", d[7:]), "wb") as f:
            f.write(data)
    with open(os.path.join(path, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": img.digest, "size": len(img.manifest),
             "annotations": {"org.opencontainers.image.ref.name": tag}}]}, f)


def _wait_port(port: int, proc: Optional[subprocess.Popen] = None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the registry exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class Registry:
    """Debian's docker-registry on loopback, in a temporary directory
    removed at close(): plain HTTP, or with `tls` a certificate of its own
    for 127.0.0.1 (`ca`: the PEM that verifies it) and with `users`
    (name -> password) an htpasswd file (bcrypt) it asks Basic credentials
    against."""

    def __init__(self, tls: bool = False, users: Optional[dict] = None):
        self.dir = tempfile.mkdtemp(prefix="sgw-registry-")
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.ca: Optional[str] = None
        self.users = users or {}
        conf = os.path.join(self.dir, "config.yml")
        text = ("version: 0.1\nlog:\n  level: error\n"
                f"storage:\n  filesystem:\n    rootdirectory: {self.dir}/data\n  delete:\n    enabled: true\n"
                f"http:\n  addr: 127.0.0.1:{self.port}\n")
        if tls:
            self.ca = os.path.join(self.dir, "cert.pem")
            key = os.path.join(self.dir, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out",
                            self.ca], check=True, capture_output=True, timeout=60)
            text += f"  tls:\n    certificate: {self.ca}\n    key: {key}\n"
        if self.users:
            import crypt  # bcrypt through the system's libcrypt (htpasswd's format)
            htpasswd = os.path.join(self.dir, "htpasswd")
            with open(htpasswd, "w") as f:
                for name, pw in self.users.items():
                    f.write(f"{name}:{crypt.crypt(pw, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
            text += f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
        with open(conf, "w") as f:
            f.write(text)
        self.proc = subprocess.Popen(["docker-registry", "serve", conf], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.dir, "log"), "wb"))
        try:
            _wait_port(self.port, self.proc)
        except Exception:
            self.close()
            raise

    def push(self, img: Image, repo: str, tag: str) -> str:
        """Pushes `img` as repo:tag with skopeo; its reference by tag."""
        layout = tempfile.mkdtemp(prefix="sgw-layout-")
        creds = []
        if self.users:
            name, pw = next(iter(self.users.items()))
            creds = [f"--dest-creds={name}:{pw}"]
        try:
            write_layout(img, layout, tag)
            subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", *creds, f"oci:{layout}:{tag}",
                            f"docker://{self.host}/{repo}:{tag}"], check=True, timeout=120,
                           capture_output=True)
        finally:
            shutil.rmtree(layout, ignore_errors=True)
        return f"{self.host}/{repo}:{tag}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RawRegistry:
    """A registry that serves exactly what it is given: manifests by
    repo:reference and blobs by digest (no check of its own), and counts
    requests; `stall` paths accept and never answer."""

    def __init__(self):
        self.manifests: dict[str, tuple[str, bytes]] = {}
        self.blobs: dict[str, bytes] = {}
        self.stall: set[str] = set()
        self.requests: list[str] = []
        # Auth: `basic` (base64 of user:password) the registry asks for with
        # a Basic challenge, or, with `bearer` (a token), a Bearer challenge
        # whose realm is this server's /token (which wants `basic` when set).
        self.basic: Optional[str] = None
        self.bearer: Optional[str] = None
        # Or: a check of the Basic credentials (base64) given.
        self.basic_check = None
        # Blobs answered with a redirect to this host:port instead.
        self.redirect_to: Optional[str] = None
        self.authorizations: list[tuple[str, Optional[str]]] = []
        reg = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def answer(self, code, body=b"", headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

            def authorized(self) -> bool:
                got = self.headers.get("Authorization")
                if reg.bearer is not None:
                    if got == f"Bearer {reg.bearer}":
                        return True
                    realm = f"http://{reg.host}/token"
                    self.answer(401, headers=[("WWW-Authenticate",
                                               f'Bearer realm="{realm}",service="test",scope="repository:x:pull"')])
                    return False
                if reg.basic is not None and got != f"Basic {reg.basic}":
                    self.answer(401, headers=[("WWW-Authenticate", 'Basic realm="test"')])
                    return False
                if reg.basic_check is not None and not (got or "").startswith("Basic ") \
                        or reg.basic_check is not None and not reg.basic_check(got[6:]):
                    self.answer(401, headers=[("WWW-Authenticate", 'Basic realm="test"')])
                    return False
                return True

            def do_GET(self):
                reg.requests.append(self.path)
                reg.authorizations.append((self.path, self.headers.get("Authorization")))
                if self.path.startswith("/token"):
                    if reg.basic is not None and self.headers.get("Authorization") != f"Basic {reg.basic}":
                        self.answer(401)
                    else:
                        self.answer(200, json.dumps({"token": reg.bearer}).encode(),
                                    [("Content-Type", "application/json")])
                    return
                if not self.authorized():
                    return
                if any(self.path.startswith(s) for s in reg.stall):
                    time.sleep(3600)
                    return
                parts = self.path.split("/")
                body, ctype = None, "application/octet-stream"
                if len(parts) >= 5 and parts[1] == "v2" and parts[-2] == "manifests":
                    found = reg.manifests.get("/".join(parts[2:-2]) + ":" + parts[-1])
                    if found is not None:
                        ctype, body = found
                elif len(parts) >= 5 and parts[1] == "v2" and parts[-2] == "blobs":
                    if reg.redirect_to is not None:
                        self.answer(307, headers=[("Location", f"http://{reg.redirect_to}{self.path}")])
                        return
                    body = reg.blobs.get(parts[-1])
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, repo: str, tag: str, img: Image) -> str:
        self.manifests[f"{repo}:{tag}"] = (img.media_type, img.manifest)
        self.manifests[f"{repo}:{img.digest}"] = (img.media_type, img.manifest)
        self.blobs.update(img.blobs)
        return f"{self.host}/{repo}:{tag}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def registry(tls: bool = False, users: Optional[dict] = None) -> Iterator[Registry]:
    r = Registry(tls=tls, users=users)
    try:
        yield r
    finally:
        r.close()
