"""Run against the real gateway: a command driven over a bidirectional
stream — stdin as it is sent, EOF, signals to its process group, its output
as it comes, its exit last; cancelling the call kills what it started;
protocol errors are clear statuses."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from tests.lib.client import new_id, pb
from tests.lib.procs import wait_until

RPC_TIMEOUT_S = 60


class Session:
    """One Run call: `send` queues input messages, `events` yields what
    comes back; `close` half-closes the input stream."""

    _END = object()

    def __init__(self, client, first: pb.ProcessInput, timeout: float = RPC_TIMEOUT_S):
        self._q: queue.Queue = queue.Queue()
        self._q.put(first)
        self.call = client.stub.Run(self._requests(), metadata=client.md, timeout=timeout)
        self.stdout = b""
        self.stderr = b""
        self.started = None
        self.exit = None

    def _requests(self):
        while True:
            m = self._q.get()
            if m is self._END:
                return
            yield m

    def send(self, **kw):
        self._q.put(pb.ProcessInput(**kw))

    def close(self):
        self._q.put(self._END)

    def next_event(self):
        ev = next(self.call)
        kind = ev.WhichOneof("event")
        assert self.exit is None, f"an event ({kind}) came after the exit"
        if kind == "started":
            assert self.started is None, "two started events"
            self.started = ev.started
        else:
            assert self.started is not None, f"{kind} came before started"
        if kind == "stdout":
            self.stdout += ev.stdout
        elif kind == "stderr":
            self.stderr += ev.stderr
        elif kind == "exit":
            self.exit = ev.exit
        return ev

    def read_until(self, text: bytes):
        while text not in self.stdout:
            self.next_event()

    def finish(self):
        """Reads to the end; the stream must end right after the exit."""
        while self.exit is None:
            self.next_event()
        with pytest.raises(StopIteration):
            next(self.call)
        return self.exit


def start(client, sid, argv, **kw) -> Session:
    return Session(client, pb.ProcessInput(start=pb.ProcessStart(sandbox_id=sid, argv=argv, **kw)))


@pytest.fixture(scope="module")
def box(sbx):
    sid = new_id("run")
    sbx.launch(sid)
    return sid


@pytest.fixture
def fresh(sbx):
    sid = new_id("run-fresh")
    sbx.launch(sid)
    return sid


def _sleeps(sbx, sid) -> list[str]:
    res = sbx.exec(sid, ["ps", "-e", "-o", "args="])
    return [p for p in res.out.splitlines() if p.startswith("sleep")]


def test_stdin_flows_to_cat_as_it_is_sent_and_close_gives_eof(sbx, box):
    s = start(sbx, box, ["cat"])
    s.next_event()
    assert s.started.pid > 0 and list(s.started.argv) == ["cat"] and s.started.running
    s.send(stdin=b"hello\n")
    s.read_until(b"hello\n")
    s.send(stdin=b"again\n")
    s.read_until(b"again\n")
    s.send(close_stdin=True)
    ex = s.finish()
    assert (ex.exit_code, ex.signal, ex.timed_out) == (0, 0, False), ex
    assert s.stdout == b"hello\nagain\n"
    s.close()


def test_a_half_close_is_end_of_input(sbx, box):
    s = start(sbx, box, ["sh", "-c", "wc -c"])
    s.send(stdin=b"x" * 100000)
    s.close()
    ex = s.finish()
    assert ex.exit_code == 0 and s.stdout.strip() == b"100000", (ex, s.stdout)


def test_python_answers_line_by_line(sbx, box):
    s = start(sbx, box, ["python3", "-i", "-q"])
    s.send(stdin=b"print(6*7)\n")
    s.read_until(b"42\n")
    s.send(stdin=b"import sys; sys.exit(3)\n")
    ex = s.finish()
    assert ex.exit_code == 3, ex
    s.close()


def test_env_and_cwd_are_the_commands(sbx, box):
    s = start(sbx, box, ["sh", "-c", "echo $GREETING; pwd"], env={"GREETING": "hi"}, cwd="/tmp")
    s.close()
    assert s.finish().exit_code == 0
    assert s.stdout == b"hi\n/tmp\n"


def test_a_signal_goes_to_the_whole_process_group(sbx, fresh):
    s = start(sbx, fresh, ["sh", "-c", "sleep 1000 & echo ready; wait"])
    s.read_until(b"ready\n")
    assert wait_until(lambda: len(_sleeps(sbx, fresh)) == 1, timeout=10.0, interval=0.05)
    s.send(signal=15)
    ex = s.finish()
    assert (ex.exit_code, ex.signal) == (-1, 15), ex
    assert wait_until(lambda: not _sleeps(sbx, fresh), timeout=10.0, interval=0.2), _sleeps(sbx, fresh)
    s.close()


def test_sigint_interrupts_and_the_exit_says_so(sbx, box):
    s = start(sbx, box, ["sleep", "1000"])
    s.next_event()
    s.send(signal=2)
    ex = s.finish()
    assert (ex.exit_code, ex.signal) == (-1, 2), ex
    s.close()


def test_cancelling_the_call_kills_everything_it_started(sbx, fresh):
    s = start(sbx, fresh, ["sh", "-c", "sleep 1000 & sleep 1000 & echo ready; wait"])
    s.read_until(b"ready\n")
    assert wait_until(lambda: len(_sleeps(sbx, fresh)) == 2, timeout=10.0, interval=0.05)
    s.call.cancel()
    with pytest.raises(grpc.RpcError) as ei:
        while True:
            s.next_event()
    assert ei.value.code() == grpc.StatusCode.CANCELLED
    assert wait_until(lambda: not _sleeps(sbx, fresh), timeout=10.0, interval=0.2), _sleeps(sbx, fresh)
    s.close()


def test_the_output_of_a_command_that_ignores_stdin_still_comes(sbx, box):
    s = start(sbx, box, ["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done"])
    ex = s.finish()
    assert ex.exit_code == 0 and s.stdout == b"1\n2\n3\n"
    s.close()


def test_stdin_after_the_command_exited_does_not_break_the_stream(sbx, box):
    s = start(sbx, box, ["true"])
    ex = s.finish()
    assert ex.exit_code == 0
    s.send(stdin=b"too late\n")
    s.close()


def _error_of(s: Session) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        while True:
            s.next_event()
    s.close()
    return ei.value


def test_a_first_message_that_is_not_start_is_invalid_argument(sbx, box):
    s = Session(sbx, pb.ProcessInput(stdin=b"x"))
    e = _error_of(s)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "start" in e.details(), e


def test_a_second_start_is_invalid_argument_and_kills_the_first(sbx, fresh):
    s = start(sbx, fresh, ["sleep", "1000"])
    s.next_event()
    s.send(start=pb.ProcessStart(sandbox_id=fresh, argv=["true"]))
    e = _error_of(s)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "first message" in e.details(), e
    assert wait_until(lambda: not _sleeps(sbx, fresh), timeout=10.0, interval=0.2)


def test_a_signal_number_linux_has_not_is_invalid_argument(sbx, fresh):
    s = start(sbx, fresh, ["sleep", "1000"])
    s.next_event()
    s.send(signal=999)
    e = _error_of(s)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "999" in e.details(), e
    assert wait_until(lambda: not _sleeps(sbx, fresh), timeout=10.0, interval=0.2)


def test_run_in_an_unknown_sandbox_is_not_found(sbx):
    s = start(sbx, new_id("ghost"), ["true"])
    assert _error_of(s).code() == grpc.StatusCode.NOT_FOUND


def test_empty_argv_is_invalid_argument(sbx, box):
    s = start(sbx, box, [])
    assert _error_of(s).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_many_runs_at_once_each_get_their_own_input(sbx, box):
    results = {}

    def one(i):
        s = start(sbx, box, ["cat"])
        s.send(stdin=f"run {i}\n".encode())
        s.send(close_stdin=True)
        results[i] = (s.finish().exit_code, s.stdout)
        s.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: (0, f"run {i}\n".encode()) for i in range(8)}


# --- on a terminal -------------------------------------------------------------

def on_pty(client, sid, argv, rows=24, cols=80, **kw) -> Session:
    return start(client, sid, argv, pty=pb.PtySize(rows=rows, cols=cols), **kw)


def test_a_pty_is_a_terminal_of_the_sandbox_with_its_term(sbx, box):
    s = on_pty(sbx, box, ["sh", "-c", "tty; echo TERM=$TERM; test -t 0 && test -t 1 && test -t 2 && echo all-ttys"])
    ex = s.finish()
    assert ex.exit_code == 0, (ex, s.stdout)
    assert b"/dev/pts/" in s.stdout and b"TERM=xterm-256color" in s.stdout and b"all-ttys" in s.stdout, s.stdout
    assert s.stderr == b"", "on a terminal all output is one stream"
    assert (s.started.pty.rows, s.started.pty.cols) == (24, 80)
    s.close()


def test_resize_changes_what_stty_size_says(sbx, box):
    s = on_pty(sbx, box, ["sh"], rows=24, cols=80)
    s.send(stdin=b"stty size\n")
    s.read_until(b"24 80")
    s.send(resize=pb.PtySize(rows=40, cols=120))
    s.send(stdin=b"stty size\n")
    s.read_until(b"40 120")
    s.send(stdin=b"exit 0\n")
    assert s.finish().exit_code == 0
    s.close()


def test_ctrl_c_interrupts_the_foreground_job_and_the_shell_answers_on(sbx, fresh):
    s = on_pty(sbx, fresh, ["bash", "--norc", "-i"], env={"PS1": "ready> "})
    s.read_until(b"ready> ")  # bash has set its signals up
    s.send(stdin=b"sleep 100; echo slept\n")
    assert wait_until(lambda: _sleeps(sbx, fresh), timeout=10.0, interval=0.05)
    s.send(stdin=b"\x03")
    s.send(stdin=b"echo alive-$((6*7))\n")
    s.read_until(b"alive-42")
    assert b"slept" not in s.stdout.split(b"\r\n"), s.stdout  # the line after the sleep never ran
    s.send(stdin=b"exit 0\n")
    assert s.finish().exit_code == 0
    s.close()


def test_bash_job_control_works_on_the_terminal(sbx, box):
    s = on_pty(sbx, box, ["bash", "--norc", "-i"], env={"PS1": "ready> "})
    s.read_until(b"ready> ")
    s.send(stdin=b"sleep 100 &\n")
    s.send(stdin=b"jobs; echo jobs-$((1+1))\n")
    s.read_until(b"jobs-2")
    assert b"Running" in s.stdout and b"sleep 100 &" in s.stdout, s.stdout
    s.send(stdin=b"kill %1; wait; exit 0\n")
    assert s.finish().exit_code == 0
    s.close()


def test_close_stdin_on_a_terminal_is_its_eof_character(sbx, box):
    s = on_pty(sbx, box, ["cat"])
    s.send(stdin=b"typed\n")
    s.read_until(b"typed\r\n")
    s.send(close_stdin=True)
    assert s.finish().exit_code == 0
    s.close()


def test_resize_without_a_terminal_is_invalid_argument(sbx, fresh):
    s = start(sbx, fresh, ["sleep", "1000"])
    s.next_event()
    s.send(resize=pb.PtySize(rows=10, cols=10))
    e = _error_of(s)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "terminal" in e.details(), e
    assert wait_until(lambda: not _sleeps(sbx, fresh), timeout=10.0, interval=0.2)


def test_half_a_terminal_size_is_invalid_argument(sbx, box):
    s = on_pty(sbx, box, ["true"], rows=24, cols=0)
    assert _error_of(s).code() == grpc.StatusCode.INVALID_ARGUMENT
