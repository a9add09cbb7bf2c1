"""Hostile images: every blob a registry serves is input from outside. A
registry under the test's control (tests/lib/images.RawRegistry) serves
path escapes, whiteout tricks, digest mismatches, oversized manifests and
configs, too many layers, a layer of too many entries and silence; each fails
with a clear status naming the image, nothing lands outside the layer
cache, nothing half-unpacked is used later, and the gateway keeps serving
another sandbox throughout."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time

import grpc
import pytest

from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.grpc_clients import sandbox_modules
from tests.lib.images import (LAYER_ZSTD, OCI_MANIFEST, Image, RawRegistry, busybox_layer, make_image,
                              sha256, tar_bytes)

pb, _ = sandbox_modules()


def layer(entries) -> bytes:
    return gzip.compress(tar_bytes(entries), mtime=0)


@pytest.fixture(scope="module")
def raw():
    r = RawRegistry()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def hgw(raw, gateway_secret):
    env = {"SANDBOX_INSECURE_REGISTRIES": raw.host, "SANDBOX_SNAPSHOT_MAX_ENTRIES": "5000"}
    with running_gateway(env, secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def c(hgw):
    with sandbox_client(hgw) as client:
        yield client


@pytest.fixture(scope="module")
def bystander(c):
    """A sandbox on the default image that must keep working."""
    sid = new_id("bys")
    c.launch(sid)
    return sid


@pytest.fixture(scope="module")
def base():
    return busybox_layer()


def launch(c, image, timeout=60):
    return c.stub.Launch(pb.LaunchRequest(sandbox_id=new_id("hi"), image=image), metadata=c.md, timeout=timeout)


def refused(c, image, code, words, timeout=60):
    with pytest.raises(grpc.RpcError) as ei:
        launch(c, image, timeout)
    assert ei.value.code() == code, ei.value.details()
    assert image in ei.value.details() or image.split("/", 1)[1] in ei.value.details(), ei.value.details()
    for w in words:
        assert w in ei.value.details(), ei.value.details()
    return ei.value.details()


def nothing_half_made(gw):
    tmp = os.path.join(gw.state_dir, "images", "tmp")
    assert [n for n in os.listdir(tmp) if not n.startswith("record.")] == []


def test_path_escape_in_a_layer_is_refused_and_lands_nowhere(c, hgw, raw, base, bystander):
    marker = f"escaped-{os.getpid()}-{time.monotonic_ns()}"
    evil = layer([("file", f"../../../../../tmp/{marker}", b"x"), ("file", f"/tmp/{marker}-abs", b"x")])
    ref = raw.add("evil/escape", "v1", make_image([base, evil]))
    refused(c, ref, grpc.StatusCode.INVALID_ARGUMENT, [])
    assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/tmp/{marker}-abs")
    nothing_half_made(hgw)
    assert c.sh(bystander, "echo ok").out == "ok\n"


def test_a_symlink_then_a_file_through_it_is_refused(c, hgw, raw, base, bystander):
    marker = f"/tmp/through-{os.getpid()}-{time.monotonic_ns()}"
    evil = layer([("symlink", "out", "/tmp"), ("file", f"out/{os.path.basename(marker)}", b"x")])
    ref = raw.add("evil/link", "v1", make_image([base, evil]))
    refused(c, ref, grpc.StatusCode.INVALID_ARGUMENT, [])
    assert not os.path.exists(marker)
    nothing_half_made(hgw)


def test_a_blob_that_does_not_match_its_digest_is_never_used(c, hgw, raw, base, bystander):
    good = layer([("file", "etc/x", b"good")])
    img = make_image([base, good])
    raw.add("evil/mismatch", "v1", img)
    raw.blobs[sha256(good)] = layer([("file", "etc/x", b"evil")])  # served under the good digest
    refused(c, f"{raw.host}/evil/mismatch:v1", grpc.StatusCode.INVALID_ARGUMENT, ["does not match its digest"])
    assert sha256(good)[7:] not in os.listdir(os.path.join(hgw.state_dir, "images", "layers"))
    nothing_half_made(hgw)


def test_a_manifest_of_too_many_layers_is_refused_before_any_blob(c, raw, base):
    img = make_image([base])
    m = json.loads(img.manifest)
    m["layers"] = m["layers"] * 100000
    big = Image(json.dumps(m).encode(), img.blobs)
    ref = raw.add("evil/layers", "v1", big)
    before = len(raw.requests)
    refused(c, ref, grpc.StatusCode.INVALID_ARGUMENT, ["layers"])
    assert not any("/blobs/sha256:" + sha256(base)[7:] in r for r in raw.requests[before:])


def test_an_oversized_manifest_and_config_are_refused(c, raw, base):
    huge = Image(b'{"schemaVersion":2,"x":"' + b"a" * (5 << 20) + b'"}', {})
    refused(c, raw.add("evil/bigmanifest", "v1", huge), grpc.StatusCode.INVALID_ARGUMENT, ["cap"])
    img = make_image([base])
    m = json.loads(img.manifest)
    m["config"]["size"] = 10 << 30
    refused(c, raw.add("evil/bigconfig", "v1", Image(json.dumps(m).encode(), img.blobs)),
            grpc.StatusCode.INVALID_ARGUMENT, ["config", "cap"])


def test_a_layer_of_more_entries_than_the_cap_is_refused_and_leaves_nothing(c, hgw, raw, base, bystander):
    # 20 000 empty files compress to a few KiB; the gateway's cap is 5 000.
    bomb = gzip.compress(tar_bytes([("file", f"f{i}", b"") for i in range(20000)]), mtime=0)
    assert len(bomb) < 200 * 1024
    refused(c, raw.add("evil/bomb", "v1", make_image([base, bomb])), grpc.StatusCode.INVALID_ARGUMENT, [])
    assert sha256(bomb)[7:] not in os.listdir(os.path.join(hgw.state_dir, "images", "layers"))
    nothing_half_made(hgw)
    assert c.sh(bystander, "echo ok").out == "ok\n"


def test_zstd_layers_unpack(c, raw, base):
    plain = tar_bytes([("file", "etc/z", b"zstd ok")])
    z = subprocess.run(["zstd", "-q", "-c"], input=plain, capture_output=True, check=True).stdout
    # busybox under a zstd layer
    img2 = make_image([base, z])
    m = json.loads(img2.manifest)
    m["layers"][1]["mediaType"] = LAYER_ZSTD
    img2 = Image(json.dumps(m).encode(), img2.blobs)
    info = launch(c, raw.add("ok/zstd", "v1", img2))
    assert c.sh(info.sandbox_id, "cat /etc/z").out == "zstd ok"


def test_a_registry_that_never_answers_is_deadline_exceeded(c, raw, bystander):
    raw.stall.add("/v2/evil/silent/")
    t0 = time.monotonic()
    refused(c, f"{raw.host}/evil/silent:v1", grpc.StatusCode.DEADLINE_EXCEEDED, [], timeout=4)
    assert time.monotonic() - t0 < 30
    assert c.sh(bystander, "echo still").out == "still\n"


def test_an_unknown_layer_media_type_is_refused(c, raw, base):
    img = make_image([base])
    m = json.loads(img.manifest)
    m["layers"][0]["mediaType"] = "application/x-evil"
    refused(c, raw.add("evil/type", "v1", Image(json.dumps(m).encode(), img.blobs)),
            grpc.StatusCode.INVALID_ARGUMENT, ["media type"])
