"""The README's REST examples, run: a doc that drifts from the shim fails.

The ```sh blocks of the README's REST section that set `SHIM=` themselves
(self-contained: they launch what they use), and any ```sh block of docs/
preceded by `<!-- runnable -->`, are split into commands (continuation
lines joined, comments and the SECRET=/SHIM= lines dropped) and each is run
with bash against a gateway and shim started here, SECRET and SHIM in its
environment. Every curl's answer is checked against what the README's
tables document for its method and path: the status code, and for the
contract's JSON answers the keys they name. NDJSON answers must be JSON
lines ending with an exit line. A command that follows a stream
(`follow=true`) runs in the background until a later command ends what it
follows, as a reader of the README would run it.

A comment line `# => [STATUS] [{JSON}]` right after a command is the
command's documented answer (docs/agents.md writes them): its status
replaces the table's, and every key of its JSON must be in the answer's
JSON with that value. Every ```sh block of docs/agents.md must be
runnable: the guide has no command that no test runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from tests.lib.gateway import running_gateway
from tests.lib.shim import running_shim

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
REST_HEADING = "## The REST API (sandbox-shim)"
# A guide all of whose commands run (every ```sh block marked runnable).
ALL_RUNNABLE = [ROOT / "docs" / "agents.md"]
ANSWER = re.compile(r"^#\s*=>\s*(?:(\d{3})\b)?\s*(\{.*\})?\s*$")
# Files the examples read, made in their working directory.
FIXTURES = {"input.txt": b"hello from input.txt\n"}
CURL_STATUS = "@@status="
COMMAND_TIMEOUT_S = 60


# ---- reading the docs --------------------------------------------------------------------

def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def sh_blocks(text: str, runnable_only: bool = False) -> list[str]:
    marker = r"<!--\s*runnable\s*-->\s*\n" if runnable_only else ""
    return re.findall(marker + r"^```sh\n(.*?)^```", text, flags=re.S | re.M)


def self_contained(block: str) -> bool:
    return re.search(r"^SHIM=", block, flags=re.M) is not None


class Answer:
    """A command's documented answer (`# => STATUS {JSON}`)."""

    def __init__(self, status: Optional[int], fields: dict):
        self.status, self.fields = status, fields


def commands_with_answers(block: str) -> list[tuple[str, Optional[Answer]]]:
    out: list[tuple[str, Optional[Answer]]] = []
    cur = ""
    for line in block.splitlines():
        cur += line.rstrip("\\") + (" " if line.endswith("\\") else "")
        if line.endswith("\\"):
            continue
        cmd, cur = cur.strip(), ""
        m = ANSWER.match(cmd)
        if m:
            assert out and out[-1][1] is None, f"`{cmd}` follows no command, or a command's second answer"
            assert m.group(1) or m.group(2), f"`{cmd}` says nothing"
            out[-1] = (out[-1][0], Answer(int(m.group(1)) if m.group(1) else None,
                                          json.loads(m.group(2)) if m.group(2) else {}))
        elif cmd and not cmd.startswith("#") and not re.match(r"^(SECRET|SHIM)=", cmd):
            out.append((cmd, None))
    return out


def commands(block: str) -> list[str]:
    return [cmd for cmd, _ in commands_with_answers(block)]


class Documented:
    """What the README's tables say a method and path answer."""

    def __init__(self, method: str, template: str, status: int, keys: list[str]):
        self.method, self.status, self.keys = method, status, keys
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template.split("?")[0]))
        self.path = re.compile(pattern + "$")

    def __repr__(self) -> str:
        return f"<{self.method} {self.path.pattern}: {self.status} {self.keys}>"


def documented_answers(rest: str) -> list[Documented]:
    rows = []
    for line in rest.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        m = re.match(r"^`([A-Z]+) (/[^`\s]*)`$", cells[0]) if cells else None
        if m is None:
            continue
        answer = cells[-1]
        code = re.search(r"`(\d{3})\b", answer)
        keys: list[str] = []
        if len(cells) == 3:  # the contract's table: "request | success"
            obj = re.search(r"`\d{3} (\{[^`]*\})`", answer)
            keys = re.findall(r'"([a-z_0-9]+)"', obj.group(1)) if obj else []
        rows.append(Documented(m.group(1), m.group(2), int(code.group(1)) if code else 200, keys))
    return rows


def request_of(cmd: str) -> tuple[str, str]:
    m = re.search(r"-X\s+([A-Z]+)", cmd)
    method = m.group(1) if m else ("POST" if re.search(r"\s(-d|--data-binary|--data)\s", cmd) else "GET")
    url = re.search(r"\$SHIM(/[^\s\"']*)", cmd)
    assert url, f"no $SHIM URL in `{cmd}`"
    return method, url.group(1).split("?")[0]


def expectation(rows: list[Documented], cmd: str) -> Documented:
    method, path = request_of(cmd)
    for row in rows:
        if row.method == method and row.path.match(path):
            return row
    raise AssertionError(f"`{cmd}`: {method} {path} is in no table of the README")


# ---- running them ----------------------------------------------------------------------------

def wrapped(cmd: str) -> str:
    """The command with curl reporting each answer's status after its body."""
    return (f"curl() {{ command curl -sS --max-time {COMMAND_TIMEOUT_S} "
            f"-w '\\n{CURL_STATUS}%{{http_code}}\\n' \"$@\"; }}\n{cmd}\n")


def split_answer(out: str) -> tuple[str, Optional[int]]:
    i = out.rfind("\n" + CURL_STATUS)
    if i < 0:
        return out, None
    return out[:i], int(out[i + 1 + len(CURL_STATUS):].strip() or 0)


def check(cmd: str, row: Documented, out: str, answer: Optional[Answer] = None) -> None:
    body, status = split_answer(out)
    want = answer.status if answer is not None and answer.status is not None else row.status
    assert status == want, f"`{cmd}`: status {status}, the docs say {want}\n{out[-2000:]}"
    if answer is not None and answer.fields:
        got = json.loads(body)
        wrong = {k: got.get(k, "(absent)") for k, v in answer.fields.items() if got.get(k) != v}
        assert not wrong, f"`{cmd}`: {wrong} where the docs say {answer.fields}\n{body[-2000:]}"
    if want != row.status:
        return  # an error the docs show: its JSON is {"detail"}, not the success's keys
    if "application/x-ndjson" in cmd or "follow=true" in cmd:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        assert lines and {"exit_code"} <= set(lines[-1]), f"`{cmd}`: no exit line\n{body[-2000:]}"
        return
    if row.keys and "-o " not in cmd:
        answer = json.loads(body)
        missing = set(row.keys) - set(answer)
        assert not missing, f"`{cmd}`: answer lacks {sorted(missing)} the README names\n{body[-2000:]}"


def blocks_to_run() -> list[tuple[str, str]]:
    text = README.read_text()
    found = [("README.md", b) for b in sh_blocks(section(text, REST_HEADING)) if self_contained(b)]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        found += [(doc.name, b) for b in sh_blocks(doc.read_text(), runnable_only=True)]
    return found


def test_every_block_of_the_agent_guide_runs():
    for doc in ALL_RUNNABLE:
        text = doc.read_text()
        blocks, runnable = sh_blocks(text), sh_blocks(text, runnable_only=True)
        assert runnable, f"{doc.name} has no runnable ```sh block"
        assert len(blocks) == len(runnable), f"{doc.name}: a ```sh block is not marked <!-- runnable -->"
        for block in runnable:
            assert self_contained(block), f"{doc.name}: a block does not set SHIM= itself"


def test_the_rest_section_has_examples_to_run():
    blocks = blocks_to_run()
    assert blocks, "no self-contained ```sh block in the README's REST section"
    rows = documented_answers(section(README.read_text(), REST_HEADING))
    for _, block in blocks:
        for cmd in commands(block):
            if cmd.startswith("curl"):
                expectation(rows, cmd)  # every example's route is documented


BLOCKS = blocks_to_run()


@pytest.mark.parametrize("where,block", BLOCKS, ids=[f"{where}-{i}" for i, (where, _) in enumerate(BLOCKS)])
def test_examples_answer_as_documented(gateway_secret, where, block):
    rows = documented_answers(section(README.read_text(), REST_HEADING))
    with running_gateway(secret=gateway_secret, check=True) as gw, running_shim(gw, check=True) as shim, \
            tempfile.TemporaryDirectory() as cwd:
        for name, data in FIXTURES.items():
            Path(cwd, name).write_bytes(data)
        env = {"PATH": "/usr/bin:/bin", "SECRET": gateway_secret, "SHIM": f"http://127.0.0.1:{shim.port}"}
        background: list[tuple[str, subprocess.Popen]] = []
        try:
            for cmd, answer in commands_with_answers(block):
                row = expectation(rows, cmd) if cmd.startswith("curl") else None
                if "follow=true" in cmd:
                    background.append((cmd, subprocess.Popen(["bash", "-c", wrapped(cmd)], cwd=cwd, env=env,
                                                             stdout=subprocess.PIPE, text=True)))
                    continue
                run = subprocess.run(["bash", "-c", wrapped(cmd)], cwd=cwd, env=env, capture_output=True, text=True,
                                     timeout=COMMAND_TIMEOUT_S + 10)
                assert run.returncode == 0, f"{where}: `{cmd}` failed\n{run.stdout[-1000:]}{run.stderr[-1000:]}"
                if row is not None:
                    check(cmd, row, run.stdout, answer)
            for cmd, proc in background:
                out, _ = proc.communicate(timeout=COMMAND_TIMEOUT_S)
                assert proc.returncode == 0, f"{where}: `{cmd}` did not end with what the block ran after it"
                check(cmd, expectation(rows, cmd), out)
        finally:
            for _, proc in background:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
