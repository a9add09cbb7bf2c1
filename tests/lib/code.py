"""Code contexts through gRPC: RunCode's events gathered into one result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from tests.lib.client import SandboxClient, pb

CODE_TIMEOUT_S = 120


@dataclass
class Cell:
    events: list = field(default_factory=list)

    @property
    def stdout(self) -> str:
        return "".join(e.stdout for e in self.events if e.WhichOneof("event") == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(e.stderr for e in self.events if e.WhichOneof("event") == "stderr")

    @property
    def results(self) -> list:
        return [e.result for e in self.events if e.WhichOneof("event") == "result"]

    @property
    def main(self):
        mains = [r for r in self.results if r.is_main_result]
        return mains[0] if mains else None

    @property
    def error(self):
        errs = [e.error for e in self.events if e.WhichOneof("event") == "error"]
        return errs[0] if errs else None

    @property
    def end(self):
        last = self.events[-1] if self.events else None
        assert last is not None and last.WhichOneof("event") == "end", self.events
        return last.end

    def kinds(self) -> list[str]:
        return [e.WhichOneof("event") for e in self.events]


def run_call(client: SandboxClient, sid: str, code: str, context_id: str = "", language: str = "",
             timeout_seconds: int = 0, timeout: float = CODE_TIMEOUT_S):
    return client.stub.RunCode(pb.RunCodeRequest(sandbox_id=sid, context_id=context_id, language=language,
                                                 code=code, timeout_seconds=timeout_seconds),
                               metadata=client.md, timeout=timeout)


def run(client: SandboxClient, sid: str, code: str, **kw) -> Cell:
    return Cell(list(run_call(client, sid, code, **kw)))


def create(client: SandboxClient, sid: str, language: str = "", cwd: str = "",
           env: Optional[dict] = None, timeout: float = CODE_TIMEOUT_S):
    return client.stub.CreateContext(pb.CreateContextRequest(sandbox_id=sid, language=language, cwd=cwd,
                                                             env=env or {}),
                                     metadata=client.md, timeout=timeout)


def contexts(client: SandboxClient, sid: str):
    return client.stub.ListContexts(pb.ListContextsRequest(sandbox_id=sid), metadata=client.md, timeout=60)


def restart(client: SandboxClient, sid: str, cid: str):
    return client.stub.RestartContext(pb.RestartContextRequest(sandbox_id=sid, context_id=cid),
                                      metadata=client.md, timeout=CODE_TIMEOUT_S)


def delete(client: SandboxClient, sid: str, cid: str):
    return client.stub.DeleteContext(pb.DeleteContextRequest(sandbox_id=sid, context_id=cid),
                                     metadata=client.md, timeout=60)
