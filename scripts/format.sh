#!/usr/bin/env bash
# Formats the C sources with clang-format and the root .clang-format.
#
#   scripts/format.sh           rewrite every file in place
#   scripts/format.sh --check   change nothing; list the files whose layout
#                               differs from clang-format's and exit 1
#
# The files are every .c and .h that git knows of (tracked, plus new files
# not yet added and not ignored), outside bazel/; new folders are covered
# without editing this script. Generated code lives in bazel-out/ and is not
# seen. CLANG_FORMAT names another binary; the layout is the one of
# clang-format 14 (Debian 12), and other versions lay some lines out
# differently.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '2,7s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "format: $CLANG_FORMAT not found (Debian package clang-format; scripts/install-deps.sh installs it)" >&2
  exit 2
fi
version=$("$CLANG_FORMAT" --version)
if [[ ! "$version" =~ version\ 14\. ]]; then
  echo "format: warning: this tree is laid out by clang-format 14, not: $version" >&2
fi

files=()
while IFS= read -r -d '' f; do
  # Tracked files deleted in the work tree are listed too: skip them.
  [[ -f "$f" ]] && files+=("$f")
done < <(git ls-files -z --cached --others --exclude-standard -- '*.c' '*.h' ':!:bazel/' | sort -zu)

if [[ ${#files[@]} -eq 0 ]]; then
  echo "format: no .c or .h files found" >&2
  exit 2
fi

if ! $check; then
  "$CLANG_FORMAT" -i --style=file -- "${files[@]}"
  echo "format: formatted ${#files[@]} files"
  exit 0
fi

drift=()
for f in "${files[@]}"; do
  if ! out=$("$CLANG_FORMAT" --dry-run -Werror --style=file -- "$f" 2>&1); then
    if [[ "$out" != *clang-format-violations* ]]; then
      printf 'format: %s failed on %s:\n%s\n' "$CLANG_FORMAT" "$f" "$out" >&2
      exit 2
    fi
    drift+=("$f")
  fi
done

if [[ ${#drift[@]} -gt 0 ]]; then
  echo "format: ${#drift[@]} of ${#files[@]} files differ from clang-format's layout (run scripts/format.sh):" >&2
  printf '  %s\n' "${drift[@]}" >&2
  exit 1
fi
echo "format: all ${#files[@]} files match clang-format's layout"
