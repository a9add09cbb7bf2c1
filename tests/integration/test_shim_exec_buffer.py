"""sandbox-shim: the buffered exec answer (no NDJSON) and its memory.

The shim holds an answer's output only as base64 text, made as the output
arrives, and serves the JSON from it; every answer's text counts against
SHIM_MAX_BUFFERED_OUTPUT until the client has read it. These tests pin the
answer byte for byte, decode large and cut outputs, refuse an exec past the
budget with 503 while others go on, and check that the shim gives its
memory back.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.lib.procs import require_shim_binary
from tests.lib.shim import ShimClient, unb64

MiB = 1024 * 1024


@pytest.fixture
def sandbox(client):
    return client.launch()


# Bodies as json_dumps(JSON_COMPACT) of the answer object laid them out
# before the answer was served from the base64 buffers: field order, no
# spaces, null exit code on timeout, -N for a signal.
EXACT_BODIES = [
    (["true"], None, '{"exit_code":0,"timed_out":false,"stdout_b64":"","stderr_b64":""}'),
    (["printf", "a"], None, '{"exit_code":0,"timed_out":false,"stdout_b64":"YQ==","stderr_b64":""}'),
    (["printf", "ab"], None, '{"exit_code":0,"timed_out":false,"stdout_b64":"YWI=","stderr_b64":""}'),
    (["printf", "abc"], None, '{"exit_code":0,"timed_out":false,"stdout_b64":"YWJj","stderr_b64":""}'),
    (["printf", "abcd"], None, '{"exit_code":0,"timed_out":false,"stdout_b64":"YWJjZA==","stderr_b64":""}'),
    (["sh", "-c", "printf '\\377\\376\\375?>/'; printf 'err\\n' >&2; exit 3"], None,
     '{"exit_code":3,"timed_out":false,"stdout_b64":"//79Pz4v","stderr_b64":"ZXJyCg=="}'),
    (["sh", "-c", "kill -9 $$"], None, '{"exit_code":-9,"timed_out":false,"stdout_b64":"","stderr_b64":""}'),
    (["sleep", "5"], 1, '{"exit_code":null,"timed_out":true,"stdout_b64":"","stderr_b64":""}'),
]


@pytest.mark.parametrize("argv,timeout,body", EXACT_BODIES, ids=[
    "empty", "one-byte", "two-bytes", "three-bytes", "four-bytes", "binary-stderr-exit3", "signal", "timeout"])
def test_answer_is_byte_identical_to_the_contract(client, sandbox, argv, timeout, body):
    r = client.exec(sandbox, argv, timeout=timeout)
    assert r.status == 200, r
    assert r.headers["content-type"] == "application/json", r.headers
    assert r.body == body.encode(), r
    assert r.headers["content-length"] == str(len(body)), r.headers


def test_large_output_decodes_to_the_bytes_printed(client, sandbox):
    """16 MiB + 1 of random bytes on stdout (arriving in many pieces, not a
    multiple of 3) and some stderr decode to exactly what the command
    printed."""
    size = 16 * MiB + 1
    body = client.run(sandbox, ["sh", "-c",
                                f"head -c {size} /dev/urandom >/tmp/big; cat /tmp/big; "
                                "sha256sum /tmp/big >&2; seq 1 20000 >&2"], timeout=120)
    assert body["exit_code"] == 0 and "truncated" not in body, {k: v for k, v in body.items() if "std" not in k}
    out = unb64(body["stdout_b64"])
    err = unb64(body["stderr_b64"]).decode()
    assert len(out) == size
    digest, rest = err.split(" ", 1)
    assert hashlib.sha256(out).hexdigest() == digest
    assert rest.split("\n", 1)[1] == "".join(f"{i}\n" for i in range(1, 20001))


def test_output_cut_mid_piece_is_truncated_and_decodes(shims, gateway):
    """A cap that is not a multiple of 3 and falls inside a piece of output:
    each stream keeps exactly its first SHIM_MAX_EXEC_OUTPUT bytes."""
    cap = 100_001
    s = shims.shim(gateway, env={"SHIM_MAX_EXEC_OUTPUT": str(cap)})
    c = ShimClient(s)
    try:
        sid = c.launch()
        seq = "".join(f"{i}\n" for i in range(1, 100_001)).encode()
        r = c.exec(sid, ["sh", "-c", "seq 1 100000; seq 1 100000 >&2"], timeout=60)
        assert r.status == 200, r
        assert list(r.json()) == ["exit_code", "timed_out", "stdout_b64", "stderr_b64", "truncated"]
        body = r.json()
        assert body["truncated"] is True and body["exit_code"] == 0
        assert unb64(body["stdout_b64"]) == seq[:cap]
        assert unb64(body["stderr_b64"]) == seq[:cap]
        # Under the cap on both streams: no "truncated".
        r = c.exec(sid, ["sh", "-c", "head -c 100001 /dev/zero; head -c 5 /dev/zero >&2"], timeout=60)
        assert r.status == 200 and "truncated" not in r.json(), r
    finally:
        c.cleanup()


# ---- SHIM_MAX_BUFFERED_OUTPUT ------------------------------------------------------------------

BUDGET = 4 * MiB + 12345


def test_exec_past_the_budget_is_503_while_small_execs_go_on(shims, gateway):
    """One exec printing 16 MiB against a budget of about 4 MiB: cancelled
    (long before its command would end) with a 503 naming the setting,
    while small execs running meanwhile all succeed; afterwards the budget
    is whole again."""
    s = shims.shim(gateway, env={"SHIM_MAX_BUFFERED_OUTPUT": str(BUDGET)})
    c = ShimClient(s)
    try:
        sid = c.launch()
        big: dict = {}

        def run_big():
            t0 = time.monotonic()
            big["r"] = c.exec(sid, ["sh", "-c", "head -c 16777216 /dev/zero; sleep 60"], timeout=120)
            big["s"] = time.monotonic() - t0

        th = threading.Thread(target=run_big, daemon=True)
        th.start()
        small = []
        while th.is_alive() or not small:
            small.append(c.exec(sid, ["echo", "small"], timeout=30))
        th.join(60)
        r = big["r"]
        assert r.status == 503, r
        detail = r.json()["detail"]
        assert set(r.json()) == {"detail"} and "SHIM_MAX_BUFFERED_OUTPUT" in detail, r
        assert big["s"] < 30, f"the refused exec took {big['s']:.1f} s: it was not cancelled"
        bad = [x for x in small if x.status != 200 or unb64(x.json()["stdout_b64"]) != b"small\n"]
        assert not bad, bad[:3]
        # The refused exec gave its share back: an answer of about 3 MiB of
        # base64 fits again.
        body = c.run(sid, ["head", "-c", str(2 * MiB + 1), "/dev/zero"], timeout=60)
        assert unb64(body["stdout_b64"]) == b"\0" * (2 * MiB + 1)
    finally:
        c.cleanup()


def _send_exec(shim, sid: str, argv: list[str]) -> socket.socket:
    """Sends an exec request on a raw connection with a small receive
    buffer (a slow client) and returns the socket unread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(60)
    sock.connect((shim.host, shim.port))
    body = json.dumps({"argv": argv, "timeout": 60}).encode()
    head = (f"POST /sandboxes/{sid}/exec HTTP/1.1\r\nHost: shim\r\nAuthorization: Bearer {shim.secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    sock.sendall(head.encode() + body)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return bytes(data)
        data += chunk


def test_an_answer_counts_until_its_client_has_read_it(shims, gateway):
    """A client that does not read its 12 MiB answer keeps it counted: an
    exec that would need more than what is left answers 503; once the slow
    client has read its answer (whole and right), the same exec succeeds."""
    s = shims.shim(gateway, env={"SHIM_MAX_BUFFERED_OUTPUT": str(16 * MiB)})
    c = ShimClient(s)
    try:
        sid = c.launch()
        slow = _send_exec(s, sid, ["head", "-c", str(9 * MiB), "/dev/zero"])
        try:
            # Its answer is made (and held) once the status line arrives.
            slow.settimeout(60)
            first = slow.recv(4096)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            r = c.exec(sid, ["head", "-c", str(4 * MiB), "/dev/zero"], timeout=60)
            assert r.status == 503 and "SHIM_MAX_BUFFERED_OUTPUT" in r.json()["detail"], r
            raw = first + _read_all(slow)
        finally:
            slow.close()
        head, body = raw.split(b"\r\n\r\n", 1)
        assert unb64(json.loads(body)["stdout_b64"]) == b"\0" * (9 * MiB)
        body = c.run(sid, ["head", "-c", str(4 * MiB), "/dev/zero"], timeout=60)
        assert unb64(body["stdout_b64"]) == b"\0" * (4 * MiB)
    finally:
        c.cleanup()


def test_memory_goes_back_after_large_execs(shims, gateway):
    """Rounds of 4 concurrent 16 MiB execs: the shim's resident memory
    after the last round is about what it was after the first (no growth
    per round) and not far above where it started."""
    s = shims.shim(gateway)
    c = ShimClient(s)
    try:
        sid = c.launch()
        c.run(sid, ["true"])
        start = s.vm_rss_kib()
        after = []
        with ThreadPoolExecutor(max_workers=4) as pool:
            for _ in range(5):
                rs = list(pool.map(lambda _: c.exec(sid, ["head", "-c", str(16 * MiB), "/dev/zero"], timeout=120),
                                   range(4)))
                assert all(r.status == 200 and len(r.body) > 16 * MiB for r in rs), [r.status for r in rs]
                del rs
                time.sleep(0.5)
                after.append(s.vm_rss_kib())
        assert after[-1] <= after[0] + 32 * 1024, f"RSS grew across rounds (KiB): start {start}, after {after}"
        # AddressSanitizer keeps freed memory in quarantine (256 MiB): a
        # build with it only shows whether memory grows round by round.
        if b"__asan_init" not in require_shim_binary().read_bytes():
            assert after[-1] <= start + 64 * 1024, f"RSS did not go back (KiB): start {start}, after {after}"
    finally:
        c.cleanup()
