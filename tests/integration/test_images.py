"""Images: sandboxes launched on OCI images pulled from a real registry
(Debian's docker-registry on loopback, images pushed with skopeo), layers
shared on disk, the image's Env and WorkingDir as defaults, PullImage,
ListImages, RemoveImage, and one pull for many concurrent launches."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.grpc_clients import sandbox_modules
from tests.lib.images import RawRegistry, busybox_layer, make_image, registry, tar_bytes

pb, _ = sandbox_modules()


def layer(entries) -> bytes:
    return gzip.compress(tar_bytes(entries), mtime=0)


@pytest.fixture(scope="module")
def base():
    return busybox_layer()


@pytest.fixture(scope="module")
def reg():
    with registry() as r:
        yield r


@pytest.fixture(scope="module")
def raw():
    r = RawRegistry()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def igw(reg, raw, gateway_secret):
    env = {"SANDBOX_INSECURE_REGISTRIES": f"{reg.host},{raw.host}"}
    with running_gateway(env, secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture
def c(igw):
    with sandbox_client(igw) as client:
        yield client


def launch(c, sid, image, timeout=120):
    return c.stub.Launch(pb.LaunchRequest(sandbox_id=sid, image=image), metadata=c.md, timeout=timeout)


def state_dir(gw) -> str:
    return gw.state_dir


def test_launch_by_tag_sees_the_image_files_env_and_workdir(c, reg, base):
    img = make_image([base, layer([("dir", "work"), ("file", "etc/greeting", b"hello from A\n")])],
                     env=["PATH=/bin", "GREETING=image-a"], workdir="/work")
    ref = reg.push(img, "test/a", "v1")
    sid = new_id("img")
    info = launch(c, sid, ref)
    assert info.image == ref and info.image_digest == img.digest
    r = c.sh(sid, "cat /etc/greeting; echo $GREETING; pwd")
    assert r.code == 0, r.describe()
    assert r.out == "hello from A\nimage-a\n/work\n"
    # The request's own values win over the image's.
    r = c.exec_call(sid, ["sh", "-c", "echo $GREETING; pwd"], env={"GREETING": "mine"}, cwd="/tmp")
    out = b"".join(ev.stdout for ev in r)
    assert out == b"mine\n/tmp\n"
    assert c.get(sid).image_digest == img.digest
    # Writes go to the sandbox's own layer, never the shared one.
    assert c.sh(sid, "echo changed > /etc/greeting && cat /etc/greeting").out == "changed\n"


def test_launch_by_digest_and_two_images_side_by_side_share_the_base_layer(c, igw, reg, base):
    a = make_image([base, layer([("file", "etc/which", b"A\n")])])
    b = make_image([base, layer([("file", "etc/which", b"B\n")])])
    reg.push(a, "test/side-a", "v1")
    reg.push(b, "test/side-b", "v1")
    sa, sb, sd = new_id("ia"), new_id("ib"), new_id("idef")
    launch(c, sa, f"{reg.host}/test/side-a@{a.digest}")
    launch(c, sb, f"{reg.host}/test/side-b:v1")
    c.launch(sd)
    assert c.sh(sa, "cat /etc/which").out == "A\n"
    assert c.sh(sb, "cat /etc/which").out == "B\n"
    # The default sandbox sees SANDBOX_ROOTFS, not an image.
    assert c.get(sd).image == "" and not c.sh(sd, "test -e /etc/which").code == 0
    layers = os.listdir(os.path.join(state_dir(igw), "images", "layers"))
    from tests.lib.images import sha256
    assert sha256(base)[7:] in layers
    # One copy of the shared base however many images have it.
    assert len([l for l in layers if l == sha256(base)[7:]]) == 1


def test_whiteouts_and_opaque_directories_of_upper_layers_apply(c, reg, base):
    lower = layer([("dir", "data"), ("file", "data/gone", b"x"), ("dir", "opq"), ("file", "opq/old", b"x"),
                   ("file", "keep", b"k")])
    upper = layer([("file", "data/.wh.gone", b""), ("dir", "opq"), ("file", "opq/.wh..wh..opq", b""),
                   ("file", "opq/new", b"n")])
    ref = reg.push(make_image([base, lower, upper]), "test/wh", "v1")
    sid = new_id("iwh")
    launch(c, sid, ref)
    r = c.sh(sid, "ls /data; echo ---; ls /opq; echo ---; cat /keep")
    assert r.out == "---\nnew\n---\nk", r.describe()


def test_layer_files_are_owned_by_the_unprivileged_image_range_on_the_host(c, igw, reg, base):
    img = make_image([base, layer([("file", "bin/suid", b"#!/bin/sh\n", 0o4755)])])
    ref = reg.push(img, "test/suid", "v1")
    sid = new_id("isu")
    launch(c, sid, ref)
    from tests.lib.images import sha256
    path = os.path.join(state_dir(igw), "images", "layers", sha256(img.blobs[list(img.blobs)[-1]])[7:], "bin", "suid")
    st = os.lstat(path)
    assert st.st_uid >= 65536 and st.st_gid >= 65536, "a layer file owned by host root"
    # Inside, the image's root-owned files are root's.
    assert c.sh(sid, "stat -c %u:%g /bin/suid").out == "0:0\n"


def test_pull_image_streams_progress_then_lists_and_removes_unless_in_use(c, reg, base):
    img = make_image([base, layer([("file", "etc/p", b"p")])])
    ref = reg.push(img, "test/pull", "v1")
    events = list(c.stub.PullImage(pb.PullImageRequest(image=ref), metadata=c.md, timeout=120))
    assert events[-1].done and events[-1].image_digest == img.digest
    assert events[-1].layers_done == events[-1].layers_total == 2
    assert any(e.layers_done < e.layers_total for e in events[:-1])
    listed = {i.image_digest: i for i in c.stub.ListImages(pb.ListImagesRequest(), metadata=c.md).images}
    assert listed[img.digest].image == ref and listed[img.digest].sandboxes == 0
    sid = new_id("irm")
    launch(c, sid, ref)
    with pytest.raises(grpc.RpcError) as ei:
        c.stub.RemoveImage(pb.RemoveImageRequest(image=ref), metadata=c.md)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert c.sh(sid, "cat /etc/p").out == "p"
    c.delete(sid)
    c.stub.RemoveImage(pb.RemoveImageRequest(image=ref), metadata=c.md)
    assert img.digest not in {i.image_digest for i in c.stub.ListImages(pb.ListImagesRequest(),
                                                                         metadata=c.md).images}
    with pytest.raises(grpc.RpcError) as ei:
        c.stub.RemoveImage(pb.RemoveImageRequest(image=ref), metadata=c.md)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


def test_ten_concurrent_launches_of_an_uncached_image_pull_it_once(c, raw, base):
    top = layer([("file", "etc/once", b"1")])
    img = make_image([base, top])
    ref = raw.add("test/once", "v1", img)
    from tests.lib.images import sha256
    ids = [new_id("ionce") for _ in range(10)]
    with ThreadPoolExecutor(10) as pool:
        infos = list(pool.map(lambda s: launch(c, s, ref), ids))
    assert {i.image_digest for i in infos} == {img.digest}
    assert raw.requests.count(f"/v2/test/once/blobs/{sha256(top)}") == 1, raw.requests
    assert c.sh(ids[-1], "cat /etc/once").out == "1"


def test_bad_references_are_invalid_argument(c):
    for ref in ["UPPER/case:x", "a/../b:1", "host:5000/repo@sha256:123", "repo:" + "t" * 200]:
        with pytest.raises(grpc.RpcError) as ei:
            launch(c, new_id("ibad"), ref)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ref


def test_a_layer_unpacking_past_its_cap_fails_the_pull_naming_it_and_leaves_nothing(raw, base, gateway_secret):
    """A decompression bomb: a few KiB of gzip holding many MiB of zeros in
    several files. Layers have no disk quota of their own, so
    SANDBOX_IMAGE_LAYER_MAX_MB bounds what one unpacks to; a layer within
    it still pulls."""
    env = {"SANDBOX_INSECURE_REGISTRIES": raw.host, "SANDBOX_IMAGE_LAYER_MAX_MB": "4"}
    zeros = b"\0" * (3 << 20)
    bomb = make_image([base, layer([("file", f"z{i}", zeros) for i in range(3)])])
    fine = make_image([base, layer([("file", "z0", zeros)])])
    with running_gateway(env, secret=gateway_secret, check=True) as gw, sandbox_client(gw) as client:
        with pytest.raises(grpc.RpcError) as ei:
            launch(client, new_id("ibomb"), raw.add("test/bomb", "v1", bomb))
        assert "SANDBOX_IMAGE_LAYER_MAX_MB" in ei.value.details(), ei.value.details()
        layers = os.path.join(state_dir(gw), "images", "layers")
        held = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(layers) for f in fs
                   if not os.path.islink(os.path.join(d, f)))
        assert held < 8 << 20, f"{held} bytes left under the layer cache"
        info = launch(client, new_id("ifine"), raw.add("test/fine", "v1", fine))
        assert client.sh(info.sandbox_id, "wc -c < /z0").out.strip() == str(3 << 20)


# --- auth ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def locked():
    """A registry that wants credentials, its blobs redirected to another
    host (`cdn`), and a gateway whose SANDBOX_REGISTRY_AUTH_FILE has them."""
    import base64
    import tempfile
    reg_, cdn = RawRegistry(), RawRegistry()
    creds = base64.b64encode(b"tester:s3cret").decode()
    reg_.basic = creds
    reg_.redirect_to = cdn.host
    auth = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"auths": {reg_.host: {"auth": creds}}}, auth)
    auth.close()
    env = {"SANDBOX_INSECURE_REGISTRIES": f"{reg_.host},{cdn.host}", "SANDBOX_REGISTRY_AUTH_FILE": auth.name}
    try:
        with running_gateway(env, check=True, secret="images-auth-secret") as gw, sandbox_client(gw) as client:
            yield reg_, cdn, client
    finally:
        reg_.close()
        cdn.close()
        os.unlink(auth.name)


def test_basic_auth_then_a_blob_redirect_to_another_host_carries_no_authorization(locked, base):
    reg_, cdn, client = locked
    img = make_image([base, layer([("file", "etc/basic", b"b")])])
    ref = reg_.add("priv/basic", "v1", img)
    cdn.blobs.update(img.blobs)
    info = launch(client, new_id("ibasic"), ref)
    assert client.sh(info.sandbox_id, "cat /etc/basic").out == "b"
    assert any(a == f"Basic {reg_.basic}" for p, a in reg_.authorizations if "/manifests/" in p)
    assert [p for p, _ in cdn.authorizations if "/blobs/" in p], "the blobs came from the other host"
    assert all(a is None for _, a in cdn.authorizations), cdn.authorizations


def test_a_plain_http_redirect_to_a_host_not_named_insecure_is_refused_unfollowed(locked, base):
    """A registry must not steer the gateway to hosts of its loopback or
    network (a port probe): plain-HTTP redirects go only to hosts of
    SANDBOX_INSECURE_REGISTRIES."""
    reg_, cdn, client = locked
    probe = RawRegistry()
    reg_.redirect_to = probe.host
    try:
        img = make_image([base, layer([("file", "etc/probe", b"p")])])
        ref = reg_.add("priv/probe", "v1", img)
        probe.blobs.update(img.blobs)
        with pytest.raises(grpc.RpcError) as ei:
            launch(client, new_id("iprobe"), ref)
        assert ei.value.code() != grpc.StatusCode.OK
        assert f"http://{probe.host}/" in ei.value.details(), ei.value.details()
        assert "SANDBOX_INSECURE_REGISTRIES" in ei.value.details(), ei.value.details()
        assert probe.requests == [], "the redirect was followed"
    finally:
        reg_.redirect_to = cdn.host
        probe.close()


def test_the_bearer_token_flow_with_basic_credentials_at_the_realm(locked, base):
    reg_, cdn, client = locked
    reg_.bearer = "tok-" + os.urandom(8).hex()
    reg_.redirect_to = None
    try:
        img = make_image([base, layer([("file", "etc/bearer", b"t")])])
        ref = reg_.add("priv/bearer", "v1", img)
        info = launch(client, new_id("ibear"), ref)
        assert client.sh(info.sandbox_id, "cat /etc/bearer").out == "t"
        assert any(p.startswith("/token") and a == f"Basic {reg_.basic}" for p, a in reg_.authorizations)
        assert any(a == f"Bearer {reg_.bearer}" for p, a in reg_.authorizations if "/blobs/" in p)
    finally:
        reg_.bearer = None
        reg_.redirect_to = cdn.host


def test_a_registry_not_named_insecure_is_spoken_to_over_tls_only(c, locked, base):
    reg_, _, _ = locked  # plain HTTP, and not in this gateway's SANDBOX_INSECURE_REGISTRIES
    ref = reg_.add("priv/tls", "v1", make_image([base]))
    with pytest.raises(grpc.RpcError) as ei:
        launch(c, new_id("itls"), ref)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"https://{reg_.host}/" in ei.value.details() and "priv/tls" in ei.value.details()
    assert not any(p.startswith("/v2/priv/tls") for p in reg_.requests), "a plain-HTTP request reached it"


def test_without_credentials_a_locked_registry_is_failed_precondition(c, raw, base):
    ref = raw.add("priv/nocreds", "v1", make_image([base]))
    raw.basic = "bm9ib2R5Om5vcGU="
    try:
        with pytest.raises(grpc.RpcError) as ei:
            launch(c, new_id("inocred"), ref)
    finally:
        raw.basic = None
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "priv/nocreds" in ei.value.details() and "401" in ei.value.details()


# --- shim ----------------------------------------------------------------------------

def test_shim_launches_on_an_image_pulls_lists_and_removes(igw, reg, base):
    import base64
    from tests.lib.shim import running_shim
    img = make_image([base, layer([("file", "etc/shim", b"via shim")])], env=["PATH=/bin", "V=1"])
    ref = reg.push(img, "test/shim", "v1")
    with running_shim(igw, check=True) as shim:
        pulled = shim.request("POST", "/images/pull", {"image": ref}, timeout=120)
        assert pulled.status == 200 and pulled.headers["content-type"] == "application/x-ndjson", pulled
        lines = [json.loads(l) for l in pulled.body.splitlines()]
        assert lines[-1]["done"] and lines[-1]["image_digest"] == img.digest
        sid = new_id("ishim")
        r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "image": ref}, timeout=120)
        assert r.status == 201 and r.json() == {"sandbox_id": sid}, r
        r = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": ["sh", "-c", "cat /etc/shim; echo $V"]})
        assert r.status == 200 and base64.b64decode(r.json()["stdout_b64"]) == b"via shim1\n", r
        listed = shim.request("GET", "/images").json()["images"]
        assert any(i["image_digest"] == img.digest and i["sandboxes"] == 1 for i in listed), listed
        assert shim.request("DELETE", f"/images/{ref}").status == 409
        assert shim.request("DELETE", f"/sandboxes/{sid}").status == 204
        assert shim.request("DELETE", f"/images/{ref}").status == 204
        assert shim.request("DELETE", f"/images/{ref}").status == 404
        # Without "image", the seed's contract as it was.
        sid2 = new_id("ishim")
        r = shim.request("POST", "/sandboxes", {"sandbox_id": sid2})
        assert r.status == 201 and r.json() == {"sandbox_id": sid2}
        assert shim.request("POST", "/sandboxes", {"sandbox_id": new_id("x"), "image": 5}).status == 422
        shim.request("DELETE", f"/sandboxes/{sid2}")


# --- snapshots ---------------------------------------------------------------------------

def test_a_snapshot_taken_on_an_image_restores_onto_that_image(c, reg, base):
    img = make_image([base, layer([("file", "etc/from-image", b"img")])], env=["PATH=/bin", "ON=a"])
    ref = reg.push(img, "test/snap", "v1")
    sid = new_id("isnap")
    launch(c, sid, ref)
    c.ok(sid, "echo mine > /root/own")
    tar = c.export(sid).data
    c.delete(sid)
    header = pb.RestoreHeader(sandbox_id=sid, image=ref)
    reqs = iter([pb.RestoreRequest(header=header), pb.RestoreRequest(tar_chunk=tar)])
    info = c.stub.Restore(reqs, metadata=c.md, timeout=120)
    assert info.image_digest == img.digest
    assert c.sh(sid, "cat /root/own /etc/from-image; echo $ON").out == "mine\nimga\n"


def test_a_persisted_sandbox_on_an_image_connects_back_onto_that_image(c, igw, reg, base):
    """A snapshot persisted to the store records the image it was taken on
    (`<object>.image`: reference and manifest digest); Connect restores it
    onto that image — from the cache, and, once the image was removed, by
    pulling it again pinned to the recorded digest — never onto the
    default image."""
    img = make_image([base, layer([("file", "etc/from-image", b"img")])], env=["PATH=/bin", "ON=b"])
    ref = reg.push(img, "test/persisted", "v1")
    sid = new_id("ipers")
    launch(c, sid, ref)
    try:
        c.ok(sid, "echo mine > /root/own")
        c.persist(sid)
        record = os.path.join(igw.state_dir, "snapshots", f"sandbox-snapshots/{sid}.tar.image")
        if not os.path.exists(record):
            record = os.path.join(igw.state_dir, "snapshots", f"{sid}.tar.image")
        with open(record) as f:
            assert json.load(f) == {"ref": ref, "digest": img.digest}
        c.delete(sid)
        got = c.connect(sid, restore_only=True)
        assert got.outcome == pb.ConnectResponse.OUTCOME_RESTORED, got
        assert got.sandbox.image_digest == img.digest
        assert c.sh(sid, "cat /root/own /etc/from-image; echo $ON").out == "mine\nimgb\n"
        # Not cached any more: pulled again by its digest.
        c.delete(sid)
        c.stub.RemoveImage(pb.RemoveImageRequest(image=ref), metadata=c.md, timeout=60)
        got = c.connect(sid, restore_only=True)
        assert got.sandbox.image_digest == img.digest
        assert c.sh(sid, "cat /root/own /etc/from-image").out == "mine\nimg"
    finally:
        with contextlib.suppress(grpc.RpcError):
            c.delete(sid, delete_snapshot=True)
    assert not os.path.exists(record), "deleting the snapshot left its image record"


def test_a_hostile_image_record_fails_the_connect_and_makes_nothing(c, igw, reg, base):
    """An image record in the store that is not {"ref", "digest"} (or is
    over its cap) fails the restore with a clear error; no sandbox is
    made, and nothing else is read."""
    img = make_image([base, layer([("file", "etc/x", b"x")])])
    ref = reg.push(img, "test/hostile-record", "v1")
    sid = new_id("irec")
    launch(c, sid, ref)
    try:
        c.persist(sid)
        c.delete(sid)
        found = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(igw.state_dir, "snapshots"))
                 for f in fs if f == f"{sid}.tar.image"]
        assert len(found) == 1, found
        for bad in [b"{", json.dumps({"ref": ref, "digest": "sha256:zz"}).encode(), b" " * 5000, b" " * 102400,
                    json.dumps({"ref": "x" * 300, "digest": img.digest}).encode()]:
            with open(found[0], "wb") as f:
                f.write(bad)
            with pytest.raises(grpc.RpcError) as e:
                c.connect(sid, restore_only=True)
            assert "image record" in e.value.details(), e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                c.stub.Get(pb.GetRequest(sandbox_id=sid), metadata=c.md, timeout=30)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        with contextlib.suppress(grpc.RpcError):
            c.delete(sid, delete_snapshot=True)


def _backdate_records(gw, seconds: float) -> None:
    """Every cached image as if last used `seconds` ago (images used in the
    last two minutes are never evicted)."""
    d = os.path.join(gw.state_dir, "images", "manifests")
    for name in os.listdir(d):
        t = os.path.getmtime(os.path.join(d, name)) - seconds
        os.utime(os.path.join(d, name), (t, t))


def _listed(c) -> set:
    return {i.image_digest for i in c.stub.ListImages(pb.ListImagesRequest(), metadata=c.md, timeout=30).images}


def _layers_on_disk(gw) -> set:
    return {n for n in os.listdir(os.path.join(gw.state_dir, "images", "layers")) if len(n) == 64}


def test_the_cache_budget_evicts_the_least_recently_used_image_not_in_use(reg, base, gateway_secret):
    """SANDBOX_IMAGE_CACHE_MB=4 and images of 2 MiB of their own each (over
    a shared base): after each pull the least recently used images that no
    live sandbox runs on are evicted, record and own layers, until the
    layers fit; the base layer, still named, stays; an image in use is kept
    even when it is the oldest; an evicted image launches again (pulled
    again)."""
    imgs = [make_image([base, layer([("file", f"big{i}", os.urandom(2 << 20))])]) for i in range(3)]
    refs = [reg.push(img, f"test/budget{i}", "v1") for i, img in enumerate(imgs)]
    env = {"SANDBOX_INSECURE_REGISTRIES": reg.host, "SANDBOX_IMAGE_CACHE_MB": "4"}
    with running_gateway(env, secret=gateway_secret, check=True) as gw, sandbox_client(gw) as c:
        pull = lambda ref: list(c.stub.PullImage(pb.PullImageRequest(image=ref), metadata=c.md, timeout=120))
        pull(refs[0])
        _backdate_records(gw, 3600)
        pull(refs[1])
        # Over 4 MiB with both: the older one went, the one just pulled stays.
        assert _listed(c) == {imgs[1].digest}
        own = [json.loads(img.manifest)["layers"][-1]["digest"][7:] for img in imgs]
        shared = json.loads(imgs[0].manifest)["layers"][0]["digest"][7:]
        assert own[0] not in _layers_on_disk(gw) and {own[1], shared} <= _layers_on_disk(gw)
        # One in use is kept, however old: a sandbox on image 1, then image 2.
        sid = new_id("budget")
        launch(c, sid, refs[1])
        _backdate_records(gw, 3600)
        pull(refs[2])
        assert _listed(c) == {imgs[1].digest, imgs[2].digest}
        assert c.sh(sid, "wc -c < /big1").out.strip() == str(2 << 20)
        c.delete(sid)
        # Evicted, then asked for again: pulled again.
        sid2 = new_id("budget")
        launch(c, sid2, refs[0])
        assert c.sh(sid2, "wc -c < /big0").out.strip() == str(2 << 20)
        c.delete(sid2)


def test_a_stalled_pull_does_not_hold_up_the_pull_of_another_image(c, raw, reg, base):
    """A registry that never sends one layer keeps only its own image's
    pull waiting (until that call's deadline): another image, pulled
    meanwhile, is pulled and launched at once; two images that share an
    uncached layer, pulled side by side, fetch it once."""
    from tests.lib.images import sha256
    slow_top = layer([("file", "etc/slow", os.urandom(64))])
    slow = make_image([base, slow_top])
    slow_ref = raw.add("test/stalled", "v1", slow)
    raw.stall.add(f"/v2/test/stalled/blobs/{sha256(slow_top)}")
    outcome: dict = {}

    def stalled_pull():
        try:
            list(c.stub.PullImage(pb.PullImageRequest(image=slow_ref), metadata=c.md, timeout=20))
            outcome["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            outcome["code"] = e.code()

    import threading
    t = threading.Thread(target=stalled_pull)
    t.start()
    try:
        time.sleep(1.0)  # the stalled pull is in
        img = make_image([base, layer([("file", "etc/quick", b"q")])])
        ref = reg.push(img, "test/quick", "v1")
        sid = new_id("iquick")
        launch(c, sid, ref, timeout=15)
        assert t.is_alive(), "the stalled pull ended before the other image was pulled"
        assert c.sh(sid, "cat /etc/quick").out == "q"
        c.delete(sid)
        # Two images over one new shared layer, side by side.
        shared = layer([("file", "etc/shared", os.urandom(256))])
        a = make_image([base, shared, layer([("file", "etc/a", b"a")])])
        b = make_image([base, shared, layer([("file", "etc/b", b"b")])])
        refs = [raw.add("test/sharea", "v1", a), raw.add("test/shareb", "v1", b)]
        with ThreadPoolExecutor(2) as pool:
            infos = list(pool.map(lambda r: list(c.stub.PullImage(pb.PullImageRequest(image=r), metadata=c.md,
                                                                  timeout=60)), refs))
        assert all(infos)
        fetched = [p for p in raw.requests if p.endswith(f"/blobs/{sha256(shared)}")]
        assert len(fetched) == 1, fetched
    finally:
        t.join(60)
    assert outcome["code"] == grpc.StatusCode.DEADLINE_EXCEEDED, outcome


@pytest.mark.parametrize("user,ids", [("app", "1000 1001"), ("app:grp", "1000 1002"), ("1234:5678", "1234 5678"),
                                      ("1234", "1234 1234"), ("root", "0 0")])
def test_the_image_user_runs_exec_and_run_with_its_ids_and_no_capabilities(c, reg, base, user, ids):
    """An image's config User (`name`, `name:group`, `uid:gid`, `uid`;
    names from the image's own /etc/passwd and /etc/group) is who Exec and
    Run commands run as: those ids, no supplementary groups, no capability
    left (root stays root)."""
    etc = layer([("file", "etc/passwd", b"root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/tmp:/bin/sh\n"),
                 ("file", "etc/group", b"root:x:0:\ngrp:x:1002:\n")])
    img = make_image([base, etc], user=user)
    ref = reg.push(img, "test/user", user.replace(":", "-"))
    sid = new_id("iuser")
    launch(c, sid, ref)
    try:
        out = c.sh(sid, "echo $(busybox id -u) $(busybox id -g); busybox id -G; grep CapEff /proc/self/status").out
        lines = out.splitlines()
        assert lines[0] == ids, out
        assert lines[1] == ids.split()[1], out  # no supplementary groups
        if ids != "0 0":
            assert lines[2].split()[1] == "0000000000000000", out
        # Run (a process) too.
        start = pb.ProcessInput(start=pb.ProcessStart(sandbox_id=sid, argv=["busybox", "id", "-u"]))
        got = b"".join(ev.stdout for ev in c.stub.Run(iter([start]), metadata=c.md, timeout=60)
                       if ev.WhichOneof("event") == "stdout")
        assert got.decode().strip() == ids.split()[0], got
    finally:
        c.delete(sid)


def test_file_calls_act_as_the_image_user(c, reg, base):
    """File calls on an image with a User act as it, as its commands do:
    what WriteFile and MakeDir make is its own, and a root-only file or
    directory refuses it."""
    import tarfile as tf
    buf = io.BytesIO()
    with tf.open(fileobj=buf, mode="w", format=tf.PAX_FORMAT) as t:
        for name, mode in (("tmp", 0o1777), ("etc", 0o755)):
            info = tf.TarInfo(name)
            info.type, info.mode = tf.DIRTYPE, mode
            t.addfile(info)
        for name, data, mode in (("etc/passwd", b"root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/tmp:/bin/sh\n", 0o644),
                                 ("etc/secret", b"root only\n", 0o600)):
            info = tf.TarInfo(name)
            info.size, info.mode = len(data), mode
            t.addfile(info, io.BytesIO(data))
    img = make_image([base, gzip.compress(buf.getvalue(), mtime=0)], user="app")
    ref = reg.push(img, "test/fileuser", "v1")
    sid = new_id("ifuser")
    launch(c, sid, ref)
    try:
        c.write_file(sid, "/tmp/made", b"mine")
        st = c.stat(sid, "/tmp/made")
        assert (st.uid, st.gid) == (1000, 1001), st
        c.stub.MakeDir(pb.MakeDirRequest(sandbox_id=sid, path="/tmp/d"), metadata=c.md, timeout=30)
        assert (c.stat(sid, "/tmp/d").uid, c.stat(sid, "/tmp/d").gid) == (1000, 1001)
        with pytest.raises(grpc.RpcError) as e:
            c.read_file(sid, "/etc/secret")
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            c.write_file(sid, "/etc/planted", b"x")
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        # The command side agrees.
        assert c.sh(sid, "busybox stat -c '%u %g' /tmp/made").out == "1000 1001\n"
    finally:
        c.delete(sid)


def test_a_100_mib_passwd_is_read_only_up_to_its_cap(c, igw, reg, base):
    """An image whose /etc/passwd is 100 MiB (100 times the 1 MiB read)
    with its User named only at the end: the command fails naming the
    User, the gateway reads no more than the cap (its memory barely
    moves), and a command on another image goes on."""
    filler = b"x:x:1:1::/:/bin/sh\n" * (100 * 1024 * 1024 // 19)
    etc = gzip.compress(tar_bytes([("file", "etc/passwd", filler + b"late:x:1234:1234::/:/bin/sh\n")]), 1,
                        mtime=0)
    ref = reg.push(make_image([base, etc], user="late"), "test/bigpasswd", "v1")
    sid = new_id("ibigpw")
    launch(c, sid, ref)
    rss0 = igw.vm_rss_kib()
    try:
        with pytest.raises(grpc.RpcError) as e:
            c.sh(sid, "true")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "late" in e.value.details(), e.value.details()
        assert igw.vm_rss_kib() - rss0 < 32 * 1024
    finally:
        c.delete(sid)


def test_an_image_user_the_image_does_not_have_fails_its_commands_naming_it(c, reg, base):
    img = make_image([base, layer([("file", "etc/passwd", b"root:x:0:0::/root:/bin/sh\n")])], user="ghost")
    ref = reg.push(img, "test/ghost", "v1")
    sid = new_id("ighost")
    launch(c, sid, ref)
    try:
        with pytest.raises(grpc.RpcError) as e:
            c.sh(sid, "true")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ghost" in e.value.details() and "/etc/passwd" in e.value.details()
    finally:
        c.delete(sid)


def test_a_tls_registry_with_htpasswd_accounts(base, gateway_secret, tmp_path):
    """Debian's docker-registry over TLS (its own CA, given as
    SANDBOX_REGISTRY_CA; not an insecure registry) asking htpasswd Basic
    credentials: with the account in SANDBOX_REGISTRY_AUTH_FILE the image
    launches; without it the pull is refused as unauthenticated; without
    the CA the certificate is not trusted. Nothing is ever asked in plain
    HTTP."""
    import base64
    with registry(tls=True, users={"agent": "s3cret-pw"}) as tr:
        img = make_image([base, layer([("file", "etc/tls", b"over tls\n")])])
        ref = tr.push(img, "test/tls", "v1")
        auth = tmp_path / "config.json"
        auth.write_text(json.dumps({"auths": {tr.host: {"auth": base64.b64encode(b"agent:s3cret-pw").decode()}}}))
        env = {"SANDBOX_REGISTRY_CA": tr.ca, "SANDBOX_REGISTRY_AUTH_FILE": str(auth)}
        with running_gateway(env, secret=gateway_secret, check=True) as gw, sandbox_client(gw) as c:
            sid = new_id("itls")
            info = launch(c, sid, ref)
            assert info.image_digest == img.digest
            assert c.sh(sid, "cat /etc/tls").out == "over tls\n"
            c.delete(sid)
        with running_gateway({"SANDBOX_REGISTRY_CA": tr.ca}, secret=gateway_secret, check=True) as gw, \
                sandbox_client(gw) as c:
            with pytest.raises(grpc.RpcError) as e:
                launch(c, new_id("itls"), ref)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
        with running_gateway({"SANDBOX_REGISTRY_AUTH_FILE": str(auth)}, secret=gateway_secret, check=True) as gw, \
                sandbox_client(gw) as c:
            with pytest.raises(grpc.RpcError) as e:
                launch(c, new_id("itls"), ref)
            assert "certificate" in e.value.details().lower() or "ssl" in e.value.details().lower(), \
                e.value.details()


def test_a_layer_is_unpacked_in_a_cgroup_of_its_own_with_limits_and_it_goes_after(c, reg, base):
    """Each layer's unpacker runs in a cgroup of its own (".unpack-<n>",
    512 MiB of memory, 16 pids), removed when it ends: watched while a
    layer of 300 MiB of zeros unpacks."""
    import glob
    import threading
    big = layer([("file", "zeros", b"\0" * (300 << 20))])
    ref = reg.push(make_image([base, big]), "test/unpackcg", "v1")
    seen: dict = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for d in glob.glob("/sys/fs/cgroup/memory/*/.unpack-*"):
                with contextlib.suppress(OSError):
                    with open(os.path.join(d, "memory.limit_in_bytes")) as f:
                        seen["memory"] = int(f.read())
                    pids = glob.glob(f"/sys/fs/cgroup/pids/*/{os.path.basename(d)}/pids.max")
                    if pids:
                        with open(pids[0]) as f:
                            seen["pids"] = f.read().strip()
            time.sleep(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        list(c.stub.PullImage(pb.PullImageRequest(image=ref), metadata=c.md, timeout=300))
    finally:
        done.set()
        t.join(10)
    assert seen.get("memory") == 512 << 20, seen
    assert seen.get("pids") == "16", seen
    assert not glob.glob("/sys/fs/cgroup/*/*/.unpack-*"), glob.glob("/sys/fs/cgroup/*/*/.unpack-*")
    c.stub.RemoveImage(pb.RemoveImageRequest(image=ref), metadata=c.md, timeout=60)


def test_google_hosts_are_logged_in_to_with_the_google_credentials(base, gateway_secret):
    """A registry of SANDBOX_REGISTRY_GOOGLE_HOSTS (Artifact Registry's
    hosts by default) that wants Basic credentials gets `oauth2accesstoken`
    and an access token from the metadata server (a fake, as GCE's); one
    not listed is pulled anonymously and refused."""
    import base64
    from tests.lib.peers import running_fake_gcs
    raw = RawRegistry()
    given = []

    def check(b64: str) -> bool:
        user, _, token = base64.b64decode(b64).decode().partition(":")
        given.append((user, token))
        return user == "oauth2accesstoken" and token.startswith("fake-")

    raw.basic_check = check
    img = make_image([base, layer([("file", "etc/ar", b"from artifact registry\n")])])
    ref = raw.add("proj/repo/tool", "v1", img)
    try:
        with running_fake_gcs() as gcs:
            env = {"SANDBOX_INSECURE_REGISTRIES": raw.host, "GCE_METADATA_HOST": gcs.host,
                   "SANDBOX_REGISTRY_GOOGLE_HOSTS": f"*-docker.pkg.dev,{raw.host}"}
            with running_gateway(env, secret=gateway_secret, check=True) as gw, sandbox_client(gw) as c:
                sid = new_id("iar")
                launch(c, sid, ref)
                assert c.sh(sid, "cat /etc/ar").out == "from artifact registry\n"
                assert given and all(u == "oauth2accesstoken" for u, _ in given), given
                assert gcs.control("/_control/stats")["metadata_grants"] >= 1
            env["SANDBOX_REGISTRY_GOOGLE_HOSTS"] = "*-docker.pkg.dev"
            with running_gateway(env, secret=gateway_secret, check=True) as gw, sandbox_client(gw) as c:
                with pytest.raises(grpc.RpcError) as e:
                    launch(c, new_id("iar2"), ref)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    finally:
        raw.close()
