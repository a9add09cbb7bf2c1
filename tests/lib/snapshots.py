"""Snapshot tars on the test's side: the hostile corpus's location, cutting
data into Restore pieces, and reading what an export delivered."""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
from pathlib import Path
from typing import Iterator

from tests.lib.grpc_clients import sandbox_modules

pb, _ = sandbox_modules()

SNAPSHOTS_DIR = Path(__file__).resolve().parents[1] / "snapshots"
HOSTILE_DIR = SNAPSHOTS_DIR / "hostile"

# Restore pieces: the gateway's default SANDBOX_MAX_MESSAGE_MB is 16.
RESTORE_CHUNK = 1024 * 1024

COMPRESSIONS = {
    "none": pb.COMPRESSION_NONE,
    "gzip": pb.COMPRESSION_GZIP,
    "zstd": pb.COMPRESSION_ZSTD,
}


def decompress(data: bytes) -> bytes:
    """Plain tar bytes from a plain, gzip or zstd stream."""
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return subprocess.run(["zstd", "-d", "-q", "-c"], input=data, stdout=subprocess.PIPE,
                              check=True, timeout=60).stdout
    return data


def open_tar(data: bytes) -> tarfile.TarFile:
    """The stream as a tarfile (decompressing first); raises if unreadable."""
    return tarfile.open(fileobj=io.BytesIO(decompress(data)), mode="r:")


def tar_members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Every member of the stream with its content (b"" but for files)."""
    out = []
    with open_tar(data) as t:
        for m in t.getmembers():
            content = b""
            if m.isfile():
                f = t.extractfile(m)
                content = f.read() if f is not None else b""
            out.append((m, content))
    return out


def chunks_of(data: bytes, size: int = RESTORE_CHUNK) -> Iterator[bytes]:
    for off in range(0, len(data), size):
        yield data[off:off + size]


def file_chunks(path: Path, size: int = RESTORE_CHUNK) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while True:
            b = f.read(size)
            if not b:
                return
            yield b
