"""The launch spec through the shim (additive REST): POST /sandboxes with
resources, env, labels, idle_ttl and max_lifetime; GET /sandboxes?labels=
filtering the fan-out over two gateways the same way; POST
/sandboxes/{id}/extend; the launch env seen by exec and detached processes. Bad input is 422 in the shim's error shape and
launches nothing."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from tests.lib.client import new_id
from tests.lib.procs import wait_until
from tests.lib.shim import start_shim

SECRET = "shim-spec-secret"


@pytest.fixture
def pair(gateways):
    gws = [gateways.gateway(env={"SANDBOX_GATEWAY_NAME": f"spec-{i}"}, secret=SECRET) for i in range(2)]
    extra = {"SHIM_GATEWAY_TARGET": None, "SHIM_GATEWAYS": ",".join(g.target for g in gws),
             "SHIM_GATEWAYS_HEALTH_SECONDS": "1"}
    shim = gateways.add(start_shim(target="unused", secret=SECRET, env=extra))
    made: list[str] = []
    try:
        yield shim, made
    finally:
        for sid in made:
            shim.request("DELETE", f"/sandboxes/{sid}")


def listed(shim, selector: str | None = None) -> dict[str, dict]:
    path = "/sandboxes" + ("?labels=" + urllib.parse.quote(selector) if selector is not None else "")
    r = shim.request("GET", path)
    assert r.status == 200, (r.status, r.body)
    return {s["sandbox_id"]: s for s in r.json()["sandboxes"]}


def test_labels_select_across_the_fan_out_over_two_gateways(pair):
    shim, made = pair
    ids = {}
    for i in range(12):
        sid = new_id(f"fan{i}")
        labels = {"tier": "web" if i % 2 == 0 else "db"}
        if i % 3 == 0:
            labels["owner"] = "alice"
        r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "labels": labels})
        assert r.status == 201, (r.status, r.body)
        made.append(sid)
        ids[sid] = labels
    mine = set(ids)
    everything = listed(shim)
    assert mine <= set(everything)
    assert everything[made[0]]["labels"] == ids[made[0]]
    web = {s for s, lb in ids.items() if lb["tier"] == "web"}
    owned = {s for s, lb in ids.items() if "owner" in lb}
    assert set(listed(shim, "tier=web")) & mine == web
    assert set(listed(shim, "tier!=web")) & mine == mine - web
    assert set(listed(shim, "owner")) & mine == owned
    assert set(listed(shim, "!owner,tier==db")) & mine == {s for s in mine - owned if ids[s]["tier"] == "db"}
    # Both gateways hold some of them (the set routes ids by hash).
    r = shim.request("GET", "/metrics")
    assert r.status == 200


def test_resources_env_and_extend_through_the_shim(pair):
    shim, made = pair
    sid = new_id("shim-spec")
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "resources": {"memory_mb": 300, "pids_max": 100},
                                            "env": {"SPEC_VAR": "from-launch"}, "idle_ttl": 30,
                                            "max_lifetime": 600})
    assert r.status == 201, (r.status, r.body)
    made.append(sid)
    r = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": ["sh", "-c", "echo $SPEC_VAR"]})
    assert r.status == 200 and base64.b64decode(r.json()["stdout_b64"]) == b"from-launch\n", r.body
    before = listed(shim)[sid]["expires_at_ms"]
    assert before > 0
    r = shim.request("POST", f"/sandboxes/{sid}/extend", {"idle_ttl": 3000})
    assert r.status == 200, (r.status, r.body)
    assert r.json()["expires_at_ms"] > before + 60_000
    r = shim.request("POST", f"/sandboxes/{sid}/extend", {"idle_ttl": 10 ** 7})
    assert r.status == 422 and "idle_ttl_seconds" in r.body.decode(), (r.status, r.body)


def test_launch_env_is_seen_by_a_detached_process_and_a_file_call_through_the_shim(pair):
    shim, made = pair
    sid = new_id("shim-env")
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "env": {"SPEC_VAR": "from-launch", "HOME": "/tmp"}})
    assert r.status == 201, (r.status, r.body)
    made.append(sid)
    for name, env, want in (("seen", {}, b"from-launch /tmp\n"), ("mine", {"SPEC_VAR": "from-run"}, b"from-run /tmp\n")):
        r = shim.request("POST", f"/sandboxes/{sid}/processes",
                         {"argv": ["sh", "-c", 'echo "$SPEC_VAR $HOME"'], "env": env, "process_id": name})
        assert r.status == 201, (r.status, r.body)
        assert wait_until(lambda: not shim.request("GET", f"/sandboxes/{sid}/processes/{name}").json()["running"],
                          10), name
        r = shim.request("GET", f"/sandboxes/{sid}/processes/{name}/output")
        assert r.status == 200, (r.status, r.body)
        out = b"".join(base64.b64decode(e["stdout_b64"]) for e in map(json.loads, r.body.splitlines())
                       if "stdout_b64" in e)
        assert out == want, (name, r.body)
    # A file call: a relative path is still taken from /root.
    r = shim.request("PUT", f"/sandboxes/{sid}/files?path=note", b"written",
                     headers={"Content-Type": "application/octet-stream"})
    assert r.status in (200, 201), (r.status, r.body)
    r = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": ["cat", "/root/note"]})
    assert r.status == 200 and base64.b64decode(r.json()["stdout_b64"]) == b"written", r.body


@pytest.mark.parametrize("body, where", [
    ({"resources": {"memory_mb": -1}}, "memory_mb"),
    ({"resources": {"cpus": "lots"}}, "cpus"),
    ({"resources": "big"}, "resources"),
    ({"env": {"A=B": "x"}}, "env"),
    ({"env": {"": "x"}}, "env"),
    ({"env": {f"V{i}": "x" for i in range(129)}}, "env"),
    ({"env": {"A": 1}}, "env"),
    ({"labels": {"bad key": "x"}}, "labels"),
    ({"labels": {f"k{i}": "v" for i in range(65)}}, "labels"),
    ({"idle_ttl": -5}, "idle_ttl"),
    ({"max_lifetime": 10 ** 12}, "max_lifetime"),
])
def test_bad_specs_are_422_and_launch_nothing(pair, body, where):
    shim, made = pair
    sid = new_id("bad-spec")
    r = shim.request("POST", "/sandboxes", dict(body, sandbox_id=sid))
    assert r.status == 422, (r.status, r.body)
    assert where in r.body.decode()
    assert sid not in listed(shim)


def test_a_gateway_maximum_is_422_with_its_reason(pair):
    shim, _ = pair
    sid = new_id("over")
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "resources": {"memory_mb": 10 ** 9}})
    assert r.status == 422 and "memory_mb" in r.body.decode(), (r.status, r.body)


@pytest.mark.parametrize("selector", ["a,,b", "=v", "env in (a,b)", "a=b=c", "x" * 5000])
def test_malformed_selectors_are_422(pair, selector):
    shim, _ = pair
    r = shim.request("GET", "/sandboxes?labels=" + urllib.parse.quote(selector))
    assert r.status == 422, (r.status, r.body)
    assert r.json()["detail"][0]["loc"] == ["query", "labels"], r.body
