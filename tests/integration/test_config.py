"""Configuration from the environment, --help, JSON logs, and exit codes."""

import os
import signal
import socket
import subprocess

import grpc
import pytest

from tests.lib.gateway import gateway_env
from tests.lib.grpc_clients import HealthClient, ReflectionClient, sandbox_modules
from tests.lib.procs import (EXIT_MARGIN_S, assert_all_json_lines, free_port, require_gateway_binary,
                             require_shim_binary, run_to_completion)
from tests.lib.shim import shim_env

VARIABLES_AND_DEFAULTS = {
    "SANDBOX_LISTEN": "127.0.0.1:50051",
    "CLOUD_RUN_SANDBOX_GATEWAY_SECRET": None,
    "SANDBOX_LOG_LEVEL": "info",
    "SANDBOX_MAX_MESSAGE_MB": "16",
    "SANDBOX_SHUTDOWN_GRACE_SECONDS": "10",
    "SANDBOX_TLS_CERT": None,
    "SANDBOX_TLS_KEY": None,
    "SANDBOX_TLS_CLIENT_CA": None,
    "SANDBOX_PERSIST_ON_SHUTDOWN": None,
    "SANDBOX_GATEWAY_NAME": None,
}


def test_help_lists_every_variable_with_its_default_and_exits_zero():
    result = run_to_completion([require_gateway_binary(), "--help"], gateway_env())
    assert result.returncode == 0, result.stderr
    text = result.stdout + result.stderr
    lines = text.splitlines()
    for var, default in VARIABLES_AND_DEFAULTS.items():
        mentions = [l for l in lines if var in l]
        assert mentions, f"--help does not mention {var}:\n{text}"
        if default is not None:
            # The default is on the variable's line or in the few lines after.
            i = lines.index(mentions[0])
            nearby = "\n".join(lines[i:i + 4])
            assert default in nearby, f"--help does not show {var}'s default {default}:\n{nearby}"


@pytest.mark.parametrize("var,value", [
    ("SANDBOX_MAX_MESSAGE_MB", "abc"),
    ("SANDBOX_MAX_MESSAGE_MB", "0"),
    ("SANDBOX_MAX_MESSAGE_MB", "1025"),
    ("SANDBOX_MAX_MESSAGE_MB", "-1"),
    ("SANDBOX_MAX_MESSAGE_MB", "16MB"),
    ("SANDBOX_MAX_MESSAGE_MB", "99999999999999999999999"),
    ("SANDBOX_LISTEN", "nonsense-without-port"),
    ("SANDBOX_LISTEN", "127.0.0.1:notaport"),
    ("SANDBOX_LISTEN", "127.0.0.1:70000"),
    ("SANDBOX_LOG_LEVEL", "loud"),
    ("SANDBOX_SHUTDOWN_GRACE_SECONDS", "abc"),
    ("SANDBOX_SHUTDOWN_GRACE_SECONDS", "-1"),
    ("SANDBOX_SHUTDOWN_GRACE_SECONDS", "3601"),  # --help documents 0..3600
    ("SANDBOX_PERSIST_ON_SHUTDOWN", "maybe"),
    ("SANDBOX_PERSIST_ON_SHUTDOWN", "2"),
    ("SANDBOX_GATEWAY_NAME", "two words"),
    ("SANDBOX_GATEWAY_NAME", "x" * 254),
])
def test_bad_value_is_refused_at_start_naming_the_variable(var, value):
    env = gateway_env({var: value}, secret="s")
    try:
        result = run_to_completion([require_gateway_binary()], env, timeout=10)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(f"{var}={value!r} was accepted: the gateway kept running\n{stderr}")
    assert result.returncode != 0, f"{var}={value!r} was accepted:\n{result.stderr}"
    assert var in result.stderr, f"the error does not name {var}:\n{result.stderr}"


@pytest.mark.parametrize("var,value", [
    ("SHIM_MAX_BUFFERED_OUTPUT", "abc"),
    ("SHIM_MAX_BUFFERED_OUTPUT", "0"),
    ("SHIM_MAX_BUFFERED_OUTPUT", "-1"),
    ("SHIM_MAX_BUFFERED_OUTPUT", "65535"),  # --help documents 65536..1099511627776
    ("SHIM_MAX_BUFFERED_OUTPUT", "1099511627777"),
    ("SHIM_MAX_BUFFERED_OUTPUT", "1GiB"),
    ("SHIM_MAX_BUFFERED_OUTPUT", "99999999999999999999999"),
])
def test_bad_shim_value_is_refused_at_start_naming_the_variable(var, value):
    env = shim_env(f"127.0.0.1:{free_port()}", free_port(), "s", {var: value})
    try:
        result = run_to_completion([require_shim_binary()], env, timeout=10)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(f"{var}={value!r} was accepted: the shim kept running\n{stderr}")
    assert result.returncode != 0, f"{var}={value!r} was accepted:\n{result.stderr}"
    assert var in result.stderr, f"the error does not name {var}:\n{result.stderr}"


def test_a_bad_persist_on_shutdown_is_refused_saying_what_it_takes():
    env = gateway_env({"SANDBOX_PERSIST_ON_SHUTDOWN": "sometimes"}, secret="s")
    result = run_to_completion([require_gateway_binary()], env, timeout=10)
    assert result.returncode == 2, result.stderr
    records = assert_all_json_lines(result.stderr.splitlines())
    errors = [r["message"] for r in records if r["severity"] == "ERROR"]
    assert len(errors) == 1, result.stderr
    assert "SANDBOX_PERSIST_ON_SHUTDOWN: `sometimes` is not a boolean (true/false" in errors[0], errors


def test_tls_files_that_do_not_exist_are_refused_at_start(tmp_path):
    env = gateway_env({"SANDBOX_TLS_CERT": str(tmp_path / "missing-cert.pem"),
                       "SANDBOX_TLS_KEY": str(tmp_path / "missing-key.pem")}, secret="s")
    result = run_to_completion([require_gateway_binary()], env)
    assert result.returncode != 0, result.stderr
    assert "SANDBOX_TLS_CERT" in result.stderr or "missing-cert.pem" in result.stderr, \
        result.stderr


def test_address_in_use_is_refused_at_start(gateway):
    # gRPC servers set SO_REUSEPORT by default, which would let a second
    # gateway share the port and split the traffic silently.
    env = gateway_env({"SANDBOX_LISTEN": gateway.target}, secret="s")
    try:
        result = run_to_completion([require_gateway_binary()], env, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second gateway started on {gateway.target}, which is in use")
    assert result.returncode != 0, result.stderr


def test_listen_failure_exits_nonzero_with_json_error_lines():
    # A plain socket (no SO_REUSEPORT) holding the port makes the bind fail.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env = gateway_env({"SANDBOX_LISTEN": f"127.0.0.1:{port}"}, secret="s")
        result = run_to_completion([require_gateway_binary()], env)
    assert result.returncode != 0, result.stderr
    records = assert_all_json_lines(result.stderr.splitlines())
    assert any(r["severity"] == "ERROR" for r in records), result.stderr


@pytest.mark.parametrize("value", ["1", "1024"])
def test_max_message_size_boundaries_are_accepted(gateways, value):
    gw = gateways.gateway({"SANDBOX_MAX_MESSAGE_MB": value}, secret="s")
    assert gw.port > 0


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_every_log_level_is_accepted(gateways, level):
    port = free_port()
    gw = gateways.gateway({"SANDBOX_LOG_LEVEL": level, "SANDBOX_LISTEN": f"127.0.0.1:{port}"},
                          secret="s", wait=False)
    # The listening line may be below the level: wait for the port instead.
    gw.wait_accepting(port)
    assert gw.alive()


def test_listening_line_reports_the_kernel_chosen_port(gateway, health, std_protos):
    rec = gateway.listening_record
    assert rec["severity"] == "INFO"
    assert 0 < rec["port"] < 65536
    assert health.check("").status == std_protos.ServingStatus.SERVING


def test_explicit_listen_port_is_used(gateways):
    port = free_port()
    gw = gateways.gateway({"SANDBOX_LISTEN": f"127.0.0.1:{port}"}, secret="s")
    assert gw.port == port


def test_every_stderr_line_is_json_with_severity_and_message(gateways, std_protos):
    gw = gateways.gateway({"SANDBOX_LOG_LEVEL": "debug"}, secret="s")
    ch = gw.channel()
    HealthClient(ch, std_protos).check("")
    ReflectionClient(ch, std_protos, "v1").list_services()
    pb2, pb2_grpc = sandbox_modules()
    with pytest.raises(grpc.RpcError):
        pb2_grpc.SandboxStub(ch).List(pb2.ListRequest(), timeout=10)
    rc = gw.stop()
    assert rc == 0
    records = assert_all_json_lines(gw.logs.snapshot())
    assert any(r["message"] == "listening" for r in records)
    assert gw.stdout.snapshot() == [], "the gateway wrote to stdout"


def test_log_level_error_hides_info_and_debug_lines(gateways, std_protos):
    port = free_port()
    gw = gateways.gateway({"SANDBOX_LOG_LEVEL": "error", "SANDBOX_LISTEN": f"127.0.0.1:{port}"},
                          secret="s", wait=False)
    gw.wait_accepting(port)
    health = HealthClient(gw.channel(), std_protos)
    assert health.check("").status == std_protos.ServingStatus.SERVING
    assert gw.stop() == 0
    records = assert_all_json_lines(gw.logs.snapshot())
    assert [r for r in records if r["severity"] in ("DEBUG", "INFO")] == []


def test_sigterm_exits_zero_within_grace_period(gateways):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": "3"}, secret="s")
    gw.send_signal(signal.SIGTERM)
    assert gw.wait(timeout=3 + EXIT_MARGIN_S) == 0


def test_sigint_exits_zero(gateways):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": "3"}, secret="s")
    gw.send_signal(signal.SIGINT)
    assert gw.wait(timeout=3 + EXIT_MARGIN_S) == 0


def _check_with_padding(gw, std_protos, size):
    """A HealthCheckRequest for "" carrying `size` bytes in an unknown field
    (which a proto3 server skips): the answer is SERVING unless the message
    is refused for its size."""
    pad_field = (15 << 3) | 2  # field 15, length-delimited
    payload = bytes([pad_field]) + _varint(size) + b"p" * size
    check = gw.channel().unary_unary("/grpc.health.v1.Health/Check",
                                     request_serializer=lambda b: b,
                                     response_deserializer=std_protos.HealthCheckResponse.FromString)
    try:
        return check(payload, timeout=30).status
    except grpc.RpcError as e:
        return e.code()


def _varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def test_max_message_size_limits_incoming_messages(gateways, std_protos):
    serving = std_protos.ServingStatus.SERVING
    small = gateways.gateway({"SANDBOX_MAX_MESSAGE_MB": "1"}, secret="s")
    assert _check_with_padding(small, std_protos, 2 * 1024 * 1024) == \
        grpc.StatusCode.RESOURCE_EXHAUSTED
    # Under the limit, whether MB means 10^6 or 2^20 bytes.
    assert _check_with_padding(small, std_protos, 900 * 1000) == serving
    default = gateways.gateway(secret="s")
    assert _check_with_padding(default, std_protos, 2 * 1024 * 1024) == serving
    assert _check_with_padding(default, std_protos, 17 * 1024 * 1024) == \
        grpc.StatusCode.RESOURCE_EXHAUSTED


# --- secrets: one trailing line end is forgiven, other whitespace refused ----

@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_secret_with_a_trailing_line_end_works_with_the_plain_token(gateways, sandbox_api, line_end):
    token = "tok-" + os.urandom(8).hex()
    gw = gateways.gateway(secret=token + line_end)
    shim = gateways.shim(gw)  # the same value, line end included
    pb2, pb2_grpc = sandbox_api
    stub = pb2_grpc.SandboxStub(gw.channel())
    stub.List(pb2.ListRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=10)
    r = shim.request("GET", "/sandboxes", token=token)
    assert r.status == 200, r
    assert shim.request("GET", "/sandboxes", token=token + "x").status == 401
    for proc, var in ((gw, "CLOUD_RUN_SANDBOX_GATEWAY_SECRET"), (shim, "CLOUD_RUN_SANDBOX_GATEWAY_SECRET")):
        warnings = proc.logs.find(lambda r: r.get("severity") == "WARNING" and var in r.get("message", ""))
        assert warnings, proc.describe()
        assert token not in "\n".join(proc.logs.snapshot()), "the secret was logged"


@pytest.mark.parametrize("value", ["tok en", " token", "token ", "tok\ten", "token \n", "token\n\n", "to\nken"])
def test_gateway_secret_with_whitespace_is_refused_naming_the_variable(value):
    result = run_to_completion([require_gateway_binary()], gateway_env(secret=value), timeout=10)
    assert result.returncode != 0, result.stderr
    assert "CLOUD_RUN_SANDBOX_GATEWAY_SECRET" in result.stderr, result.stderr
    assert "tok" not in result.stderr, "the secret was logged"


@pytest.mark.parametrize("var", ["CLOUD_RUN_SANDBOX_GATEWAY_SECRET", "SHIM_GATEWAY_SECRET"])
def test_shim_secret_with_whitespace_is_refused_naming_the_variable(var):
    env = shim_env(f"127.0.0.1:{free_port()}", free_port(), "plain", {var: "tok en"})
    result = run_to_completion([require_shim_binary()], env, timeout=10)
    assert result.returncode != 0, result.stderr
    assert var in result.stderr, result.stderr
    assert "tok" not in result.stderr, "the secret was logged"


# --- values that name things on the filesystem or the network ----------------

def _refused(argv, env, var):
    """Runs a program expected to refuse its configuration: non-zero exit,
    stderr naming `var`. Returns stderr."""
    try:
        result = run_to_completion(argv, env, timeout=10)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(f"{var} was accepted: the program kept running\n{stderr}")
    assert result.returncode != 0, f"{var} was accepted:\n{result.stderr}"
    assert var in result.stderr, f"the error does not name {var}:\n{result.stderr}"
    return result.stderr


def _pem(path, body="CERTIFICATE"):
    path.write_text(f"-----BEGIN {body}-----\nAAAA\n-----END {body}-----\n")
    return str(path)


@pytest.mark.parametrize("var,value", [
    ("SANDBOX_ROOTFS", "/nonexistent"),
    ("SANDBOX_ROOTFS", "<file>"),
    ("SANDBOX_STATE_DIR", "/proc/nope"),
    ("SANDBOX_STATE_DIR", "<file>"),
])
def test_gateway_path_that_cannot_be_used_is_refused_naming_the_variable(tmp_path, var, value):
    if value == "<file>":
        (tmp_path / "file").write_text("x")
        value = str(tmp_path / "file")
    _refused([require_gateway_binary()], gateway_env({var: value}, secret="s"), var)


@pytest.mark.parametrize("broken", ["missing", "directory", "not-pem"])
def test_unreadable_tls_cert_is_reported_as_such_not_as_a_listen_failure(tmp_path, broken):
    cert = {"missing": str(tmp_path / "missing.pem"), "directory": str(tmp_path),
            "not-pem": str(tmp_path / "junk.pem")}[broken]
    (tmp_path / "junk.pem").write_text("junk\n")
    env = gateway_env({"SANDBOX_TLS_CERT": cert, "SANDBOX_TLS_KEY": _pem(tmp_path / "key.pem", "PRIVATE KEY")},
                      secret="s")
    stderr = _refused([require_gateway_binary()], env, "SANDBOX_TLS_CERT")
    assert "SANDBOX_LISTEN" not in stderr and "cannot listen" not in stderr, stderr


def test_tls_pem_that_grpc_rejects_is_not_reported_as_a_listen_failure(tmp_path):
    env = gateway_env({"SANDBOX_TLS_CERT": _pem(tmp_path / "cert.pem"),
                       "SANDBOX_TLS_KEY": _pem(tmp_path / "key.pem", "PRIVATE KEY")}, secret="s")
    stderr = _refused([require_gateway_binary()], env, "SANDBOX_TLS_CERT")
    assert "SANDBOX_LISTEN" not in stderr and "cannot listen" not in stderr, stderr


@pytest.mark.parametrize("target", ["nonsense", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", "http://gw:50051",
                                    "gw:50051 ", "dns:gw", "unix:", "[::1]50051", "host_name:50051"])
def test_shim_gateway_target_that_grpc_could_not_dial_is_refused(target):
    env = shim_env(target, free_port(), "s")
    _refused([require_shim_binary()], env, "SHIM_GATEWAY_TARGET")


@pytest.mark.parametrize("target", ["localhost:50051", "[::1]:50051", "dns:///localhost:50051",
                                    "ipv4:127.0.0.1:50051", "unix:/run/none.sock"])
def test_shim_gateway_target_forms_grpc_accepts_start_the_shim(shims, target):
    shim = shims.shim(target=target, secret="s")
    assert shim.alive()


@pytest.mark.parametrize("present,missing", [("SHIM_GATEWAY_TLS_CERT", "SHIM_GATEWAY_TLS_KEY"),
                                             ("SHIM_GATEWAY_TLS_KEY", "SHIM_GATEWAY_TLS_CERT")])
@pytest.mark.parametrize("tls", ["true", "false"])
def test_shim_client_cert_without_its_pair_is_refused(tmp_path, present, missing, tls):
    env = shim_env(f"127.0.0.1:{free_port()}", free_port(), "s",
                   {"SHIM_GATEWAY_TLS": tls, present: _pem(tmp_path / "x.pem")})
    stderr = _refused([require_shim_binary()], env, present)
    assert missing in stderr, stderr


@pytest.mark.parametrize("var", ["SHIM_GATEWAY_TLS_CA", "SHIM_GATEWAY_TLS_SERVER_NAME"])
def test_shim_tls_setting_without_tls_is_refused(tmp_path, var):
    value = _pem(tmp_path / "ca.pem") if var.endswith("_CA") else "gateway.example.com"
    env = shim_env(f"127.0.0.1:{free_port()}", free_port(), "s", {var: value})
    _refused([require_shim_binary()], env, var)


def test_shim_unreadable_tls_ca_is_refused_naming_the_variable(tmp_path):
    env = shim_env(f"127.0.0.1:{free_port()}", free_port(), "s",
                   {"SHIM_GATEWAY_TLS": "true", "SHIM_GATEWAY_TLS_CA": str(tmp_path / "missing.pem")})
    _refused([require_shim_binary()], env, "SHIM_GATEWAY_TLS_CA")
