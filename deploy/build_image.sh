#!/usr/bin/env bash
# Assembles the OCI image: the cached base layer (deploy/base/build_base.sh)
# plus one app layer, then the image config. Run by //deploy:image (see
# deploy/image.bzl); usable by hand with the same arguments.
#
#   build_image.sh --out DIR --base BASE_TXT --base-script SCRIPT
#                  --entrypoint FILE --check-libs FILE [--status FILE]
#                  [--tag TAG] [--source-url URL] [--version V]
#                  GATEWAY HELPER UNPACK SHIM
#
# The app layer (all of it under /usr/local):
#   /usr/local/bin/sandbox-gateway, sandbox-helper, sandbox-unpack,
#                  sandbox-shim, sandbox-entrypoint
#   /usr/local/share/sandbox-gateway/shared-libraries.txt  what they load,
#                  and from which layer
#   + any shared library the base lacks, at its usual path (check_libs.py;
#     none with the shipped package list)
# File times are the commit's time, so unchanged programs give the same layer.
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
log() { printf 'build_image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

out="" base_txt="" base_script="" entrypoint="" check_libs="" status_file="" tag=latest
source_url="" version=""
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --out) out=$2 ;;
    --base) base_txt=$2 ;;
    --base-script) base_script=$2 ;;
    --entrypoint) entrypoint=$2 ;;
    --check-libs) check_libs=$2 ;;
    --status) status_file=$2 ;;
    --tag) tag=$2 ;;
    --source-url) source_url=$2 ;;
    --version) version=$2 ;;
    *) die "unknown option $1" ;;
  esac
  shift 2
done
[[ $# -eq 4 ]] || die "want 4 programs (gateway helper unpack shim), got $#"
[[ -n $out && -n $base_script && -n $entrypoint && -n $check_libs ]] || die "missing options"
gateway=$1 helper=$2 unpack=$3 shim=$4
command -v umoci >/dev/null || die "umoci not found (scripts/install-deps.sh installs it)"
start=$(date +%s)

# The base: named by the base_layer action; re-made if the cache entry went
# away since (build_base.sh returns at once when it is there).
base=""
[[ -n $base_txt ]] && base=$(cat "$base_txt")
if [[ -z $base || ! -f $base/ok ]]; then
  base=$("$base_script" | tail -n 1)
fi
[[ -f $base/ok && -d $base/oci && -d $base/rootfs ]] || die "no base layer at '$base'"
log "base layer $base"

# ---- provenance --------------------------------------------------------------
# From Bazel's stable status (deploy/workspace_status.sh, when .bazelrc names
# it: then a new commit re-runs this action) or else from git directly.
status_value() {
  [[ -n $status_file && -f $status_file ]] || return 0
  awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print; exit }' "$status_file"
}
src_dir=$(dirname "$(dirname "$(readlink -f "$entrypoint")")")
git_() { git -C "$src_dir" "$@" 2>/dev/null; }
revision=$(status_value STABLE_GIT_COMMIT)
[[ -n $revision ]] || revision=$(git_ rev-parse HEAD || echo unknown)
commit_time=$(status_value STABLE_GIT_COMMIT_TIME)
[[ -n $commit_time ]] || commit_time=$(git_ log -1 --format=%ct || echo 0)
if [[ -z $version ]]; then
  version=$(status_value STABLE_IMAGE_VERSION)
  [[ -n $version ]] || version=$(git_ describe --tags --always --dirty || echo 0.0.0-unknown)
fi
if [[ -z $source_url ]]; then
  source_url=$(status_value STABLE_GIT_REMOTE)
  [[ -n $source_url ]] || source_url=$(git_ config --get remote.origin.url || true)
  [[ -n $source_url ]] || source_url=unknown
fi
created=$(date -u -d "@$commit_time" +%Y-%m-%dT%H:%M:%SZ)
log "version $version, revision $revision, source $source_url, created $created"

# ---- the layout: a copy of the base's ---------------------------------------
rm -rf "${out:?}"
mkdir -p "$out"
# Blobs are content-addressed and never modified: hard links when the cache
# and the output share a file system (instant), a copy otherwise. index.json
# and oci-layout are rewritten by umoci, so they are copied.
mkdir -p "$out/blobs"
cp -al "$base/oci/blobs/." "$out/blobs/" 2>/dev/null || cp -a --reflink=auto "$base/oci/blobs/." "$out/blobs/"
cp "$base/oci/index.json" "$base/oci/oci-layout" "$out/"

# ---- the app layer -----------------------------------------------------------
stage=$(mktemp -d "${TMPDIR:-/tmp}/sandbox-image-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"
install -d -m 0755 "$stage/usr" "$stage/usr/local" "$stage/usr/local/bin" \
  "$stage/usr/local/share" "$stage/usr/local/share/sandbox-gateway"
install -m 0755 "$gateway" "$stage/usr/local/bin/sandbox-gateway"
install -m 0755 "$helper" "$stage/usr/local/bin/sandbox-helper"
install -m 0755 "$unpack" "$stage/usr/local/bin/sandbox-unpack"
install -m 0755 "$shim" "$stage/usr/local/bin/sandbox-shim"
install -m 0755 "$entrypoint" "$stage/usr/local/bin/sandbox-entrypoint"

/usr/bin/python3 "$check_libs" "$base/rootfs" "$stage" \
  "$stage/usr/local/share/sandbox-gateway/shared-libraries.txt" \
  "$stage/usr/local/bin/sandbox-gateway" "$stage/usr/local/bin/sandbox-helper" \
  "$stage/usr/local/bin/sandbox-unpack" "$stage/usr/local/bin/sandbox-shim" ||
  die "shared libraries missing from the image (see above)"
if grep -q ' app$' "$stage/usr/local/share/sandbox-gateway/shared-libraries.txt"; then
  log "the app layer carries shared libraries the base lacks:"
  grep ' app$' "$stage/usr/local/share/sandbox-gateway/shared-libraries.txt" >&2
fi

# The layer: a deterministic tar of the stage (sorted, the commit's time,
# root-owned), added verbatim. (`umoci insert` 0.4.7 writes the tar without
# the padding of its last file and the end-of-archive blocks: GNU tar and
# Go's archive/tar reject such layers.)
layer=$stage.tar
(cd "$stage" && tar --sort=name --mtime="@$commit_time" --owner=0 --group=0 --numeric-owner \
  --format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$layer" -- *)
trap 'rm -rf "$stage" "$layer"' EXIT
umoci raw add-layer --image "$out:base" --history.created "$created" \
  --history.created_by "bazel build //deploy:image (app layer: /usr/local)" "$layer"

# ---- the config --------------------------------------------------------------
label() { printf -- '--config.label=%s=%s\n--manifest.annotation=%s=%s\n' "$1" "$2" "$1" "$2"; }
mapfile -t labels < <(
  label org.opencontainers.image.title sandbox-gateway
  label org.opencontainers.image.description "sandbox-gateway (gRPC, isolated Linux sandboxes) and sandbox-shim (REST) on Debian 12"
  label org.opencontainers.image.version "$version"
  label org.opencontainers.image.revision "$revision"
  label org.opencontainers.image.source "$source_url"
  label org.opencontainers.image.created "$created"
  label org.opencontainers.image.base.name "debian:bookworm (debootstrap, base-$(cat "$base/ok"))"
)
umoci config --image "$out:base" --tag "$tag" \
  --created "$created" --history.created "$created" \
  --history.created_by "umoci config (entrypoint, ports, labels)" \
  --clear config.env --clear config.entrypoint --clear config.cmd \
  --clear config.exposedports --clear config.labels \
  --config.user 0:0 \
  --config.workingdir / \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env LANG=C.UTF-8 \
  --config.env PORT=8080 \
  --config.entrypoint /usr/local/bin/sandbox-entrypoint \
  --config.cmd all \
  --config.exposedports 8080/tcp \
  --config.exposedports 50051/tcp \
  --config.stopsignal SIGTERM \
  --architecture amd64 --os linux \
  "${labels[@]}"
umoci rm --image "$out:base"
umoci gc --layout "$out"
log "image $out:$tag in $(($(date +%s) - start)) s"
