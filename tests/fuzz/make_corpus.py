#!/usr/bin/python3
"""Writes the fuzzers' seed corpora under tests/fuzz/corpus/ (deterministic).

    /usr/bin/python3 tests/fuzz/make_corpus.py   # from the repository root

Needs Debian's python3-protobuf and the Python stubs Bazel generates
(bazel build //proto/...), found under bazel-out/k8-fastbuild/bin/proto/py.
The hostile tars of tests/snapshots/hostile/ are not copied: tests/fuzz/run
passes that directory to the unpack fuzzer as extra seeds.
"""
import gzip
import io
import os
import shutil
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bazel-out/k8-fastbuild/bin/proto/py"))
from sandbox.v1 import sandbox_pb2 as pb  # noqa: E402

OUT = os.path.join(ROOT, "tests/fuzz/corpus")
# Pad archives to 1 KiB rather than tarfile's 10 KiB records: smaller seeds.
tarfile.RECORDSIZE = 1024


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- shim: selector byte, parameter byte, first part NUL rest -----------------
def shim():
    def seed(name, sel, param, first, rest=None):
        data = bytes([sel, param]) + first.encode()
        if rest is not None:
            data += b"\0" + (rest if isinstance(rest, bytes) else rest.encode())
        write("shim", name, data)

    seed("launch-ok", 0, 0, "application/json", '{"sandbox_id":"sb-1","allow_egress":true}')
    seed("launch-null-ct", 0, 0, "", '{"sandbox_id":"a","allow_egress":"yes"}')
    seed("launch-bad", 0, 0, "text/plain", '{"sandbox_id":"-x"}')
    seed("launch-long-id", 0, 0, "application/merge-patch+json; charset=utf-8", '{"sandbox_id":"' + "a" * 65 + '"}')
    seed("launch-dup", 0, 0, "application/json", '{"sandbox_id":"a","sandbox_id":"b","allow_egress":2}')
    seed("exec-ok", 1, 0, "application/json", '{"argv":["sh","-c","echo hi"],"timeout":60}')
    seed("exec-timeouts", 1, 0, "", '{"argv":["x"],"timeout":"3600"}')
    seed("exec-float", 1, 0, "", '{"argv":["x"],"timeout":1.0e3}')
    seed("exec-bad", 1, 0, "application/json", '{"argv":[1,null],"timeout":-1}')
    seed("exec-nul", 1, 0, "", b'{"argv":["a\\u0000b"]}\0')
    seed("id-ok", 2, 0, "Abc_9-z")
    seed("id-bad", 2, 0, "_x")
    seed("bool-yes", 3, 0, "YES")
    seed("bool-off", 3, 0, "off")
    seed("match-route", 4, 0x80 | 3, "/sandboxes/sb-1/exec")
    seed("match-route-long", 4, 0x80 | 2, "/sandboxes/" + "x" * 80)
    seed("match-tmpl", 4, 66, "/a/{id}/b", "/a/id/b")
    seed("match-tmpl-cap1", 4, 0, "{id}", "abc")
    seed("process-ok", 5, 0, "application/json",
         '{"argv":["sh"],"env":{"A":"1"},"cwd":"/tmp","timeout":0,"pty":{"rows":24,"cols":80},"process_id":"p-1"}')
    seed("process-bad", 5, 0, "", '{"argv":"x","env":{"A":1},"pty":{"rows":0},"timeout":3601,"process_id":"."}')
    seed("signal-name", 6, 0, "", '{"signal":"sigterm"}')
    seed("signal-number", 6, 0, "", '{"signal":"15"}')
    seed("signal-bad", 6, 0, "", '{"signal":65.0}')
    seed("resize-ok", 7, 0, "", '{"rows":30,"cols":"100"}')
    seed("resize-bad", 7, 0, "", '{"rows":70000}')


# ---- unpack: tars ----------------------------------------------------------------
class Tar:
    def __init__(self, fmt=tarfile.PAX_FORMAT):
        self.buf = io.BytesIO()
        self.t = tarfile.open(fileobj=self.buf, mode="w", format=fmt)

    def _info(self, name, **kw):
        ti = tarfile.TarInfo(name)
        ti.mtime = 0
        for k, v in kw.items():
            setattr(ti, k, v)
        return ti

    def file(self, name, data=b"", **kw):
        kw.setdefault("mode", 0o644)
        self.t.addfile(self._info(name, size=len(data), **kw), io.BytesIO(data))
        return self

    def dir(self, name, **kw):
        kw.setdefault("mode", 0o755)
        self.t.addfile(self._info(name, type=tarfile.DIRTYPE, **kw))
        return self

    def symlink(self, name, target):
        self.t.addfile(self._info(name, type=tarfile.SYMTYPE, linkname=target))
        return self

    def hardlink(self, name, target):
        self.t.addfile(self._info(name, type=tarfile.LNKTYPE, linkname=target))
        return self

    def bytes(self):
        self.t.close()
        return self.buf.getvalue()


def unpack():
    write("unpack", "empty-archive.tar", Tar().bytes())
    write("unpack", "tree.tar",
          Tar().dir("etc").file("etc/hostname", b"sandbox\n").dir("root").file("root/.profile", b"PS1=$ \n")
          .symlink("bin", "usr/bin").dir("usr").dir("usr/bin").file("usr/bin/tool", b"#!/bin/sh\n", mode=0o755)
          .hardlink("usr/bin/tool2", "usr/bin/tool").bytes())
    write("unpack", "dot-slash.tar", Tar().dir("./").file("./a/b/c", b"deep\n").bytes())
    write("unpack", "whiteouts.tar",
          Tar().dir("d").file("d/.wh.gone").file("e/.wh..wh..opq").file(".wh.top").bytes())
    write("unpack", "xattrs.tar",
          Tar().file("f", b"x", pax_headers={"SCHILY.xattr.user.k": "v",
                                             "SCHILY.xattr.trusted.overlay.redirect": "/x",
                                             "SCHILY.xattr.trusted.overlay.opaque": "y"}).bytes())
    write("unpack", "modes-owners.tar",
          Tar().dir("locked", mode=0o000).file("suid", b"#!", mode=0o4755, uid=1000, gid=1000, uname="u", gname="g")
          .file("locked2/f", b"1").dir("locked2", mode=0o500).bytes())
    write("unpack", "long-names.tar", Tar().file("n/" * 60 + "leaf", b"1").file("x" * 200, b"2").bytes())
    write("unpack", "gnu-format.tar", Tar(tarfile.GNU_FORMAT).file("l" * 150, b"gnu longname").symlink("s", "t" * 120).bytes())
    write("unpack", "ustar.tar.gz", gzip.compress(Tar(tarfile.USTAR_FORMAT).file("a", b"hello\n" * 50).bytes(), mtime=0))
    write("unpack", "replace-symlink-by-file.tar", Tar().symlink("x", "/etc/passwd").file("x", b"ok\n").bytes())
    write("unpack", "dir-then-file-same-name.tar", Tar().dir("x").file("x", b"1").file("y", b"1").dir("y").bytes())


# ---- proto: selector byte (index in proto_fuzz.c's table) + wire bytes -----------
def proto():
    def seed(name, sel, msg):
        write("proto", name, bytes([sel]) + (msg if isinstance(msg, bytes) else msg.SerializeToString()))

    seed("launch", 0, pb.LaunchRequest(sandbox_id="sb-1", allow_egress=True))
    seed("restore-header", 1, pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id="r", allow_egress=True)))
    seed("restore-chunk", 1, pb.RestoreRequest(tar_chunk=b"\x1f\x8b" + b"\0" * 30))
    seed("exec", 2, pb.ExecRequest(sandbox_id="e", argv=["sh", "-c", "env"], timeout_seconds=5, stdin=b"in",
                                   env={"A": "1", "B": ""}, cwd="/tmp"))
    seed("export", 3, pb.ExportSnapshotRequest(sandbox_id="x", compression=2))
    seed("export-unknown-enum", 3, pb.ExportSnapshotRequest(sandbox_id="x", compression=77))
    seed("persist", 4, pb.PersistSnapshotRequest(sandbox_id="p"))
    seed("connect", 5, pb.ConnectRequest(sandbox_id="c", allow_egress=True))
    seed("delete", 6, pb.DeleteRequest(sandbox_id="d", delete_snapshot=True))
    seed("get", 7, pb.GetRequest(sandbox_id="g"))
    seed("list-unknown-fields", 8, b"\x08\x01\x12\x03abc\x1d\x01\x02\x03\x04\x21" + bytes(8))
    seed("status-empty", 9, b"")
    # grpc.health.v1.HealthCheckRequest {service = 1}
    seed("health", 10, b"\x0a\x12sandbox.v1.Sandbox")
    # grpc.reflection ServerReflectionRequest {host = 1, list_services = 7,
    # file_containing_symbol = 4, file_containing_extension = 5 {type 1, number 2}}
    seed("reflection-v1-list", 11, b"\x0a\x00\x3a\x01*")
    seed("reflection-v1-symbol", 11, b"\x22\x12sandbox.v1.Sandbox")
    seed("reflection-v1alpha-ext", 12, b"\x2a\x0a\x0a\x06a.b.Cd\x10\x05")
    # ExecRequest env map entry without a value, and a packed-looking argv.
    seed("exec-map-partial", 2, b"\x2a\x03\x0a\x01K\x12\x00")


# ---- gcs_parse: selector byte, parameter byte, data ------------------------------
def gcs():
    def seed(name, sel, param, data):
        write("gcs_parse", name, bytes([sel, param]) + data.encode())

    seed("status-11", 0, 0, "HTTP/1.1 308 Resume Incomplete\r\n")
    seed("status-2", 0, 0, "HTTP/2 200\r\n")
    seed("status-bad", 0, 0, "HTTP/1.1 99\r\n")
    seed("hdr-location", 1, 0, "Location: https://storage.googleapis.com/upload?upload_id=xyz \r\n")
    seed("hdr-range", 1, 1, "range:\tbytes=0-1023\r\n")
    seed("hdr-hash", 1, 2, "X-Goog-Hash: crc32c=n03x6A==,md5=XrY7u+Ae7tCTyyK7j1rNww==\r\n")
    seed("range-ok", 2, 0, "bytes=0-1048575")
    seed("range-overflow", 2, 0, "bytes=0-18446744073709551615")
    seed("range-not-zero", 2, 0, "bytes=5-9")
    seed("hash-crc", 3, 0, "crc32c=n03x6A==")
    seed("hash-both", 3, 0, "md5=XrY7u+Ae7tCTyyK7j1rNww==, crc32c=AAAAAA==")
    seed("hash-bad", 3, 0, "crc32c=n03x6A=")
    seed("crc-data", 4, 7, "123456789" * 5)
    seed("b64", 5, 0, "\x00\xff\xfe\x01abc")


# ---- http1: selector byte, split step, a sandbox server's bytes ---------------------
def http1():
    def seed(name, sel, step, data):
        write("http1", name, bytes([sel, step]) + (data if isinstance(data, bytes) else data.encode()))

    seed("head-ok", 0, 7, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello")
    seed("head-chunked", 0, 0, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close, X-A\r\n\r\n")
    seed("head-10-eof", 0, 3, "HTTP/1.0 404 \r\nX-Blank: \t v \t\r\n\r\n")
    seed("head-bare-lf", 0, 1, "HTTP/1.1 200 OK\nA: b\n\n")
    seed("head-obs-fold", 0, 2, "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n")
    seed("head-dup-cl", 0, 5, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\n")
    seed("head-cl-differ", 0, 5, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
    seed("head-cl-te", 0, 9, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
    seed("head-cl-overflow", 0, 9, "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n")
    seed("head-te-gzip", 0, 9, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
    seed("head-status-bad", 0, 0, "HTTP/1.1 20x OK\r\nA: b\r\n\r\n")
    seed("head-no-colon", 0, 0, "HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\nNo colon\r\n\r\n")
    seed("head-ctl", 0, 0, b"HTTP/1.1 200 OK\r\nA: b\x00c\r\nB: \x7f\r\n\r\n")
    seed("head-many", 0, 200, "HTTP/1.1 200 OK\r\n" + "".join("X-%d: v\r\n" % i for i in range(130)) + "\r\n")
    seed("head-big", 0, 255, "HTTP/1.1 200 OK\r\nX-Big: " + "h" * 70000 + "\r\n\r\n")
    seed("chunked-ok", 1, 3, "5\r\nhello\r\n1;name=value\r\n \r\nA \t; ext\r\n0123456789\r\n0\r\nX-T: y\r\n\r\nafter")
    seed("chunked-missing-end", 1, 2, "5\r\nhello\r\n")
    seed("chunked-negative", 1, 1, "-1\r\nx\r\n0\r\n\r\n")
    seed("chunked-overflow", 1, 4, "10000000000000000\r\nx\r\n")
    seed("chunked-hex-garbage", 1, 0, "0x10\r\nzz\r\n")
    seed("chunked-bare-lf", 1, 0, "5\nhello\n0\n\n")
    seed("chunked-no-crlf", 1, 6, "5\r\nhelloX\r\n0\r\n\r\n")
    seed("chunked-long-ext", 1, 100, "1;" + "e" * 1100 + "\r\nx\r\n0\r\n\r\n")
    seed("chunked-trailers", 1, 50, "0\r\n" + "X: " + "t" * 17000 + "\r\n\r\n")


# ---- jmsg: selector byte, then frames each as a 2-byte little-endian length --
def jmsg():
    import json
    import struct

    def frames(*parts):
        out = b""
        for p in parts:
            p = p if isinstance(p, bytes) else p.encode()
            out += struct.pack("<H", len(p)) + p
        return out

    header = json.dumps({"msg_id": "m1", "msg_type": "stream", "session": "s", "username": "u",
                         "date": "2026-01-01T00:00:00Z", "version": "5.3"})
    parent = json.dumps({"msg_id": "req-1"})
    content = json.dumps({"name": "stdout", "text": "2\n"})
    sig = "0" * 64
    write("jmsg", "stream-signed", b"\1" + frames("kernel", "<IDS|MSG>", sig, header, parent, "{}", content))
    write("jmsg", "stream-unsigned", b"\0" + frames("<IDS|MSG>", sig, header, parent, "{}", content, b"\0buffer"))
    write("jmsg", "no-parent", b"\1" + frames("<IDS|MSG>", sig, header, "{}", "{}", content))
    write("jmsg", "not-objects", b"\1" + frames("<IDS|MSG>", sig, "[]", "1", "null", '"x"'))
    write("jmsg", "bad-json", b"\1" + frames("<IDS|MSG>", sig, '{"msg_type":', "{}", "{}", "{}"))
    write("jmsg", "no-type", b"\1" + frames("<IDS|MSG>", sig, '{"msg_type":7}', "{}", "{}", "{}"))
    write("jmsg", "no-delimiter", b"\0" + frames("a", "b", "c", "d", "e", "f"))
    write("jmsg", "short", b"\1" + frames("<IDS|MSG>", sig, header))
    write("jmsg", "deep", b"\1" + frames("<IDS|MSG>", sig, '{"msg_type":"x","a":' + "[" * 3000 + "]" * 3000 + "}",
                                          "{}", "{}", "{}"))


if __name__ == "__main__":
    for t in ("shim", "unpack", "proto", "gcs_parse", "http1", "jmsg"):
        shutil.rmtree(os.path.join(OUT, t), ignore_errors=True)
    shim()
    unpack()
    proto()
    gcs()
    http1()
    jmsg()
