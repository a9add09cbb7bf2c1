"""A raw HTTP/2 client for the hostile-client tests: frames written by hand
(a static-table-only HPACK encoder), so a test can do what no gRPC library
lets it — reset streams as fast as it can, open streams past the server's
limit, never read. Loopback only."""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 8
SETTINGS_INITIAL_WINDOW_SIZE = 4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _string(b: bytes) -> bytes:
    assert len(b) < 127
    return bytes([len(b)]) + b


def grpc_headers(path: str, metadata: dict[str, str] | None = None) -> bytes:
    """An HPACK block for a gRPC request: indexed :method POST and :scheme
    http, literals (never in the dynamic table) for the rest."""
    block = b"\x83\x86" + b"\x04" + _string(path.encode()) + b"\x01" + _string(b"localhost")
    for name, value in [("content-type", "application/grpc"), ("te", "trailers"), *(metadata or {}).items()]:
        block += b"\x00" + _string(name.encode()) + _string(value.encode())
    return block


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def connect(port: int, source: str = "127.0.0.1", rcvbuf: int | None = None,
            settings: bytes = b"", timeout: float = 10.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))
    return s


def rapid_reset_burst(first_stream: int, n: int, path: str) -> bytes:
    """`n` streams, each HEADERS then RST_STREAM(CANCEL) at once."""
    block = grpc_headers(path)
    out = bytearray()
    for i in range(n):
        sid = first_stream + 2 * i
        out += frame(HEADERS, END_HEADERS, sid, block)
        out += frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
    return bytes(out)


def _drain(s: socket.socket) -> bool:
    """Reads whatever is there without waiting; False once the server has
    closed the connection."""
    timeout = s.gettimeout()
    s.settimeout(0)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.settimeout(timeout)


def rapid_reset(port: int, source: str, seconds: float, rate: int, path: str, out) -> None:
    """HEADERS then RST_STREAM, `rate` streams a second for `seconds`, on one
    connection at a time (a new one when the server closes it). Puts
    (streams sent, connections used) on `out` (a multiprocessing queue)."""
    import time
    sent, conns, burst = 0, 0, 100
    end = time.monotonic() + seconds
    s, stream = None, 1
    while time.monotonic() < end:
        if s is None:
            try:
                s, stream = connect(port, source), 1
                conns += 1
            except OSError:
                time.sleep(0.05)
                continue
        t0 = time.monotonic()
        try:
            s.sendall(rapid_reset_burst(stream, burst, path))
        except OSError:
            s.close()
            s = None
            continue
        stream += 2 * burst
        sent += burst
        if not _drain(s) or stream > 2**31 - 2 * burst:
            s.close()
            s = None
        pause = burst / rate - (time.monotonic() - t0)
        if pause > 0:
            time.sleep(pause)
    if s is not None:
        s.close()
    out.put((sent, conns))


def refused_flood(port: int, source: str, seconds: float, streams: int, path: str, reflection: bytes,
                  out) -> None:
    """Connections that never read: each asks for `reflection` answers (a
    gRPC message) on one stream to fill the window, then opens `streams`
    streams to `path` (refused: no token) and holds the connection for a
    while; again until `seconds` are over. Puts the count of connections."""
    import time
    conns, held = 0, []
    end = time.monotonic() + seconds
    reflect = grpc_headers("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    block = grpc_headers(path)
    while time.monotonic() < end:
        try:
            s = connect(port, source, rcvbuf=4096,
                        settings=struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 2**31 - 1))
            s.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
            s.sendall(frame(HEADERS, END_HEADERS, 1, reflect)
                      + frame(DATA, 0, 1, grpc_message(reflection) * 200))
            out_frames = bytearray()
            for i in range(streams):
                out_frames += frame(HEADERS, END_HEADERS | END_STREAM, 3 + 2 * i, block)
            s.settimeout(2.0)
            s.sendall(out_frames)
        except OSError:
            time.sleep(0.1)
            continue
        conns += 1
        held.append(s)
        time.sleep(min(2.0, max(0.0, end - time.monotonic())))
        if len(held) > 4:
            held.pop(0).close()
    for s in held:
        s.close()
    out.put(conns)
