"""Watch: changes made by the sandbox's own processes arrive as events —
created, modified (on close after a write), removed, renamed — and events
the client is too slow for are reported as an overflow, never dropped
silently. Watches per sandbox are capped."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from tests.lib.client import pb, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.procs import wait_until

K = pb.FileEvent


@pytest.fixture(scope="module")
def client(gateway):
    with sandbox_client(gateway) as c:
        yield c


class Watcher:
    """Reads a Watch call on a thread into a queue."""

    def __init__(self, client, sid, path, recursive=False):
        self.call = client.watch(sid, path, recursive=recursive, timeout=120)
        self.events: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        first = self.next(30)
        assert first.kind == K.KIND_WATCHING, first

    def _read(self):
        try:
            for ev in self.call:
                self.events.put(ev)
        except grpc.RpcError as e:
            self.events.put(e)

    def next(self, timeout=10.0):
        ev = self.events.get(timeout=timeout)
        if isinstance(ev, Exception):
            raise ev
        return ev

    def until(self, pred, timeout=20.0):
        seen = []
        while True:
            ev = self.next(timeout)
            seen.append(ev)
            if pred(ev):
                return seen

    def close(self):
        self.call.cancel()
        self.thread.join(10)


def test_watch_sees_create_modify_rename_remove(client):
    sid = client.launch().sandbox_id
    client.ok(sid, "mkdir -p /tmp/w/sub")
    w = Watcher(client, sid, "/tmp/w", recursive=True)
    try:
        client.ok(sid, "echo hi > /tmp/w/a && mv /tmp/w/a /tmp/w/b && echo deep > /tmp/w/sub/c && rm /tmp/w/b "
                       "&& mkdir /tmp/w/new && echo x > /tmp/w/new/inner")
        seen = w.until(lambda e: e.path == "/tmp/w/new/inner" and e.kind == K.KIND_MODIFIED)
        got = [(e.kind, e.path, e.old_path) for e in seen]
        for want in [(K.KIND_CREATED, "/tmp/w/a", ""), (K.KIND_MODIFIED, "/tmp/w/a", ""),
                     (K.KIND_RENAMED, "/tmp/w/b", "/tmp/w/a"), (K.KIND_MODIFIED, "/tmp/w/sub/c", ""),
                     (K.KIND_REMOVED, "/tmp/w/b", ""), (K.KIND_CREATED, "/tmp/w/new", "")]:
            assert want in got, (want, got)
        assert got.index((K.KIND_CREATED, "/tmp/w/a", "")) < got.index((K.KIND_RENAMED, "/tmp/w/b", "/tmp/w/a"))
        # The file API's own writes are seen too.
        client.write_file(sid, "/tmp/w/api", b"x")
        w.until(lambda e: e.kind == K.KIND_RENAMED and e.path == "/tmp/w/api")
    finally:
        w.close()


def test_a_slow_reader_gets_an_overflow_event(client):
    sid = client.launch().sandbox_id
    client.ok(sid, "mkdir -p /tmp/flood")
    call = client.watch(sid, "/tmp/flood", timeout=240)
    events = iter(call)
    try:
        assert next(events).kind == K.KIND_WATCHING
        # Far more events than the kernel queues (16384) while the client
        # reads none: long names, so the stream's buffers fill up first.
        client.py(sid, "n = 'n' * 200\n"
                       "for i in range(60000):\n"
                       "    open(f'/tmp/flood/{n}{i}', 'w').close()\n", timeout_seconds=300)
        kinds = set()
        for ev in events:
            kinds.add(ev.kind)
            if ev.kind == K.KIND_OVERFLOW:
                break
        assert K.KIND_OVERFLOW in kinds
    finally:
        call.cancel()


def test_watches_per_sandbox_are_capped(gateway_secret):
    with running_gateway(secret=gateway_secret, env={"SANDBOX_MAX_WATCHES": "2"}) as gw, sandbox_client(gw) as c:
        sid = c.launch().sandbox_id
        ws = [Watcher(c, sid, "/tmp"), Watcher(c, sid, "/tmp")]
        try:
            third = c.watch(sid, "/tmp", timeout=30)
            with pytest.raises(grpc.RpcError) as e:
                next(iter(third))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            for w in ws:
                w.close()
        # A closed watch frees its place (once the gateway has seen the
        # cancellation).
        def again():
            try:
                Watcher(c, sid, "/tmp").close()
                return True
            except grpc.RpcError:
                return False
        assert wait_until(again, timeout=10)


def test_watching_a_missing_path_is_not_found(client):
    sid = client.launch().sandbox_id
    with pytest.raises(grpc.RpcError) as e:
        next(iter(client.watch(sid, "/tmp/nope", timeout=30)))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_watch_ends_when_the_watched_directory_goes(client):
    sid = client.launch().sandbox_id
    client.exec(sid, ["mkdir", "-p", "/tmp/gone/sub"])
    w = Watcher(client, sid, "/tmp/gone", recursive=True)
    client.exec(sid, ["rm", "-rf", "/tmp/gone"])
    w.until(lambda ev: ev.kind == K.KIND_REMOVED and ev.path == "/tmp/gone")
    # Then the stream ends, OK: nothing more can come.
    w.thread.join(10)
    assert not w.thread.is_alive()
    assert w.events.empty(), w.events.get()
    assert w.call.code() == grpc.StatusCode.OK
