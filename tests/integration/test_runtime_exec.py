"""Exec against the real gateway: output streams, exit status, stdin, env,
cwd, streaming as produced, timeouts and cancellation."""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path

import grpc
import pytest

from tests.lib.client import collect, new_id
from tests.lib.procs import wait_until


@pytest.fixture(scope="module")
def box(sbx):
    """One sandbox shared by the tests that only read."""
    sid = new_id("exec")
    sbx.launch(sid)
    return sid


@pytest.fixture
def fresh(sbx):
    """A sandbox private to one test (deleted with the others at the end of
    the module: deletes run concurrently there)."""
    sid = new_id("fresh")
    sbx.launch(sid)
    return sid


def ps_comms(sbx, sid) -> list[str]:
    res = sbx.exec(sid, ["ps", "-e", "-o", "pid=,comm=,args="])
    assert res.code == 0, res.describe()
    return res.out.splitlines()


# --- output and exit status ----------------------------------------------------

def test_stdout_and_stderr_arrive_on_separate_streams(sbx, box):
    res = sbx.sh(box, "echo out1; echo err1 >&2; echo out2; printf err2 >&2")
    assert res.code == 0
    assert res.stdout == b"out1\nout2\n"
    assert res.stderr == b"err1\nerr2"
    kinds = [e.WhichOneof("event") for e in res.events]
    assert kinds[-1] == "exit" and kinds.count("exit") == 1


@pytest.mark.parametrize("code", [0, 1, 42, 255])
def test_exit_code_of_the_command_is_reported(sbx, box, code):
    res = sbx.sh(box, f"exit {code}")
    assert (res.code, res.exit.signal, res.exit.timed_out) == (code, 0, False), res.describe()


@pytest.mark.parametrize("sig", [9, 15])
def test_command_killed_by_a_signal_reports_minus_one_and_the_signal(sbx, box, sig):
    res = sbx.sh(box, f"kill -{sig} $$")
    assert (res.code, res.exit.signal, res.exit.timed_out) == (-1, sig, False), res.describe()


def test_binary_output_keeps_all_256_byte_values(sbx, box):
    script = ("import sys; d = bytes(range(256)) * 3; "
              "sys.stdout.buffer.write(d); sys.stdout.flush(); sys.stderr.buffer.write(d[::-1])")
    res = sbx.exec(box, ["python3", "-c", script])
    assert res.code == 0, res.describe()
    assert res.stdout == bytes(range(256)) * 3
    assert res.stderr == (bytes(range(256)) * 3)[::-1]


def test_output_written_before_the_exit_reaches_a_slow_reader_whole(sbx, box):
    """The drain after the exit is bounded for output that comes later, not
    for what the command wrote before it exited: a slow reader (or a busy
    gateway) still gets every byte."""
    size = 4 * 1024 * 1024
    call = sbx.exec_call(box, ["head", "-c", str(size), "/dev/zero"], timeout_seconds=60, rpc_timeout=90)
    got, code = 0, None
    for ev in call:
        got += len(ev.stdout)
        if ev.WhichOneof("event") == "exit":
            code = ev.exit.exit_code
        time.sleep(0.1)  # about 2.5 MB/s: the pipe's last MiB takes longer than the drain's bound
    assert (got, code) == (size, 0)


def test_256_mib_of_output_arrives_intact(sbx, box):
    size = 256 * 1024 * 1024
    # Random data, hashed inside the sandbox as it is written; the hash goes
    # to stderr once all of stdout is out.
    script = (
        "import hashlib, os, sys\n"
        "h = hashlib.sha256(); out = sys.stdout.buffer\n"
        f"for _ in range({size} // 65536):\n"
        "    b = os.urandom(65536); h.update(b); out.write(b)\n"
        "out.flush(); sys.stderr.write(h.hexdigest())\n")
    h = hashlib.sha256()
    total = 0
    biggest = 0
    stderr = []
    exit_status = None
    for ev in sbx.exec_call(box, ["python3", "-c", script], timeout_seconds=120, rpc_timeout=150):
        kind = ev.WhichOneof("event")
        assert exit_status is None, "event after the exit event"
        if kind == "stdout":
            h.update(ev.stdout)
            total += len(ev.stdout)
            biggest = max(biggest, len(ev.stdout))
        elif kind == "stderr":
            stderr.append(ev.stderr)
        else:
            exit_status = ev.exit
    assert exit_status is not None and exit_status.exit_code == 0, (exit_status, b"".join(stderr))
    assert total == size
    assert biggest <= 256 * 1024, "a chunk is larger than 256 KiB (the bound in sandbox.proto)"
    assert b"".join(stderr).decode() == h.hexdigest()


# --- stdin -----------------------------------------------------------------------

def test_stdin_is_fed_to_the_command_then_closed(sbx, box):
    data = b"hello\x00world\n" + bytes(range(256))
    res = sbx.exec(box, ["cat"], stdin=data, timeout_seconds=20)
    assert res.code == 0 and res.stdout == data, res.describe()


def test_large_stdin_is_fed_while_output_is_read(sbx, box):
    # More than any pipe holds, echoed back: a gateway that wrote all of
    # stdin before reading stdout would deadlock (and time out).
    data = secrets.token_bytes(3 * 1024 * 1024)
    res = sbx.exec(box, ["cat"], stdin=data, timeout_seconds=30)
    assert res.code == 0 and not res.exit.timed_out, res.describe()
    assert res.stdout == data
    res = sbx.exec(box, ["wc", "-c"], stdin=data, timeout_seconds=30)
    assert res.out.strip() == str(len(data))


def test_without_stdin_the_command_reads_end_of_file(sbx, box):
    res = sbx.exec(box, ["cat"], timeout_seconds=20)
    assert (res.code, res.exit.timed_out, res.stdout) == (0, False, b""), res.describe()


# --- environment and working directory -------------------------------------------

def test_default_environment_has_path_and_home(sbx, box):
    res = sbx.exec(box, ["env"])
    env = dict(line.split("=", 1) for line in res.out.splitlines())
    assert env.get("HOME") == "/root"
    assert "/usr/bin" in env.get("PATH", "").split(":") and "/bin" in env["PATH"].split(":")


def test_gateway_environment_does_not_leak_into_commands(sbx, box, gateway_secret):
    res = sbx.exec(box, ["env"])
    assert gateway_secret not in res.out
    assert "CLOUD_RUN_SANDBOX" not in res.out and "SANDBOX_STATE_DIR" not in res.out, res.out


def test_request_env_is_added_to_the_defaults(sbx, box):
    res = sbx.sh(box, 'printf "%s|%s|%s" "$GREETING" "$HOME" "$EMPTY-x"',
                 env={"GREETING": "hello world = ok", "EMPTY": ""})
    assert res.out == "hello world = ok|/root|-x", res.describe()


def test_request_env_overrides_a_default(sbx, box):
    res = sbx.sh(box, 'echo "$HOME"', env={"HOME": "/tmp"})
    assert res.out == "/tmp\n"


def test_env_name_with_equals_sign_is_invalid_argument(sbx, box):
    with pytest.raises(grpc.RpcError) as ei:
        sbx.exec(box, ["true"], env={"A=B": "c"})
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_argv_and_env_up_to_their_limit_reach_the_command(sbx, box):
    """argv and env may take up to 256 KiB together; a request that large is
    one message to the sandbox's pid 1, more than a socket's default buffer
    holds (208 KiB): it still arrives whole."""
    args = [secrets.token_hex(50 * 1024) for _ in range(2)]  # 2 x 100 KiB (one arg may be 128 KiB)
    env = {"BIG": secrets.token_hex(20 * 1024)}  # 40 KiB
    res = sbx.exec(box, ["sh", "-c", 'printf "%s %s %s" "${#1}" "${#2}" "${#BIG}"; echo; printf %s "$1$2$BIG" | sha256sum',
                         "sh", *args], env=env)
    assert res.code == 0, res.describe()
    lengths, digest = res.out.splitlines()
    assert lengths == f"{len(args[0])} {len(args[1])} {len(env['BIG'])}"
    assert digest.split()[0] == hashlib.sha256("".join(args + [env["BIG"]]).encode()).hexdigest()


@pytest.mark.parametrize("kib", [260, 1024])
def test_argv_and_env_past_their_limit_is_invalid_argument(sbx, box, kib):
    args = [secrets.token_hex(512) for _ in range(kib)]  # kib x 1 KiB
    with pytest.raises(grpc.RpcError) as ei:
        sbx.exec(box, ["true", *args])
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "256 KiB" in ei.value.details()
    assert sbx.exec(box, ["true"]).code == 0  # the sandbox is fine


def test_default_working_directory_is_root_home(sbx, box):
    assert sbx.exec(box, ["pwd"]).out == "/root\n"


def test_given_working_directory_is_used(sbx, box):
    assert sbx.exec(box, ["pwd"], cwd="/tmp").out == "/tmp\n"
    assert sbx.exec(box, ["pwd"], cwd="/usr/share").out == "/usr/share\n"


def test_missing_working_directory_fails_with_a_clear_message(sbx, box):
    res = sbx.exec(box, ["pwd"], cwd="/no/such/dir")
    assert res.code != 0 and res.stdout == b"", res.describe()
    text = res.err + res.exit.message
    assert "/no/such/dir" in text and "No such file or directory" in text, res.describe()


def test_relative_working_directory_is_invalid_argument(sbx, box):
    with pytest.raises(grpc.RpcError) as ei:
        sbx.exec(box, ["pwd"], cwd="tmp")
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_empty_argv_is_invalid_argument(sbx, box):
    with pytest.raises(grpc.RpcError) as ei:
        sbx.exec(box, [])
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_command_not_found_exits_127_with_a_message_on_stderr(sbx, box):
    res = sbx.exec(box, ["no-such-command-xyz", "arg"])
    assert res.code == 127, res.describe()
    assert "no-such-command-xyz" in res.err and "No such file or directory" in res.err, res.describe()


def test_more_arguments_than_the_holder_takes_are_refused_by_name(sbx, box):
    # 4 095 arguments is the most (SBX_EXEC_MAX_ARGS); one more is refused
    # before the request is sent, with an error that names the limit.
    res = sbx.exec(box, ["sh", "-c", 'echo "$#"', "sh"] + ["a"] * (4095 - 4))
    assert res.code == 0 and res.out.strip() == str(4095 - 4), res.describe()
    with pytest.raises(grpc.RpcError) as ei:
        sbx.exec(box, ["true"] + ["a"] * 4095)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 4095 arguments" in ei.value.details()
    assert sbx.exec(box, ["true"]).code == 0


# --- streaming -----------------------------------------------------------------

def test_output_is_streamed_while_the_command_still_runs(sbx, fresh):
    # The command prints a line, then waits for a file that the test creates
    # (through a second Exec) only once it has received that line: if output
    # were held back until the command ended, the first event would never
    # come and the call would hit its deadline.
    flag = f"/tmp/go-{secrets.token_hex(4)}"
    call = sbx.exec_call(fresh, ["sh", "-c", f"echo first; while [ ! -e {flag} ]; do sleep 0.02; done; echo second"],
                         timeout_seconds=30, rpc_timeout=30)
    try:
        first = next(call)
        assert first.WhichOneof("event") == "stdout" and first.stdout == b"first\n", first
        sbx.ok(fresh, f"touch {flag}")
        rest = collect(call)
    finally:
        call.cancel()
    assert rest.code == 0 and rest.stdout == b"second\n", rest.describe()


def test_stderr_is_streamed_while_the_command_still_runs(sbx, fresh):
    flag = f"/tmp/go-{secrets.token_hex(4)}"
    call = sbx.exec_call(fresh, ["sh", "-c", f"echo early >&2; while [ ! -e {flag} ]; do sleep 0.02; done"],
                         timeout_seconds=30, rpc_timeout=30)
    try:
        first = next(call)
        assert first.WhichOneof("event") == "stderr" and first.stderr == b"early\n", first
        sbx.ok(fresh, f"touch {flag}")
        assert collect(call).code == 0
    finally:
        call.cancel()


# --- timeouts --------------------------------------------------------------------

def test_timeout_kills_the_command_and_everything_it_started(sbx, fresh):
    script = "sleep 1000 & sleep 1000 & nohup sleep 1000 >/dev/null 2>&1 & sleep 1000"
    res = sbx.exec(fresh, ["sh", "-c", script], timeout_seconds=2, rpc_timeout=30)
    assert res.exit.timed_out, res.describe()
    assert res.code == -1 and res.exit.signal == 9, res.describe()
    assert res.exit.message, "a timed-out exit carries a message"
    procs = ps_comms(sbx, fresh)
    assert not [p for p in procs if "sleep" in p], procs
    # Only the holder (pid 1) and ps itself.
    assert len(procs) == 2 and procs[0].split()[0] == "1", procs
    # The sandbox is still usable.
    assert sbx.ok(fresh, "echo alive").out == "alive\n"


def test_timeout_above_3600_seconds_is_invalid_argument(sbx, box):
    with pytest.raises(grpc.RpcError) as ei:
        sbx.exec(box, ["true"], timeout_seconds=3601)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sbx.exec(box, ["true"], timeout_seconds=3600).code == 0


def test_timeout_zero_means_the_default_not_immediate(sbx, box):
    res = sbx.sh(box, "sleep 0.5; echo done", timeout_seconds=0)
    assert (res.code, res.exit.timed_out, res.out) == (0, False, "done\n"), res.describe()


def test_command_that_ends_in_time_is_not_timed_out(sbx, box):
    res = sbx.sh(box, "echo quick", timeout_seconds=5)
    assert not res.exit.timed_out and res.exit.message == "", res.describe()


# --- cancellation ------------------------------------------------------------------

def _no_sleep_left(sbx, sid):
    return not [p for p in ps_comms(sbx, sid) if "sleep" in p]


def test_cancelled_exec_kills_the_command(sbx, fresh):
    call = sbx.exec_call(fresh, ["sh", "-c", "echo started; sleep 1000 & sleep 1000"], rpc_timeout=60)
    first = next(call)
    assert first.stdout == b"started\n", first
    assert not _no_sleep_left(sbx, fresh), "precondition: the sleeps run"
    call.cancel()
    with pytest.raises(grpc.RpcError) as ei:
        for _ in call:
            pass
    assert ei.value.code() == grpc.StatusCode.CANCELLED
    assert wait_until(lambda: _no_sleep_left(sbx, fresh), timeout=10.0, interval=0.2), ps_comms(sbx, fresh)


def test_exec_whose_deadline_passes_kills_the_command(sbx, fresh):
    call = sbx.exec_call(fresh, ["sh", "-c", "echo started; sleep 1000"], rpc_timeout=3)
    with pytest.raises(grpc.RpcError) as ei:
        for _ in call:
            pass
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_until(lambda: _no_sleep_left(sbx, fresh), timeout=10.0, interval=0.2), ps_comms(sbx, fresh)


# --- the end of an exec ----------------------------------------------------------

def test_exec_ends_with_its_command_though_a_child_it_left_keeps_writing(sbx, fresh):
    """The answer comes when the command exits (plus a short drain), with the
    command's own status, even though a background child still writes to
    the exec's stdout: not at the timeout, not as timed out."""
    res = sbx.sh(fresh, "(while :; do echo x; sleep 0.02; done) & echo done", timeout_seconds=6, rpc_timeout=30)
    assert (res.code, res.exit.timed_out, res.exit.signal) == (0, False, 0), res.describe()
    assert "done" in res.out.splitlines(), res.describe()


INTRUDER = """
import os, socket, time
s = socket.socket(socket.AF_UNIX)
s.bind("/tmp/intruder.sock")
s.listen(1)
c, _ = s.accept()
_, fds, _, _ = socket.recv_fds(c, 1, 1)
while True:
    os.write(fds[0], b"y\\n")
    time.sleep(0.01)
"""

VICTIM = ("import socket, time; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/intruder.sock'); "
          "socket.send_fds(s, [b'x'], [1]); time.sleep(1.5); print('end', flush=True)")


def test_another_process_writing_into_an_exec_pipe_cannot_hold_it_open(sbx, fresh):
    """A process of the sandbox outside the exec gets the exec's stdout (the
    command hands it over a Unix socket) and writes into it forever: the
    exec still ends when its command does, with its status."""
    sbx.ok(fresh, f"cat > /tmp/intruder.py <<'EOF'\n{INTRUDER}\nEOF\n"
                  "setsid nohup python3 /tmp/intruder.py >/dev/null 2>&1 </dev/null & "
                  "while [ ! -S /tmp/intruder.sock ]; do sleep 0.05; done")
    res = sbx.exec(fresh, ["python3", "-c", VICTIM], timeout_seconds=6, rpc_timeout=30)
    assert (res.code, res.exit.timed_out) == (0, False), res.describe()
    lines = res.out.splitlines()
    assert "end" in lines and "y" in lines, res.describe()  # the intruder did write into the pipe


def _exec_groups(gw, sid) -> list[str]:
    found = []
    for root in Path("/sys/fs/cgroup").iterdir():
        g = root / gw.cgroup_group / sid
        if g.is_dir():
            found += [p.name for p in g.iterdir() if p.is_dir() and p.name.startswith("exec-")]
    return found


def test_each_exec_cgroup_goes_with_its_exec_and_what_it_left_running_lives_on(sbx, fresh):
    for _ in range(5):
        sbx.ok(fresh, "true")
    sbx.ok(fresh, "nohup sleep 1000 >/dev/null 2>&1 & echo started")
    # The answer goes out first; the group goes right after it.
    assert wait_until(lambda: _exec_groups(sbx.gw, fresh) == [], 5.0), _exec_groups(sbx.gw, fresh)
    assert [p for p in ps_comms(sbx, fresh) if "sleep 1000" in p], "the background sleep was killed"
    assert wait_until(lambda: _exec_groups(sbx.gw, fresh) == [], 5.0), _exec_groups(sbx.gw, fresh)
