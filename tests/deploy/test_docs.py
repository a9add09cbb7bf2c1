"""docs/deploy.md's configuration reference never drifts from the programs.

Both programs print their environment variables with `--help`:

      NAME
          description (one or more lines)
          default: VALUE  [MIN..MAX]

docs/deploy.md has one table per program between markers
(`<!-- env:sandbox-gateway -->` ... `<!-- /env:sandbox-gateway -->`, the
same for sandbox-shim), one row per variable: | `NAME` | `DEFAULT` | ... |.
The test asserts that the tables list exactly the variables of `--help`
(none missing, none stale) with the same defaults, and that every variable
also appears elsewhere in the doc's text as written.

docs/runtime.md and docs/agents.md name only constants, settings and
files that exist (a rename without the doc fails).

Binaries: SANDBOX_GATEWAY_BIN and SANDBOX_SHIM_BIN, else the plain build
under bazel-out/k8-fastbuild/bin (as the integration tests).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAIN_BIN = ROOT / "bazel-out" / "k8-fastbuild" / "bin"
DOC = ROOT / "docs" / "deploy.md"
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"

PROGRAMS = {
    "sandbox-gateway": Path(os.environ.get("SANDBOX_GATEWAY_BIN") or PLAIN_BIN / "gateway" / "sandbox-gateway"),
    "sandbox-shim": Path(os.environ.get("SANDBOX_SHIM_BIN") or PLAIN_BIN / "shim" / "sandbox-shim"),
}

_NAME = re.compile(r"^  ([A-Z][A-Z0-9_]*)\s*$")
_DEFAULT = re.compile(r"^\s+default: (.*?)(?:\s{2,}\[[^\]]*\])?\s*$")


def parse_help(text: str) -> dict[str, str]:
    """NAME -> default, from a program's --help."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = _NAME.match(line)
        if m:
            name = m.group(1)
            continue
        m = _DEFAULT.match(line)
        if m and name is not None:
            out[name] = m.group(1).strip()
            name = None
    return out


def doc_table(doc: str, program: str) -> dict[str, str]:
    """NAME -> default, from the doc's table for `program`."""
    m = re.search(rf"<!-- env:{re.escape(program)} -->(.*?)<!-- /env:{re.escape(program)} -->", doc, re.S)
    assert m, f"docs/deploy.md has no <!-- env:{program} --> table"
    rows: dict[str, str] = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        assert name not in rows, f"{name} twice in the {program} table"
        default = cells[1]
        if default.startswith("`") and default.endswith("`"):
            default = default[1:-1]
        rows[name] = default.replace("\\|", "|")
    return rows


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request) -> tuple[str, dict[str, str]]:
    name = request.param
    binary = PROGRAMS[name]
    if not binary.is_file():
        pytest.fail(f"{binary} not found: build it with `bazel build //...`")
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    variables = parse_help(r.stdout)
    assert len(variables) >= 5, f"could not parse {name} --help:\n{r.stdout}"
    return name, variables


def test_parser_reads_a_known_variable():
    sample = "Environment variables:\n  PORT\n      port to listen on\n      default: 8080  [1..65535]\n"
    assert parse_help(sample) == {"PORT": "8080"}


def test_every_variable_is_documented(program, doc):
    name, variables = program
    table = doc_table(doc, name)
    missing = sorted(set(variables) - set(table))
    stale = sorted(set(table) - set(variables))
    assert not missing, f"docs/deploy.md's {name} table lacks {missing}"
    assert not stale, f"docs/deploy.md's {name} table lists {stale}, which `{name} --help` does not"


def test_defaults_match_help(program, doc):
    name, variables = program
    table = doc_table(doc, name)
    wrong = {v: (table[v], d) for v, d in variables.items() if v in table and table[v] != d}
    assert not wrong, f"{name} defaults differ (doc, --help): {wrong}"


def test_every_variable_appears_in_the_doc(program, doc):
    _, variables = program
    absent = [v for v in variables if v not in doc]
    assert not absent, absent


def test_entrypoint_variables_are_documented(doc):
    """The entrypoint's own variables (its header comment) are in the doc too."""
    header = ENTRYPOINT.read_text().split("\nset -euo", 1)[0]
    names = set(re.findall(r"^#\s+(SANDBOX_[A-Z_]+)\s", header, re.M))
    assert names, "no variables found in deploy/entrypoint.sh's header"
    absent = sorted(n for n in names if n not in doc)
    assert not absent, absent


# ---- docs/runtime.md and docs/agents.md name only what exists -------------------------------

NAMED_DOCS = [ROOT / "docs" / "runtime.md", ROOT / "docs" / "agents.md"]
SOURCE_DIRS = ["common", "gateway", "shim"]


def _sources_text() -> str:
    parts = []
    for d in SOURCE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.suffix in (".c", ".h") and p.is_file():
                parts.append(p.read_text(errors="replace"))
    return "\n".join(parts)


@pytest.mark.parametrize("path", NAMED_DOCS, ids=[p.name for p in NAMED_DOCS])
def test_named_constants_and_files_exist(path):
    """Every `UPPER_CASE` name the doc quotes (a setting or a constant) is
    in the sources, and every repository path it quotes exists: renaming
    or removing one without the doc fails here."""
    text = path.read_text()
    sources = _sources_text()
    names = set(re.findall(r"`([A-Z][A-Z0-9]*_[A-Z0-9_]+)`", text))
    assert names, f"{path.name} quotes no constant"
    absent = sorted(n for n in names if n not in sources)
    assert not absent, f"{path.name} names {absent}, which no file of {SOURCE_DIRS} has"
    files = set(re.findall(r"`((?:gateway|common|shim|tests|bench)/[A-Za-z0-9_./-]+)`", text))
    missing = sorted(f for f in files if not (ROOT / f).exists())
    assert not missing, f"{path.name} names {missing}, which do not exist"
