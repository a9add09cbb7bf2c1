"""deploy/kubernetes/scaled: what a cluster needs around the workloads,
read from the YAML (no kubectl): the namespace and its Pod Security
level, the gateways' ServiceAccount for the bucket, the NetworkPolicies,
the TLS Secrets each side mounts, and the metrics scrape (docs/deploy.md,
"Scaling out")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCALED = ROOT / "deploy" / "kubernetes" / "scaled"


def _kustomization() -> dict:
    return yaml.safe_load((SCALED / "kustomization.yaml").read_text())


def _all() -> list[dict]:
    out = []
    for name in _kustomization()["resources"]:
        out += [d for d in yaml.safe_load_all((SCALED / name).read_text()) if d]
    return out


def _of(kind: str) -> list[dict]:
    return [d for d in _all() if d["kind"] == kind]


def _one(kind: str) -> dict:
    (d,) = _of(kind)
    return d


def _labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def _pod(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def _container(workload: dict) -> dict:
    (c,) = _pod(workload)["containers"]
    return c


def _env(workload: dict) -> dict[str, dict]:
    return {e["name"]: e for e in _container(workload)["env"]}


def _matches(selector: dict, labels: dict) -> bool:
    assert "matchExpressions" not in selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


@pytest.fixture(scope="module")
def sts() -> dict:
    return _one("StatefulSet")


@pytest.fixture(scope="module")
def shim() -> dict:
    return _one("Deployment")


# ---- namespace and identity ----------------------------------------------------------------


def test_the_layout_has_its_namespace_which_allows_the_gateways_privileges():
    ns = _one("Namespace")
    assert _kustomization()["namespace"] == ns["metadata"]["name"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_gateways_run_as_a_service_account_bound_to_a_google_one_without_a_token(sts, shim):
    sa = _one("ServiceAccount")
    assert _pod(sts)["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(".iam.gserviceaccount.com")
    assert sa["automountServiceAccountToken"] is False
    assert _pod(sts)["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in _pod(shim), "the shims need no bucket access"


# ---- TLS between the hops ---------------------------------------------------------------------


def _secret_files(workload: dict) -> dict[str, str]:
    """Mount path -> Secret name, for the container's Secret volumes."""
    by_volume = {v["name"]: v["secret"]["secretName"] for v in _pod(workload).get("volumes", []) if "secret" in v}
    mounts = {}
    for m in _container(workload).get("volumeMounts", []):
        if m["name"] in by_volume:
            assert m.get("readOnly") is True, m
            mounts[m["mountPath"]] = by_volume[m["name"]]
    return mounts


def _in_secret(workload: dict, path: str) -> str:
    """The Secret that `path` comes from."""
    found = [s for mount, s in _secret_files(workload).items() if path.startswith(mount + "/")]
    assert len(found) == 1, (path, _secret_files(workload))
    return found[0]


def test_gateways_serve_mutual_tls_from_their_secret(sts):
    env = _env(sts)
    files = {v: env[v]["value"] for v in ("SANDBOX_TLS_CERT", "SANDBOX_TLS_KEY", "SANDBOX_TLS_CLIENT_CA")}
    assert {_in_secret(sts, p) for p in files.values()} == {"sandbox-gateway-tls"}
    assert [p.rsplit("/", 1)[1] for p in files.values()] == ["tls.crt", "tls.key", "ca.crt"]


def test_shims_speak_mutual_tls_verifying_each_member_under_its_own_name(shim):
    env = _env(shim)
    assert env["SHIM_GATEWAY_TLS"]["value"] == "true"
    files = {v: env[v]["value"] for v in ("SHIM_GATEWAY_TLS_CA", "SHIM_GATEWAY_TLS_CERT", "SHIM_GATEWAY_TLS_KEY")}
    assert {_in_secret(shim, p) for p in files.values()} == {"sandbox-shim-tls"}
    assert [p.rsplit("/", 1)[1] for p in files.values()] == ["ca.crt", "tls.crt", "tls.key"]
    # One name for all would have to be in every member's certificate and
    # would not tell the members apart: each is checked under its SRV name.
    assert "SHIM_GATEWAY_TLS_SERVER_NAME" not in env


def test_the_shims_key_is_readable_by_the_shim_and_no_one_else(shim):
    pod = _pod(shim)
    uid = pod["securityContext"]["runAsUser"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == uid
    [tls] = [v for v in pod["volumes"] if "secret" in v]
    assert tls["secret"]["defaultMode"] == 0o440


# ---- who may connect --------------------------------------------------------------------------


def _policy_for(workload: dict) -> dict:
    found = [p for p in _of("NetworkPolicy") if _matches(p["spec"]["podSelector"], _labels(workload))]
    assert len(found) == 1, found
    return found[0]


def _port_number(workload: dict, port) -> int:
    if isinstance(port, int):
        return port
    [p] = [p for p in _container(workload)["ports"] if p.get("name") == port]
    return p["containerPort"]


def test_only_shims_reach_the_gateways_grpc_port_and_no_pod_the_health_port(sts, shim):
    policy = _policy_for(sts)["spec"]
    assert "Ingress" in policy["policyTypes"]
    [rule] = policy["ingress"]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}, "the shims of this namespace only"
    assert _matches(peer["podSelector"], _labels(shim))
    assert not _matches(peer["podSelector"], _labels(sts)), "sandboxes with egress leave from the gateway pods"
    assert [_port_number(sts, p["port"]) for p in rule["ports"]] == [
        int(_env(sts)["SANDBOX_LISTEN"]["value"].rsplit(":", 1)[1])]


def test_only_the_backend_and_prometheus_reach_the_shims(shim, sts):
    policy = _policy_for(shim)["spec"]
    assert "Ingress" in policy["policyTypes"]
    [rule] = policy["ingress"]
    assert [_port_number(shim, p["port"]) for p in rule["ports"]] == [int(_env(shim)["PORT"]["value"])]
    for peer in rule["from"]:
        # Every peer is narrowed by pod labels: none admits every pod.
        assert peer.get("podSelector", {}).get("matchLabels"), peer
        assert not _matches(peer["podSelector"], _labels(sts))


# ---- metrics ----------------------------------------------------------------------------------


def test_the_scrape_of_the_shims_metrics_presents_the_bearer_secret(shim):
    [monitor] = [d for d in yaml.safe_load_all((SCALED / "monitoring" / "podmonitor.yaml").read_text()) if d]
    assert monitor["kind"] == "PodMonitor"
    assert _matches(monitor["spec"]["selector"], _labels(shim))
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    assert _port_number(shim, endpoint["port"]) == int(_env(shim)["PORT"]["value"])
    auth = endpoint["authorization"]
    assert auth["type"] == "Bearer"
    ref = _env(shim)["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"]["valueFrom"]["secretKeyRef"]
    assert {k: auth["credentials"][k] for k in ("name", "key")} == {k: ref[k] for k in ("name", "key")}
    # The namespace's NetworkPolicy admits the scraper.
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert any(_matches(p.get("podSelector", {}), prometheus) for p in _policy_for(shim)["spec"]["ingress"][0]["from"])
