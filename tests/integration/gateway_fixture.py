"""Start the project's real binaries for integration tests.

A `ManagedProcess` runs one binary with a controlled environment, drains its
stdout and stderr in background threads (so a pipe never fills and blocks the
program) and keeps every line for assertions. `Gateway` adds what is specific
to sandbox-gateway: it listens on a port picked by the kernel
(SANDBOX_LISTEN=127.0.0.1:0) and the port is read from the JSON log line
{"message": "listening", "port": N}.

Paths come from the environment, with defaults inside the repository:

    SANDBOX_GATEWAY_BIN       <repo>/bazel-out/k8-fastbuild/bin/gateway/sandbox-gateway
    SANDBOX_PY_STUBS          <repo>/bazel-out/k8-fastbuild/bin/proto/py
    SANDBOX_STD_DESCRIPTORS   <repo>/bazel-out/k8-fastbuild/bin/proto/std_descriptors.pb

Every wait has a timeout; `stop()` always ends the process (SIGTERM, then
SIGKILL as a last resort).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]

# How long a binary may take to report that it is ready (generous: sanitizer
# builds start slowly).
START_TIMEOUT_S = float(os.environ.get("SANDBOX_TEST_START_TIMEOUT", "30"))
# Default deadline of every RPC a test makes.
RPC_TIMEOUT_S = 10.0
# Extra time allowed beyond a configured grace period before a process that
# was sent SIGTERM counts as hung.
EXIT_MARGIN_S = 5.0
# The gateway's default SANDBOX_SHUTDOWN_GRACE_SECONDS.
DEFAULT_GRACE_S = 10.0

# Variables of the parent environment that must not leak into a binary under
# test: the tests decide every setting themselves.
_CONTROLLED_PREFIXES = ("SANDBOX_", "CLOUD_RUN_SANDBOX_")


# The plain build's output tree. `bazel-bin` points at whichever
# configuration was built last (e.g. --config=asan); this does not move.
PLAIN_BIN = "bazel-out/k8-fastbuild/bin"


def _path_from_env(var: str, default_rel: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else REPO_ROOT / default_rel


def gateway_binary() -> Path:
    return _path_from_env("SANDBOX_GATEWAY_BIN", f"{PLAIN_BIN}/gateway/sandbox-gateway")


def py_stubs_dir() -> Path:
    return _path_from_env("SANDBOX_PY_STUBS", f"{PLAIN_BIN}/proto/py")


def std_descriptors_path() -> Path:
    return _path_from_env("SANDBOX_STD_DESCRIPTORS", f"{PLAIN_BIN}/proto/std_descriptors.pb")


def require_file(path: Path, hint: str) -> Path:
    """Returns `path`, or raises FileNotFoundError explaining how to make it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; {hint}")
    return path


def require_gateway_binary() -> Path:
    path = require_file(gateway_binary(),
                        "build it with `bazel build //gateway:sandbox-gateway` "
                        "or set SANDBOX_GATEWAY_BIN")
    if not os.access(path, os.X_OK):
        raise PermissionError(f"{path} is not executable")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tests that cannot use port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def base_env(extra: Optional[Mapping[str, Optional[str]]] = None) -> dict:
    """The parent environment without any SANDBOX_*/CLOUD_RUN_SANDBOX_*
    variable, plus `extra` (a value of None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONTROLLED_PREFIXES)}
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


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


def _is_listening(rec: dict) -> bool:
    port = rec.get("port")
    return (rec.get("message") == "listening" and isinstance(port, int)
            and not isinstance(port, bool))


class Gateway(ManagedProcess):
    """A running sandbox-gateway. `port`, `target` are set once it listens."""

    def __init__(self, env: Mapping[str, str], args: Iterable[str] = (),
                 binary: Optional[Path] = None, name: str = "sandbox-gateway"):
        binary = binary or require_gateway_binary()
        grace = float(env.get("SANDBOX_SHUTDOWN_GRACE_SECONDS") or DEFAULT_GRACE_S)
        super().__init__([str(binary), *args], env, name=name,
                         stop_timeout=grace + EXIT_MARGIN_S)
        self.grace_seconds = grace
        self.secret = env.get("CLOUD_RUN_SANDBOX_GATEWAY_SECRET")
        self.port: Optional[int] = None
        self.host = "127.0.0.1"
        self.state_dir: Optional[str] = env.get("SANDBOX_STATE_DIR")
        self.cgroup_group: Optional[str] = env.get("SANDBOX_CGROUP_GROUP")
        self.listening_record: Optional[dict] = None
        self._channels: list = []
        self.on_stop(self.close_channels)
        self.after_stop(self.remove_state)

    @property
    def target(self) -> str:
        if self.port is None:
            raise RuntimeError("the gateway has not reported its port")
        return f"{self.host}:{self.port}"

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> int:
        rec = self.logs.wait_for(_is_listening, timeout, alive=self.alive)
        if rec is None:
            why = ("exited before listening" if not self.alive()
                   else f"did not log a \"listening\" line with a port within {timeout}s")
            detail = self.describe()
            self.stop(timeout=5.0)
            raise ProcessStartError(f"sandbox-gateway {why}\n{detail}")
        self.listening_record = rec
        self.port = rec["port"]
        return self.port

    def wait_accepting(self, port: int, timeout: float = START_TIMEOUT_S) -> int:
        """For a gateway started on a known port whose listening line may be
        hidden (e.g. SANDBOX_LOG_LEVEL=error): waits until the port accepts
        TCP connections, failing early if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise ProcessStartError(f"sandbox-gateway exited before accepting on port {port}\n"
                                        f"{self.describe()}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                if s.connect_ex((self.host, port)) == 0:
                    self.port = port
                    return port
            if time.monotonic() >= deadline:
                detail = self.describe()
                self.stop(timeout=5.0)
                raise ProcessStartError(f"sandbox-gateway did not accept on port {port} "
                                        f"within {timeout}s\n{detail}")
            time.sleep(0.05)

    # --- clients -------------------------------------------------------------
    def channel(self, options: Optional[list] = None):
        """An insecure channel to the gateway, closed when the gateway stops."""
        import grpc
        ch = grpc.insecure_channel(self.target, options=options or [])
        self._channels.append(ch)
        return ch

    def secure_channel(self, root_certificates: bytes, private_key: Optional[bytes] = None,
                       certificate_chain: Optional[bytes] = None,
                       server_name: str = "localhost", options: Optional[list] = None):
        """A TLS channel (optionally with a client certificate)."""
        import grpc
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates,
                                             private_key=private_key,
                                             certificate_chain=certificate_chain)
        opts = [("grpc.ssl_target_name_override", server_name)] + (options or [])
        ch = grpc.secure_channel(self.target, creds, options=opts)
        self._channels.append(ch)
        return ch

    def auth_metadata(self, token: Optional[str] = None) -> list[tuple[str, str]]:
        """`authorization: Bearer <token>` (the configured secret by default)."""
        token = self.secret if token is None else token
        return [("authorization", f"Bearer {token}")]

    def leftovers(self) -> list[str]:
        """Mounts below the state directory and cgroups of this instance that
        still exist: after a clean delete or shutdown there are none."""
        found = []
        if self.state_dir:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mp = line.split()[4]
                    if mp.startswith(self.state_dir + "/"):
                        found.append(f"mount {mp}")
        if self.cgroup_group:
            for root in Path("/sys/fs/cgroup").iterdir():
                g = root / self.cgroup_group
                if g.is_dir():
                    found += [f"cgroup {p}" for p in g.iterdir() if p.is_dir()]
        return found

    def remove_state(self) -> None:
        """Removes the private state directory and cgroup group (after the
        process has exited), unmounting anything a crash left."""
        if self.alive():
            return
        if self.state_dir and os.path.isdir(self.state_dir):
            with open("/proc/self/mountinfo") as f:
                mounts = [line.split()[4] for line in f
                          if line.split()[4].startswith(self.state_dir + "/")]
            for mp in sorted(mounts, key=len, reverse=True):
                subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.cgroup_group:
            for root in Path("/sys/fs/cgroup").iterdir():
                g = root / self.cgroup_group
                if g.is_dir():
                    for sub in sorted(g.rglob("*"), key=lambda p: len(str(p)), reverse=True):
                        if sub.is_dir():
                            with contextlib.suppress(OSError):
                                sub.rmdir()
                    with contextlib.suppress(OSError):
                        g.rmdir()

    def close_channels(self) -> None:
        channels, self._channels = self._channels, []
        for ch in channels:
            with contextlib.suppress(Exception):
                ch.close()


_instance_counter = itertools.count(1)


def gateway_env(env: Optional[Mapping[str, Optional[str]]] = None,
                secret: Optional[str] = None) -> dict:
    """Environment for a gateway on 127.0.0.1:0 with a private state
    directory and cgroup group (so gateways of concurrent tests never touch
    each other's sandboxes): `secret` (when given) as
    CLOUD_RUN_SANDBOX_GATEWAY_SECRET, then `env` on top (None removes)."""
    n = next(_instance_counter)
    extra: dict = {
        "SANDBOX_LISTEN": "127.0.0.1:0",
        # A fresh path, made by the gateway itself (nothing to clean up when
        # the gateway never starts, e.g. --help).
        "SANDBOX_STATE_DIR": os.path.join(tempfile.gettempdir(),
                                          f"sgw-state-{os.getpid()}-{n}-{os.urandom(4).hex()}"),
        "SANDBOX_CGROUP_GROUP": f"sgw-test-{os.getpid()}-{n}",
    }
    if secret is not None:
        extra["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"] = secret
    extra.update(env or {})
    return base_env(extra)


def start_gateway(env: Optional[Mapping[str, Optional[str]]] = None, *,
                  secret: Optional[str] = None, args: Iterable[str] = (),
                  wait: bool = True, timeout: float = START_TIMEOUT_S) -> Gateway:
    """Starts the gateway; with `wait`, returns once it logged its port.
    The caller must stop() it (or use `running_gateway`)."""
    gw = Gateway(gateway_env(env, secret), args=args)
    if wait:
        gw.wait_listening(timeout)
    return gw


@contextlib.contextmanager
def running_gateway(env: Optional[Mapping[str, Optional[str]]] = None, *,
                    secret: Optional[str] = None, args: Iterable[str] = ()) -> Iterator[Gateway]:
    gw = start_gateway(env, secret=secret, args=args)
    try:
        yield gw
    finally:
        gw.stop()


def run_to_completion(argv: list[str], env: Mapping[str, str],
                      timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs a binary that is expected to exit by itself (e.g. --help, a bad
    configuration); raises subprocess.TimeoutExpired (after killing it) when
    it does not."""
    return subprocess.run([str(a) for a in argv], env=dict(env), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, text=True, errors="replace")


class ProcessGroup:
    """Processes started by one test, all stopped at teardown. Pytest fixtures
    return one of these as a factory."""

    def __init__(self):
        self.processes: list[ManagedProcess] = []

    def add(self, proc: ManagedProcess) -> ManagedProcess:
        self.processes.append(proc)
        return proc

    def gateway(self, env: Optional[Mapping[str, Optional[str]]] = None, *,
                secret: Optional[str] = None, args: Iterable[str] = (),
                wait: bool = True) -> Gateway:
        gw = Gateway(gateway_env(env, secret), args=args)
        self.add(gw)
        if wait:
            gw.wait_listening()
        return gw

    def stop_all(self) -> list[tuple[ManagedProcess, int]]:
        return [(p, p.stop()) for p in reversed(self.processes)]

    def report_sections(self) -> list[tuple[str, str]]:
        out = []
        for i, p in enumerate(self.processes):
            out.append((f"{p.name} #{i + 1}", p.describe()))
        return out


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


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Polls `predicate` until it returns a truthy value or `timeout` passes;
    returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


# --- sandbox-shim ------------------------------------------------------------
#
# The shim cannot listen on port 0: `start_shim()` picks a free port and
# retries on a bind failure. Its binary comes from SANDBOX_SHIM_BIN (default
# <repo>/bazel-out/k8-fastbuild/bin/shim/sandbox-shim). Variables of the parent environment
# that configure the shim (SHIM_*, PORT) never leak into it.

_SHIM_PREFIXES = ("SHIM_",)
_SHIM_VARS = ("PORT",)
# Marks "use the gateway's secret" in start_shim() (None means: unset).
FROM_GATEWAY = object()


def shim_binary() -> Path:
    return _path_from_env("SANDBOX_SHIM_BIN", f"{PLAIN_BIN}/shim/sandbox-shim")


def require_shim_binary() -> Path:
    path = require_file(shim_binary(),
                        "build it with `bazel build //shim:sandbox-shim` or set SANDBOX_SHIM_BIN")
    if not os.access(path, os.X_OK):
        raise PermissionError(f"{path} is not executable")
    return path


class ShimResponse:
    """One HTTP answer: status, headers (lower-case names) and the body."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes):
        self.status = status
        self.header_list = headers
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<HTTP {self.status} {self.body[:500]!r}>"


class Shim(ManagedProcess):
    """A running sandbox-shim on 127.0.0.1:`port`, with a tiny stdlib HTTP
    client (`request`) that sends the configured bearer token."""

    def __init__(self, env: Mapping[str, str], binary: Optional[Path] = None,
                 name: str = "sandbox-shim"):
        binary = binary or require_shim_binary()
        super().__init__([str(binary)], env, name=name, stop_timeout=DEFAULT_GRACE_S + EXIT_MARGIN_S)
        self.host = env.get("SHIM_HOST", "127.0.0.1")
        self.port = int(env["PORT"])
        self.secret = env.get("CLOUD_RUN_SANDBOX_GATEWAY_SECRET")
        self.listening_record: Optional[dict] = None

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> Optional[dict]:
        """The "listening" record, or None when the shim exited first (e.g.
        the port was taken) or did not report within `timeout`."""
        rec = self.logs.wait_for(lambda r: r.get("message") == "listening", timeout, alive=self.alive)
        self.listening_record = rec
        return rec

    def connection(self, timeout: float = 60.0):
        import http.client
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def auth_headers(self, token: Optional[str] = None) -> dict:
        token = self.secret if token is None else token
        return {"Authorization": f"Bearer {token}"} if token is not None else {}

    def request(self, method: str, path: str, body: Any = None, *,
                headers: Optional[Mapping[str, str]] = None, auth: bool = True,
                token: Optional[str] = None, timeout: float = 60.0) -> ShimResponse:
        """Sends one request on a fresh connection. A dict/list body is sent
        as JSON (Content-Type application/json unless `headers` says
        otherwise); str/bytes as is."""
        hdrs = dict(self.auth_headers(token)) if auth else {}
        hdrs.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            if not any(k.lower() == "content-type" for k in hdrs):
                hdrs["Content-Type"] = "application/json"
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return ShimResponse(resp.status, resp.getheaders(), resp.read())
        finally:
            conn.close()

    def vm_rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for pid {self.pid}")


def shim_env(target: str, port: int, secret: Optional[str],
             env: Optional[Mapping[str, Optional[str]]] = None) -> dict:
    """Environment for a shim on 127.0.0.1:`port` in front of `target`:
    `secret` (None: unset) as CLOUD_RUN_SANDBOX_GATEWAY_SECRET, then `env`
    on top (None removes)."""
    out = {k: v for k, v in base_env().items()
           if not k.startswith(_SHIM_PREFIXES) and k not in _SHIM_VARS}
    out.update({"SHIM_HOST": "127.0.0.1", "PORT": str(port), "SHIM_GATEWAY_TARGET": target})
    if secret is not None:
        out["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"] = secret
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def start_shim(gateway: Optional[Gateway] = None, *, target: Optional[str] = None,
               secret: Any = FROM_GATEWAY, env: Optional[Mapping[str, Optional[str]]] = None,
               attempts: int = 5, timeout: float = START_TIMEOUT_S) -> Shim:
    """Starts a shim in front of `gateway` (or `target`, e.g. a closed port)
    and returns once it listens. `secret` defaults to the gateway's; None
    leaves it unset. The caller must stop() it (or use `running_shim`)."""
    if target is None:
        if gateway is None:
            raise ValueError("start_shim needs a gateway or a target")
        target = gateway.target
    if secret is FROM_GATEWAY:
        secret = gateway.secret if gateway is not None else None
    last = ""
    for _ in range(attempts):
        shim = Shim(shim_env(target, free_port(), secret, env))
        if shim.wait_listening(timeout) is not None:
            return shim
        last = shim.describe()
        shim.stop(timeout=5.0)
        if "cannot listen" not in last:
            break  # not a port race: do not hide the real failure
    raise ProcessStartError(f"sandbox-shim did not start\n{last}")


@contextlib.contextmanager
def running_shim(gateway: Optional[Gateway] = None, **kw) -> Iterator[Shim]:
    shim = start_shim(gateway, **kw)
    try:
        yield shim
    finally:
        shim.stop()


# --- helpers shared by tests that need a peer ------------------------------

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
