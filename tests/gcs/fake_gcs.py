#!/usr/bin/env python3
"""fake_gcs: a local stand-in for the part of the Google Cloud Storage JSON
API that the gateway's GCS store (gateway/gcs) and Google's own clients use,
with faults to inject on demand. Python standard library only.

What it speaks (objects live in memory, buckets spring into existence):
  POST   /upload/storage/v1/b/B/o?uploadType=resumable[&name=N]  start a session
  PUT    <session URI> with Content-Range                    chunks, status (308 + Range), final
  DELETE <session URI>                                       cancel (499)
  GET    /storage/v1/b/B/o/N?alt=media                       media, with x-goog-hash crc32c and md5
  GET    /storage/v1/b/B/o/N                                 the object resource
  DELETE /storage/v1/b/B/o/N                                 204, or 404
  POST   /token                                              OAuth2 JWT bearer grant (RS256 verified)
  GET    /computeMetadata/v1/instance/service-accounts/default/token   (Metadata-Flavor: Google)

With --pubkey PEM the storage routes require "Authorization: Bearer <token>"
with a token this server handed out (from /token, for a JWT signed by the
matching private key, or from the metadata route).

Control (never faulted, never authenticated):
  POST /_control/fault   JSON {"kind": K, "count": N, "methods": [..], "path": "substring", ...}
      kind "status":   answer `code` (default 503) instead; with "commit": true
                       the request is applied first (the answer is lost)
      kind "drop":     read `fraction` (default 0.5) of the body, commit whole
                       256 KiB units of it to the session when "commit" is
                       true (default), then close the connection unanswered
      kind "slow":     sleep `delay` seconds (default 1), then answer normally
      kind "bad_hash": media downloads carry a wrong crc32c
      kind "partial":  a chunk PUT commits only its first half (in 256 KiB
                       units) and answers 308
      kind "truncate": a media download sends half its body and closes
  POST /_control/reset   drop all faults (and, with {"objects": true}, objects)
  POST /_control/revoke  forget every token handed out (the next use gets 401)
  GET  /_control/stats   counters: requests, faults fired, tokens granted, ...

Prints its port on stdout when it is ready (listens on 127.0.0.1:0 unless
--port). Threading: one thread per connection; all state under one lock.
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

QUANTUM = 256 * 1024
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"

# ---- CRC32C (Castagnoli, reflected) -----------------------------------------

def _crc_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    """CRC32C of `data`, continuing from `crc` (0 to start)."""
    c = crc ^ 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc_b64(crc):
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


# ---- JWT verification --------------------------------------------------------

def verify_rs256(pubkey_pem, signed, signature):
    """True when `signature` is an RS256 signature of `signed` by the key."""
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding
    except ImportError:
        return _verify_with_openssl(pubkey_pem, signed, signature)
    if os.environ.get("FAKE_GCS_FORCE_OPENSSL"):
        return _verify_with_openssl(pubkey_pem, signed, signature)
    key = serialization.load_pem_public_key(pubkey_pem)
    try:
        key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
        return True
    except Exception:
        return False


def _verify_with_openssl(pubkey_pem, signed, signature):
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for name, content in (("pub.pem", pubkey_pem), ("data", signed), ("sig", signature)):
            paths[name] = os.path.join(d, name)
            with open(paths[name], "wb") as f:
                f.write(content)
        r = subprocess.run(
            ["openssl", "dgst", "-sha256", "-verify", paths["pub.pem"], "-signature", paths["sig"], paths["data"]],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        return r.returncode == 0


# ---- state ----------------------------------------------------------------------

class State:
    def __init__(self, pubkey):
        self.lock = threading.Lock()
        self.pubkey = pubkey          # bytes (PEM) or None: no auth
        self.objects = {}             # (bucket, name) -> dict
        self.sessions = {}            # upload id -> dict
        self.faults = []
        self.tokens = set()
        self.generation = 1000
        self.stats = {"requests": 0, "faults_fired": 0, "token_grants": 0, "token_refusals": 0,
                      "metadata_grants": 0, "unauthorized": 0, "uploads_started": 0,
                      "uploads_finished": 0, "chunk_puts": 0, "status_queries": 0}

    def take_fault(self, method, path):
        """Consumes and returns the first fault that matches, or None."""
        with self.lock:
            for f in self.faults:
                if f.get("count", 1) <= 0:
                    continue
                if f.get("methods") and method not in f["methods"]:
                    continue
                if f.get("path") and f["path"] not in path:
                    continue
                if f["kind"] in ("bad_hash", "truncate") and not (method == "GET" and "alt=media" in path):
                    continue
                if f["kind"] == "partial" and not (method == "PUT" and "upload_id=" in path):
                    continue
                f["count"] = f.get("count", 1) - 1
                self.stats["faults_fired"] += 1
                return dict(f)
        return None


def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".000Z"


def resource(bucket, name, obj):
    return {
        "kind": "storage#object",
        "id": f"{bucket}/{name}/{obj['generation']}",
        "name": name,
        "bucket": bucket,
        "generation": str(obj["generation"]),
        "metageneration": "1",
        "contentType": obj["content_type"],
        "size": str(len(obj["data"])),
        "crc32c": crc_b64(obj["crc"]),
        "md5Hash": base64.b64encode(obj["md5"]).decode(),
        "etag": f"E{obj['generation']}",
        "timeCreated": rfc3339(obj["created"]),
        "updated": rfc3339(obj["created"]),
        "storageClass": "STANDARD",
    }


class Dropped(Exception):
    """The handler closed the connection on purpose."""


# ---- the handler -----------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-gcs/1"
    state = None  # set by main
    verbose = False

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("fake_gcs: " + (fmt % args) + "\n")

    # -- plumbing --

    def read_body(self, limit=None):
        """The request body (Content-Length or chunked); at most `limit` bytes
        of a Content-Length body when given."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(16)
        n = int(self.headers.get("Content-Length") or 0)
        if limit is not None:
            n = min(n, limit)
        return self.rfile.read(n) if n > 0 else b""

    def send(self, code, body=b"", headers=None, content_type=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            content_type = content_type or "application/json; charset=UTF-8"
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, message):
        self.send(code, {"error": {"code": code, "message": message, "errors": [{"message": message}]}})

    def drop(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raise Dropped()

    # -- dispatch --

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def dispatch(self):
        try:
            self._dispatch()
        except Dropped:
            pass
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _dispatch(self):
        st = self.state
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, urllib.parse.parse_qs(url.query)
        if path.startswith("/_control/"):
            return self.control(path)
        with st.lock:
            st.stats["requests"] += 1
        if path == "/token" and self.command == "POST":
            return self.token()
        if path == "/computeMetadata/v1/instance/service-accounts/default/token":
            return self.metadata_token()

        fault = st.take_fault(self.command, self.path)
        if fault and fault["kind"] == "slow":
            time.sleep(float(fault.get("delay", 1)))
        if fault and fault["kind"] == "status" and not fault.get("commit"):
            self.read_body()
            return self.error(int(fault.get("code", 503)), "injected failure")
        if fault and fault["kind"] == "drop":
            return self.drop_after_part(fault, path, query)

        if st.pubkey is not None:
            auth = self.headers.get("Authorization", "")
            with st.lock:
                ok = auth.startswith("Bearer ") and auth[7:] in st.tokens
                if not ok:
                    st.stats["unauthorized"] += 1
            if not ok:
                self.read_body()
                return self.error(401, "Anonymous caller does not have storage.objects access (fake_gcs)")

        if fault and fault["kind"] == "status":
            # commit: apply the request, then lose the answer.
            self.route(path, query, None, quiet=True)
            return self.error(int(fault.get("code", 503)), "injected failure after commit")
        return self.route(path, query, fault)

    def route(self, path, query, fault, quiet=False):
        parts = path.split("/")
        # /upload/storage/v1/b/B/o
        if len(parts) == 7 and parts[1] == "upload" and parts[2:4] == ["storage", "v1"] and parts[4] == "b" \
                and parts[6] == "o":
            bucket = urllib.parse.unquote(parts[5])
            if "upload_id" in query:
                return self.session_request(bucket, query["upload_id"][0], fault, quiet)
            if self.command == "POST":
                return self.start_upload(bucket, query, quiet)
        # /storage/v1/b/B/o/N (also /download/storage/v1/...)
        base = parts[1:]
        if base and base[0] == "download":
            base = base[1:]
        if len(base) == 5 and base[0:2] == ["storage", "v1"] and base[2] == "b" and base[4] == "o" \
                and self.command == "GET":
            return self.list_objects(urllib.parse.unquote(base[3]), query, quiet)
        if len(base) >= 6 and base[0:2] == ["storage", "v1"] and base[2] == "b" and base[4] == "o":
            bucket = urllib.parse.unquote(base[3])
            name = urllib.parse.unquote("/".join(base[5:]))
            if self.command == "GET":
                return self.get_object(bucket, name, query, fault, quiet)
            if self.command == "DELETE":
                return self.delete_object(bucket, name, quiet)
        self.read_body()
        if not quiet:
            self.error(404, f"fake_gcs: no route for {self.command} {path}")

    # -- uploads --

    def start_upload(self, bucket, query, quiet):
        st = self.state
        body = self.read_body()
        meta = {}
        if body:
            try:
                meta = json.loads(body)
            except ValueError:
                return self.error(400, "metadata is not JSON")
        name = query.get("name", [None])[0] or meta.get("name")
        if query.get("uploadType", [""])[0] != "resumable":
            return self.error(400, "fake_gcs speaks only uploadType=resumable")
        if not name:
            return self.error(400, "no object name")
        upload_id = secrets.token_hex(12)
        content_type = self.headers.get("X-Upload-Content-Type") or meta.get("contentType") or "application/octet-stream"
        with st.lock:
            st.sessions[upload_id] = {"bucket": bucket, "name": name, "data": bytearray(), "crc": 0,
                                      "content_type": content_type, "done": None}
            st.stats["uploads_started"] += 1
        host = self.headers.get("Host", "127.0.0.1:%d" % self.server.server_address[1])
        location = (f"http://{host}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
                    f"?uploadType=resumable&name={urllib.parse.quote(name, safe='')}&upload_id={upload_id}")
        if not quiet:
            self.send(200, b"", {"Location": location, "X-GUploader-UploadID": upload_id})

    def range_headers(self, sess):
        n = len(sess["data"])
        return {"Range": f"bytes=0-{n - 1}"} if n > 0 else {}

    def finalize(self, sess):
        """Makes the session's object visible; returns its resource."""
        st = self.state
        data = bytes(sess["data"])
        with st.lock:
            st.generation += 1
            obj = {"data": data, "crc": sess["crc"], "md5": hashlib.md5(data).digest(),
                   "content_type": sess["content_type"], "generation": st.generation, "created": time.time()}
            st.objects[(sess["bucket"], sess["name"])] = obj
            sess["done"] = resource(sess["bucket"], sess["name"], obj)
            st.stats["uploads_finished"] += 1
        return sess["done"]

    def session_request(self, bucket, upload_id, fault, quiet):
        st = self.state
        with st.lock:
            sess = st.sessions.get(upload_id)
        if self.command == "DELETE":
            self.read_body()
            with st.lock:
                st.sessions.pop(upload_id, None)
            return None if quiet else self.send(499, b"")
        if sess is None:
            self.read_body()
            return None if quiet else self.error(404, "no such upload session")
        if self.command != "PUT":
            self.read_body()
            return None if quiet else self.error(405, "method not allowed on a session")
        cr = self.headers.get("Content-Range", "")
        body = self.read_body()
        try:
            first, last, total = parse_content_range(cr)
        except ValueError as e:
            return None if quiet else self.error(400, f"bad Content-Range `{cr}`: {e}")
        with st.lock:
            if first is None and total is None:
                st.stats["status_queries"] += 1
            else:
                st.stats["chunk_puts"] += 1
        if sess["done"] is not None:
            return None if quiet else self.send(200, sess["done"])
        if first is not None:
            if last - first + 1 != len(body):
                return None if quiet else self.error(400, f"Content-Range says {last - first + 1} bytes, body has {len(body)}")
            committed = len(sess["data"])
            if first > committed:
                return None if quiet else self.error(400, f"chunk starts at {first}, only {committed} committed")
            new = body[committed - first:]
            if fault and fault["kind"] == "partial" and total is None:
                keep = (len(new) // 2) // QUANTUM * QUANTUM
                new = new[:keep]
                total = None
            with st.lock:
                sess["data"] += new
                sess["crc"] = crc32c(new, sess["crc"])
        if total is not None:
            n = len(sess["data"])
            if n > total:
                return None if quiet else self.error(400, f"total {total} is less than the {n} bytes received")
            if n == total:
                want = parse_goog_hash(self.headers.get_all("X-Goog-Hash") or [])
                if want is not None and want != sess["crc"]:
                    with st.lock:
                        st.sessions.pop(upload_id, None)
                    return None if quiet else self.error(400, "Provided CRC32C does not match the data")
                res = self.finalize(sess)
                return None if quiet else self.send(200, res)
        if not quiet:
            self.send(308, b"", self.range_headers(sess))

    def drop_after_part(self, fault, path, query):
        st = self.state
        n = int(self.headers.get("Content-Length") or 0)
        part = self.read_body(limit=int(n * float(fault.get("fraction", 0.5))))
        if fault.get("commit", True) and "upload_id" in query and self.command == "PUT":
            try:
                first, _, _ = parse_content_range(self.headers.get("Content-Range", ""))
            except ValueError:
                first = None
            with st.lock:
                sess = st.sessions.get(query["upload_id"][0])
                if sess is not None and first is not None and first <= len(sess["data"]) and sess["done"] is None:
                    new = part[len(sess["data"]) - first:]
                    keep = (first + len(part)) // QUANTUM * QUANTUM - len(sess["data"])
                    if keep > 0:
                        new = new[:keep]
                        sess["data"] += new
                        sess["crc"] = crc32c(new, sess["crc"])
        self.drop()

    # -- objects --

    def list_objects(self, bucket, query, quiet):
        """objects.list with prefix and delimiter: names become "prefixes" up
        to the delimiter after the prefix; two names a page (pageToken is
        the index of the next one), so that paging is exercised."""
        st = self.state
        self.read_body()
        prefix = query.get("prefix", [""])[0]
        delim = query.get("delimiter", [""])[0]
        with st.lock:
            names = sorted(n for (b, n) in st.objects if b == bucket and n.startswith(prefix))
        entries = []
        for n in names:
            rest = n[len(prefix):]
            if delim and delim in rest:
                p = prefix + rest[:rest.index(delim) + 1]
                if ("p", p) not in entries:
                    entries.append(("p", p))
            else:
                entries.append(("o", n))
        start = int(query.get("pageToken", ["0"])[0])
        page = entries[start:start + 2]
        body = {"prefixes": [v for k, v in page if k == "p"],
                "items": [{"name": v} for k, v in page if k == "o"]}
        if start + 2 < len(entries):
            body["nextPageToken"] = str(start + 2)
        if not quiet:
            self.send(200, body)

    def get_object(self, bucket, name, query, fault, quiet):
        st = self.state
        self.read_body()
        with st.lock:
            obj = st.objects.get((bucket, name))
        if quiet:
            return
        if obj is None:
            return self.error(404, f"No such object: {bucket}/{name}")
        if query.get("alt", [""])[0] != "media":
            return self.send(200, resource(bucket, name, obj))
        data = obj["data"]
        crc = obj["crc"] ^ 1 if fault and fault["kind"] == "bad_hash" else obj["crc"]
        headers = {
            "x-goog-hash": f"crc32c={crc_b64(crc)},md5={base64.b64encode(obj['md5']).decode()}",
            "x-goog-generation": str(obj["generation"]),
            "x-goog-metageneration": "1",
            "x-goog-stored-content-length": str(len(data)),
            "x-goog-stored-content-encoding": "identity",
            "ETag": f"E{obj['generation']}",
        }
        code = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else max(0, len(data) - int(b))
            end = int(b) if (a and b) else len(data) - 1
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data = data[start:end + 1]
            code = 206
        if fault and fault["kind"] == "truncate":
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", obj["content_type"])
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.drop()
        self.send(code, data, headers, obj["content_type"])

    def delete_object(self, bucket, name, quiet):
        st = self.state
        self.read_body()
        with st.lock:
            obj = st.objects.pop((bucket, name), None)
        if quiet:
            return
        if obj is None:
            return self.error(404, f"No such object: {bucket}/{name}")
        self.send(204, b"")

    # -- tokens --

    def grant(self, key):
        token = "fake-" + secrets.token_hex(16)
        with self.state.lock:
            self.state.tokens.add(token)
            self.state.stats[key] += 1
        self.send(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    def token(self):
        st = self.state
        form = urllib.parse.parse_qs(self.read_body().decode(errors="replace"))

        def refuse(desc):
            with st.lock:
                st.stats["token_refusals"] += 1
            self.send(400, {"error": "invalid_grant", "error_description": desc})

        if st.pubkey is None:
            return refuse("this fake_gcs was started without --pubkey")
        if form.get("grant_type", [""])[0] != GRANT:
            return refuse("unsupported grant_type")
        jwt = form.get("assertion", [""])[0]
        pieces = jwt.split(".")
        if len(pieces) != 3:
            return refuse("the assertion is not a JWT")
        try:
            header = json.loads(b64url_decode(pieces[0]))
            claims = json.loads(b64url_decode(pieces[1]))
            signature = b64url_decode(pieces[2])
        except ValueError:
            return refuse("the assertion does not decode")
        if header.get("alg") != "RS256":
            return refuse("alg is not RS256")
        if not verify_rs256(st.pubkey, (pieces[0] + "." + pieces[1]).encode(), signature):
            return refuse("Invalid JWT Signature.")
        now = time.time()
        host = self.headers.get("Host", "")
        if claims.get("aud") != f"http://{host}/token":
            return refuse(f"aud {claims.get('aud')!r} is not this token endpoint")
        if not claims.get("iss"):
            return refuse("no iss")
        if SCOPE not in str(claims.get("scope", "")).split():
            return refuse("scope lacks devstorage.read_write")
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int) or abs(iat - now) > 300 or exp <= now \
                or exp - iat > 3600:
            return refuse("iat/exp out of range")
        self.grant("token_grants")

    def metadata_token(self):
        self.read_body()
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.error(403, "Missing Metadata-Flavor: Google header")
        self.grant("metadata_grants")

    # -- control --

    def control(self, path):
        st = self.state
        body = self.read_body()
        args = json.loads(body) if body else {}
        if path == "/_control/fault" and self.command == "POST":
            with st.lock:
                st.faults.append(args)
            return self.send(200, {"ok": True})
        if path == "/_control/reset" and self.command == "POST":
            with st.lock:
                st.faults.clear()
                if args.get("objects"):
                    st.objects.clear()
                    st.sessions.clear()
            return self.send(200, {"ok": True})
        if path == "/_control/revoke" and self.command == "POST":
            with st.lock:
                st.tokens.clear()
            return self.send(200, {"ok": True})
        if path == "/_control/stats":
            with st.lock:
                stats = dict(st.stats)
                stats["objects"] = len(st.objects)
                stats["faults_pending"] = sum(max(0, f.get("count", 1)) for f in st.faults)
            return self.send(200, stats)
        self.error(404, "no such control")


def parse_content_range(value):
    """("bytes A-B/T" | "bytes */T" | "bytes A-B/*" | "bytes */*") -> (A|None, B|None, T|None)."""
    if not value.startswith("bytes "):
        raise ValueError("not `bytes ...`")
    span, _, total = value[6:].strip().partition("/")
    if not total:
        raise ValueError("no total")
    t = None if total == "*" else int(total)
    if span == "*":
        return None, None, t
    a, _, b = span.partition("-")
    first, last = int(a), int(b)
    if last < first:
        raise ValueError("last before first")
    return first, last, t


def parse_goog_hash(values):
    for v in values:
        for part in v.split(","):
            k, _, val = part.strip().partition("=")
            if k.lower() == "crc32c":
                return int.from_bytes(base64.b64decode(val), "big")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--pubkey", help="PEM public key; enables auth mode")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    pubkey = None
    if args.pubkey:
        with open(args.pubkey, "rb") as f:
            pubkey = f.read()
    Handler.state = State(pubkey)
    Handler.verbose = args.verbose
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
