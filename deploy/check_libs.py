#!/usr/bin/env python3
"""Checks that every shared library the image's programs need is in the image.

    check_libs.py ROOTFS STAGE REPORT BINARY...

ROOTFS is the unpacked base layer, STAGE the app layer being assembled (its
files land at the same paths in the image), BINARY the programs as staged
(STAGE/usr/local/bin/...). For every binary the ELF interpreter and the
NEEDED entries are resolved, transitively, the way the dynamic loader does
in the image: the binary's RUNPATH, then the default directories, inside
ROOTFS or STAGE (absolute symlinks are followed inside them).

A library found in neither is copied from the build machine (where the
program was linked: `ldd` there names it) into STAGE at the same path, so
the app layer carries exactly the libraries the base lacks; the build prints
a warning naming it, because the right fix is adding its Debian package to
deploy/base/packages.txt. A library found nowhere fails the check.

REPORT receives one line per library: `<soname> <path in the image> <layer>`
(layer: base or app), grouped by binary. Exit status 0 when everything
resolves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

DEFAULT_DIRS = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
]



def in_base_layout(base, path):
    """`path` as the base lays it out: a directory the base has as a symlink
    (Debian's /lib -> usr/lib) is followed, so that the app layer adds a
    file there instead of a real directory that would hide the link."""
    parts = path.strip("/").split("/")
    out = ""
    for i, part in enumerate(parts[:-1]):
        cand = out + "/" + part
        link = os.path.join(base, cand.lstrip("/"))
        if os.path.islink(link):
            target = os.readlink(link)
            cand = os.path.normpath(target if target.startswith("/") else os.path.join(out or "/", target))
        out = cand
    return out + "/" + parts[-1]

def readelf(args: list[str], path: str) -> str:
    return subprocess.run(["readelf", "-W", *args, path], check=True, capture_output=True, text=True).stdout


def dynamic_info(path: str) -> tuple[list[str], list[str], str | None]:
    """(NEEDED sonames, RUNPATH/RPATH dirs, interpreter) of an ELF file."""
    needed, runpath = [], []
    for line in readelf(["-d"], path).splitlines():
        if "(NEEDED)" in line:
            needed.append(line.split("[", 1)[1].rstrip("]"))
        elif "(RUNPATH)" in line or "(RPATH)" in line:
            runpath.extend(line.split("[", 1)[1].rstrip("]").split(":"))
    interp = None
    for line in readelf(["-l"], path).splitlines():
        if "[Requesting program interpreter:" in line:
            interp = line.split(":", 1)[1].strip().rstrip("]").strip()
    return needed, runpath, interp


def resolve_in(root: str, path: str) -> str | None:
    """The real file that `path` (absolute, as seen in the image) names in
    `root`, following symlinks inside root, or None."""
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        if os.path.islink(candidate):
            hops += 1
            if hops > 40:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        if not os.path.lexists(candidate):
            return None
        resolved.append(part)
    full = os.path.join(root, *resolved)
    return full if os.path.isfile(full) else None


def host_libraries(binary: str) -> dict[str, str]:
    """soname -> path on the build machine, from its ldd."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "=>" and fields[2].startswith("/"):
            libs[fields[0]] = fields[2]
    return libs


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    rootfs, stage, report_path, binaries = argv[0], argv[1], argv[2], argv[3:]
    failures: list[str] = []
    report: list[str] = []
    copied: list[str] = []

    def find(image_path: str) -> tuple[str, str] | None:
        for layer, root in (("app", stage), ("base", rootfs)):
            real = resolve_in(root, image_path)
            if real is not None:
                return layer, real
        return None

    for binary in binaries:
        name = "/" + os.path.relpath(binary, stage)
        report.append(f"# {name}")
        host = host_libraries(binary)
        seen: set[str] = set()
        queue = [binary]
        while queue:
            elf = queue.pop(0)
            needed, runpath, interp = dynamic_info(elf)
            origin = "/" + os.path.relpath(os.path.dirname(elf), stage if elf.startswith(stage) else rootfs)
            dirs = [d.replace("$ORIGIN", origin) for d in runpath] + DEFAULT_DIRS
            if interp is not None and interp not in seen:
                seen.add(interp)
                hit = find(interp)
                if hit is None:
                    failures.append(f"{name}: interpreter {interp} is not in the image")
                else:
                    report.append(f"{os.path.basename(interp)} {interp} {hit[0]}")
            for soname in needed:
                if soname in seen:
                    continue
                seen.add(soname)
                hit, image_path = None, None
                for d in dirs:
                    hit = find(os.path.join(d, soname))
                    if hit is not None:
                        image_path = os.path.join(d, soname)
                        break
                if hit is None and soname in host:
                    # Not in the base: bring the build machine's copy along.
                    image_path = in_base_layout(base, host[soname])
                    dest = os.path.join(stage, image_path.lstrip("/"))
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    shutil.copy2(os.path.realpath(image_path), dest)
                    copied.append(f"{soname} ({image_path})")
                    hit = ("app", dest)
                if hit is None:
                    failures.append(f"{name}: {soname} is neither in the image nor on the build machine")
                    continue
                report.append(f"{soname} {image_path} {hit[0]}")
                queue.append(hit[1])

    with open(report_path, "w") as f:
        f.write("# Shared libraries of the image's programs: soname, path, layer.\n")
        f.write("\n".join(report) + "\n")
    for c in copied:
        print(f"check_libs: warning: {c} is not in the base layer; copied into the app layer "
              "(add its Debian package to deploy/base/packages.txt)", file=sys.stderr)
    for f_ in failures:
        print(f"check_libs: error: {f_}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
