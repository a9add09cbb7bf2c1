"""sandbox-shim under load: a 1 GiB restore and a 1 GiB tar download with
the shim's resident memory flat (the body is streamed, never buffered), and
200 concurrent execs."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.lib.client import new_id
from tests.lib.procs import RssSampler
from tests.lib.shim import ShimClient, metric_value, unb64

GIB = 1 << 30
MIB = 1 << 20
# How much the shim's VmRSS may grow while it moves 1 GiB.
RSS_BUDGET = 64 * MIB


class PatternReader:
    """`size` bytes of a repeated random 1 MiB block, read piece by piece
    (never held whole); hashes what it hands out."""

    def __init__(self, size: int):
        self.left = size
        self.block = os.urandom(MIB)
        self.pos = 0
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.left
        n = min(n, self.left, MIB - self.pos)
        out = self.block[self.pos:self.pos + n]
        self.pos = (self.pos + n) % MIB
        self.left -= n
        self.sha.update(out)
        return out


def stream_tar(name: str, size: int):
    """(reader, content) : a pipe whose read end yields a tar archive of one
    file of `size` bytes, written by a thread with tarfile's streaming mode."""
    r, w = os.pipe()
    content = PatternReader(size)
    errors: list[BaseException] = []

    def writer():
        try:
            with os.fdopen(w, "wb", buffering=MIB) as out:
                with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT,
                                  bufsize=MIB, copybufsize=MIB) as t:
                    info = tarfile.TarInfo(name)
                    info.size = size
                    info.mode = 0o644
                    info.mtime = int(time.time())
                    t.addfile(info, content)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    return os.fdopen(r, "rb", buffering=MIB), content, th, errors


class HashingReader:
    """Wraps an HTTP response: counts and hashes every byte read."""

    def __init__(self, resp):
        self.resp = resp
        self.count = 0
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.resp.read(n)
        self.count += len(data)
        self.sha.update(data)
        return data


def test_1gib_restore_and_tar_with_flat_memory(shims):
    gw = shims.gateway({"SANDBOX_DISK_MB": "2000", "SANDBOX_MEMORY_MB": "4096"},
                       secret="big-secret")
    shim = shims.shim(gw)
    client = ShimClient(shim)
    sid = new_id("gib")
    try:
        # Warm up (first connection thread, first gRPC call) before the baseline.
        assert shim.request("GET", "/health", auth=False).status == 200
        client.launch(new_id("warm"))
        baseline = shim.vm_rss_kib() * 1024

        # --- restore: 1 GiB streamed in with chunked transfer encoding ---
        body, content, writer, errors = stream_tar("tmp/big.bin", GIB)
        t0 = time.monotonic()
        with RssSampler(shim) as up:
            conn = shim.connection(timeout=300)
            conn.blocksize = MIB
            try:
                conn.request("POST", f"/sandboxes/{sid}/restore", body=body,
                             headers={**shim.auth_headers(), "Content-Type": "application/x-tar"})
                client.created.add(sid)
                resp = conn.getresponse()
                answer = resp.read()
            finally:
                conn.close()
                body.close()
        writer.join(30)
        restore_s = time.monotonic() - t0
        assert not errors, errors
        assert resp.status == 201, (resp.status, answer)
        assert json.loads(answer) == {"sandbox_id": sid}
        assert content.left == 0
        want_sha = content.sha.hexdigest()
        assert up.samples, "no RSS sample"
        assert up.peak_bytes - baseline < RSS_BUDGET, \
            f"shim RSS grew {(up.peak_bytes - baseline) / MIB:.1f} MiB during a 1 GiB restore"

        out = client.sh(sid, "stat -c %s /tmp/big.bin")
        assert out.strip() == str(GIB)

        # --- tar: 1 GiB streamed out, read and discarded piece by piece ---
        t0 = time.monotonic()
        found = {}
        with RssSampler(shim) as down:
            conn = shim.connection(timeout=300)
            try:
                conn.request("GET", f"/sandboxes/{sid}/tar", headers=shim.auth_headers())
                resp = conn.getresponse()
                assert resp.status == 200, (resp.status, resp.read(2000))
                assert resp.getheader("Content-Type") == "application/x-tar"
                src = HashingReader(resp)
                with tarfile.open(fileobj=src, mode="r|", bufsize=MIB) as t:
                    for m in t:
                        if m.name == "tmp/big.bin":
                            f = t.extractfile(m)
                            h, n = hashlib.sha256(), 0
                            while True:
                                piece = f.read(MIB)
                                if not piece:
                                    break
                                h.update(piece)
                                n += len(piece)
                            found = {"size": m.size, "read": n, "sha": h.hexdigest()}
                # Whatever follows the end-of-archive blocks.
                while src.read(MIB):
                    pass
            finally:
                conn.close()
        tar_s = time.monotonic() - t0
        assert found, "tmp/big.bin is not in the downloaded tar"
        assert found["size"] == GIB and found["read"] == GIB, found
        assert found["sha"] == want_sha, "the downloaded file differs from the restored one"
        assert src.count > GIB
        assert down.peak_bytes - baseline < RSS_BUDGET, \
            f"shim RSS grew {(down.peak_bytes - baseline) / MIB:.1f} MiB during a 1 GiB tar download"
        print(f"restore {restore_s:.1f}s, tar {tar_s:.1f}s ({src.count} bytes), baseline "
              f"{baseline / MIB:.1f} MiB, peaks {up.peak_bytes / MIB:.1f} / {down.peak_bytes / MIB:.1f} MiB")

        m = shim.request("GET", "/metrics").body.decode()
        assert metric_value(m, "shim_bytes_streamed_total", {"direction": "upload"}) >= GIB, m
        assert metric_value(m, "shim_bytes_streamed_total", {"direction": "download"}) >= GIB, m
    finally:
        client.cleanup()


def test_200_concurrent_execs(shim):
    n_sandboxes, per_sandbox = 10, 20
    client = ShimClient(shim)
    try:
        ids = [client.launch(new_id("conc")) for _ in range(n_sandboxes)]
        jobs = [ids[i % n_sandboxes] for i in range(n_sandboxes * per_sandbox)]
        barrier = threading.Barrier(len(jobs))

        def one(i_sid):
            i, sid = i_sid
            barrier.wait(30)
            r = client.exec(sid, ["sh", "-c", f"sleep 1; echo {i}"], timeout=120, http_timeout=180)
            return i, r

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(one, enumerate(jobs)))
        elapsed = time.monotonic() - t0
        bad = []
        for i, r in results:
            if r.status != 200:
                bad.append((i, r))
                continue
            body = r.json()
            if body["exit_code"] != 0 or body["timed_out"] or unb64(body["stdout_b64"]) != f"{i}\n".encode():
                bad.append((i, body))
        assert not bad, f"{len(bad)} of {len(jobs)} execs failed, e.g. {bad[:5]}"
        # Run concurrently, not one after the other (200 s).
        assert elapsed < 60, f"200 concurrent `sleep 1` took {elapsed:.1f}s"
    finally:
        client.cleanup()
