#!/usr/bin/env bash
# Prints the image that scripts/run-local.sh gives its sandboxes
# (SANDBOX_ROOTFS) and explains the choice on stderr:
#   - SANDBOX_ROOTFS when it is set;
#   - else the prepared Debian base layer the build makes (//deploy:base,
#     cached in ~/.cache/sandbox-gateway): sandboxes see nothing of the host;
#   - the host's own / only with SANDBOX_LOCAL_ROOTFS=host-root-exposes-host-files,
#     which shows sandboxes every readable host file: /etc and its users, other
#     gateways' state directories and stored snapshots (only this gateway's
#     own paths are masked), the shim's mTLS client key.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OPT_IN="host-root-exposes-host-files"
if [[ -n "${SANDBOX_ROOTFS:-}" ]]; then
  echo "run-local: sandboxes see SANDBOX_ROOTFS=$SANDBOX_ROOTFS" >&2
  printf '%s\n' "$SANDBOX_ROOTFS"
  exit 0
fi
case "${SANDBOX_LOCAL_ROOTFS:-}" in
  "$OPT_IN")
    echo "run-local: WARNING: sandboxes see the host's own / read-only: every readable host file, other" \
         "gateways' state directories and stored snapshots, the shim's mTLS client key" >&2
    printf '/\n'
    exit 0
    ;;
  "") ;;
  *)
    echo "run-local: SANDBOX_LOCAL_ROOTFS must be unset or '$OPT_IN' (the host's / shown to sandboxes)" >&2
    exit 2
    ;;
esac
# debootstrap makes the base once (minutes); it is cached afterwards.
if ! command -v debootstrap >/dev/null 2>&1; then
  env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    debootstrap debian-archive-keyring gpgv >&2
fi
bazel build //deploy:base >&2
entry="$(cat bazel-out/k8-fastbuild/bin/deploy/base.txt)"
if [[ ! -d "$entry/rootfs" ]]; then
  echo "run-local: the base layer at $entry has no rootfs" >&2
  exit 1
fi
echo "run-local: sandboxes see the prepared Debian base $entry/rootfs (not the host's /;" \
     "SANDBOX_LOCAL_ROOTFS=$OPT_IN shows them the host's)" >&2
printf '%s\n' "$entry/rootfs"
