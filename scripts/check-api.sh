#!/usr/bin/env bash
# Checks the gRPC API in proto/ with buf (pinned in tools/buf, installed from
# npm on first use):
#
#   scripts/check-api.sh                          lint proto/, then check it
#                                                 against the released API
#   scripts/check-api.sh --update-baseline REF    record the API of git REF
#                                                 as the released API
#
# Lint rules and their exceptions are in proto/buf.yaml. The breaking check
# (FILE rules: wire and generated-source compatibility) compares proto/ with
# proto/released/sandbox-v1.json, a buf image committed to the repository, so
# it needs no git history (CI clones may be shallow). When an API version is
# released, run --update-baseline with its tag or commit and commit the new
# image; proto/released/README.md then names the commit it was taken from.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUF_DIR=tools/buf
BUF=$BUF_DIR/node_modules/.bin/buf
BASELINE=proto/released/sandbox-v1.json
PYTHON=/usr/bin/python3

usage() {
  sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# buf from tools/buf/node_modules, installed with `npm ci` (exact versions from
# package-lock.json) when missing or not the pinned version.
ensure_buf() {
  local want have=""
  want=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["dependencies"]["@bufbuild/buf"])' \
    "$BUF_DIR/package.json")
  if [[ -x "$BUF" ]]; then
    have=$("$BUF" --version 2>/dev/null || true)
  fi
  if [[ "$have" == "$want" ]]; then
    return
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "check-api: npm is needed to install buf $want (scripts/install-deps.sh installs it)" >&2
    exit 2
  fi
  echo "check-api: installing buf $want (npm ci in $BUF_DIR)" >&2
  # --ignore-scripts: npm ci itself installs the platform package that holds
  # the binary; buf's postinstall would only check it again (the version is
  # checked below).
  (cd "$BUF_DIR" && npm ci --ignore-scripts --no-audit --no-fund >&2)
  have=$("$BUF" --version)
  if [[ "$have" != "$want" ]]; then
    echo "check-api: $BUF is version $have, expected $want" >&2
    exit 2
  fi
}

update_baseline() {
  local ref=$1 commit
  if ! commit=$(git rev-parse --verify --quiet "$ref^{commit}"); then
    echo "check-api: no commit named \`$ref\`" >&2
    exit 2
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # git archive rather than buf's git input: it works in worktrees and needs
  # only the one commit.
  git archive --format=tar "$commit" proto | tar -x -C "$tmp"
  "$BUF" build "$tmp/proto" --exclude-source-info -o "$tmp/image.json"
  mkdir -p "$(dirname "$BASELINE")"
  # buf's JSON spacing is not stable from one buf build to the next: re-indent
  # it so the file diffs well in review.
  "$PYTHON" -c '
import json, sys
with open(sys.argv[1]) as f:
    image = json.load(f)
with open(sys.argv[2], "w") as f:
    json.dump(image, f, indent=2)
    f.write("\n")
' "$tmp/image.json" "$BASELINE"
  write_baseline_readme "$commit" "$(git log -1 --format=%cs "$commit")" "$ref"
  echo "check-api: $BASELINE now holds the API of $ref ($commit); review and commit it" >&2
}

write_baseline_readme() {
  local commit=$1 date=$2 ref=$3 named=""
  [[ "$ref" == "$commit" ]] || named=", \`$ref\`"
  cat >"$(dirname "$BASELINE")/README.md" <<EOF
# The released API

\`sandbox-v1.json\` is a buf image (the API's descriptors, in JSON) of
\`proto/\` as released. \`scripts/check-api.sh\` runs \`buf breaking\`
against it, so the current API must stay wire- and source-compatible with it.

Taken from commit \`$commit\` ($date$named).

Regenerate it when an API version is released, from that release's tag or
commit, and commit the result:

\`\`\`sh
scripts/check-api.sh --update-baseline <git-ref>
\`\`\`

Written by \`scripts/check-api.sh --update-baseline\`; do not edit by hand.
EOF
}

case "${1:-}" in
  "")
    [[ $# -eq 0 ]] || { usage >&2; exit 2; }
    ;;
  --update-baseline)
    [[ $# -eq 2 ]] || { usage >&2; exit 2; }
    ensure_buf
    update_baseline "$2"
    exit 0
    ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

ensure_buf
if [[ ! -f "$BASELINE" ]]; then
  echo "check-api: no released API at $BASELINE (scripts/check-api.sh --update-baseline <git-ref>)" >&2
  exit 2
fi

status=0
echo "check-api: buf lint proto" >&2
"$BUF" lint proto || status=1
echo "check-api: buf breaking proto --against $BASELINE" >&2
"$BUF" breaking proto --against "$BASELINE" || status=1
if [[ $status -ne 0 ]]; then
  echo "check-api: FAILED (rules and exceptions: proto/buf.yaml; released API: $BASELINE)" >&2
  exit 1
fi
echo "check-api: lint and breaking checks passed" >&2
