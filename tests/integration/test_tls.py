"""TLS (SANDBOX_TLS_CERT/KEY) and mutual TLS (SANDBOX_TLS_CLIENT_CA)."""

import os
import select
import socket
import subprocess
import time
from types import SimpleNamespace

import grpc
import pytest

from tests.lib.grpc_clients import HealthClient, rpc_code, sandbox_modules


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _make_ca(d, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN={name}", cwd=d)


def _make_leaf(d, ca, name, cn, ext):
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
             "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a server certificate (localhost, 127.0.0.1) and a client
    certificate, and a second CA with its own client certificate."""
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    _make_leaf(d, "ca", "server", "localhost",
               "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _make_leaf(d, "ca", "client", "test-client", "extendedKeyUsage=clientAuth\n")
    _make_leaf(d, "other-ca", "stranger", "stranger", "extendedKeyUsage=clientAuth\n")
    read = lambda n: (d / n).read_bytes()  # noqa: E731
    return SimpleNamespace(
        dir=d,
        ca=read("ca.pem"),
        client_key=read("client.key"), client_cert=read("client.pem"),
        stranger_key=read("stranger.key"), stranger_cert=read("stranger.pem"),
        env={"SANDBOX_TLS_CERT": str(d / "server.pem"), "SANDBOX_TLS_KEY": str(d / "server.key")},
    )


def _check(channel, std_protos):
    try:
        return HealthClient(channel, std_protos).check("", timeout=5).status
    except grpc.RpcError as e:
        return e.code()


def test_tls_gateway_serves_health_to_tls_client(gateways, pki, std_protos):
    gw = gateways.gateway(pki.env, secret="s")
    assert _check(gw.secure_channel(pki.ca), std_protos) == std_protos.ServingStatus.SERVING


def test_tls_gateway_refuses_plaintext_client(gateways, pki, std_protos):
    gw = gateways.gateway(pki.env, secret="s")
    assert _check(gw.channel(), std_protos) == grpc.StatusCode.UNAVAILABLE


def test_tls_gateway_still_requires_the_token(gateways, pki, gateway_secret):
    gw = gateways.gateway(pki.env, secret=gateway_secret)
    pb2, pb2_grpc = sandbox_modules()
    stub = pb2_grpc.SandboxStub(gw.secure_channel(pki.ca))
    code, _ = rpc_code(stub.List, pb2.ListRequest(), timeout=10)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, details = rpc_code(stub.List, pb2.ListRequest(), metadata=gw.auth_metadata(),
                             timeout=10)
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED), details


@pytest.fixture
def mtls_gateway(gateways, pki):
    return gateways.gateway({**pki.env, "SANDBOX_TLS_CLIENT_CA": str(pki.dir / "ca.pem")},
                            secret="s")


def test_mtls_accepts_client_certificate_signed_by_the_ca(mtls_gateway, pki, std_protos):
    ch = mtls_gateway.secure_channel(pki.ca, private_key=pki.client_key,
                                     certificate_chain=pki.client_cert)
    assert _check(ch, std_protos) == std_protos.ServingStatus.SERVING


def test_mtls_refuses_client_without_certificate(mtls_gateway, pki, std_protos):
    assert _check(mtls_gateway.secure_channel(pki.ca), std_protos) == grpc.StatusCode.UNAVAILABLE


def test_mtls_refuses_client_certificate_from_another_ca(mtls_gateway, pki, std_protos):
    ch = mtls_gateway.secure_channel(pki.ca, private_key=pki.stranger_key,
                                     certificate_chain=pki.stranger_cert)
    assert _check(ch, std_protos) == grpc.StatusCode.UNAVAILABLE


PER_PEER = 8


def test_tls_connections_are_capped_per_address_before_any_handshake(gateways, pki, std_protos):
    """The gateway's own listener takes TLS connections too: past
    SANDBOX_MAX_CONNECTIONS_PER_PEER from one address, a connection that
    never starts its handshake is closed at once, and the descriptors stay
    bounded; a client from another address is served meanwhile."""
    gw = gateways.gateway({**pki.env, "SANDBOX_MAX_CONNECTIONS_PER_PEER": str(PER_PEER)}, secret="s")
    base = len(os.listdir(f"/proc/{gw.pid}/fd"))
    socks = [socket.create_connection(("127.0.0.1", gw.port), timeout=5, source_address=("127.0.1.7", 0))
             for _ in range(4 * PER_PEER)]
    try:
        closed: set[int] = set()
        deadline = time.monotonic() + 10
        while len(closed) < 3 * PER_PEER and time.monotonic() < deadline:
            ready, _, _ = select.select([s for s in socks if s.fileno() not in closed], [], [], 0.5)
            for s in ready:
                try:
                    if s.recv(1) == b"":
                        closed.add(s.fileno())
                except ConnectionError:
                    closed.add(s.fileno())
        assert len(closed) == 3 * PER_PEER, f"{len(closed)} of {4 * PER_PEER} closed"
        assert len(os.listdir(f"/proc/{gw.pid}/fd")) <= base + PER_PEER + 8
        assert _check(gw.secure_channel(pki.ca), std_protos) == std_protos.ServingStatus.SERVING
    finally:
        for s in socks:
            s.close()
