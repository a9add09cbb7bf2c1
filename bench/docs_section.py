#!/usr/bin/env python3
"""docs_section FILE NAME SECTION: puts the text of the file SECTION into
FILE in place of the lines from "<!-- bench/NAME: begin -->" to
"<!-- bench/NAME: end -->", or at the end of FILE (after a blank line) when
FILE has no such block yet. SECTION carries the markers itself. Used by
bench/snapshots, bench/shim and bench/ports --docs, so that each rewrites only its own
section of docs/benchmarks.md."""

import os
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    path, name, section_path = sys.argv[1:]
    with open(section_path, encoding="utf-8") as f:
        section = f.read().rstrip("\n") + "\n"
    begin, end = f"<!-- bench/{name}: begin -->", f"<!-- bench/{name}: end -->"
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    lines = text.splitlines(keepends=True)
    starts = [i for i, l in enumerate(lines) if l.strip() == begin]
    ends = [i for i, l in enumerate(lines) if l.strip() == end]
    if starts and ends and ends[0] > starts[0]:
        out = "".join(lines[:starts[0]]) + section + "".join(lines[ends[0] + 1:])
    else:
        body = text.rstrip("\n")
        out = (body + "\n\n" if body else "") + section
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(out)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
