"""The deployment manifests probe the shim the way docs/deploy.md says:
startup and readiness on /ready (the gateway answers, serves and accepts
the shim's secret), liveness on the cheap /health."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _container(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = docs[0]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return container


def test_kubernetes_startup_and_readiness_use_ready_and_liveness_uses_health():
    c = _container(ROOT / "deploy" / "kubernetes" / "deployment.yaml")
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"


def test_cloud_run_startup_uses_ready_and_liveness_uses_health():
    c = _container(ROOT / "deploy" / "cloudrun" / "service.yaml")
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
