"""The deployment manifests probe the shim the way docs/deploy.md says:
startup and readiness on /ready (the gateway answers, serves and accepts
the shim's secret); on Kubernetes, liveness on the gateway's own gRPC
health (a hung gateway is restarted), on Cloud Run on the cheap /health."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _container(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = docs[0]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return container


def test_kubernetes_startup_and_readiness_use_ready_and_liveness_asks_the_gateway():
    c = _container(ROOT / "deploy" / "kubernetes" / "deployment.yaml")
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    # /health answers 200 whenever the shim runs, hung gateway or not: the
    # liveness probe asks the gateway's gRPC health on the pod's address.
    env = {e["name"]: e.get("value") for e in c["env"]}
    host, port = env["SANDBOX_LISTEN"].rsplit(":", 1)
    assert host not in ("127.0.0.1", "localhost", "[::1]"), "the kubelet probes the pod's address"
    assert "SANDBOX_TLS_CERT" not in env, "the kubelet's gRPC probe speaks no TLS"
    assert c["livenessProbe"]["grpc"]["port"] == int(port)
    assert [p["name"] for p in c["ports"] if p["containerPort"] == int(port)] == ["grpc"]


def test_cloud_run_startup_uses_ready_and_liveness_uses_health():
    c = _container(ROOT / "deploy" / "cloudrun" / "service.yaml")
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
