"""Servers inside sandboxes, reached through the gateway's Forward and
ListPorts: a small TCP server program to run detached in a sandbox, and a
client of one Forward call."""

from __future__ import annotations

import queue
import time
from typing import Optional

import grpc

from tests.lib.client import pb

FORWARD_TIMEOUT_S = 300.0

# A TCP server for the sandbox: `python3 -c SERVER PORT MODE [TEXT]`.
#   echo   echoes every byte; on EOF shuts its write side (half-close)
#   hello  sends TEXT and closes
#   die    sends TEXT, then the whole program exits mid-connection
#   reset  sends TEXT, then resets the connection (SO_LINGER 0)
#   v6     as echo, bound to [::1] only
SERVER = r"""
import os, socket, struct, sys, threading
port, mode = int(sys.argv[1]), sys.argv[2]
text = sys.argv[3].encode() if len(sys.argv) > 3 else b""
fam, host = (socket.AF_INET6, "::1") if mode == "v6" else (socket.AF_INET, "0.0.0.0")
ls = socket.socket(fam, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(128)
def serve(c):
    if mode in ("echo", "v6"):
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            c.sendall(b)
        c.shutdown(socket.SHUT_WR)
        c.close()
    elif mode == "hello":
        c.sendall(text)
        c.close()
    elif mode == "die":
        c.sendall(text)
        os._exit(0)
    elif mode == "reset":
        c.sendall(text)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def start_server(client, sid: str, port: int, mode: str = "echo", text: str = "",
                 timeout: float = 30.0) -> None:
    """Starts SERVER detached in sandbox `sid` and waits until ListPorts
    shows it listening."""
    argv = ["python3", "-c", SERVER, str(port), mode] + ([text] if text else [])
    start_detached(client, sid, argv)
    wait_listening(client, sid, port, timeout)


def start_detached(client, sid: str, argv: list[str]) -> None:
    """Starts `argv` as a detached process and leaves the starting call."""
    call = client.stub.Run(iter([pb.ProcessInput(start=pb.ProcessStart(sandbox_id=sid, argv=argv, detach=True))]),
                           metadata=client.md, timeout=60)
    ev = next(call)
    assert ev.WhichOneof("event") == "started", ev
    call.cancel()


def list_ports(client, sid: str):
    return list(client.stub.ListPorts(pb.ListPortsRequest(sandbox_id=sid), metadata=client.md, timeout=30).ports)


def wait_listening(client, sid: str, port: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        found = [p for p in list_ports(client, sid) if p.port == port]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on {port} in {sid} after {timeout}s")
        time.sleep(0.1)


class Forward:
    """One Forward call to `port` in `sid`. The constructor waits for the
    gateway's `connected` frame (a refused port raises grpc.RpcError).
    `send`, `close_write` and `end` queue client frames; `recv` returns the
    next data (b"" once the server closed its side)."""

    _END = object()

    def __init__(self, client, sid: str, port: int, first: bytes = b"", timeout: float = FORWARD_TIMEOUT_S):
        self._q: queue.Queue = queue.Queue()
        self._q.put(pb.ForwardFrame(sandbox_id=sid, port=port, data=first))
        self.call = client.stub.Forward(self._frames(), metadata=client.md, timeout=timeout)
        self.server_closed = False
        frame = next(self.call)
        assert frame.connected, frame

    def _frames(self):
        while True:
            m = self._q.get()
            if m is self._END:
                return
            yield m

    def send(self, data: bytes) -> None:
        self._q.put(pb.ForwardFrame(data=data))

    def close_write(self) -> None:
        self._q.put(pb.ForwardFrame(close_write=True))

    def end(self) -> None:
        """Half-closes the gRPC stream (also a close_write)."""
        self._q.put(self._END)

    def recv(self) -> bytes:
        while not self.server_closed:
            frame = next(self.call)
            if frame.close_write:
                self.server_closed = True
            if frame.data or self.server_closed:
                return bytes(frame.data)
        return b""

    def read_all(self) -> bytes:
        out = bytearray()
        while True:
            b = self.recv()
            if not b and self.server_closed:
                return bytes(out)
            out += b

    def finish(self) -> Optional[grpc.StatusCode]:
        """The end of the call: its status code (OK)."""
        for frame in self.call:
            assert not frame.data, "data after the server's close"
        return self.call.code()

    def cancel(self) -> None:
        self.call.cancel()
        self._q.put(self._END)
