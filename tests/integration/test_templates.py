"""Templates: a sandbox's writable layer made a read-only layer over its
image (CreateTemplate), stored through the snapshot store as an OCI image
layout, launched from (`template:<name>`) on the gateway that made it and
on another sharing the store, listed, deleted; made on a registry image and
on the default image; the seed's use case (a package installed once, then
imported at once by every sandbox launched from the template)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import zipfile

import grpc
import pytest

from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.grpc_clients import sandbox_modules
from tests.lib.images import busybox_layer, make_image, registry, sha256, tar_bytes

pb, _ = sandbox_modules()


def layer(entries) -> bytes:
    return gzip.compress(tar_bytes(entries), mtime=0)


@pytest.fixture(scope="module")
def reg():
    with registry() as r:
        yield r


@pytest.fixture(scope="module")
def store():
    d = tempfile.mkdtemp(prefix="sgw-templates-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def gw_env(reg, store):
    return {"SANDBOX_INSECURE_REGISTRIES": reg.host, "SANDBOX_SNAPSHOT_DIR": store}


@pytest.fixture(scope="module")
def tgw(reg, store, gateway_secret):
    with running_gateway(gw_env(reg, store), secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture
def c(tgw):
    with sandbox_client(tgw) as client:
        yield client


@pytest.fixture(scope="module")
def image_ref(reg):
    img = make_image([busybox_layer(), layer([("dir", "app"), ("file", "etc/greeting", b"hello\n"),
                                              ("file", "etc/doomed", b"x\n")])],
                     env=["PATH=/bin", "GREETING=from-image"], workdir="/app")
    return reg.push(img, "test/tpl-base", "v1"), img


def launch(c, sid, image, timeout=120):
    c.created.append(sid)
    return c.stub.Launch(pb.LaunchRequest(sandbox_id=sid, image=image), metadata=c.md, timeout=timeout)


def create(c, sid, name, timeout=120):
    return c.stub.CreateTemplate(pb.CreateTemplateRequest(sandbox_id=sid, name=name), metadata=c.md,
                                 timeout=timeout)


def templates(c):
    return {t.name: t for t in c.stub.ListTemplates(pb.ListTemplatesRequest(), metadata=c.md, timeout=60).templates}


def delete(c, name):
    return c.stub.DeleteTemplate(pb.DeleteTemplateRequest(name=name), metadata=c.md, timeout=60)


def layout_dir(store, name):
    return os.path.join(store, "sandbox-snapshots", "templates", name)


def made_on_image(c, image_ref, name):
    ref, _ = image_ref
    sid = new_id("tsrc")
    launch(c, sid, ref)
    c.ok(sid, "mkdir -p /opt/pkg && echo installed > /opt/pkg/marker && rm /etc/doomed && "
              "echo changed > /etc/greeting")
    return sid, create(c, sid, name)


def test_a_template_of_an_image_sandbox_launches_with_its_changes_and_the_images_config(c, image_ref):
    ref, img = image_ref
    sid, t = made_on_image(c, image_ref, "tpl-basic")
    assert t.name == "tpl-basic" and t.sandbox_id == sid and t.layers == 3
    assert t.base_image == ref and t.base_image_digest == img.digest
    assert t.image_digest.startswith("sha256:") and t.image_digest != img.digest and t.size_bytes > 0
    # The source sandbox goes on (it was frozen only while read).
    assert c.sh(sid, "cat /opt/pkg/marker").out == "installed\n"
    new = new_id("tnew")
    info = launch(c, new, "template:tpl-basic")
    assert info.image == "template:tpl-basic" and info.image_digest == t.image_digest
    r = c.sh(new, "cat /opt/pkg/marker /etc/greeting; test -e /etc/doomed || echo gone; echo $GREETING; pwd")
    assert r.code == 0, r.describe()
    assert r.out == "installed\nchanged\ngone\nfrom-image\n/app\n"
    # Its own writes stay its own.
    c.ok(new, "echo mine > /opt/pkg/marker")
    assert c.sh(sid, "cat /opt/pkg/marker").out == "installed\n"
    assert c.get(new).image_digest == t.image_digest


def test_the_template_is_a_verifiable_oci_layout_that_skopeo_copies(c, image_ref, store, tmp_path):
    _, t = made_on_image(c, image_ref, "tpl-layout")
    d = layout_dir(store, "tpl-layout")
    assert json.load(open(os.path.join(d, "oci-layout"))) == {"imageLayoutVersion": "1.0.0"}
    index = json.load(open(os.path.join(d, "index.json")))
    assert index["manifests"][0]["digest"] == t.image_digest
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "tpl-layout"
    blobs = os.path.join(d, "blobs", "sha256")
    for name in os.listdir(blobs):
        with open(os.path.join(blobs, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == name
    manifest = json.load(open(os.path.join(blobs, t.image_digest[7:])))
    config = json.load(open(os.path.join(blobs, manifest["config"]["digest"][7:])))
    # The new layer is an uncompressed tar: its digest is its diff id.
    top = manifest["layers"][-1]
    assert top["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    assert config["rootfs"]["diff_ids"][-1] == top["digest"]
    assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"]) == 3
    assert config["config"]["Env"] == ["PATH=/bin", "GREETING=from-image"]
    with open(os.path.join(blobs, top["digest"][7:]), "rb") as f:
        names = set(tarfile_names(f.read()))
    assert "opt/pkg/marker" in names and "etc/.wh.doomed" in names
    out = tmp_path / "copy"
    subprocess.run(["skopeo", "copy", f"oci:{d}:tpl-layout", f"oci:{out}:x"], check=True, capture_output=True,
                   timeout=120)
    copied = json.load(open(out / "index.json"))["manifests"][0]["digest"]
    copied_manifest = json.load(open(out / "blobs" / "sha256" / copied[7:]))
    # The base's blobs travel as they are (skopeo compresses the plain tar).
    assert [d["digest"] for d in copied_manifest["layers"]][:2] == [d["digest"] for d in manifest["layers"]][:2]
    assert len(copied_manifest["layers"]) == 3


def tarfile_names(data: bytes) -> list[str]:
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return [m.name.lstrip("./") for m in t.getmembers()]


def test_a_second_gateway_sharing_the_store_launches_it_and_lists_it(c, image_ref, reg, store, gateway_secret):
    made_on_image(c, image_ref, "tpl-shared")
    with running_gateway(gw_env(reg, store), secret=gateway_secret, check=True) as gw2, sandbox_client(gw2) as c2:
        assert "tpl-shared" in templates(c2)
        sid = new_id("tgw2")
        info = launch(c2, sid, "template:tpl-shared")
        assert info.image_digest == templates(c2)["tpl-shared"].image_digest
        assert c2.sh(sid, "cat /opt/pkg/marker; echo $GREETING").out == "installed\nfrom-image\n"
        c2.delete(sid)


def test_list_and_delete(c, image_ref, store):
    src, t = made_on_image(c, image_ref, "tpl-del")
    running = new_id("trun")
    launch(c, running, "template:tpl-del")
    assert templates(c)["tpl-del"].image_digest == t.image_digest
    delete(c, "tpl-del")
    assert "tpl-del" not in templates(c)
    assert not os.path.exists(os.path.join(layout_dir(store, "tpl-del"), "index.json"))
    assert not os.path.exists(layout_dir(store, "tpl-del"))  # every object, and the directories they leave
    with pytest.raises(grpc.RpcError) as e:
        launch(c, new_id("tgone"), "template:tpl-del")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "tpl-del" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        delete(c, "tpl-del")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # A sandbox already running on it goes on.
    assert c.sh(running, "cat /opt/pkg/marker").out == "installed\n"


def test_a_name_made_again_is_launched_in_its_new_version(c, image_ref):
    src, t1 = made_on_image(c, image_ref, "tpl-again")
    launch(c, new_id("tv1"), "template:tpl-again")  # cached here now
    delete(c, "tpl-again")
    c.ok(src, "echo second > /opt/pkg/marker")
    t2 = create(c, src, "tpl-again")
    assert t2.image_digest != t1.image_digest
    sid = new_id("tv2")
    assert launch(c, sid, "template:tpl-again").image_digest == t2.image_digest
    assert c.sh(sid, "cat /opt/pkg/marker").out == "second\n"


def test_a_template_of_a_template_keeps_both_layers(c, image_ref):
    _, t1 = made_on_image(c, image_ref, "tpl-first")
    mid = new_id("tmid")
    launch(c, mid, "template:tpl-first")
    c.ok(mid, "echo more > /opt/pkg/second")
    t2 = create(c, mid, "tpl-second")
    assert t2.layers == 4 and t2.base_image == "template:tpl-first" and t2.base_image_digest == t1.image_digest
    sid = new_id("tboth")
    launch(c, sid, "template:tpl-second")
    assert c.sh(sid, "cat /opt/pkg/marker /opt/pkg/second").out == "installed\nmore\n"


@pytest.mark.parametrize("name", ["", "UPPER", "../etc", "a/b", "-lead", "a..b", "x" * 64, "sp ace"])
def test_bad_names_are_refused(c, image_ref, name):
    ref, _ = image_ref
    sid = new_id("tbad")
    launch(c, sid, ref)
    with pytest.raises(grpc.RpcError) as e:
        create(c, sid, name)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        launch(c, new_id("tbadl"), "template:" + name)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()


def test_a_taken_name_and_a_missing_sandbox_are_refused(c, image_ref):
    sid, _ = made_on_image(c, image_ref, "tpl-taken")
    with pytest.raises(grpc.RpcError) as e:
        create(c, sid, "tpl-taken")
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as e:
        create(c, "no-such-sandbox", "tpl-nosb")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "tpl-nosb" not in templates(c)


def test_a_tampered_layer_in_the_store_is_refused_by_another_gateway(c, image_ref, reg, store, gateway_secret):
    _, t = made_on_image(c, image_ref, "tpl-tamper")
    d = layout_dir(store, "tpl-tamper")
    manifest = json.load(open(os.path.join(d, "blobs", "sha256", t.image_digest[7:])))
    top = os.path.join(d, "blobs", "sha256", manifest["layers"][-1]["digest"][7:])
    data = bytearray(open(top, "rb").read())
    data[600] ^= 0x01
    open(top, "wb").write(bytes(data))
    with running_gateway(gw_env(reg, store), secret=gateway_secret, check=True) as gw2, sandbox_client(gw2) as c2:
        with pytest.raises(grpc.RpcError) as e:
            launch(c2, new_id("ttamp"), "template:tpl-tamper")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not match its digest" in e.value.details()
        assert not any(i.image == "template:tpl-tamper"
                       for i in c2.stub.ListImages(pb.ListImagesRequest(), metadata=c2.md, timeout=30).images)


def make_wheel(name: str = "agentpkg", version: str = "1.0") -> tuple[str, bytes]:
    """A pure-Python wheel written by hand (no build tool): `import
    agentpkg; agentpkg.VALUE` is 42."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": b"VALUE = 42\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for fname, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{fname},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for fname, data in files.items():
            z.writestr(fname, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def c_state_dir(c) -> str:
    return c.gw.state_dir


def test_a_package_installed_once_is_imported_at_once_by_every_sandbox_of_the_template(c, reg, store,
                                                                                        gateway_secret):
    """The default image: pip installs a local wheel (no index, no network)
    into one sandbox; its template then serves 20 launches, each importing
    the package with no install step, and a second gateway too."""
    wheel, data = make_wheel()
    src = new_id("tpip")
    c.launch(src)
    c.exec(src, ["sh", "-c", f"cat > /tmp/{wheel}"], stdin=data)
    r = c.sh(src, f"python3 -m pip install --no-index --no-cache-dir --break-system-packages /tmp/{wheel}",
             timeout_seconds=120, rpc_timeout=150)
    assert r.code == 0, r.describe()
    t = create(c, src, "py-agent")
    assert t.base_image == "" and t.layers == 1
    # Its one layer is kept as a blob, never unpacked as a lower layer.
    manifest = json.load(open(os.path.join(layout_dir(store, "py-agent"), "blobs", "sha256", t.image_digest[7:])))
    top = manifest["layers"][0]["digest"][7:]
    assert manifest["annotations"]["io.sandbox-gateway.base"] == "rootfs"
    images = os.path.join(c_state_dir(c), "images")
    assert os.path.exists(os.path.join(images, "blobs", top))
    assert not os.path.exists(os.path.join(images, "layers", top))
    for i in range(20):
        sid = new_id(f"tpy{i}")
        info = launch(c, sid, "template:py-agent")
        assert info.image_digest == t.image_digest
        r = c.py(sid, "import agentpkg; print(agentpkg.VALUE)")
        assert (r.code, r.out) == (0, "42\n"), r.describe()
        c.delete(sid)
    # A default sandbox does not have it.
    plain = new_id("tplain")
    c.launch(plain)
    assert c.py(plain, "import agentpkg").code != 0
    with running_gateway(gw_env(reg, store), secret=gateway_secret, check=True) as gw2, sandbox_client(gw2) as c2:
        sid = new_id("tpy2")
        launch(c2, sid, "template:py-agent")
        r = c2.py(sid, "import agentpkg; print(agentpkg.VALUE)")
        assert (r.code, r.out) == (0, "42\n"), r.describe()
        c2.delete(sid)


def test_templates_in_gcs_are_listed_page_by_page_launched_elsewhere_and_deleted(reg, image_ref, gateway_secret):
    """The GCS store (the fake answers two names a page): three templates
    made on one gateway are listed, launched and deleted by another."""
    from tests.lib.peers import running_fake_gcs
    ref, _ = image_ref
    with running_fake_gcs() as gcs:
        env = {"SANDBOX_INSECURE_REGISTRIES": reg.host, "CLOUD_RUN_SANDBOX_GCS_BUCKET": "tpl-bucket",
               "STORAGE_EMULATOR_HOST": gcs.host, "SANDBOX_GCS_RETRY_SECONDS": "20"}
        with running_gateway(env, secret=gateway_secret, check=True) as gw1, sandbox_client(gw1) as c1:
            for i in range(3):
                sid = new_id("tgcs")
                launch(c1, sid, ref)
                c1.ok(sid, f"echo {i} > /etc/which")
                create(c1, sid, f"gcs-{i}")
            layout = json.loads(gcs.object_bytes("tpl-bucket", "sandbox-snapshots/templates/gcs-1/oci-layout"))
            assert layout == {"imageLayoutVersion": "1.0.0"}
        with running_gateway(env, secret=gateway_secret, check=True) as gw2, sandbox_client(gw2) as c2:
            assert sorted(templates(c2)) == ["gcs-0", "gcs-1", "gcs-2"]
            sid = new_id("tgcs2")
            launch(c2, sid, "template:gcs-1")
            assert c2.sh(sid, "cat /etc/which").out == "1\n"
            delete(c2, "gcs-0")
            assert sorted(templates(c2)) == ["gcs-1", "gcs-2"]
            with pytest.raises(grpc.RpcError) as e:
                launch(c2, new_id("tgcs3"), "template:gcs-0")
            assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_shim_makes_lists_launches_and_deletes_templates(tgw, image_ref):
    from tests.lib.shim import running_shim
    ref, _ = image_ref
    with running_shim(tgw, check=True) as shim:
        sid = new_id("tshim")
        assert shim.request("POST", "/sandboxes", {"sandbox_id": sid, "image": ref}, timeout=120).status == 201
        r = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": ["sh", "-c", "echo via-shim > /etc/shim"]})
        assert r.status == 200, r
        r = shim.request("POST", "/templates", {"sandbox_id": sid, "name": "tpl-shim"}, timeout=120)
        assert r.status == 201, r
        made = r.json()
        assert made["name"] == "tpl-shim" and made["sandbox_id"] == sid and made["base_image"] == ref
        assert made["image_digest"].startswith("sha256:") and made["layers"] == 3
        listed = {t["name"]: t for t in shim.request("GET", "/templates").json()["templates"]}
        assert listed["tpl-shim"] == made
        sid2 = new_id("tshim2")
        r = shim.request("POST", "/sandboxes", {"sandbox_id": sid2, "image": "template:tpl-shim"}, timeout=120)
        assert r.status == 201, r
        r = shim.request("POST", f"/sandboxes/{sid2}/exec", {"argv": ["cat", "/etc/shim"]})
        assert r.status == 200 and base64.b64decode(r.json()["stdout_b64"]) == b"via-shim\n", r
        assert shim.request("POST", "/templates", {"sandbox_id": sid, "name": "tpl-shim"}).status == 409
        assert shim.request("POST", "/templates", {"sandbox_id": sid, "name": "Bad/Name"}).status in (400, 422)
        assert shim.request("POST", "/templates", {"sandbox_id": sid}).status == 422
        assert shim.request("POST", "/templates", [1]).status == 422
        assert shim.request("POST", "/templates", {"sandbox_id": "nope", "name": "tpl-x"}).status == 404
        assert shim.request("DELETE", "/templates/tpl-shim").status == 204
        assert shim.request("DELETE", "/templates/tpl-shim").status == 404
        assert "tpl-shim" not in {t["name"] for t in shim.request("GET", "/templates").json()["templates"]}
        for s in (sid, sid2):
            shim.request("DELETE", f"/sandboxes/{s}")


def test_files_a_sandbox_names_like_whiteouts_stay_files_in_its_template(c, image_ref):
    """Names that look like OCI whiteouts, made by the sandbox, are its
    files: they travel escaped and come back as they were, hiding nothing
    of the image below."""
    ref, _ = image_ref
    sid = new_id("twh")
    launch(c, sid, ref)
    c.ok(sid, "mkdir -p /etc/sub && echo a > /etc/.wh.greeting && echo b > /etc/sub/.wh..wh..opq && "
              "echo c > /etc/sub/kept && rm /etc/doomed")
    create(c, sid, "tpl-wh")
    new = new_id("twh2")
    launch(c, new, "template:tpl-wh")
    r = c.sh(new, "cat /etc/.wh.greeting /etc/sub/.wh..wh..opq /etc/sub/kept /etc/greeting; "
                  "test -e /etc/doomed || echo gone")
    assert r.code == 0, r.describe()
    assert r.out == "a\nb\nc\nhello\ngone\n"
