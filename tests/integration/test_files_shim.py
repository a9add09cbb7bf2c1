"""The shim's file endpoints with a plain HTTP client: raw bytes up (PUT,
streamed) and down (GET, Range), stat, list, delete, rename, mkdir, watch
as NDJSON; errors as the rest of the shim (404, 409, 422; 403 for the
sandbox's own permissions, 507 for its disk quota); and a seed-style
workflow: upload a script, run it through exec, download its output."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.parse

import pytest

from tests.lib.shim import ShimClient, running_shim

MiB = 1 << 20


@pytest.fixture(scope="module")
def api(shim):
    c = ShimClient(shim)
    yield c
    c.cleanup()


@pytest.fixture(scope="module")
def sid(api):
    return api.launch()


def q(path: str, **kw) -> str:
    return urllib.parse.urlencode({"path": path, **kw})


def test_put_then_get_round_trips_bytes(shim, sid):
    for data in (b"", b"z", bytes(range(256)), os.urandom(5 * MiB + 3)):
        r = shim.request("PUT", f"/sandboxes/{sid}/files?{q('/tmp/up.bin', mode='0600')}", data,
                         headers={"Content-Type": "application/octet-stream"})
        assert r.status == 201, r
        info = r.json()
        assert info["size"] == len(data) and info["type"] == "file" and info["mode"] == 0o600, info
        g = shim.request("GET", f"/sandboxes/{sid}/files?{q('/tmp/up.bin')}")
        assert g.status == 200, g
        assert g.headers["content-type"] == "application/octet-stream"
        assert int(g.headers["content-length"]) == len(data)
        assert hashlib.sha256(g.body).digest() == hashlib.sha256(data).digest()


def test_range_gives_206(shim, sid):
    data = bytes(range(256)) * 16
    assert shim.request("PUT", f"/sandboxes/{sid}/files?{q('/tmp/range')}", data).status == 201
    r = shim.request("GET", f"/sandboxes/{sid}/files?{q('/tmp/range')}", headers={"Range": "bytes=10-19"})
    assert r.status == 206 and r.body == data[10:20], r
    assert r.headers["content-range"] == f"bytes 10-19/{len(data)}"
    r = shim.request("GET", f"/sandboxes/{sid}/files?{q('/tmp/range')}", headers={"Range": "bytes=4000-"})
    assert r.status == 206 and r.body == data[4000:], r
    r = shim.request("GET", f"/sandboxes/{sid}/files?{q('/tmp/range')}", headers={"Range": "bytes=99999-"})
    assert r.status == 416, r


def test_metadata_endpoints(shim, sid):
    base = f"/sandboxes/{sid}/files"
    r = shim.request("POST", f"{base}/mkdir", {"path": "/tmp/m/a/b", "parents": True, "mode": 0o750})
    assert r.status == 201 and r.json()["type"] == "directory" and r.json()["mode"] == 0o750, r
    assert shim.request("PUT", f"{base}?{q('/tmp/m/a/f', append='true')}", b"12").status == 201
    assert shim.request("PUT", f"{base}?{q('/tmp/m/a/f', append='true')}", b"34").status == 201
    st = shim.request("GET", f"{base}/stat?{q('/tmp/m/a/f')}")
    assert st.status == 200 and st.json()["size"] == 4 and st.json()["name"] == "f", st
    ls = shim.request("GET", f"{base}/list?{q('/tmp/m', depth=3)}")
    assert [e["path"] for e in ls.json()["entries"]] == ["/tmp/m/a", "/tmp/m/a/b", "/tmp/m/a/f"], ls
    mv = shim.request("POST", f"{base}/rename", {"from": "/tmp/m/a/f", "to": "/tmp/m/g"})
    assert mv.status == 200 and mv.json()["path"] == "/tmp/m/g", mv
    assert shim.request("POST", f"{base}/rename", {"from": "/tmp/m/g", "to": "/tmp/m/a"}).status == 409
    assert shim.request("DELETE", f"{base}?{q('/tmp/m')}").status == 409
    assert shim.request("DELETE", f"{base}?{q('/tmp/m', recursive='true')}").status == 204
    assert shim.request("GET", f"{base}/stat?{q('/tmp/m')}").status == 404


def test_errors_map_like_the_rest_of_the_shim(shim, sid):
    base = f"/sandboxes/{sid}/files"
    assert shim.request("GET", f"{base}?{q('/nope')}").status == 404
    assert shim.request("GET", f"/sandboxes/no-such-sbx/files?{q('/etc/hostname')}").status == 404
    assert shim.request("GET", f"/sandboxes/--evil/files?{q('/etc/hostname')}").status == 422
    assert shim.request("GET", f"{base}").status == 422
    assert shim.request("GET", f"{base}?path=").status == 422
    assert shim.request("GET", f"{base}?path=/etc/pass%00wd").status == 422
    assert shim.request("PUT", f"{base}?path=/tmp/x%00y", b"x").status == 422
    assert shim.request("PUT", f"{base}?{q('/tmp/x', mode='999')}", b"x").status == 422
    assert shim.request("GET", f"{base}?{q('/etc')}").status == 409
    assert shim.request("GET", f"{base}?{q('/proc/1/environ')}").status == 403
    assert shim.request("POST", f"{base}/mkdir", {"path": ""}).status == 422
    assert shim.request("POST", f"{base}/mkdir", {"path": "/etc"}).status == 409
    assert shim.request("POST", f"{base}/rename", {"from": "/a"}).status == 422
    assert shim.request("GET", f"{base}?{q('/etc/hostname')}", auth=False).status == 401


def test_a_put_over_the_quota_is_507_and_keeps_the_old_file(shims, gateway_secret):
    gw = shims.gateway({"SANDBOX_DISK_MB": "24"}, secret=gateway_secret)
    s = shims.shim(gw)
    c = ShimClient(s)
    sid = c.launch()
    try:
        assert s.request("PUT", f"/sandboxes/{sid}/files?{q('/tmp/q/f', make_parents='true')}", b"old").status == 201
        r = s.request("PUT", f"/sandboxes/{sid}/files?{q('/tmp/q/f')}", os.urandom(40 * MiB))
        assert r.status == 507, r
        assert s.request("GET", f"/sandboxes/{sid}/files?{q('/tmp/q/f')}").body == b"old"
        ls = s.request("GET", f"/sandboxes/{sid}/files/list?{q('/tmp/q')}").json()["entries"]
        assert [e["name"] for e in ls] == ["f"]
    finally:
        c.cleanup()


def test_watch_streams_ndjson(shim, api, sid):
    api.sh(sid, "mkdir -p /tmp/wn")
    conn = shim.connection(30)
    try:
        conn.request("GET", f"/sandboxes/{sid}/files/watch?{q('/tmp/wn')}", headers=shim.auth_headers())
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("content-type").startswith("application/x-ndjson")
        assert json.loads(resp.readline())["event"] == "watching"
        api.sh(sid, "echo x > /tmp/wn/f")
        events = [json.loads(resp.readline()) for _ in range(2)]
        assert events == [{"event": "created", "path": "/tmp/wn/f", "is_dir": False},
                          {"event": "modified", "path": "/tmp/wn/f", "is_dir": False}], events
    finally:
        conn.close()


def test_seed_workflow_upload_run_download(shim, api, sid):
    script = b"#!/bin/sh\nset -e\nmkdir -p /root/out\nfor i in 1 2 3; do echo line $i; done > /root/out/result.txt\n"
    r = shim.request("PUT", f"/sandboxes/{sid}/files?{q('/root/seed/run.sh', mode='0755', make_parents='true')}",
                     script)
    assert r.status == 201 and r.json()["mode"] == 0o755, r
    res = api.run(sid, ["/root/seed/run.sh"])
    assert res["exit_code"] == 0, res
    out = shim.request("GET", f"/sandboxes/{sid}/files?{q('/root/out/result.txt')}")
    assert out.status == 200 and out.body == b"line 1\nline 2\nline 3\n", out


def test_a_listing_of_several_pages_comes_whole_and_one_past_the_caps_is_429(shim, api, sid):
    # 20 000 entries: more than the shim's page of 16 384 (and, with
    # 1 KiB names, more than the gateway's page of 4 MiB), fewer than its
    # cap of 100 000 entries and 16 MiB.
    make = ("import os\n"
            "os.makedirs('/tmp/many')\n"
            "for i in range(20000):\n"
            "    os.close(os.open('/tmp/many/%05d' % i, os.O_CREAT | os.O_WRONLY))\n"
            "os.makedirs('/tmp/long')\n"
            "for i in range(17000):\n"
            "    os.close(os.open('/tmp/long/%05d' % i + 'n' * 250, os.O_CREAT | os.O_WRONLY))\n"
            "os.makedirs('/tmp/huge/' + '/'.join(['d' * 250] * 15))\n")
    r = shim.request("POST", f"/sandboxes/{sid}/exec", json.dumps({"argv": ["python3", "-c", make]}).encode(),
                     headers={"Content-Type": "application/json"})
    assert r.status == 200 and r.json()["exit_code"] == 0, r.body[-500:]
    ls = shim.request("GET", f"/sandboxes/{sid}/files/list?{q('/tmp/many')}").json()["entries"]
    assert [e["name"] for e in ls] == ["%05d" % i for i in range(20000)]
    long_names = shim.request("GET", f"/sandboxes/{sid}/files/list?{q('/tmp/long')}").json()["entries"]
    assert len(long_names) == 17000 and long_names[-1]["name"] == "16999" + "n" * 250
    # More than 16 MiB of entries, with paths of ~3.8 KB: 4600 hard links.
    link = ("import os\n"
            "d = '/tmp/huge/' + '/'.join(['d' * 250] * 15)\n"
            "open(d + '/f', 'w').close()\n"
            "for i in range(4600):\n"
            "    os.link(d + '/f', d + '/l%d' % i)\n"
            "print(d)\n")
    r = shim.request("POST", f"/sandboxes/{sid}/exec", json.dumps({"argv": ["python3", "-c", link]}).encode(),
                     headers={"Content-Type": "application/json"})
    assert r.status == 200 and r.json()["exit_code"] == 0, r.body[-500:]
    deep = base64.b64decode(r.json()["stdout_b64"]).decode().strip()
    r = shim.request("GET", f"/sandboxes/{sid}/files/list?{q(deep)}")
    assert r.status == 429 and "smaller depth" in r.json()["detail"], (r.status, r.body[:300])
