"""Code contexts: stateful cells in Jupyter kernels running inside the
sandbox, with rich results (charts, tables), errors, interrupts, timeouts,
kernels that die, a second kernelspec, the per-sandbox cap and contexts
dying with their sandbox. One gateway and one sandbox are shared by the
module (a kernel takes about a second to start)."""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import threading
import time
import zlib
from pathlib import Path

import grpc
import pytest

from tests.lib import code
from tests.lib.client import LAUNCH_TIMEOUT_S, new_id, pb, sandbox_client
from tests.lib.gateway import commands_in, holder_pids, running_gateway
from tests.lib.procs import wait_until
from tests.lib.shim import running_shim

MAX_CONTEXTS = 4
MEMORY_MB = 768


@pytest.fixture(scope="module")
def gwc(gateway_secret):
    env = {"SANDBOX_MAX_CONTEXTS": str(MAX_CONTEXTS), "SANDBOX_MEMORY_MB": str(MEMORY_MB)}
    with running_gateway(env, secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gwc):
    with sandbox_client(gwc) as c:
        yield c


@pytest.fixture(scope="module")
def sid(client):
    return client.launch().sandbox_id


@pytest.fixture(scope="module")
def ctx(client, sid):
    return code.create(client, sid).context_id


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """The chunks of a PNG, each CRC-checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[-1][0] == b"IEND"
    return chunks


def test_state_is_kept_between_cells(client, sid, ctx):
    first = code.run(client, sid, "x = 1", context_id=ctx)
    assert first.error is None and first.end.execution_count >= 1
    cell = code.run(client, sid, "x += 1; x", context_id=ctx)
    assert cell.main is not None and cell.main.text == "2"
    assert cell.end.execution_count == first.end.execution_count + 1


def test_a_context_sees_the_launch_env_beneath_its_own(client):
    """The launch env is the default of code contexts as of commands: a
    context's own env wins over it, the default context has it as is."""
    sid = new_id("cenv")
    client.created.append(sid)
    client.stub.Launch(pb.LaunchRequest(sandbox_id=sid, env={"FROM_LAUNCH": "launch", "BOTH": "launch"}),
                       metadata=client.md, timeout=60)
    try:
        cell = code.run(client, sid, "import os; os.environ['FROM_LAUNCH'] + '/' + os.environ['BOTH']")
        assert cell.error is None and cell.main.text == "'launch/launch'", cell.events
        own = code.create(client, sid, env={"BOTH": "context"}).context_id
        cell = code.run(client, sid, "import os; os.environ['FROM_LAUNCH'] + '/' + os.environ['BOTH']",
                        context_id=own)
        assert cell.error is None and cell.main.text == "'launch/context'", cell.events
    finally:
        client.delete(sid)


def test_two_contexts_do_not_share_variables_and_restart_forgets(client, sid, ctx):
    other = code.create(client, sid).context_id
    try:
        code.run(client, sid, "y = 'mine'", context_id=ctx)
        cell = code.run(client, sid, "y", context_id=other)
        assert cell.error is not None and cell.error.name == "NameError"
        code.run(client, sid, "z = 5", context_id=other)
        code.restart(client, sid, other)
        cell = code.run(client, sid, "z", context_id=other)
        assert cell.error is not None and cell.error.name == "NameError"
        assert code.run(client, sid, "y", context_id=ctx).main.text == "'mine'"
    finally:
        code.delete(client, sid, other)
    ids = [c.context_id for c in code.contexts(client, sid).contexts]
    assert other not in ids and ctx in ids


def test_matplotlib_chart_is_a_valid_png(client, sid, ctx):
    cell = code.run(client, sid, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()", context_id=ctx)
    assert cell.error is None, cell.error
    pngs = [r.png for r in cell.results if r.png]
    assert len(pngs) == 1 and not cell.results[0].is_main_result
    chunks = png_chunks(pngs[0])
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert chunks[0][0] == b"IHDR" and 100 <= width <= 4000 and 100 <= height <= 4000
    zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))


def test_dataframe_gives_html_and_text(client, sid, ctx):
    cell = code.run(client, sid, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
                    context_id=ctx)
    main = cell.main
    assert main is not None and "<table" in main.html and "</table>" in main.html
    assert "a" in main.text and "x" in main.text


def test_display_results_keep_order_with_print_between(client, sid, ctx):
    cell = code.run(client, sid, "from IPython.display import display\n"
                    "display('first'); print('between', flush=True); display('second')", context_id=ctx)
    kinds = [k for k in cell.kinds() if k in ("result", "stdout")]
    assert kinds == ["result", "stdout", "result"], cell.events
    assert [r.text for r in cell.results] == ["'first'", "'second'"]
    assert not any(r.is_main_result for r in cell.results)
    assert cell.stdout == "between\n"


def test_errors_give_name_and_traceback_and_the_context_works_after(client, sid, ctx):
    cell = code.run(client, sid, "1/0", context_id=ctx)
    assert cell.error.name == "ZeroDivisionError" and "division" in cell.error.value
    assert any("ZeroDivisionError" in line for line in cell.error.traceback)
    cell = code.run(client, sid, "def f(:\n  pass", context_id=ctx)
    assert cell.error.name == "SyntaxError" and cell.error.traceback
    assert code.run(client, sid, "6 * 7", context_id=ctx).main.text == "42"


def test_timeout_interrupts_with_keyboard_interrupt(client, sid, ctx):
    cell = code.run(client, sid, "import time; time.sleep(100)", context_id=ctx, timeout_seconds=1)
    assert cell.error is not None and cell.error.name == "KeyboardInterrupt"
    assert not cell.end.restarted and "timed out" in cell.end.message
    assert code.run(client, sid, "x", context_id=ctx).main.text == "2"


def test_cancel_interrupts_and_the_context_survives(client, sid, ctx):
    call = code.run_call(client, sid, "import time; time.sleep(100)", context_id=ctx)
    threading.Timer(1.0, call.cancel).start()
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert e.value.code() == grpc.StatusCode.CANCELLED
    cell = code.run(client, sid, "x", context_id=ctx)
    assert cell.main.text == "2" and not cell.end.restarted


def test_a_cell_ignoring_sigint_past_its_timeout_restarts_the_kernel(client, sid):
    cid = code.create(client, sid).context_id
    try:
        code.run(client, sid, "kept = 1", context_id=cid)
        cell = code.run(client, sid, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                        "time.sleep(100)", context_id=cid, timeout_seconds=1)
        assert cell.end.restarted and "restarted" in cell.end.message
        cell = code.run(client, sid, "kept", context_id=cid)
        assert cell.error.name == "NameError"
        assert code.run(client, sid, "1 + 1", context_id=cid).main.text == "2"
    finally:
        code.delete(client, sid, cid)


def test_a_cancelled_cell_ignoring_sigint_stops_its_kernel_and_the_next_cell_starts_one(gwc, client, sid):
    """Nobody waits for a new kernel after a cancel: the one that did not
    stop is stopped, and the next cell starts a fresh one and says why."""
    cid = code.create(client, sid).context_id
    try:
        code.run(client, sid, "kept = 1", context_id=cid)
        threads = zmq_threads(gwc.pid)
        call = code.run_call(client, sid, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                             "time.sleep(100)", context_id=cid)
        threading.Timer(1.0, call.cancel).start()
        with pytest.raises(grpc.RpcError) as e:
            list(call)
        assert e.value.code() == grpc.StatusCode.CANCELLED
        # CODE_INTERRUPT_GRACE_MS (3 s) after the interrupt, the kernel goes.
        assert wait_until(lambda: zmq_threads(gwc.pid) == threads - 2, 8, interval=0.1)
        cell = code.run(client, sid, "kept", context_id=cid)
        assert cell.error.name == "NameError" and cell.end.restarted
        assert "did not stop" in cell.end.message, cell.end.message
    finally:
        code.delete(client, sid, cid)


def test_a_kernel_killed_by_the_memory_limit_is_a_clear_error_and_restarts(client, sid):
    cid = code.create(client, sid).context_id
    try:
        cell = code.run(client, sid, f"b = b'x' * ({MEMORY_MB * 2} * 1024 * 1024)", context_id=cid)
        assert cell.error is not None and cell.error.name == "KernelDied", cell.events
        assert "out of memory" in cell.error.value and "restarts" in cell.end.message
        cell = code.run(client, sid, "3 * 3", context_id=cid)
        assert cell.main.text == "9" and cell.end.restarted and "out of memory" in cell.end.message
    finally:
        code.delete(client, sid, cid)


def test_output_over_the_frame_cap_fails_the_cell_at_once_and_the_next_cell_says_it_restarted(client, sid):
    """One stream message of 20 MiB is over JMSG_FRAME_MAX (8 MiB): libzmq
    drops the iopub connection for good, the call fails then (not at its
    timeout), and the next cell runs on a new kernel and says why."""
    cid = code.create(client, sid).context_id
    try:
        code.run(client, sid, "kept = 1", context_id=cid)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            code.run(client, sid, "print('x' * (20 << 20))", context_id=cid, timeout_seconds=60)
        assert time.monotonic() - t0 < 10
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "`iopub` connection was dropped" in e.value.details() and "JMSG_FRAME_MAX" in e.value.details()
        cell = code.run(client, sid, "kept", context_id=cid)
        assert cell.error is not None and cell.error.name == "NameError"
        assert cell.end.restarted and "JMSG_FRAME_MAX" in cell.end.message, cell.end.message
    finally:
        code.delete(client, sid, cid)


ECHO_KERNEL = '''
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel


class EchoKernel(Kernel):
    implementation = "echo"
    implementation_version = "1"
    language_info = {"name": "echo", "mimetype": "text/plain", "file_extension": ".txt"}
    banner = "echo"

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False):
        self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": code[::-1]})
        self.send_response(self.iopub_socket, "execute_result", {
            "execution_count": self.execution_count, "metadata": {},
            "data": {"text/plain": str(len(code))}})
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}


IPKernelApp.launch_instance(kernel_class=EchoKernel)
'''


def test_a_second_kernelspec_is_listed_and_runs(client, sid):
    spec_dir = "/root/.local/share/jupyter/kernels/echo"
    client.write_file(sid, spec_dir + "/echo_kernel.py", ECHO_KERNEL.encode(), make_parents=True)
    client.write_file(sid, spec_dir + "/kernel.json", json.dumps({
        "argv": ["/usr/bin/python3", spec_dir + "/echo_kernel.py", "-f", "{connection_file}"],
        "display_name": "Echo", "language": "echo"}).encode(), make_parents=True)
    assert {"python3", "echo"} <= set(code.contexts(client, sid).languages)
    cell = code.run(client, sid, "hello", language="echo")
    assert cell.stdout == "olleh" and cell.main.text == "5", cell.events
    echo = [c for c in code.contexts(client, sid).contexts if c.language == "echo"]
    assert len(echo) == 1 and echo[0].is_default
    code.delete(client, sid, echo[0].context_id)


# A kernel wrapper that, the first time only, has a process of the sandbox
# listen on the shell port it was handed before it starts ipykernel there:
# the kernel then fails to bind for real, as when a server of the sandbox
# happens to hold one of the ports the gateway picked.
PORT_TAKER = '''
import json, os, socket, sys, time
conn = json.load(open(sys.argv[1]))
if not os.path.exists("/tmp/port-taken-once"):
    open("/tmp/port-taken-once", "w").close()
    s = socket.socket()
    s.bind(("127.0.0.1", conn["shell_port"]))
    s.listen()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(60)
        os._exit(0)
    s.close()
os.execv("/usr/bin/python3", ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", sys.argv[1]])
'''


def _spec(client, sid, name: str, argv: list[str]) -> None:
    client.write_file(sid, f"/root/.local/share/jupyter/kernels/{name}/kernel.json", json.dumps({
        "argv": argv, "display_name": name, "language": "python"}).encode(), make_parents=True)


def test_a_kernel_whose_port_is_taken_starts_on_other_ports(client, sid):
    client.write_file(sid, "/root/port_taker.py", PORT_TAKER.encode())
    _spec(client, sid, "taken", ["/usr/bin/python3", "/root/port_taker.py", "{connection_file}"])
    cell = code.run(client, sid, "6 * 7", language="taken")
    assert cell.main.text == "42", cell.events
    assert client.exec(sid, ["test", "-e", "/tmp/port-taken-once"]).code == 0
    for c in code.contexts(client, sid).contexts:
        if c.language == "taken":
            code.delete(client, sid, c.context_id)


def test_a_kernel_that_exits_at_start_is_named_with_its_last_words(client, sid):
    _spec(client, sid, "dies", ["/bin/sh", "-c", "echo 'ImportError: no module named nothing_here' >&2; exit 3",
                                "{connection_file}"])
    with pytest.raises(grpc.RpcError) as e:
        code.create(client, sid, language="dies")
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "exited with status 3: ImportError: no module named nothing_here" in e.value.details()
    assert [c for c in code.contexts(client, sid).contexts if c.language == "dies"] == []
    assert connection_files(client, sid) == []  # a failed start removes it too


@pytest.mark.parametrize("call", ["CreateContext", "RunCode"])
def test_cancelling_a_call_while_its_kernel_starts_stops_the_start(gwc, client, sid, call):
    """A kernel that never answers (a copy of sleep, one process): the call
    is cancelled after 1 s of its start (CODE_START_MS is 60 s); the gateway
    stops the start within a couple of seconds — the kernel killed, its ZMQ
    threads gone, no context left — and the sandbox's code runs after."""
    client.exec(sid, ["cp", "/bin/sleep", "/root/slow-kernel"])
    _spec(client, sid, "slow", ["/root/slow-kernel", "300"])
    client.ids()
    threads = zmq_threads(gwc.pid)
    if call == "CreateContext":
        rpc = client.stub.CreateContext.future(pb.CreateContextRequest(sandbox_id=sid, language="slow"),
                                               metadata=client.md, timeout=120)
    else:
        rpc = code.run_call(client, sid, "1", language="slow")
    try:
        assert wait_until(lambda: "slow-kernel" in commands_in(gwc, sid), 10, interval=0.1), commands_in(gwc, sid)
        time.sleep(1)
        assert zmq_threads(gwc.pid) == threads + 2  # the start is under way
        rpc.cancel()
        t0 = time.monotonic()
        assert wait_until(lambda: "slow-kernel" not in commands_in(gwc, sid) and zmq_threads(gwc.pid) == threads,
                          10, interval=0.05), (commands_in(gwc, sid), zmq_threads(gwc.pid), threads)
        took = time.monotonic() - t0
        assert took < 2, took
    finally:
        rpc.cancel()
    assert [c for c in code.contexts(client, sid).contexts if c.language == "slow"] == []
    assert connection_files(client, sid) == []
    assert code.run(client, sid, "6 * 7").main.text == "42"


KERNELS_DIR = "/tmp/.sandbox-kernels"


def connection_files(client, sid) -> list[str]:
    """The connection files in the sandbox (each holds its kernel's key)."""
    return client.sh_out(sid, f"ls -A {KERNELS_DIR} 2>/dev/null || true").split()


def test_the_connection_file_is_gone_once_the_kernel_answers(client, sid):
    """The kernel reads its connection file (ports and HMAC key) at start;
    once it answers, the gateway removes it: the key is not left where any
    process of the sandbox can read it."""
    cid = code.create(client, sid).context_id
    try:
        cell = code.run(client, sid, "import os, sys\nf = sys.argv[sys.argv.index('-f') + 1]\n"
                        "(os.path.basename(f), os.path.exists(f))", context_id=cid)
        assert cell.main.text == f"('kernel-{cid}.json', False)", cell.events
        assert connection_files(client, sid) == []
        code.restart(client, sid, cid)
        assert connection_files(client, sid) == []
        assert code.run(client, sid, "1 + 2", context_id=cid).main.text == "3"
    finally:
        code.delete(client, sid, cid)


def test_unknown_language_is_not_found(client, sid):
    with pytest.raises(grpc.RpcError) as e:
        code.create(client, sid, language="no-such-kernel")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        code.create(client, sid, language="../python3")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_cap_gives_resource_exhausted_and_contexts_die_with_delete(client):
    sid = client.launch().sandbox_id
    for _ in range(MAX_CONTEXTS):
        code.create(client, sid)
    with pytest.raises(grpc.RpcError) as e:
        code.create(client, sid)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.get(sid).context_count == MAX_CONTEXTS
    client.delete(sid)
    with pytest.raises(grpc.RpcError) as e:
        code.contexts(client, sid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    client.launch(sid)
    assert list(code.contexts(client, sid).contexts) == []
    assert client.get(sid).context_count == 0
    client.delete(sid)


def test_the_total_cap_spans_sandboxes_and_deleting_one_frees_its_share(gateway_secret):
    """SANDBOX_MAX_CONTEXTS_TOTAL bounds the kernels (and the gateway threads
    they hold) of all sandboxes together, whatever each sandbox's own cap."""
    env = {"SANDBOX_MAX_CONTEXTS_TOTAL": "2", "SANDBOX_MEMORY_MB": str(MEMORY_MB)}
    with running_gateway(env, secret=gateway_secret, check=True) as gw, sandbox_client(gw) as c:
        first, second, third = (c.launch().sandbox_id for _ in range(3))
        code.create(c, first)
        code.create(c, second)
        with pytest.raises(grpc.RpcError) as e:
            code.create(c, third)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "SANDBOX_MAX_CONTEXTS_TOTAL" in e.value.details()
        assert c.get(third).context_count == 0
        c.delete(first)
        cell = code.run(c, third, "6 * 7")
        assert cell.main is not None and cell.main.text == "42"
        assert c.get(third).context_count == 1


def zmq_threads(pid: int) -> int:
    """The gateway's libzmq threads (ZMQbg/IO/0 and ZMQbg/Reaper: two per
    context)."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            n += (task / "comm").read_text().startswith("ZMQbg")
        except OSError:
            pass  # the thread ended meanwhile
    return n


def fds(pid: int) -> list[str]:
    """What the gateway's descriptors are (readlink of /proc/<pid>/fd/*)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return sorted(out)


def zmq_kinds(links: list[str]) -> list[str]:
    """Of `links`, the kinds a ZMQ context and its sockets hold (TCP sockets,
    its mailboxes' eventfds, its poller's epoll): a dead sandbox keeps its
    disk and its processes' pidfds until it is deleted, not these."""
    return [x for x in links if x.startswith(("socket:", "anon_inode:[eventfd]", "anon_inode:[eventpoll]"))]


def ends_by_idle(client, gw, sid):
    """Its idle TTL (3 s) passes; only List is polled (Get renews it)."""
    assert wait_until(lambda: sid not in client.ids(), 15, interval=0.2), f"{sid} did not expire"


def ends_by_holder_death(client, gw, sid):
    """Its pid 1 is killed from the host: the sandbox is dead until deleted."""
    os.kill(holder_pids(gw, expect=sid)[sid], signal.SIGKILL)
    assert wait_until(lambda: client.get(sid).dead, 10, interval=0.2), f"{sid} is not dead"


@pytest.mark.parametrize("ends", [ends_by_idle, ends_by_holder_death], ids=["idle_ttl", "holder_died"])
def test_contexts_end_at_once_with_their_sandbox_however_it_ends(gwc, client, ends):
    """Not only Delete: a sandbox that idles out or whose pid 1 dies takes
    its contexts (their kernels' ZMQ sockets and threads) with it, without
    waiting for another context to be made."""
    client.ids()  # the client's connection is made before the count
    threads, links = zmq_threads(gwc.pid), fds(gwc.pid)
    sid = new_id("ctx-end")
    client.created.append(sid)
    ttl = 3 if ends is ends_by_idle else 0
    client.stub.Launch(pb.LaunchRequest(sandbox_id=sid, idle_ttl_seconds=ttl,
                                        persist_on_expiry=pb.PERSIST_ON_EXPIRY_NO),
                       metadata=client.md, timeout=LAUNCH_TIMEOUT_S)
    try:
        code.create(client, sid)
        assert code.run(client, sid, "1 + 1").main.text == "2"  # a second, default context
        assert client.get(sid).context_count == 2
        assert zmq_threads(gwc.pid) == threads + 4
        ends(client, gwc, sid)
        # The reaper and the idler look once a second.
        assert wait_until(lambda: zmq_threads(gwc.pid) == threads, 5, interval=0.1), (threads, zmq_threads(gwc.pid))
        assert wait_until(lambda: len(zmq_kinds(fds(gwc.pid))) <= len(zmq_kinds(links)), 5, interval=0.1), \
            (zmq_kinds(links), zmq_kinds(fds(gwc.pid)))
        if sid in client.ids():
            assert client.get(sid).context_count == 0
            client.delete(sid)
        assert wait_until(lambda: len(fds(gwc.pid)) <= len(links), 5, interval=0.1), (links, fds(gwc.pid))
    finally:
        if sid in client.ids():
            client.delete(sid)


# --- REST (sandbox-shim) --------------------------------------------------------

@pytest.fixture(scope="module")
def shimc(gwc):
    with running_shim(gwc, check=True) as s:
        yield s


CHART = ("import matplotlib.pyplot as plt\nprint('drawing')\nplt.plot([0, 1], [1, 0]); plt.show()\n"
         "import pandas as pd\npd.DataFrame({'v': [1]})")


def test_rest_code_answers_one_json_document_with_base64_images(shimc, sid):
    resp = shimc.request("POST", f"/sandboxes/{sid}/code", {"code": CHART}, timeout=120)
    assert resp.status == 200, resp
    doc = resp.json()
    assert {"results", "logs", "error", "execution_count"} <= set(doc)
    assert doc["logs"] == {"stdout": ["drawing\n"], "stderr": []} and doc["error"] is None
    png = [r for r in doc["results"] if "png" in r]
    assert len(png) == 1 and not png[0]["is_main_result"]
    png_chunks(base64.b64decode(png[0]["png"]))
    main = [r for r in doc["results"] if r["is_main_result"]]
    assert len(main) == 1 and "<table" in main[0]["html"]
    err = shimc.request("POST", f"/sandboxes/{sid}/code", {"code": "raise ValueError('no')"}, timeout=120).json()
    assert err["error"]["name"] == "ValueError" and err["error"]["value"] == "no" and err["error"]["traceback"]


def test_rest_code_streams_ndjson_events_in_order(shimc, sid):
    resp = shimc.request("POST", f"/sandboxes/{sid}/code", {"code": CHART},
                         headers={"Accept": "application/x-ndjson"}, timeout=120)
    assert resp.status == 200 and "application/x-ndjson" in {k.lower(): v for k, v in dict(resp.headers).items()}.get("content-type", "")
    lines = [json.loads(line) for line in resp.body.decode().splitlines() if line]
    types = [e["type"] for e in lines]
    assert types[0] == "stdout" and types[-1] == "end" and types.count("result") == 2, types
    png = next(e for e in lines if e["type"] == "result" and "png" in e)
    png_chunks(base64.b64decode(png["png"]))


def test_rest_contexts_create_list_restart_delete(shimc, sid):
    resp = shimc.request("POST", f"/sandboxes/{sid}/contexts", {"language": "python3", "cwd": "/tmp"}, timeout=120)
    assert resp.status == 201, resp
    cid = resp.json()["context_id"]
    assert resp.json()["cwd"] == "/tmp"
    run = shimc.request("POST", f"/sandboxes/{sid}/code", {"code": "import os; q = 3; os.getcwd()",
                                                             "context_id": cid}, timeout=120).json()
    assert run["results"][0]["text"] == "'/tmp'"
    listed = shimc.request("GET", f"/sandboxes/{sid}/contexts").json()
    assert cid in [c["context_id"] for c in listed["contexts"]] and "python3" in listed["languages"]
    assert shimc.request("POST", f"/sandboxes/{sid}/contexts/{cid}/restart", timeout=120).status == 200
    run = shimc.request("POST", f"/sandboxes/{sid}/code", {"code": "q", "context_id": cid}, timeout=120).json()
    assert run["error"]["name"] == "NameError"
    assert shimc.request("DELETE", f"/sandboxes/{sid}/contexts/{cid}").status == 204
    assert shimc.request("DELETE", f"/sandboxes/{sid}/contexts/{cid}").status == 404
    assert shimc.request("POST", f"/sandboxes/{sid}/code", {"code": 5}).status == 422
    assert shimc.request("POST", f"/sandboxes/{sid}/code", {"code": "1", "timeout": -1}).status == 422
