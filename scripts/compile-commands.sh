#!/usr/bin/env bash
# Writes compile_commands.json at the repository root, for clangd,
# clang-tidy and editors, from the compile actions Bazel would run.
#
#   scripts/compile-commands.sh [--no-build] [BAZEL_OPTION...]
#
# It first builds what compiling needs but does not compile anything (the
# generated protobuf-c sources and headers), so that tools find every header;
# --no-build skips that. BAZEL_OPTIONs (e.g. --config=asan) go to every
# Bazel command. Run it again after adding a file or a target.
#
# Each entry's `directory` is Bazel's execution root, where the relative paths
# of Bazel's command lines (-iquote bazel-out/..., external/...) resolve; its
# source folders are links to this tree. The source file itself is named by
# its path in this tree, so editors match their open files exactly. Two
# changes make GCC's command lines readable by clang tools: options clang
# does not know are dropped, and -Wno-unknown-warning-option is added.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
PYTHON=/usr/bin/python3

build=true
BAZEL_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --no-build) build=false ;;
    -h | --help) sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) BAZEL_ARGS+=("$arg") ;;
  esac
done

if $build; then
  # Bazel's output group of the inputs a compile needs (headers, generated
  # sources), without compiling.
  bazel build "${BAZEL_ARGS[@]}" --output_groups=compilation_prerequisites_INTERNAL_ //...
fi

EXECROOT=$(bazel info "${BAZEL_ARGS[@]}" execution_root)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bazel aquery "${BAZEL_ARGS[@]}" 'mnemonic("CppCompile", //...)' --output=jsonproto >"$tmp/aquery.json"

"$PYTHON" - "$tmp/aquery.json" "$EXECROOT" "$ROOT" "$tmp/compile_commands.json" <<'EOF'
import json
import os
import sys

aquery_path, execroot, root, out_path = sys.argv[1:]

# GCC options that clang rejects outright (an unknown -W option is only a
# warning, silenced below); the dependency-file options are of no use to tools.
DROP = {"-fno-canonical-system-headers", "-MD", "-MMD"}
DROP_WITH_VALUE = {"-MF", "-MT", "-MQ"}
DROP_PREFIX = ("-frandom-seed=",)

with open(aquery_path) as f:
    aquery = json.load(f)

entries = {}
for action in aquery.get("actions", []):
    args = action.get("arguments", [])
    if "-c" not in args:
        continue
    src = args[args.index("-c") + 1]
    # A source of this tree is named by its path here; generated sources
    # (bazel-out/...) and external ones stay relative to the execution root.
    if not src.startswith(("bazel-out/", "external/")) and os.path.isfile(os.path.join(root, src)):
        src_path = os.path.join(root, src)
    else:
        src_path = src
    cleaned = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in DROP or arg.startswith(DROP_PREFIX):
            continue
        if arg in DROP_WITH_VALUE:
            skip = True
            continue
        if i > 0 and args[i - 1] == "-c":
            arg = src_path
        cleaned.append(arg)
    cleaned.append("-Wno-unknown-warning-option")
    entry = {"directory": execroot, "file": src_path, "arguments": cleaned}
    if "-o" in args:
        entry["output"] = args[args.index("-o") + 1]
    # One entry per file: a file compiled by several targets keeps the first.
    entries.setdefault(src_path, entry)

with open(out_path, "w") as f:
    json.dump(sorted(entries.values(), key=lambda e: e["file"]), f, indent=2)
    f.write("\n")
print("compile-commands: %d files" % len(entries), file=sys.stderr)
EOF

mv "$tmp/compile_commands.json" "$ROOT/compile_commands.json"
echo "compile-commands: wrote $ROOT/compile_commands.json (directory: $EXECROOT)" >&2
