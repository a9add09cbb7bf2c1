"""Scale-out: several gateways behind shims that route every call by
sandbox id (SHIM_GATEWAYS), one shared local snapshot store standing in for
GCS. Each test starts its own gateways and shims on loopback; SRV records
come from a DNS server of the test (tests/lib/dns.py), seen by the shim
through a private mount namespace's /etc/resolv.conf.

What is checked: ids spread evenly and every shim sends an id to the same
gateway; a gateway joining moves about 1/N of the ids, which a connect
restores on their new owner; SIGTERM persists every sandbox before the
gateway exits and its ids come back elsewhere with their latest files;
kill -9 fails over to the last persisted state, with clear errors and no
hang in the gap and no id held by two gateways; a gateway failing its
health check leaves the set and comes back."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.lib.client import SandboxClient, new_id
from tests.lib.gateway import Gateway
from tests.lib.procs import free_port, require_shim_binary, run_to_completion, wait_until
from tests.lib.shim import Shim, ShimClient, metric_value, shim_env, start_shim

SECRET = "scaleout-test-secret"
POOL = 8

dnslib = pytest.importorskip("dnslib", reason="python3-dnslib is needed for the SRV tests")


@pytest.fixture
def store():
    d = tempfile.mkdtemp(prefix="sgw-shared-store-")
    yield Path(d)
    for root, dirs, files in os.walk(d, topdown=False):
        for f in files:
            os.unlink(os.path.join(root, f))
        for x in dirs:
            os.rmdir(os.path.join(root, x))
    os.rmdir(d)


def start_gateways(group, n: int, store: Path, env: dict | None = None) -> list[Gateway]:
    """`n` gateways sharing the snapshot store `store`."""
    extra = {"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_PERSIST_ON_SHUTDOWN": "false"}
    extra.update(env or {})
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: group.gateway(env=dict(extra, SANDBOX_GATEWAY_NAME=f"gw-{i}"),
                                                     secret=SECRET), range(n)))


def list_shim(group, gateways: str, env: dict | None = None) -> Shim:
    """A shim routing over `gateways` (SHIM_GATEWAYS), probing every second."""
    extra = {"SHIM_GATEWAY_TARGET": None, "SHIM_GATEWAYS": gateways, "SHIM_GATEWAYS_HEALTH_SECONDS": "1"}
    extra.update(env or {})
    return group.add(start_shim(target="unused", secret=SECRET, env=extra))


def three_behind_a_shim(group, store, ids: list[str]) -> tuple[list[Gateway], Shim]:
    """Three gateways, a shim routing over them, and `ids` launched
    through it."""
    gws = start_gateways(group, 3, store)
    shim = list_shim(group, ",".join(g.target for g in gws))
    launch_all(shim, ids)
    return gws, shim


def holders(gws: list[Gateway]) -> dict[str, list[int]]:
    """Which gateways (indexes) hold each sandbox id, asked over gRPC."""
    out: dict[str, list[int]] = {}
    for i, gw in enumerate(gws):
        if gw.alive():
            for sid in SandboxClient(gw).ids():
                out.setdefault(sid, []).append(i)
    return out


def launch_all(shim: Shim, ids: list[str]) -> None:
    def one(sid):
        r = shim.request("POST", "/sandboxes", {"sandbox_id": sid})
        assert r.status == 201, (sid, r)
    with ThreadPoolExecutor(POOL) as pool:
        list(pool.map(one, ids))


def in_parallel(fn, items) -> list:
    with ThreadPoolExecutor(POOL) as pool:
        return list(pool.map(fn, items))


def metrics(shim: Shim) -> str:
    r = shim.request("GET", "/metrics")
    assert r.status == 200, r
    return r.body.decode()


def gateway_state(shim: Shim, member: str) -> float:
    """1 up, 0.5 draining, 0 down, -1 not listed."""
    text = metrics(shim)
    if f'shim_gateway_up{{gateway="{member}"}}' not in text:
        return -1.0
    return metric_value(text, "shim_gateway_up", {"gateway": member})


def write_file(shim: Shim, sid: str, text: str) -> None:
    r = shim.request("POST", f"/sandboxes/{sid}/exec",
                     {"argv": ["sh", "-c", f"printf %s {text} > /root/state"]})
    assert r.status == 200 and r.json()["exit_code"] == 0, (sid, r)


def read_file(shim: Shim, sid: str) -> str:
    return ShimClient(shim).sh(sid, "cat /root/state")


def persist(shim: Shim, sid: str) -> None:
    r = shim.request("POST", f"/sandboxes/{sid}/snapshot", timeout=120)
    assert r.status == 200, (sid, r)


def connect(shim: Shim, sid: str) -> str:
    r = shim.request("POST", f"/sandboxes/{sid}/connect", timeout=120)
    assert r.status == 200, (sid, r)
    return r.json()["outcome"]


def delete_all(shim: Shim, ids) -> None:
    in_parallel(lambda sid: shim.request("DELETE", f"/sandboxes/{sid}?delete_snapshot=true"), list(ids))


def delete_everywhere(gws: list[Gateway]) -> None:
    """Deletes what every live gateway still holds, over gRPC (copies no
    shim routes to any more)."""
    for gw in gws:
        if gw.alive():
            c = SandboxClient(gw)
            in_parallel(lambda sid: c.delete(sid, delete_snapshot=True), c.ids())


# --- spread and agreement ------------------------------------------------------

def test_ids_spread_evenly_and_every_shim_routes_an_id_to_the_same_gateway(gateways, store):
    gws = start_gateways(gateways, 3, store)
    spec = ",".join(g.target for g in gws)
    shim_a = list_shim(gateways, spec)
    # The other shim lists the gateways in another order: owners follow the
    # names, not their position.
    shim_b = list_shim(gateways, ",".join(g.target for g in reversed(gws)))
    ids = [new_id("spread") for _ in range(300)]
    launch_all(shim_a, ids[:150])
    launch_all(shim_b, ids[150:])
    try:
        held = holders(gws)
        assert sorted(held) == sorted(ids)
        assert all(len(v) == 1 for v in held.values()), {k: v for k, v in held.items() if len(v) > 1}
        counts = [sum(1 for v in held.values() if v == [i]) for i in range(3)]
        assert all(75 <= c <= 125 for c in counts), counts  # within ±25 % of 100

        # Either shim reaches each id (a call routed elsewhere would be 404).
        for shim in (shim_a, shim_b):
            statuses = in_parallel(lambda sid: shim.request("GET", f"/sandboxes/{sid}/processes").status, ids)
            assert statuses == [200] * len(ids)
            r = shim.request("GET", "/sandboxes")
            assert r.status == 200, r
            assert sorted(s["sandbox_id"] for s in r.json()["sandboxes"]) == sorted(ids)

        text = metrics(shim_a)
        for g in gws:
            assert metric_value(text, "shim_gateway_up", {"gateway": g.target}) == 1
            assert metric_value(text, "shim_gateway_sandboxes", {"gateway": g.target}) == counts[gws.index(g)]
            assert metric_value(text, "shim_gateway_calls_routed_total", {"gateway": g.target}) > 0
        assert metric_value(text, "shim_gateway_members_up") == 3
        for i, g in enumerate(gws):
            assert metric_value(text, "shim_gateway_info", {"gateway": g.target, "name": f"gw-{i}"}) == 1
    finally:
        delete_all(shim_a, ids)


@pytest.mark.parametrize("spec, why", [
    (",", "names no gateway"),
    ("127.0.0.1:1,,127.0.0.1:2", "empty entry"),
    ("dns-srv:", "needs a DNS name"),
    ("dns-srv:a b", "needs a DNS name"),
    ("no-port", "gateway address"),
])
def test_a_gateway_set_that_names_nothing_usable_is_refused_at_start(spec, why):
    env = shim_env("unused", free_port(), SECRET, {"SHIM_GATEWAY_TARGET": None, "SHIM_GATEWAYS": spec})
    result = run_to_completion([require_shim_binary()], env, timeout=10)
    assert result.returncode == 2, result
    assert "SHIM_GATEWAYS" in result.stderr and why in result.stderr, result.stderr


def test_naming_the_gateways_twice_is_refused_at_start():
    env = shim_env("127.0.0.1:1", free_port(), SECRET, {"SHIM_GATEWAYS": "127.0.0.1:2"})
    result = run_to_completion([require_shim_binary()], env, timeout=10)
    assert result.returncode == 2 and "both set" in result.stderr, result


# --- membership from SRV records --------------------------------------------------

@pytest.fixture
def dns():
    from tests.lib.dns import DnsServer
    server = DnsServer()
    try:
        yield server
    finally:
        server.stop()


SRV_NAME = "_grpc._tcp.sandbox-gateway.scaleout.test"


def srv_shim(group, dns) -> Shim:
    env = shim_env("unused", free_port(), SECRET,
                   {"SHIM_GATEWAY_TARGET": None, "SHIM_GATEWAYS": f"dns-srv:{SRV_NAME}",
                    "SHIM_GATEWAYS_REFRESH_SECONDS": "1", "SHIM_GATEWAYS_HEALTH_SECONDS": "1"})
    shim = group.add(Shim(env, binary=dns.resolv_wrapper(require_shim_binary())))
    assert shim.wait_listening() is not None, shim.describe()
    return shim


def publish(dns, gws: list[Gateway]) -> list[str]:
    """SRV records naming `gws` by stable names; the member names."""
    names = []
    records = []
    for i, g in enumerate(gws):
        host = f"sandbox-gateway-{i}.sandbox-gateway.scaleout.test"
        dns.set_a(host, "127.0.0.1")
        records.append((host, int(g.target.rsplit(":", 1)[1])))
        names.append(f"{host}:{records[-1][1]}")
    dns.set_srv(SRV_NAME, records)
    return names


def test_a_fourth_gateway_joining_moves_about_a_quarter_of_the_ids_which_connect_restores(gateways, store, dns):
    gws = start_gateways(gateways, 4, store)
    names = publish(dns, gws[:3])
    shim = srv_shim(gateways, dns)
    assert wait_until(lambda: all(gateway_state(shim, n) == 1 for n in names), 15), metrics(shim)
    ids = [new_id("srv") for _ in range(200)]
    launch_all(shim, ids)
    try:
        in_parallel(lambda sid: write_file(shim, sid, f"saved-{sid}"), ids)
        in_parallel(lambda sid: persist(shim, sid), ids)
        before = holders(gws)
        assert all(before[sid] in ([0], [1], [2]) for sid in ids), before

        names = publish(dns, gws)  # the StatefulSet scales to 4
        assert wait_until(lambda: gateway_state(shim, names[3]) == 1, 15), metrics(shim)

        outcomes = dict(zip(ids, in_parallel(lambda sid: connect(shim, sid), ids)))
        moved = [sid for sid in ids if outcomes[sid] != "live"]
        assert all(outcomes[sid] == "restored" for sid in moved), outcomes
        assert 0.13 * len(ids) <= len(moved) <= 0.37 * len(ids), len(moved)
        after = holders(gws)
        for sid in ids:
            if sid in moved:
                # restored on the new gateway, from its snapshot
                assert 3 in after[sid], (sid, after[sid])
                assert read_file(shim, sid) == f"saved-{sid}"
            else:
                assert after[sid] == before[sid], (sid, before[sid], after[sid])
        assert metric_value(metrics(shim), "shim_gateway_members") == 4
    finally:
        # with the copies left on the old owners of the moved ids
        delete_everywhere(gws)


# --- drain on SIGTERM -------------------------------------------------------------

def test_sigterm_persists_every_sandbox_and_each_comes_back_on_its_new_owner(gateways, store):
    gws = start_gateways(gateways, 3, store,
                         {"SANDBOX_PERSIST_ON_SHUTDOWN": "true", "SANDBOX_SHUTDOWN_GRACE_SECONDS": "120"})
    shim = list_shim(gateways, ",".join(g.target for g in gws))
    # Sandboxes until gateway 0 holds 50.
    ids: list[str] = []
    mine: list[str] = []
    while len(mine) < 50:
        batch = [new_id("drain") for _ in range(40)]
        launch_all(shim, batch)
        ids += batch
        held = set(SandboxClient(gws[0]).ids())
        mine = [sid for sid in ids if sid in held]
    mine = mine[:50]
    try:
        # Unsaved changes: written, never persisted.
        in_parallel(lambda sid: write_file(shim, sid, f"latest-{sid}"), mine)
        gws[0].send_signal(signal.SIGTERM)
        assert gws[0].wait(150) == 0, gws[0].describe()
        gws[0].signalled = True
        persisted = {r["sandbox_id"] for r in gws[0].logs.find(lambda r: r.get("outcome") == "persisted")}
        assert set(mine) <= persisted, sorted(set(mine) - persisted)
        # Once it is gone its ids belong to the others: a connect restores
        # each with its latest file.
        assert wait_until(lambda: gateway_state(shim, gws[0].target) == 0, 15), metrics(shim)
        outcomes = in_parallel(lambda sid: connect(shim, sid), mine)
        assert outcomes == ["restored"] * len(mine), outcomes
        contents = in_parallel(lambda sid: read_file(shim, sid), mine)
        assert contents == [f"latest-{sid}" for sid in mine]
        held = holders(gws)
        assert all(len(held[sid]) == 1 and held[sid][0] != 0 for sid in mine)
    finally:
        delete_all(shim, ids)


# --- kill -9 ------------------------------------------------------------------------

def test_kill_9_fails_over_to_the_last_persisted_state_with_clear_errors_in_the_gap(gateways, store):
    ids = [new_id("kill") for _ in range(60)]
    gws, shim = three_behind_a_shim(gateways, store, ids)
    victim = gws[1]
    try:
        in_parallel(lambda sid: write_file(shim, sid, f"persisted-{sid}"), ids)
        in_parallel(lambda sid: persist(shim, sid), ids)
        in_parallel(lambda sid: write_file(shim, sid, f"unsaved-{sid}"), ids)
        lost = [sid for sid in ids if holders(gws)[sid] == [1]]
        assert lost

        victim.expected_exit = None
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(10)
        victim.signalled = True
        # The gap: every call answers, quickly and clearly (the gateway is
        # gone: 502; once the shim knows, the new owner does not know the id
        # yet: 404).
        t0 = time.monotonic()
        statuses = {shim.request("GET", f"/sandboxes/{sid}/processes", timeout=30).status for sid in lost}
        assert statuses <= {502, 404}, statuses
        assert time.monotonic() - t0 < 30
        assert wait_until(lambda: gateway_state(shim, victim.target) == 0, 15), metrics(shim)
        assert {shim.request("GET", f"/sandboxes/{sid}/processes").status for sid in lost} == {404}
        # The backend's connect restores the last persisted state.
        assert in_parallel(lambda sid: connect(shim, sid), lost) == ["restored"] * len(lost)
        assert in_parallel(lambda sid: read_file(shim, sid), lost) == [f"persisted-{sid}" for sid in lost]
        # The others never moved and kept their unsaved work.
        kept = [sid for sid in ids if sid not in lost]
        assert in_parallel(lambda sid: read_file(shim, sid), kept) == [f"unsaved-{sid}" for sid in kept]
        held = holders(gws)
        assert all(len(held[sid]) == 1 for sid in ids), held
        text = metrics(shim)
        assert sum(metric_value(text, "shim_gateway_failovers_total", {"gateway": g.target})
                   for g in (gws[0], gws[2])) > 0
    finally:
        delete_all(shim, ids)
        # What the killed gateway left (cgroups, state) is found and removed
        # by a gateway started on its state directory.
        if victim.returncode is not None:
            again = gateways.add(Gateway(dict(victim.env)))
            again.wait_listening()


# --- health ------------------------------------------------------------------------

def test_a_gateway_failing_its_health_check_leaves_the_set_and_comes_back(gateways, store):
    ids: list[str] = []
    gws, shim = three_behind_a_shim(gateways, store, ids)
    hung = gws[2]
    try:
        os.kill(hung.pid, signal.SIGSTOP)  # hung: answers nothing
        try:
            assert wait_until(lambda: gateway_state(shim, hung.target) == 0, 15), metrics(shim)
            r = shim.request("GET", "/ready")
            assert r.status == 200, r  # the others carry on
            away = [new_id("away") for _ in range(45)]
            launch_all(shim, away)
            ids += away
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        assert wait_until(lambda: gateway_state(shim, hung.target) == 1, 15), metrics(shim)
        held = holders(gws)
        assert not [sid for sid in away if 2 in held[sid]]
        back = [new_id("back") for _ in range(60)]
        launch_all(shim, back)
        ids += back
        held = holders(gws)
        assert 5 <= sum(1 for sid in back if held[sid] == [2]) <= 40
        r = shim.request("GET", "/sandboxes")
        assert sorted(s["sandbox_id"] for s in r.json()["sandboxes"]) == sorted(ids)
    finally:
        # Ids launched elsewhere while it was out whose owner it is are no
        # longer routed to their copies (docs/deploy.md): over gRPC.
        delete_everywhere(gws)


# --- restore on miss ------------------------------------------------------------------

def test_restore_on_miss_restores_a_sandbox_its_owner_does_not_hold_and_only_that(gateways, store):
    gws = start_gateways(gateways, 2, store)
    spec = ",".join(g.target for g in gws)
    shim = list_shim(gateways, spec, {"SHIM_RESTORE_ON_MISS": "true"})
    plain = list_shim(gateways, spec)
    saved, unsaved = new_id("miss"), new_id("miss")
    launch_all(shim, [saved, unsaved])
    try:
        write_file(shim, saved, "from-the-store")
        persist(shim, saved)
        write_file(shim, saved, "after-the-persist")
        held = holders(gws)
        # Its owner loses them (as after a failover), the store keeps one.
        for sid in (saved, unsaved):
            assert SandboxClient(gws[held[sid][0]]).delete(sid) is not None

        # Off (the default): the contract's 404.
        r = plain.request("POST", f"/sandboxes/{saved}/exec", {"argv": ["true"]})
        assert r.status == 404 and r.json() == {"detail": "Sandbox not found"}, r
        # On: restored from the store first, then answered.
        assert read_file(shim, saved) == "from-the-store"
        assert holders(gws)[saved] == held[saved]
        # Not in the store: 404 as before, nothing created.
        r = shim.request("POST", f"/sandboxes/{unsaved}/exec", {"argv": ["true"]})
        assert r.status == 404 and r.json() == {"detail": "Sandbox not found"}, r
        assert unsaved not in holders(gws)
        # A missing file in a live sandbox is not a missing sandbox.
        r = shim.request("GET", f"/sandboxes/{saved}/files/stat?path=/nope")
        assert r.status == 404, r
        text = metrics(shim)
        assert metric_value(text, "shim_restores_on_miss_total", {"outcome": "restored"}) == 1
        assert metric_value(text, "shim_restores_on_miss_total", {"outcome": "absent"}) == 1
        # A delete is never a reason to restore.
        assert SandboxClient(gws[held[saved][0]]).delete(saved) is not None
        r = shim.request("DELETE", f"/sandboxes/{saved}")
        assert r.status == 404, r
        assert saved not in holders(gws)
    finally:
        delete_everywhere(gws)


# --- a copy left behind -----------------------------------------------------------------

def test_a_gateway_that_comes_back_gives_way_to_the_snapshot_written_while_it_was_out(gateways, store):
    ids = [new_id("back") for _ in range(30)]
    gws, shim = three_behind_a_shim(gateways, store, ids)
    hung = gws[2]
    try:
        held = holders(gws)
        mine = [sid for sid in ids if held[sid] == [2]]
        assert mine
        in_parallel(lambda sid: write_file(shim, sid, f"before-{sid}"), mine)
        in_parallel(lambda sid: persist(shim, sid), mine)
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: gateway_state(shim, hung.target) == 0, 15), metrics(shim)
            # A turn elsewhere: connect restores, work, persist.
            assert in_parallel(lambda sid: connect(shim, sid), mine) == ["restored"] * len(mine)
            in_parallel(lambda sid: write_file(shim, sid, f"elsewhere-{sid}"), mine)
            in_parallel(lambda sid: persist(shim, sid), mine)
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        assert wait_until(lambda: gateway_state(shim, hung.target) == 1, 15), metrics(shim)
        # Routed to the returning gateway again, whose copies are older than
        # the snapshots: the next turn's connect replaces them.
        assert in_parallel(lambda sid: connect(shim, sid), mine) == ["restored"] * len(mine)
        assert in_parallel(lambda sid: read_file(shim, sid), mine) == [f"elsewhere-{sid}" for sid in mine]
        # Its own copies it persisted itself stay live.
        assert in_parallel(lambda sid: connect(shim, sid), mine) == ["live"] * len(mine)
        assert "gives way to that snapshot" in hung.describe()
    finally:
        delete_everywhere(gws)


def test_sigterm_does_not_persist_a_copy_left_behind_over_a_newer_snapshot(gateways, store):
    from tests.lib.client import pb
    old, new = start_gateways(gateways, 2, store, {"SANDBOX_PERSIST_ON_SHUTDOWN": "true",
                                                    "SANDBOX_SHUTDOWN_GRACE_SECONDS": "60"})
    a, b = SandboxClient(old), SandboxClient(new)
    moved, kept, fresh = new_id("moved"), new_id("kept"), new_id("fresh")
    # `moved` lived on `old`, was persisted, then served by `new` (which
    # restored it and persisted its own work): `old` keeps a stale copy with
    # an unsaved change of its own.
    a.launch(moved)
    a.ok(moved, "echo old > /root/state")
    a.persist(moved)
    assert b.connect(moved).outcome == pb.ConnectResponse.OUTCOME_RESTORED
    b.ok(moved, "echo new > /root/state")
    b.persist(moved)
    a.ok(moved, "echo stale > /root/state")
    # `kept` lives only on `old`, with unsaved work: persisted as ever.
    a.launch(kept)
    a.ok(kept, "echo kept > /root/state")
    # `fresh` has an old snapshot from an earlier life (persisted, deleted
    # without it), and a new sandbox under its id on `old`: the new one wins.
    b.launch(fresh)
    b.ok(fresh, "echo earlier > /root/state")
    b.persist(fresh)
    b.delete(fresh)
    time.sleep(0.05)
    a.launch(fresh)
    a.ok(fresh, "echo later > /root/state")

    old.send_signal(signal.SIGTERM)
    assert old.wait(90) == 0, old.describe()
    old.signalled = True
    outcome = {r["sandbox_id"]: r["outcome"] for r in old.logs.find(lambda r: "outcome" in r and "sandbox_id" in r)}
    assert outcome == {moved: "stale", kept: "persisted", fresh: "persisted"}, outcome

    b.delete(moved)
    for sid, text in ((moved, "new"), (kept, "kept"), (fresh, "later")):
        assert b.connect(sid).outcome == pb.ConnectResponse.OUTCOME_RESTORED
        assert b.sh_out(sid, "cat /root/state").strip() == text, sid
    for sid in (moved, kept, fresh):
        b.delete(sid, delete_snapshot=True)
