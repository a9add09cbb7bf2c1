"""Many sandboxes at once: 50 launched, 50 concurrent execs each routed to
its own sandbox, all deleted without a trace."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.lib.client import SandboxClient, new_id

N = 50


def test_fifty_sandboxes_with_concurrent_execs(gateway):
    client = SandboxClient(gateway)
    ids = [new_id(f"s{i:02d}") for i in range(N)]
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            infos = list(pool.map(lambda sid: client.launch(sid, timeout=60), ids))
        assert [i.sandbox_id for i in infos] == ids
        assert set(ids) <= set(client.ids())

        # Each sandbox gets a file naming it, then 50 execs run at once and
        # each must see its own sandbox's file (and only its own processes).
        with ThreadPoolExecutor(max_workers=N) as pool:
            setup = list(pool.map(lambda sid: client.sh(sid, 'echo "$ME" > /root/me', env={"ME": sid}),
                                  ids))
        assert all(r.code == 0 for r in setup), [r.describe() for r in setup if r.code != 0][:3]

        script = ('echo "$(cat /root/me) $$"; cat /proc/self/cgroup | wc -l; '
                  'ps -e -o pid= | wc -l; sleep 0.5')
        with ThreadPoolExecutor(max_workers=N) as pool:
            results = list(pool.map(lambda sid: client.sh(sid, script, timeout_seconds=60, rpc_timeout=120),
                                    ids))
        for sid, res in zip(ids, results):
            assert res.code == 0, (sid, res.describe())
            lines = res.out.split("\n")
            assert lines[0].split()[0] == sid, (sid, res.out)
            assert int(lines[1]) > 0
            # The holder, sh, ps and wc: nothing from the other sandboxes.
            assert int(lines[2]) <= 5, (sid, res.out)
    finally:
        client.delete_many(ids, ignore_missing=True)
    assert not set(ids) & set(client.ids())
    assert gateway.leftovers() == []
