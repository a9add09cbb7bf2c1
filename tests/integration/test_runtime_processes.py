"""Detached processes: started by Run with `detach`, they outlive the call;
their output waits in ring buffers for any number of attachers (replay,
then live); ListProcesses and SignalProcess find and stop them; limits and
ids hold against hostile use."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.integration.test_runtime_run import Session, _error_of, start
from tests.lib.client import SandboxClient, new_id, pb
from tests.lib.gateway import running_gateway
from tests.lib.procs import vm_rss_kib, wait_until

SERVER = ["python3", "-u", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
FETCH = ("import urllib.request, time\n"
         "for _ in range(100):\n"
         "    try:\n"
         "        print(urllib.request.urlopen('http://127.0.0.1:8000/').status); break\n"
         "    except OSError:\n"
         "        time.sleep(0.1)\n")


def detached(client, sid, argv, process_id="", **kw) -> Session:
    return start(client, sid, argv, detach=True, process_id=process_id, **kw)


def background(client, sid, argv, process_id="", **kw) -> pb.ProcessInfo:
    """Starts a detached process and leaves it: the starting call ends at
    once (the process runs on). Its ProcessInfo."""
    s = detached(client, sid, argv, process_id=process_id, **kw)
    s.next_event()
    s.call.cancel()
    s.close()
    return s.started


def attach(client, sid, process_id, replay=False, no_follow=False) -> Session:
    return Session(client, pb.ProcessInput(attach=pb.ProcessAttach(sandbox_id=sid, process_id=process_id,
                                                                   replay=replay, no_follow=no_follow)))


def drain(s: Session) -> Session:
    """Reads a call to its end (OK), exit event or not."""
    while True:
        try:
            s.next_event()
        except StopIteration:
            return s


def buffered(client, sid, process_id) -> Session:
    """The process's buffered output, read once (no follow)."""
    s = attach(client, sid, process_id, replay=True, no_follow=True)
    s.close()
    return drain(s)


def processes(client, sid) -> dict:
    resp = client.stub.ListProcesses(pb.ListProcessesRequest(sandbox_id=sid), metadata=client.md, timeout=30)
    return {p.process_id: p for p in resp.processes}


def signal(client, sid, process_id, sig):
    client.stub.SignalProcess(pb.SignalProcessRequest(sandbox_id=sid, process_id=process_id, signal=sig),
                              metadata=client.md, timeout=30)


@pytest.fixture
def fresh(sbx):
    sid = new_id("proc")
    sbx.launch(sid)
    return sid


def test_a_detached_server_outlives_its_call_and_is_found_attached_and_stopped(sbx, fresh):
    s = detached(sbx, fresh, SERVER, process_id="web")
    s.next_event()
    assert s.started.process_id == "web" and s.started.detached and s.started.running
    s.call.cancel()  # the starting stream goes; the server stays
    s.close()

    out = sbx.exec(fresh, ["python3", "-c", FETCH], timeout_seconds=60)
    assert out.out.strip() == "200", out.describe()

    info = processes(sbx, fresh)["web"]
    assert info.running and info.detached and info.pid > 0 and list(info.argv) == SERVER
    assert not info.HasField("exit")

    a = attach(sbx, fresh, "web", replay=True)
    a.next_event()
    while b"GET / HTTP" not in a.stderr:  # its log (stderr): the request above, replayed
        a.next_event()
    a.call.cancel()
    a.close()

    signal(sbx, fresh, "web", 15)
    assert wait_until(lambda: not processes(sbx, fresh)["web"].running, timeout=10.0, interval=0.1)
    info = processes(sbx, fresh)["web"]
    assert (info.exit.exit_code, info.exit.signal) == (-1, 15), info
    with pytest.raises(grpc.RpcError) as ei:
        signal(sbx, fresh, "web", 15)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_starting_call_sees_output_and_exit_like_an_attachment(sbx, fresh):
    s = detached(sbx, fresh, ["sh", "-c", "echo one; echo two >&2; exit 4"])
    ex = s.finish()
    assert ex.exit_code == 4 and s.stdout == b"one\n" and s.stderr == b"two\n", (ex, s.stdout, s.stderr)
    assert s.started.process_id  # generated
    s.close()
    info = processes(sbx, fresh)[s.started.process_id]
    assert not info.running and info.exit.exit_code == 4


def test_attach_without_replay_sees_only_what_comes_after(sbx, fresh):
    s = detached(sbx, fresh, ["sh", "-c", "echo early; read x; echo late $x"], process_id="w")
    s.read_until(b"early\n")
    a = attach(sbx, fresh, "w")
    a.next_event()
    a.send(stdin=b"input\n")  # stdin from any attacher goes to the process
    ex = a.finish()
    assert ex.exit_code == 0 and a.stdout == b"late input\n", a.stdout
    a.close()
    s.call.cancel()
    s.close()


def test_two_attachers_both_see_live_output(sbx, fresh):
    background(sbx, fresh, ["sh", "-c", "while :; do echo tick; sleep 0.05; done"], process_id="ticker")
    a, b = attach(sbx, fresh, "ticker"), attach(sbx, fresh, "ticker")
    a.read_until(b"tick\n")
    b.read_until(b"tick\n")
    for x in (a, b):
        x.call.cancel()
        x.close()
    assert processes(sbx, fresh)["ticker"].running, "attachers leaving stopped the process"
    signal(sbx, fresh, "ticker", 9)


def test_a_detached_process_on_a_terminal(sbx, fresh):
    s = detached(sbx, fresh, ["sh"], process_id="tty", pty=pb.PtySize(rows=30, cols=100))
    s.next_event()
    s.send(stdin=b"stty size; tty\n")
    s.read_until(b"/dev/pts/")
    assert b"30 100" in s.stdout
    s.send(resize=pb.PtySize(rows=31, cols=101))
    s.send(stdin=b"stty size\n")
    s.read_until(b"31 101")
    s.send(close_stdin=True)  # Ctrl-D: the shell exits
    assert s.finish().exit_code == 0
    s.close()


def test_the_ring_keeps_the_newest_output_and_counts_what_it_dropped(gateway_secret):
    with running_gateway({"SANDBOX_PROCESS_BUFFER_BYTES": "4096"}, secret=gateway_secret) as gw:
        c = SandboxClient(gw)
        try:
            sid = new_id("ring")
            c.launch(sid)
            background(c, sid, ["seq", "1", "100000"], process_id="seq")
            assert wait_until(lambda: not processes(c, sid)["seq"].running, timeout=30.0, interval=0.1)
            info = processes(c, sid)["seq"]
            total = sum(len(f"{i}\n") for i in range(1, 100001))
            assert info.output_dropped_bytes == total - 4096, info
            a = attach(c, sid, "seq", replay=True)
            ex = a.finish()
            assert ex.exit_code == 0 and len(a.stdout) == 4096 and a.stdout.endswith(b"\n99999\n100000\n")
            a.close()
        finally:
            c.cleanup()


def test_output_nobody_reads_costs_bounded_memory(sbx, fresh):
    before = vm_rss_kib(sbx.gw.pid)
    background(sbx, fresh, ["yes", "spew"], process_id="spew")
    time.sleep(2.0)  # `yes` writes hundreds of MiB meanwhile
    info = processes(sbx, fresh)["spew"]
    assert info.running and info.output_dropped_bytes > 64 << 20, info
    grew = vm_rss_kib(sbx.gw.pid) - before
    assert grew < 32 << 10, f"the gateway grew {grew} KiB"  # the two 1 MiB rings, not the output
    signal(sbx, fresh, "spew", 9)


def test_the_65th_running_process_is_refused(sbx, fresh):
    for i in range(64):
        background(sbx, fresh, ["sleep", "1000"], process_id=f"s{i}")
    e = _error_of(detached(sbx, fresh, ["sleep", "1000"], process_id="one-too-many"))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "64" in e.details(), e
    assert sum(p.running for p in processes(sbx, fresh).values()) == 64


def test_ids_are_checked_and_unique(sbx, fresh):
    e = _error_of(detached(sbx, fresh, ["true"], process_id="../etc"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    s = detached(sbx, fresh, ["sleep", "1000"], process_id="same")
    s.next_event()
    e = _error_of(detached(sbx, fresh, ["true"], process_id="same"))
    assert e.code() == grpc.StatusCode.ALREADY_EXISTS
    s.call.cancel()
    s.close()


def test_another_sandboxs_process_is_not_found(sbx, fresh):
    other = new_id("proc-other")
    sbx.launch(other)
    background(sbx, other, ["sleep", "1000"], process_id="theirs")
    assert _error_of(attach(sbx, fresh, "theirs")).code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as ei:
        signal(sbx, fresh, "theirs", 9)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert "theirs" not in processes(sbx, fresh)
    assert processes(sbx, other)["theirs"].running


def test_delete_kills_detached_processes_and_forgets_them(sbx, fresh):
    background(sbx, fresh, ["sleep", "1000"], process_id="doomed")
    sbx.delete(fresh)
    with pytest.raises(grpc.RpcError) as ei:
        processes(sbx, fresh)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    sbx.launch(fresh)  # the id is free again, with no processes
    assert processes(sbx, fresh) == {}


@pytest.mark.parametrize("counts", [False, True])
def test_a_detached_process_keeps_its_sandbox_from_idling_only_when_configured(gateway_secret, counts):
    env = {"SANDBOX_IDLE_TTL": "2", "SANDBOX_IDLE_TTL_COUNTS_PROCESSES": "true" if counts else "false"}
    with running_gateway(env, secret=gateway_secret) as gw:
        c = SandboxClient(gw)
        try:
            sid = new_id("idle-proc")
            c.launch(sid)
            background(c, sid, ["sleep", "1000"], process_id="bg")
            gone = wait_until(lambda: sid not in c.ids(), timeout=6.0, interval=0.2)  # List is no use
            assert bool(gone) == (not counts), c.ids()
        finally:
            c.cleanup()


def test_an_attacher_that_stops_sending_leaves_the_process_stdin_open(sbx, fresh):
    background(sbx, fresh, ["cat"], process_id="cat")
    a = attach(sbx, fresh, "cat")
    a.next_event()
    a.close()  # half-close: this attacher has no more input
    b = attach(sbx, fresh, "cat")
    b.next_event()
    b.send(stdin=b"still open\n")
    b.read_until(b"still open\n")
    b.send(close_stdin=True)  # only an explicit close ends it
    assert b.finish().exit_code == 0
    b.close()
    a.call.cancel()


def test_stdin_to_an_exited_or_closed_process_is_failed_precondition(sbx, fresh):
    background(sbx, fresh, ["true"], process_id="gone")
    assert wait_until(lambda: not processes(sbx, fresh)["gone"].running, 10.0)
    a = attach(sbx, fresh, "gone", no_follow=True)
    a.send(stdin=b"late\n")
    a.close()
    e = _error_of(a)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
    assert "no more input" in e.details()

    background(sbx, fresh, ["sleep", "100"], process_id="shut")
    b = attach(sbx, fresh, "shut")
    b.send(close_stdin=True)
    b.send(stdin=b"after close\n")
    b.close()
    e = _error_of(b)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
    assert processes(sbx, fresh)["shut"].running  # refused input changes nothing


def test_attach_without_follow_sends_the_buffer_and_ends(sbx, fresh):
    background(sbx, fresh, ["sh", "-c", "echo one; echo two >&2; exec cat"], process_id="log")
    assert wait_until(lambda: b"two" in buffered(sbx, fresh, "log").stderr, 10.0)
    a = buffered(sbx, fresh, "log")
    assert a.started.running and a.exit is None  # it runs on: no exit event
    assert a.stdout == b"one\n" and a.stderr == b"two\n"

    # Input through a call that does not follow: taken, then the call ends OK.
    w = attach(sbx, fresh, "log", no_follow=True)
    w.send(stdin=b"three\n")
    w.close()
    drain(w)
    assert wait_until(lambda: b"three" in buffered(sbx, fresh, "log").stdout, 10.0)

    # Once exited, the buffer then the exit event.
    signal(sbx, fresh, "log", 15)
    assert wait_until(lambda: not processes(sbx, fresh)["log"].running, 10.0)
    z = buffered(sbx, fresh, "log")
    assert z.stdout == b"one\nthree\n" and z.exit is not None and z.exit.signal == 15
