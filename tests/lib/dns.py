"""A small authoritative DNS server for tests (python3-dnslib): SRV, A and
AAAA answers from a table the test changes while it runs, on port 53 of a
loopback address of its own (resolv.conf has no port: programs reach it
when started in a private mount namespace whose /etc/resolv.conf names
it — see `resolv_wrapper`)."""

from __future__ import annotations

import os
import random
import stat
import tempfile
import threading
from pathlib import Path

from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSLabel
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class _Table(BaseResolver):
    def __init__(self):
        self.lock = threading.Lock()
        self.srv: dict[str, list[tuple[str, int]]] = {}
        self.a: dict[str, str] = {}

    def resolve(self, request, handler):
        reply = request.reply()
        q = request.q
        name = str(q.qname).rstrip(".").lower()
        with self.lock:
            if q.qtype == QTYPE.SRV and name in self.srv:
                for target, port in self.srv[name]:
                    reply.add_answer(RR(q.qname, QTYPE.SRV, ttl=1,
                                        rdata=SRV(priority=0, weight=1, port=port, target=DNSLabel(target + "."))))
            elif q.qtype == QTYPE.A and name in self.a:
                reply.add_answer(RR(q.qname, QTYPE.A, ttl=1, rdata=A(self.a[name])))
            elif q.qtype == QTYPE.AAAA and name in self.a:
                pass  # the name exists, without an IPv6 address
            elif name not in self.srv and name not in self.a:
                reply.header.rcode = RCODE.NXDOMAIN
        return reply


class DnsServer:
    """`set_srv(name, [(target, port)...])`, `set_a(name, address)`; serves
    on `address`:53 over UDP and TCP until `stop()`."""

    def __init__(self):
        self.table = _Table()
        self.address = f"127.{random.randint(60, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"
        quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
        self.servers = [DNSServer(self.table, address=self.address, port=53, tcp=tcp, logger=quiet)
                        for tcp in (False, True)]
        for s in self.servers:
            s.start_thread()
        self.dir = Path(tempfile.mkdtemp(prefix="sgw-dns-"))
        self.resolv_conf = self.dir / "resolv.conf"
        self.resolv_conf.write_text(f"nameserver {self.address}\noptions timeout:1 attempts:2\n")

    def set_srv(self, name: str, records: list[tuple[str, int]]) -> None:
        with self.table.lock:
            self.table.srv[name.rstrip(".").lower()] = list(records)

    def set_a(self, name: str, address: str) -> None:
        with self.table.lock:
            self.table.a[name.rstrip(".").lower()] = address

    def resolv_wrapper(self, binary: Path) -> Path:
        """An executable that runs `binary` in a private mount namespace
        where /etc/resolv.conf names this server (the host's is untouched)."""
        path = self.dir / f"{binary.name}-with-dns"
        path.write_text("#!/bin/sh\n"
                        "exec unshare --mount --propagation private sh -c "
                        f"'mount --bind {self.resolv_conf} /etc/resolv.conf && exec {binary}'\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        for p in self.dir.iterdir():
            os.unlink(p)
        os.rmdir(self.dir)
