"""deploy/kubernetes/scaled: the manifests of the scaled topology agree with
each other and with the programs (docs/deploy.md, "Scaling out").

- the gateways' StatefulSet names a headless Service that publishes
  not-ready addresses (so a draining gateway stays in DNS until it has
  persisted its sandboxes) and has a port named `grpc`;
- the shims' SHIM_GATEWAYS is that Service's SRV name for that port;
- the pod's grace period leaves a margin after SANDBOX_SHUTDOWN_GRACE_SECONDS;
- the gateway runs with exactly the privileges, volumes and resources of
  the all-in-one deployment.yaml, the shim with none;
- Services and PodDisruptionBudgets select the pods they are meant for;
- every environment variable any manifest (Kubernetes and Cloud Run) sets
  is one the program it reaches knows (its --help, or the entrypoint's
  own).

Binaries: SANDBOX_GATEWAY_BIN and SANDBOX_SHIM_BIN, else the plain build
under bazel-out/k8-fastbuild/bin (as test_docs.py; `bazel build //...`).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SCALED = K8S / "scaled"
CLOUDRUN = ROOT / "deploy" / "cloudrun" / "service.yaml"
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
PLAIN_BIN = ROOT / "bazel-out" / "k8-fastbuild" / "bin"
PROGRAMS = {
    "gateway": Path(os.environ.get("SANDBOX_GATEWAY_BIN") or PLAIN_BIN / "gateway" / "sandbox-gateway"),
    "shim": Path(os.environ.get("SANDBOX_SHIM_BIN") or PLAIN_BIN / "shim" / "sandbox-shim"),
}



# ---- reading the manifests ------------------------------------------------------------


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _scaled() -> list[dict]:
    kust = yaml.safe_load((SCALED / "kustomization.yaml").read_text())
    out: list[dict] = []
    for name in kust["resources"]:
        out += _docs(SCALED / name)
    return out


def _one(kind: str, name: str | None = None) -> dict:
    found = [d for d in _scaled() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in deploy/kubernetes/scaled"
    return found[0]


def _container(workload: dict) -> dict:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def _env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def _selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels, or the plain map of a Service) against
    a pod's labels."""
    match = selector.get("matchLabels", selector) if "matchExpressions" not in selector else None
    assert match is not None, "matchExpressions are not handled here"
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


@pytest.fixture(scope="module")
def sts() -> dict:
    return _one("StatefulSet")


@pytest.fixture(scope="module")
def shim() -> dict:
    return _one("Deployment")


@pytest.fixture(scope="module")
def headless(sts) -> dict:
    return _one("Service", sts["spec"]["serviceName"])


# ---- the files ---------------------------------------------------------------------------


def test_every_manifest_parses_and_is_listed():
    for path in sorted(K8S.rglob("*.yaml")) + [CLOUDRUN]:
        assert _docs(path), f"{path} is empty"
    kust = yaml.safe_load((SCALED / "kustomization.yaml").read_text())
    files = {p.name for p in SCALED.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files, "kustomization.yaml and the directory differ"
    images = {i["name"] for i in kust["images"]}
    for d in _scaled():
        if d["kind"] in ("StatefulSet", "Deployment"):
            assert _container(d)["image"].split(":")[0] in images, d["metadata"]["name"]


# ---- the gateways and their Service --------------------------------------------------------


def test_statefulset_names_a_headless_service_that_publishes_not_ready_addresses(sts, headless):
    spec = headless["spec"]
    assert spec.get("clusterIP") == "None", "the gateways' Service must be headless"
    assert spec.get("publishNotReadyAddresses") is True, (
        "without publishNotReadyAddresses a draining gateway leaves DNS at once and its ids "
        "move before it has persisted them")
    assert _selects(spec["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert _selects(sts["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_headless_service_has_a_grpc_port_on_the_gateway(sts, headless):
    [port] = [p for p in headless["spec"]["ports"] if p.get("name") == "grpc"]
    c = _container(sts)
    [cport] = [p for p in c["ports"] if p["containerPort"] == port["port"]]
    assert port.get("targetPort", port["port"]) in (cport.get("name"), cport["containerPort"])
    assert _env(c)["SANDBOX_LISTEN"]["value"] == f"0.0.0.0:{cport['containerPort']}"
    assert c["args"] == ["gateway"]


def test_grace_period_covers_the_shutdown_grace(sts):
    pod_grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    grace = int(_env(_container(sts))["SANDBOX_SHUTDOWN_GRACE_SECONDS"]["value"])
    assert pod_grace > grace, (pod_grace, grace)
    # The margin covers the exit after the last persist; SIGKILL comes at pod_grace.
    assert pod_grace - grace >= 10, (pod_grace, grace)


def test_gateways_share_a_snapshot_store(sts):
    env = _env(_container(sts))
    assert env.get("CLOUD_RUN_SANDBOX_GCS_BUCKET", {}).get("value"), "the members need a shared store"
    assert env["SANDBOX_PERSIST_ON_SHUTDOWN"]["value"] == "true"
    # Copies left behind when ids move without a persist are reclaimed only
    # by the idle TTL (docs/deploy.md, "What each kind of failure costs").
    assert int(env["SANDBOX_IDLE_TTL"]["value"]) > 0


def test_gateway_probes_are_grpc_on_its_plaintext_health_port(sts, headless):
    # The kubelet's gRPC probes speak no TLS: they go to the plaintext
    # health-only listener, never to the TLS port the shims use.
    c = _container(sts)
    env = _env(c)
    health_port = int(env["SANDBOX_HEALTH_LISTEN"]["value"].rsplit(":", 1)[1])
    tls_port = int(env["SANDBOX_LISTEN"]["value"].rsplit(":", 1)[1])
    assert health_port != tls_port
    assert health_port in [p["containerPort"] for p in c["ports"]]
    assert health_port not in [p["port"] for p in headless["spec"]["ports"]], "the shims need no health port"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == health_port, probe
    assert "lifecycle" not in c, "no preStop: the shims keep routing to a draining gateway"


def test_gateway_has_the_privileges_volumes_and_resources_of_the_all_in_one(sts):
    [aio] = _docs(K8S / "deployment.yaml")
    a, g = _container(aio), _container(sts)
    for key in ("securityContext", "resources"):
        assert g[key] == a[key], key
    # The same volumes, and the TLS Secret (read-only) on top.
    extra_mounts = [m for m in g["volumeMounts"] if m not in a["volumeMounts"]]
    assert len(g["volumeMounts"]) - len(extra_mounts) == len(a["volumeMounts"])
    assert [m["readOnly"] for m in extra_mounts] == [True]
    aio_volumes = aio["spec"]["template"]["spec"]["volumes"]
    extra = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v not in aio_volumes]
    assert len(sts["spec"]["template"]["spec"]["volumes"]) - len(extra) == len(aio_volumes)
    assert [v["name"] for v in extra] == [extra_mounts[0]["name"]] and "secret" in extra[0]
    assert sts["spec"]["template"]["metadata"]["annotations"] == aio["spec"]["template"]["metadata"]["annotations"]
    assert g["name"] == a["name"], "the AppArmor annotation names the container"
    assert _env(g)["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"] == _env(a)["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"]


# ---- the shims ---------------------------------------------------------------------------


def test_shim_gateways_is_the_srv_name_of_the_headless_grpc_port(shim, headless):
    c = _container(shim)
    assert c["args"] == ["shim"]
    env = _env(c)
    value = env["SHIM_GATEWAYS"]["value"]
    m = re.fullmatch(r"dns-srv:_([a-z0-9-]+)\._tcp\.([a-z0-9-]+)\.\$\(POD_NAMESPACE\)\.svc\.cluster\.local", value)
    assert m, value
    port_name, service = m.groups()
    assert service == headless["metadata"]["name"]
    assert port_name in [p.get("name") for p in headless["spec"]["ports"]]
    assert [p.get("protocol", "TCP") for p in headless["spec"]["ports"] if p.get("name") == port_name] == ["TCP"]
    # $(POD_NAMESPACE) expands only when defined earlier in the list.
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_NAMESPACE") < names.index("SHIM_GATEWAYS")
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "SHIM_GATEWAY_TARGET" not in env, "SHIM_GATEWAYS replaces it"
    assert env["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"] == _env(_container(_one("StatefulSet")))[
        "CLOUD_RUN_SANDBOX_GATEWAY_SECRET"]


def test_shim_runs_unprivileged(shim):
    pod = shim["spec"]["template"]["spec"]
    sc = {**pod.get("securityContext", {}), **_container(shim)["securityContext"]}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"


def test_shim_probes(shim):
    c = _container(shim)
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert shim["spec"]["replicas"] >= 2


def test_shim_service_selects_the_shims_without_affinity(shim, sts):
    svc = [s for s in _scaled() if s["kind"] == "Service" and s["spec"].get("clusterIP") != "None"]
    assert len(svc) == 1, svc
    spec = svc[0]["spec"]
    assert _selects(spec["selector"], shim["spec"]["template"]["metadata"]["labels"])
    assert not _selects(spec["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert spec.get("sessionAffinity", "None") == "None", "routing is by sandbox id: no affinity"
    [port] = spec["ports"]
    assert port["port"] == 80
    [cport] = [p for p in _container(shim)["ports"] if p.get("name") == port["targetPort"]]
    assert cport["containerPort"] == int(_env(_container(shim))["PORT"]["value"]) == 8080


# ---- disruption budgets ------------------------------------------------------------------


def test_pdbs_select_the_right_pods(sts, shim):
    pdbs = [d for d in _scaled() if d["kind"] == "PodDisruptionBudget"]
    gw_labels = sts["spec"]["template"]["metadata"]["labels"]
    shim_labels = shim["spec"]["template"]["metadata"]["labels"]
    [gw] = [p for p in pdbs if _selects(p["spec"]["selector"], gw_labels)]
    [sh] = [p for p in pdbs if _selects(p["spec"]["selector"], shim_labels)]
    assert gw is not sh and len(pdbs) == 2
    assert not _selects(gw["spec"]["selector"], shim_labels)
    assert not _selects(sh["spec"]["selector"], gw_labels)
    assert gw["spec"] == {"maxUnavailable": 1, "selector": gw["spec"]["selector"]}
    assert sh["spec"]["minAvailable"] == 1 < shim["spec"]["replicas"]


# ---- every variable set is known -------------------------------------------------------------

_NAME = re.compile(r"^  ([A-Z][A-Z0-9_]*)\s*$")


def _help_variables(program: str) -> set[str]:
    binary = PROGRAMS[program]
    if not binary.is_file():
        pytest.fail(f"{binary} not found: build it with `bazel build //...`")
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    names = {m.group(1) for line in r.stdout.splitlines() if (m := _NAME.match(line))}
    assert len(names) >= 5, f"could not parse {binary} --help:\n{r.stdout}"
    return names


@pytest.fixture(scope="module")
def known() -> dict[str, set[str]]:
    header = ENTRYPOINT.read_text().split("\nset -euo", 1)[0]
    entrypoint = set(re.findall(r"^#\s+(SANDBOX_[A-Z_]+)\s", header, re.M))
    assert entrypoint, "no variables in deploy/entrypoint.sh's header"
    gateway, shim = _help_variables("gateway"), _help_variables("shim")
    return {"gateway": gateway | entrypoint, "shim": shim | entrypoint, "all": gateway | shim | entrypoint}


def _workloads() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.rglob("*.yaml")) + [CLOUDRUN]:
        for d in _docs(path):
            if d.get("kind") in ("Deployment", "StatefulSet", "Service") and "template" in d.get("spec", {}):
                out.append((f"{path.relative_to(ROOT)} {d['kind']}/{d['metadata']['name']}", d))
    return out


def test_the_manifests_are_found():
    kinds = sorted(d["kind"] for _, d in _workloads())
    assert kinds == ["Deployment", "Deployment", "Service", "StatefulSet"], kinds


def test_every_variable_set_is_known_to_its_program(known):
    unknown = {}
    for where, d in _workloads():
        for c in d["spec"]["template"]["spec"]["containers"]:
            mode = (c.get("args") or ["all"])[0]
            values = " ".join(str(e.get("value", "")) for e in c.get("env", []))
            for e in c.get("env", []):
                name = e["name"]
                # A downward-API value used only to build others ($(NAME)).
                if "fieldRef" in e.get("valueFrom", {}) and f"$({name})" in values:
                    continue
                if name not in known[mode]:
                    unknown.setdefault(where, []).append(name)
    assert not unknown, f"variables no program of the container knows: {unknown}"
