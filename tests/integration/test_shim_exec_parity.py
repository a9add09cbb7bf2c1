"""sandbox-shim: what REST exec and launch add to the contract so that a REST
client can do what a gRPC one does — additive only, the contract's answers
otherwise unchanged.

- exec takes `cwd`, `env` and `stdin_b64`; bad values are FastAPI-shaped 422s;
- exec answers (buffered and the NDJSON exit line) say `"oom_killed": true`
  and `"pids_limited": true` when a sandbox limit hit the command, and only
  then;
- an NDJSON exec cuts each stream at SHIM_MAX_EXEC_OUTPUT, as the buffered
  answer does, and says `"truncated": true` in its exit line;
- a launch (or restore) asking for egress from a gateway that forbids it
  answers `"allow_egress": false` and the shim logs a warning.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile

import pytest

from tests.lib.client import new_id
from tests.lib.gateway import running_gateway
from tests.lib.shim import (ShimClient, assert_validation_error, raw_connect, read_response_head, running_shim,
                            status_of, unb64)

CONTRACT_KEYS = {"stdout_b64", "stderr_b64", "exit_code", "timed_out"}
PIDS_MAX = 64
MEMORY_MB = 128


@pytest.fixture(scope="module")
def sandbox(shim):
    c = ShimClient(shim)
    sid = c.launch(new_id("parity"))
    try:
        yield sid
    finally:
        c.cleanup()


@pytest.fixture(scope="module")
def limited(gateway_secret):
    """A shim in front of a gateway with small memory and process limits."""
    env = {"SANDBOX_PIDS_MAX": str(PIDS_MAX), "SANDBOX_MEMORY_MB": str(MEMORY_MB)}
    with running_gateway(env, secret=gateway_secret, check=True) as gw, running_shim(gw, check=True) as s:
        c = ShimClient(s)
        try:
            yield c
        finally:
            c.cleanup()


def exec_ndjson(shim, sid: str, body: dict) -> list[dict]:
    conn = shim.connection(timeout=120)
    try:
        conn.request("POST", f"/sandboxes/{sid}/exec", body=json.dumps(body),
                     headers={**shim.auth_headers(), "Content-Type": "application/json",
                              "Accept": "application/x-ndjson"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        return [json.loads(line) for line in resp.read().splitlines()]
    finally:
        conn.close()


def joined(events: list[dict], key: str) -> bytes:
    return b"".join(unb64(e[key]) for e in events if key in e)


# ---- cwd, env, stdin ------------------------------------------------------------------------

SCRIPT = 'pwd; printf "%s|%s\\n" "$GREETING" "$EMPTY"; cat | od -An -tx1 | tr -d " \\n"'
STDIN = b"in\x00put\n"


def test_exec_runs_in_cwd_with_env_and_stdin(shim, sandbox):
    r = shim.request("POST", f"/sandboxes/{sandbox}/exec", {
        "argv": ["sh", "-c", SCRIPT], "cwd": "/tmp", "env": {"GREETING": "hi there", "EMPTY": ""},
        "stdin_b64": base64.b64encode(STDIN).decode()})
    assert r.status == 200, r
    body = r.json()
    assert set(body) == CONTRACT_KEYS and body["exit_code"] == 0, body
    assert unb64(body["stdout_b64"]).decode() == "/tmp\nhi there|\n" + STDIN.hex(), body


def test_ndjson_exec_takes_the_same_fields(shim, sandbox):
    events = exec_ndjson(shim, sandbox, {
        "argv": ["sh", "-c", SCRIPT], "cwd": "/", "env": {"GREETING": "x"},
        "stdin_b64": base64.b64encode(STDIN).decode()})
    assert events[-1] == {"exit_code": 0, "timed_out": False}, events
    assert joined(events, "stdout_b64").decode() == "/\nx|\n" + STDIN.hex(), events


def test_exec_without_stdin_reads_end_of_file_and_defaults_to_root(shim, sandbox):
    r = shim.request("POST", f"/sandboxes/{sandbox}/exec", {"argv": ["sh", "-c", "pwd; cat | wc -c"],
                                                             "cwd": None, "env": None, "stdin_b64": None})
    assert r.status == 200 and unb64(r.json()["stdout_b64"]) == b"/root\n0\n", r


def test_exec_stdin_as_large_as_the_json_body_cap_allows(shim, sandbox):
    data = bytes(range(256)) * (700 * 1024 // 256)  # base64: ~933 KiB, under the 1 MiB body cap
    r = shim.request("POST", f"/sandboxes/{sandbox}/exec", {
        "argv": ["sh", "-c", "sha256sum | cut -d' ' -f1"], "stdin_b64": base64.b64encode(data).decode()})
    assert r.status == 200 and unb64(r.json()["stdout_b64"]).decode().strip() == hashlib.sha256(data).hexdigest(), r
    # Past the cap the body is refused from its declared length (413), before
    # it is read.
    body = json.dumps({"argv": ["true"], "stdin_b64": base64.b64encode(b"x" * (800 * 1024)).decode()})
    sock = raw_connect(shim)
    try:
        sock.sendall((f"POST /sandboxes/{sandbox}/exec HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {shim.secret}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode())
        assert status_of(read_response_head(sock, 10)) == 413
    finally:
        sock.close()


@pytest.mark.parametrize("extra,loc", [
    ({"cwd": "tmp"}, ["body", "cwd"]),
    ({"cwd": ""}, ["body", "cwd"]),
    ({"cwd": 5}, ["body", "cwd"]),
    ({"env": ["A=b"]}, ["body", "env"]),
    ({"env": {"": "x"}}, ["body", "env", ""]),
    ({"env": {"A=B": "x"}}, ["body", "env", "A=B"]),
    ({"env": {"A": 1}}, ["body", "env", "A"]),
    ({"stdin_b64": "abc"}, ["body", "stdin_b64"]),
    ({"stdin_b64": "ab!="}, ["body", "stdin_b64"]),
    ({"stdin_b64": "a=bc"}, ["body", "stdin_b64"]),
    ({"stdin_b64": 12}, ["body", "stdin_b64"]),
])
def test_exec_bad_new_fields_are_422(shim, sandbox, extra, loc):
    r = shim.request("POST", f"/sandboxes/{sandbox}/exec", {"argv": ["true"], **extra})
    assert_validation_error(r, loc)


def test_exec_reports_every_bad_field_at_once(shim, sandbox):
    r = shim.request("POST", f"/sandboxes/{sandbox}/exec",
                     {"argv": [], "timeout": 0, "cwd": "x", "env": {"=": "y"}, "stdin_b64": "@"})
    errors = assert_validation_error(r)
    assert {tuple(e["loc"]) for e in errors} == {
        ("body", "argv"), ("body", "timeout"), ("body", "cwd"), ("body", "env", "="), ("body", "stdin_b64")}, errors


# ---- limits in the exit status -------------------------------------------------------------

def test_plain_exec_answers_have_no_limit_fields(shim, sandbox):
    r = shim.request("POST", f"/sandboxes/{sandbox}/exec", {"argv": ["sh", "-c", "exit 3"]})
    assert r.status == 200 and set(r.json()) == CONTRACT_KEYS and r.json()["exit_code"] == 3, r
    events = exec_ndjson(shim, sandbox, {"argv": ["sh", "-c", "exit 3"]})
    assert events[-1] == {"exit_code": 3, "timed_out": False}, events


MEMORY_HOG = ["python3", "-c", "b = bytearray(10**9)"]


def test_oom_kill_is_reported_in_the_buffered_answer(limited):
    sid = limited.launch()
    r = limited.exec(sid, MEMORY_HOG, timeout=60)
    assert r.status == 200, r
    body = r.json()
    assert body["oom_killed"] is True and body["exit_code"] == -9, body
    assert set(body) == CONTRACT_KEYS | {"oom_killed"}, body
    # The sandbox lives on.
    assert limited.sh(sid, "echo alive") == "alive\n"


def test_oom_kill_is_reported_in_the_ndjson_exit_line(limited):
    sid = limited.launch()
    events = exec_ndjson(limited.shim, sid, {"argv": MEMORY_HOG, "timeout": 60})
    assert events[-1] == {"exit_code": -9, "timed_out": False, "oom_killed": True}, events


FORK_UP_TO_THE_LIMIT = (
    "import os, signal, time\n"
    "pids, refused = [], False\n"
    "for i in range(2 * %d):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        refused = True; break\n"
    "    if pid == 0:\n"
    "        time.sleep(60); os._exit(0)\n"
    "    pids.append(pid)\n"
    "print(refused)\n"
    "for p in pids: os.kill(p, signal.SIGKILL)\n"
    "for p in pids: os.waitpid(p, 0)\n" % PIDS_MAX)


def test_process_limit_is_reported_in_both_answers(limited):
    sid = limited.launch()
    r = limited.exec(sid, ["python3", "-c", FORK_UP_TO_THE_LIMIT], timeout=60)
    assert r.status == 200, r
    body = r.json()
    assert unb64(body["stdout_b64"]) == b"True\n", body
    assert body["pids_limited"] is True and "oom_killed" not in body and body["exit_code"] == 0, body
    events = exec_ndjson(limited.shim, sid, {"argv": ["python3", "-c", FORK_UP_TO_THE_LIMIT], "timeout": 60})
    assert events[-1] == {"exit_code": 0, "timed_out": False, "pids_limited": True}, events
    # A later exec that stays under the limit says nothing of it.
    assert set(limited.exec(sid, ["true"]).json()) == CONTRACT_KEYS


# ---- NDJSON output cap ---------------------------------------------------------------------

def test_ndjson_exec_cuts_each_stream_at_the_output_cap(shims, gateway):
    s = shims.shim(gateway, env={"SHIM_MAX_EXEC_OUTPUT": "1024"})
    c = ShimClient(s)
    try:
        sid = c.launch()
        # Far past the cap: the stream is cut, the command still runs to its end.
        events = exec_ndjson(s, sid, {"argv": ["sh", "-c", "head -c 3000000 /dev/zero; echo end >&2; exit 5"]})
        assert events[-1] == {"exit_code": 5, "timed_out": False, "truncated": True}, events[-1]
        assert joined(events, "stdout_b64") == b"\0" * 1024
        assert joined(events, "stderr_b64") == b"end\n"
        # stderr is cut on its own.
        events = exec_ndjson(s, sid, {"argv": ["sh", "-c", "head -c 3000 /dev/zero >&2; echo small"]})
        assert joined(events, "stderr_b64") == b"\0" * 1024 and joined(events, "stdout_b64") == b"small\n"
        assert events[-1].get("truncated") is True, events[-1]
        # Exactly at the cap: not truncated.
        events = exec_ndjson(s, sid, {"argv": ["head", "-c", "1024", "/dev/zero"]})
        assert joined(events, "stdout_b64") == b"\0" * 1024
        assert events[-1] == {"exit_code": 0, "timed_out": False}, events[-1]
    finally:
        c.cleanup()


# ---- egress a gateway does not allow --------------------------------------------------------

def egress_warning(shim, sid):
    return shim.logs.wait_for(lambda r: r.get("sandbox_id") == sid and "egress" in r.get("message", ""), 5.0)


def small_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("tmp/x")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def test_launch_asking_for_refused_egress_says_so_and_warns(shim, client):
    sid = new_id("noegress")
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "allow_egress": True})
    client.created.add(sid)
    assert r.status == 201 and r.json() == {"sandbox_id": sid, "allow_egress": False}, r
    assert egress_warning(shim, sid) is not None, shim.logs.text()[-2000:]
    # Not asking: the contract's answer, and no warning.
    sid = new_id("noegress")
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "allow_egress": False})
    client.created.add(sid)
    assert r.status == 201 and r.json() == {"sandbox_id": sid}, r
    assert not shim.logs.find(lambda rec: rec.get("sandbox_id") == sid and "egress" in rec.get("message", ""))


def test_restore_asking_for_refused_egress_says_so(shim, client):
    sid = new_id("noegress")
    r = shim.request("POST", f"/sandboxes/{sid}/restore?allow_egress=true", small_tar(),
                     headers={"Content-Type": "application/x-tar"})
    client.created.add(sid)
    assert r.status == 201 and r.json() == {"sandbox_id": sid, "allow_egress": False}, r
    assert egress_warning(shim, sid) is not None


def test_launch_with_egress_granted_answers_as_the_contract(shims, gateway_secret):
    gw = shims.gateway({"ALLOW_EGRESS": "true"}, secret=gateway_secret)
    s = shims.shim(gw)
    c = ShimClient(s)
    try:
        sid = new_id("egress")
        r = s.request("POST", "/sandboxes", {"sandbox_id": sid, "allow_egress": True})
        c.created.add(sid)
        assert r.status == 201 and r.json() == {"sandbox_id": sid}, r
    finally:
        c.cleanup()
