"""deploy/kubernetes/scaled: the TLS hop between shims and gateways, run
for real with the manifests' settings and the certificates that
tls/make-certs.sh makes (docs/deploy.md, "TLS between shims and gateways").

The script runs as the docs say; its printed `kubectl create secret`
commands are laid out as the kubelet mounts the Secrets, at the paths the
manifests give; the gateways get the StatefulSet's TLS and health-listener
variables, the shim the Deployment's TLS variables and an SRV gateway set
from a DNS server of the test (tests/lib/dns.py), with the members' names
as Kubernetes makes them (sandbox-gateway-N.sandbox-gateway.<ns>.svc.<domain>).

Checked: the gateway's TLS port refuses plaintext and clients without the
shims' certificate; its plaintext health port answers Check and nothing
else (no sandbox call, no Watch, no reflection); the shim reaches every
member over mutual TLS, each verified under its own SRV name (a member
published under a name the certificate does not cover stays down), and a
sandbox works through it; a health address that is not host:port, or
whose port is taken, stops the gateway at start naming the variable.

Binaries: as test_scaled_manifests.py (bazel build //...). Root (the
gateways make sandboxes; the shim runs in a private mount namespace)."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import grpc
import pytest
import yaml

from tests.lib.gateway import ProcessGroup, gateway_env
from tests.lib.grpc_clients import HealthClient, StdProtos, rpc_code, sandbox_modules
from tests.lib.procs import free_port, require_gateway_binary, require_shim_binary, run_to_completion, wait_until
from tests.lib.shim import Shim, ShimClient, metric_value, shim_env

dnslib = pytest.importorskip("dnslib", reason="python3-dnslib is needed for the SRV tests")

ROOT = Path(__file__).resolve().parents[2]
SCALED = ROOT / "deploy" / "kubernetes" / "scaled"
SCRIPT = SCALED / "tls" / "make-certs.sh"
NS, DOMAIN = "tlstest", "cluster.test"
SERVICE = "sandbox-gateway"
SRV_NAME = f"_grpc._tcp.{SERVICE}.{NS}.svc.{DOMAIN}"
SECRET = "scaled-tls-test-secret"


def _workload(kind: str) -> dict:
    for path in SCALED.glob("*.yaml"):
        for d in yaml.safe_load_all(path.read_text()):
            if d and d["kind"] == kind:
                return d
    raise AssertionError(f"no {kind} in {SCALED}")


def _mounted_secrets(workload: dict) -> dict[str, str]:
    """Secret name -> the path the container mounts it at."""
    spec = workload["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    by_volume = {v["name"]: v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    return {by_volume[m["name"]]: m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] in by_volume}


def _env(workload: dict, prefixes: tuple[str, ...], secret_dirs: dict[str, Path]) -> dict[str, str]:
    """The container's plain values of the variables starting with
    `prefixes`, with Secret mount paths replaced by the local copies."""
    mounts = _mounted_secrets(workload)
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    out = {}
    for e in c["env"]:
        if e["name"].startswith(prefixes) and "value" in e:
            value = e["value"]
            for secret, path in mounts.items():
                value = value.replace(path, str(secret_dirs[secret]))
            out[e["name"]] = value
    return out


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> dict[str, Path]:
    """The Secrets the script's commands make, each as a directory of
    files named by their keys."""
    d = tmp_path_factory.mktemp("tls")
    r = subprocess.run([str(SCRIPT), NS, DOMAIN, str(d)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    commands = re.findall(r"create secret generic (\S+) \\\n\s+((?:--from-file=\S+ ?)+)", r.stdout)
    assert {name for name, _ in commands} == {"sandbox-gateway-tls", "sandbox-shim-tls"}, r.stdout
    out = {}
    for name, files in commands:
        secret = d / name
        secret.mkdir()
        for key, src in re.findall(r"--from-file=([^=\s]+)=(\S+)", files):
            (secret / key).write_bytes((d / src).read_bytes())
        out[name] = secret
    return out


@pytest.fixture
def group():
    g = ProcessGroup(secret=SECRET)
    try:
        yield g
    finally:
        g.stop_checked()


@pytest.fixture
def dns():
    from tests.lib.dns import DnsServer
    server = DnsServer()
    try:
        yield server
    finally:
        server.stop()


def _gateway(group, secrets):
    env = _env(_workload("StatefulSet"), ("SANDBOX_TLS_", "SANDBOX_HEALTH_LISTEN"), secrets)
    assert set(env) == {"SANDBOX_TLS_CERT", "SANDBOX_TLS_KEY", "SANDBOX_TLS_CLIENT_CA", "SANDBOX_HEALTH_LISTEN"}
    health_port = free_port()
    env["SANDBOX_HEALTH_LISTEN"] = f"127.0.0.1:{health_port}"
    gw = group.gateway(env)
    return gw, health_port


def _member(i: int) -> str:
    return f"{SERVICE}-{i}.{SERVICE}.{NS}.svc.{DOMAIN}"


def test_gateway_serves_mtls_and_answers_only_health_checks_in_plaintext(group, secrets):
    std = StdProtos()
    gw, health_port = _gateway(group, secrets)
    shim_tls = secrets["sandbox-shim-tls"]
    ca = (shim_tls / "ca.crt").read_bytes()
    key, cert = (shim_tls / "tls.key").read_bytes(), (shim_tls / "tls.crt").read_bytes()

    def check(channel):
        try:
            return HealthClient(channel, std).check("", timeout=10).status
        except grpc.RpcError as e:
            return e.code()

    # The TLS port: the shims' certificate, verified under a member's name.
    assert check(gw.secure_channel(ca, key, cert, server_name=_member(0))) == std.ServingStatus.SERVING
    assert check(gw.channel()) == grpc.StatusCode.UNAVAILABLE, "plaintext on the TLS port"
    assert check(gw.secure_channel(ca, server_name=_member(0))) == grpc.StatusCode.UNAVAILABLE, "no client cert"

    # The health port: plaintext, Check alone.
    health = grpc.insecure_channel(f"127.0.0.1:{health_port}")
    try:
        assert check(health) == std.ServingStatus.SERVING
        pb2, pb2_grpc = sandbox_modules()
        code, _ = rpc_code(pb2_grpc.SandboxStub(health).List, pb2.ListRequest(),
                           metadata=gw.auth_metadata(), timeout=10)
        assert code == grpc.StatusCode.UNIMPLEMENTED, "a sandbox call on the plaintext port"
        with pytest.raises(grpc.RpcError) as watch:
            next(iter(HealthClient(health, std).watch("", timeout=10)))
        assert watch.value.code() == grpc.StatusCode.UNIMPLEMENTED
        reflect = health.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as refl:
            list(reflect(iter([b"\x3a\x00"]), timeout=10))  # list_services
        assert refl.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        health.close()


def _state(shim: Shim, member: str) -> float:
    """1 up, 0.5 draining, 0 down, -1 not listed."""
    r = shim.request("GET", "/metrics")
    assert r.status == 200, r
    text = r.body.decode()
    if f'shim_gateway_up{{gateway="{member}"}}' not in text:
        return -1.0
    return metric_value(text, "shim_gateway_up", {"gateway": member})


def test_shim_reaches_every_srv_member_over_mtls_each_under_its_own_name(group, secrets, dns):
    gws = [_gateway(group, secrets)[0] for _ in range(3)]
    # Two members as the StatefulSet names them; a third, the same kind of
    # gateway with the same certificate, under a name the certificate's
    # wildcard does not cover.
    names = [_member(0), _member(1), f"{SERVICE}-2.elsewhere.{NS}.svc.{DOMAIN}"]
    records = []
    for host, gw in zip(names, gws):
        dns.set_a(host, "127.0.0.1")
        records.append((host, gw.port))
    dns.set_srv(SRV_NAME, records)
    members = [f"{host}:{gw.port}" for host, gw in zip(names, gws)]

    tls = _env(_workload("Deployment"), ("SHIM_GATEWAY_TLS",), secrets)
    assert tls["SHIM_GATEWAY_TLS"] == "true" and "SHIM_GATEWAY_TLS_SERVER_NAME" not in tls, tls
    env = shim_env("unused", free_port(), SECRET,
                   {"SHIM_GATEWAY_TARGET": None, "SHIM_GATEWAYS": f"dns-srv:{SRV_NAME}",
                    "SHIM_GATEWAYS_REFRESH_SECONDS": "1", "SHIM_GATEWAYS_HEALTH_SECONDS": "1", **tls})
    shim = group.add(Shim(env, binary=dns.resolv_wrapper(require_shim_binary())))
    assert shim.wait_listening() is not None, shim.describe()

    assert wait_until(lambda: all(_state(shim, m) == 1 for m in members[:2]), 30), shim.describe()
    # The third has been listed and checked several times by now.
    assert wait_until(lambda: _state(shim, members[2]) == 0, 10), shim.describe()
    assert not wait_until(lambda: _state(shim, members[2]) != 0, 3), "a name outside the certificate passed"

    client = ShimClient(shim)
    try:
        sid = client.launch()
        assert client.sh(sid, "echo over-tls") == "over-tls\n"
    finally:
        client.cleanup()


@pytest.mark.parametrize("value", ["no-port", "127.0.0.1:70000"])
def test_a_bad_health_listen_address_is_refused_at_start_naming_it(value):
    env = gateway_env({"SANDBOX_HEALTH_LISTEN": value}, secret=SECRET)
    result = run_to_completion([require_gateway_binary()], env, timeout=30)
    assert result.returncode == 2 and "SANDBOX_HEALTH_LISTEN" in result.stderr, result


def test_a_health_port_in_use_stops_the_gateway_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = gateway_env({"SANDBOX_HEALTH_LISTEN": f"127.0.0.1:{port}",
                           "SANDBOX_STATE_DIR": str(tmp_path / "state")}, secret=SECRET)
        result = run_to_completion([require_gateway_binary()], env, timeout=60)
    assert result.returncode == 1 and "SANDBOX_HEALTH_LISTEN" in result.stderr, result
