"""Templates under attack: what a sandbox plants in its layer, two
creations of one layer at once, racing clients, and a writer of the shared
store that plants FIFOs, symbolic links and oversized documents or leaves
names behind. Each gets a clear error or the right template, promptly,
and nothing outside the store is touched."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import grpc
import pytest

# The gateway, registry, store and base image of the template tests.
from tests.integration.test_templates import c, image_ref, reg, store, tgw  # noqa: F401 (fixtures)
from tests.integration.test_templates import create, delete, gw_env, launch, layout_dir, made_on_image, templates
from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway

# A gateway call that a planted object could hang is given this long.
PROMPT_S = 30


def test_two_templates_of_one_layer_made_at_once_both_hold_every_file(c, image_ref):
    ref, _ = image_ref
    src = new_id("trace")
    launch(c, src, ref)
    c.ok(src, "mkdir -p /root/many && cd /root/many && i=0; while [ $i -lt 3000 ]; do echo x > $i; i=$((i+1)); done",
         timeout_seconds=120, rpc_timeout=150)
    got: dict = {}

    def make(name):
        try:
            got[name] = create(c, src, name).image_digest
        except grpc.RpcError as e:
            got[name] = e

    threads = [threading.Thread(target=make, args=(n,)) for n in ("race-a", "race-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(isinstance(v, str) for v in got.values()), got
    for name in got:
        sid = new_id("tracel")
        launch(c, sid, f"template:{name}")
        assert c.sh(sid, "ls /root/many | wc -l").out.strip() == "3000", name
        c.delete(sid)


def test_a_fifo_in_the_store_fails_listing_deleting_and_launching_at_once(c, image_ref, store):
    _, t = made_on_image(c, image_ref, "tpl-fifo")
    d = layout_dir(store, "tpl-fifo")
    index = os.path.join(d, "index.json")
    os.unlink(index)
    os.mkfifo(index)
    t0 = time.monotonic()
    assert "tpl-fifo" not in templates(c)
    with pytest.raises(grpc.RpcError) as e:
        launch(c, new_id("tfifo"), "template:tpl-fifo")
    assert e.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        delete(c, "tpl-fifo")
    assert e.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
    assert time.monotonic() - t0 < PROMPT_S
    # The cache's gate was never held: other templates are made and listed.
    made_on_image(c, image_ref, "tpl-after-fifo")
    assert "tpl-after-fifo" in templates(c)


def test_a_fifo_for_a_blob_fails_the_launch_at_once(c, image_ref, reg, store, gateway_secret):
    _, t = made_on_image(c, image_ref, "tpl-fifo-blob")
    blobs = os.path.join(layout_dir(store, "tpl-fifo-blob"), "blobs", "sha256")
    manifest = json.load(open(os.path.join(blobs, t.image_digest[7:])))
    top = os.path.join(blobs, manifest["layers"][-1]["digest"][7:])
    os.unlink(top)
    os.mkfifo(top)
    with running_gateway(gw_env(reg, store), secret=gateway_secret, check=True) as gw2, sandbox_client(gw2) as c2:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            launch(c2, new_id("tfifob"), "template:tpl-fifo-blob", timeout=PROMPT_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert time.monotonic() - t0 < PROMPT_S


def test_a_symlinked_template_directory_is_refused_and_its_target_untouched(c, image_ref, store, tmp_path):
    target = tmp_path / "host"
    target.mkdir()
    (target / "keep").write_text("host file\n")
    (target / "blobs" / "sha256").mkdir(parents=True)
    (target / "blobs" / "sha256" / ("a" * 64)).write_text("host blob\n")
    templates_dir = os.path.join(store, "sandbox-snapshots", "templates")
    os.makedirs(templates_dir, exist_ok=True)
    os.symlink(target, os.path.join(templates_dir, "evil"))
    ref, _ = image_ref
    sid = new_id("tevil")
    launch(c, sid, ref)
    with pytest.raises(grpc.RpcError) as e:
        create(c, sid, "evil")
    assert e.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT), \
        e.value.details()
    with pytest.raises(grpc.RpcError):
        delete(c, "evil")
    with pytest.raises(grpc.RpcError):
        launch(c, new_id("tevil2"), "template:evil")
    assert sorted(os.listdir(target)) == ["blobs", "keep"]
    assert (target / "keep").read_text() == "host file\n"
    assert (target / "blobs" / "sha256" / ("a" * 64)).exists()


def test_a_deleted_template_leaves_no_name_behind(c, image_ref, store):
    for i in range(3):
        made_on_image(c, image_ref, f"tpl-gone-{i}")
        delete(c, f"tpl-gone-{i}")
    left = os.listdir(os.path.join(store, "sandbox-snapshots", "templates"))
    assert not [n for n in left if n.startswith("tpl-gone-")], left
    assert not [n for n in templates(c) if n.startswith("tpl-gone-")]


def test_an_image_directory_removed_and_made_again_comes_back_as_the_sandbox_left_it(c, image_ref):
    """The sandbox removes a directory of its image and makes it again with
    other files (an opaque directory in its layer): a launch from its
    template sees exactly the new files over the image's."""
    ref, _ = image_ref
    sid = new_id("topq")
    launch(c, sid, ref)
    c.ok(sid, "rm -rf /etc && mkdir /etc && echo new > /etc/only-new && rm -rf /app && mkdir /app && echo w > /app/w")
    create(c, sid, "tpl-opaque")
    new = new_id("topq2")
    launch(c, new, "template:tpl-opaque")
    r = c.sh(new, "ls -A /etc; cat /app/w")
    assert r.out == "only-new\nw\n", r.describe()


def test_creations_deletions_and_launches_racing_on_one_name_leave_it_whole_or_gone(c, image_ref):
    """Several clients make, delete and launch one name at once, and six
    creations at once meet the cap: no call hangs or crashes the gateway, a
    creation past the cap is RESOURCE_EXHAUSTED, and at the end the name is
    either a whole template that launches with its files or not listed."""
    ref, _ = image_ref
    src = new_id("tloop")
    launch(c, src, ref)
    c.ok(src, "echo raced > /etc/raced")
    codes: list = []

    def worker(kind):
        for _ in range(6):
            try:
                if kind == "create":
                    create(c, src, "tpl-raced")
                elif kind == "delete":
                    delete(c, "tpl-raced")
                else:
                    sid = new_id("tloopl")
                    launch(c, sid, "template:tpl-raced")
                    c.delete(sid)
                codes.append("OK")
            except grpc.RpcError as e:
                codes.append(e.code().name)

    threads = [threading.Thread(target=worker, args=(k,)) for k in ("create", "create", "delete", "launch")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert set(codes) <= {"OK", "ALREADY_EXISTS", "NOT_FOUND", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"}, codes
    if "tpl-raced" in templates(c):
        sid = new_id("tloopend")
        launch(c, sid, "template:tpl-raced")
        assert c.sh(sid, "cat /etc/raced").out == "raced\n"
    many: list = []

    made: list = []

    def make(i):
        try:
            create(c, src, f"tpl-many-{i}")
            many.append("OK")
            made.append(f"tpl-many-{i}")
        except grpc.RpcError as e:
            many.append(e.code().name)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(many) <= {"OK", "RESOURCE_EXHAUSTED"} and "OK" in many, many
    # Exactly the creations that answered OK are listed.
    assert sorted(n for n in templates(c) if n.startswith("tpl-many-")) == sorted(made)


def test_what_a_sandbox_plants_in_its_layer_stays_inside_its_template(c, image_ref, store, tgw):
    """A setuid-root file, a link to the host's /etc/shadow, a hard link
    and a 1 TiB sparse file in the sandbox's layer: on the host the
    template's unpacked layer has nothing setuid owned by root, the link is
    a link (the host's file never read or touched), and the sparse file
    costs the store next to nothing; in a sandbox launched from it each is
    what the sandbox made."""
    ref, _ = image_ref
    sid = new_id("tplant")
    launch(c, sid, ref)
    shadow = open("/etc/shadow", "rb").read()
    c.ok(sid, "echo s > /suid && chmod 4755 /suid && ln -s /etc/shadow /shadow-link && echo h > /h1 && "
              "ln /h1 /h2 && busybox dd if=/dev/zero of=/sparse bs=1 count=1 seek=1099511627775 2>/dev/null")
    t = create(c, sid, "tpl-planted")
    assert t.size_bytes < 64 << 20, t.size_bytes
    layers = os.path.join(tgw.state_dir, "images", "layers")
    for root, dirs, files in os.walk(layers):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            assert not (st.st_mode & (stat.S_ISUID | stat.S_ISGID) and st.st_uid == 0), (root, name)
    assert open("/etc/shadow", "rb").read() == shadow
    new = new_id("tplant2")
    launch(c, new, "template:tpl-planted")
    r = c.sh(new, "busybox stat -c '%a %s' /suid; busybox readlink /shadow-link; "
                  "[ $(busybox stat -c %i /h1) = $(busybox stat -c %i /h2) ] && echo linked; "
                  "busybox stat -c %s /sparse")
    assert r.out == "4755 2\n/etc/shadow\nlinked\n1099511627776\n", r.describe()


def test_an_index_100_times_its_cap_is_skipped_by_listings_and_refused_by_launches(c, image_ref, store):
    """An index.json of 6.4 MiB (100 times what is read of one) written into
    the store: listings leave the template out and launches refuse it,
    reading no more than the cap."""
    made_on_image(c, image_ref, "tpl-huge-index")
    with open(os.path.join(layout_dir(store, "tpl-huge-index"), "index.json"), "wb") as f:
        f.write(b" " * (100 * 64 * 1024))
    assert "tpl-huge-index" not in templates(c)
    with pytest.raises(grpc.RpcError) as e:
        launch(c, new_id("thuge"), "template:tpl-huge-index")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
