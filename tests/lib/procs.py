"""Running the project's binaries, and watching processes on the host.

A `ManagedProcess` runs one binary with a controlled environment, drains its
stdout and stderr in background threads (so a pipe never fills and blocks the
program) and keeps every line for assertions. Every wait has a timeout;
`stop()` always ends the process (SIGTERM, then SIGKILL as a last resort).

Paths of the build outputs come from the environment, with defaults inside
the repository (the plain build's output tree):

    SANDBOX_GATEWAY_BIN       <repo>/bazel-out/k8-fastbuild/bin/gateway/sandbox-gateway
    SANDBOX_SHIM_BIN          <repo>/bazel-out/k8-fastbuild/bin/shim/sandbox-shim
    SANDBOX_PY_STUBS          <repo>/bazel-out/k8-fastbuild/bin/proto/py
    SANDBOX_STD_DESCRIPTORS   <repo>/bazel-out/k8-fastbuild/bin/proto/std_descriptors.pb
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# How long a binary may take to report that it is ready (generous: sanitizer
# builds start slowly).
START_TIMEOUT_S = float(os.environ.get("SANDBOX_TEST_START_TIMEOUT", "30"))
# Extra time allowed beyond a configured grace period before a process that
# was sent SIGTERM counts as hung.
EXIT_MARGIN_S = 5.0
# The gateway's default SANDBOX_SHUTDOWN_GRACE_SECONDS.
DEFAULT_GRACE_S = 10.0

# Variables of the parent environment that must not leak into a binary under
# test: the tests decide every setting themselves.
_CONTROLLED_PREFIXES = ("SANDBOX_", "CLOUD_RUN_SANDBOX_")


# --- build outputs -----------------------------------------------------------

# The plain build's output tree. `bazel-bin` points at whichever
# configuration was built last (e.g. --config=asan); this does not move.
PLAIN_BIN = "bazel-out/k8-fastbuild/bin"


def _path_from_env(var: str, default_rel: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else REPO_ROOT / default_rel


def gateway_binary() -> Path:
    return _path_from_env("SANDBOX_GATEWAY_BIN", f"{PLAIN_BIN}/gateway/sandbox-gateway")


def shim_binary() -> Path:
    return _path_from_env("SANDBOX_SHIM_BIN", f"{PLAIN_BIN}/shim/sandbox-shim")


def py_stubs_dir() -> Path:
    return _path_from_env("SANDBOX_PY_STUBS", f"{PLAIN_BIN}/proto/py")


def std_descriptors_path() -> Path:
    return _path_from_env("SANDBOX_STD_DESCRIPTORS", f"{PLAIN_BIN}/proto/std_descriptors.pb")


def require_file(path: Path, hint: str) -> Path:
    """Returns `path`, or raises FileNotFoundError explaining how to make it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; {hint}")
    return path


def _require_binary(path: Path, target: str, var: str) -> Path:
    require_file(path, f"build it with `bazel build {target}` or set {var}")
    if not os.access(path, os.X_OK):
        raise PermissionError(f"{path} is not executable")
    return path


def require_gateway_binary() -> Path:
    return _require_binary(gateway_binary(), "//gateway:sandbox-gateway", "SANDBOX_GATEWAY_BIN")


def require_shim_binary() -> Path:
    return _require_binary(shim_binary(), "//shim:sandbox-shim", "SANDBOX_SHIM_BIN")


# --- environment and ports ---------------------------------------------------

# Ports handed to servers that bind them later are taken below the kernel's
# ephemeral range (ip_local_port_range, 32768-60999 by default): a port the
# kernel picked for us is one it may hand to any outgoing connection before
# the server binds it, which made a shim fail "address in use" at start.
_FIXED_PORTS = (20000, 32000)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago on `host` and on 0.0.0.0, outside
    the ephemeral range (for tests that cannot use port 0)."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(*_FIXED_PORTS)
        if _bindable(host, port) and _bindable("0.0.0.0", port):
            return port
    raise RuntimeError(f"no free port in {_FIXED_PORTS}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def overlay_env(env: dict, extra: Optional[Mapping[str, Optional[str]]]) -> dict:
    """`env` (changed in place) with `extra` on top: a value of None removes
    the variable."""
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def base_env(extra: Optional[Mapping[str, Optional[str]]] = None) -> dict:
    """The parent environment without any SANDBOX_*/CLOUD_RUN_SANDBOX_*
    variable, plus `extra` (a value of None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONTROLLED_PREFIXES)}
    return overlay_env(env, extra)


# --- output of a running binary ----------------------------------------------

class LogStream:
    """Lines read from one pipe by a background thread.

    `lines` holds the raw text lines (without the newline). For programs that
    log JSON, `records()` gives the lines that parse as JSON objects and
    `wait_for()` waits for a record matching a predicate.
    """

    def __init__(self, pipe, name: str):
        self.name = name
        self.lines: list[str] = []
        self.eof = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._drain, args=(pipe,),
                                        name=f"drain-{name}", daemon=True)
        self._thread.start()

    def _drain(self, pipe) -> None:
        try:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()
            with self._cond:
                self.eof = True
                self._cond.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def snapshot(self) -> list[str]:
        with self._cond:
            return list(self.lines)

    def text(self) -> str:
        return "\n".join(self.snapshot())

    @staticmethod
    def parse(line: str) -> Optional[dict]:
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def records(self) -> list[dict]:
        return [r for r in (self.parse(l) for l in self.snapshot()) if r is not None]

    def find(self, predicate: Callable[[dict], bool]) -> list[dict]:
        return [r for r in self.records() if predicate(r)]

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float,
                 alive: Callable[[], bool] = lambda: True) -> Optional[dict]:
        """The first JSON record matching `predicate`, waiting up to `timeout`
        seconds. Returns None on timeout, at end of stream, or once `alive()`
        is false and no matching line has arrived."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                while seen < len(self.lines):
                    rec = self.parse(self.lines[seen])
                    seen += 1
                    if rec is not None and predicate(rec):
                        return rec
                if self.eof:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if not alive():
                    # The process is gone; its last lines may still be in the
                    # pipe, and EOF will follow shortly.
                    self._cond.wait(min(remaining, 1.0))
                    if seen >= len(self.lines):
                        return None
                    continue
                self._cond.wait(min(remaining, 0.2))


def assert_all_json_lines(lines: list[str]) -> list[dict]:
    """Every non-empty line is a JSON object with a valid severity and a
    string message; returns the records."""
    valid = {"DEBUG", "INFO", "WARNING", "ERROR"}
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        rec = LogStream.parse(line)
        assert rec is not None, f"stderr line {i + 1} is not a JSON object: {line!r}"
        assert rec.get("severity") in valid, f"stderr line {i + 1} has no valid severity: {line!r}"
        assert isinstance(rec.get("message"), str), f"stderr line {i + 1} has no message: {line!r}"
        records.append(rec)
    return records


# --- managed processes -------------------------------------------------------

class ProcessStartError(RuntimeError):
    pass


# Processes not stopped yet: killed when the interpreter exits, whatever
# happened to the tests.
_live: "weakref.WeakSet[ManagedProcess]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for p in list(_live):
        if p.alive():
            p.kill()


class ManagedProcess:
    """One running binary. Use as a context manager, or call stop()."""

    def __init__(self, argv: list[str], env: Mapping[str, str], name: Optional[str] = None,
                 stop_timeout: float = DEFAULT_GRACE_S + EXIT_MARGIN_S):
        self.argv = [str(a) for a in argv]
        self.name = name or Path(self.argv[0]).name
        self.env = dict(env)
        self.stop_timeout = stop_timeout
        self.killed = False  # True when stop() had to use SIGKILL
        # Set once the test (or stop()) sent a signal: an exit before that is
        # a crash or an unexpected exit.
        self.signalled = False
        # The exit code teardown expects after SIGTERM; None: do not check.
        self.expected_exit: Optional[int] = 0
        self._stop_callbacks: list[Callable[[], None]] = []
        self._after_stop_callbacks: list[Callable[[], None]] = []
        # Its own process group, so that a last-resort SIGKILL also reaches
        # anything it started.
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        _live.add(self)
        self.stdout = LogStream(self.proc.stdout, f"{self.name}-stdout")
        self.logs = LogStream(self.proc.stderr, f"{self.name}-stderr")

    # --- state -------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def vm_rss_kib(self) -> int:
        return vm_rss_kib(self.pid)

    # --- control -----------------------------------------------------------
    def on_stop(self, callback: Callable[[], None]) -> None:
        """Runs `callback` (e.g. closing client channels) before SIGTERM."""
        self._stop_callbacks.append(callback)

    def after_stop(self, callback: Callable[[], None]) -> None:
        """Runs `callback` (e.g. removing state) once the process has exited."""
        self._after_stop_callbacks.append(callback)

    def send_signal(self, sig: int) -> None:
        self.signalled = True
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code; raises subprocess.TimeoutExpired if still running."""
        rc = self.proc.wait(timeout=timeout)
        # Let the drain threads read the last lines.
        self.stdout.join(2.0)
        self.logs.join(2.0)
        return rc

    def stop(self, timeout: Optional[float] = None) -> int:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit code
        (negative: killed by that signal). Safe to call more than once."""
        callbacks, self._stop_callbacks = self._stop_callbacks, []
        for cb in callbacks:
            with contextlib.suppress(Exception):
                cb()
        if self.alive():
            self.send_signal(signal.SIGTERM)
        try:
            return self.wait(self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.killed = True
            self.kill()
            return self.wait(10.0)
        finally:
            _live.discard(self)
            after, self._after_stop_callbacks = self._after_stop_callbacks, []
            for cb in after:
                with contextlib.suppress(Exception):
                    cb()

    def kill(self) -> None:
        """SIGKILL to the process and its process group."""
        self.signalled = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    # --- diagnostics -------------------------------------------------------
    def describe(self, max_lines: int = 300) -> str:
        """Exit state and the last lines of output, for failure messages."""
        rc = self.returncode
        state = "running" if rc is None else f"exited with {rc}"
        if self.killed:
            state += " (SIGKILLed after not stopping on SIGTERM)"
        parts = [f"{self.name} (pid {self.pid}) {state}"]
        for stream in (self.logs, self.stdout):
            lines = stream.snapshot()
            if lines:
                shown = lines[-max_lines:]
                skipped = len(lines) - len(shown)
                header = f"--- {stream.name} ({len(lines)} lines" + (
                    f", first {skipped} omitted" if skipped else "") + ") ---"
                parts.append(header)
                parts.extend(shown)
        return "\n".join(parts)

    def report_sections(self) -> list[tuple[str, str]]:
        return [(self.name, self.describe())]


def stop_problems(*procs: ManagedProcess, check_leftovers: bool = False) -> list[str]:
    """Stops the processes (SIGTERM), in the order given; returns what went
    wrong instead of raising, so that everything is stopped first: a process
    that ended before it was signalled, an exit code other than its
    `expected_exit` (None: not checked), and with `check_leftovers` what a
    cleanly stopped process's `leftovers()` still finds."""
    problems = []
    for p in procs:
        died_early = p.returncode is not None and not p.signalled
        rc = p.stop()
        if p.expected_exit is None:
            continue
        if died_early:
            problems.append(f"{p.name} ended during the test (exit {rc})\n{p.describe()}")
        elif rc != p.expected_exit:
            problems.append(f"{p.name} exited {rc} on SIGTERM, expected {p.expected_exit}\n"
                            f"{p.describe()}")
        elif check_leftovers:
            left = p.leftovers()
            if left:
                problems.append(f"{p.name} left behind: {left}")
    return problems


def stop_checked(*procs: ManagedProcess, check_leftovers: bool = False) -> None:
    """`stop_problems`, failing the test (or fixture teardown) with the
    processes' logs when there are any."""
    problems = stop_problems(*procs, check_leftovers=check_leftovers)
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


def run_to_completion(argv: list[str], env: Mapping[str, str],
                      timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs a binary that is expected to exit by itself (e.g. --help, a bad
    configuration); raises subprocess.TimeoutExpired (after killing it) when
    it does not."""
    return subprocess.run([str(a) for a in argv], env=dict(env), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, text=True, errors="replace")


def run(argv: list[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Runs a host command (text output captured)."""
    return subprocess.run(argv, check=check, timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """Polls `predicate` until it returns a truthy value or `timeout` passes;
    returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


# --- host processes ----------------------------------------------------------

def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (a zombie is dead; reaping
    it is its parent's business)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def vm_rss_kib(pid: int) -> int:
    """The resident memory of `pid` (VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Repeater:
    """Calls `step()` every `interval` seconds in a background thread for
    the duration of a `with` block; at its end the thread is stopped and
    joined (waiting up to `join_timeout` seconds)."""

    def __init__(self, interval: float, join_timeout: float = 5.0):
        self.interval = interval
        self.join_timeout = join_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(self.join_timeout)
        return False


class RssSampler(Repeater):
    """Samples the VmRSS of a process (a pid, or anything with a `pid`) every
    `interval` seconds during a `with` block: `start_kib` when made,
    `peak_kib` the largest value seen, `samples` how many were taken."""

    def __init__(self, process: Union[int, Any], interval: float = 0.05):
        super().__init__(interval)
        self.pid = getattr(process, "pid", process)
        self.start_kib = vm_rss_kib(self.pid)
        self.peak_kib = self.start_kib
        self.samples = 0

    def step(self, count: bool = True) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.peak_kib = max(self.peak_kib, vm_rss_kib(self.pid))
            self.samples += count

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.step(count=False)
        return False

    @property
    def peak_bytes(self) -> int:
        return self.peak_kib * 1024

    @property
    def growth_mib(self) -> float:
        """Peak minus the value when made, in MiB."""
        return (self.peak_kib - self.start_kib) / 1024.0
