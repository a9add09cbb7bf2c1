#!/usr/bin/env bash
# Builds (once) and caches the image's base layer: a Debian 12 (bookworm)
# rootfs made with debootstrap from deploy/base/packages.txt, packed as a
# one-layer OCI image with umoci.
#
#   build_base.sh [--print-key]
#
# Prints the cache directory on stdout (the last line); everything else goes
# to stderr. The directory holds:
#   oci/      OCI image layout, tag "base": the packed base layer
#   rootfs/   the unpacked rootfs (build_image.sh checks shared libraries
#             against it)
#   packages.lst  dpkg -l of the rootfs (name version), for the record
#   ok        written last: the entry is complete
#
# Cache key: sha256 of this script, packages.txt, the suite, the
# architecture and the mirror. The entry lives outside Bazel's output base
# (`bazel clean --expunge` keeps it) in
#   $SANDBOX_IMAGE_CACHE                (when set)
#   ${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-gateway   (otherwise; Bazel
#                                       actions have no HOME: the passwd entry)
# named base-<first 16 hex of the key>. Concurrent builds serialise on a lock
# file; an interrupted build leaves only a base-*.tmp.* directory, removed by
# the next build.
#
# Needs root (debootstrap creates device nodes and chowns) and Debian's
# package archive (SANDBOX_DEBIAN_MIRROR, default http://deb.debian.org/debian;
# security updates from SANDBOX_DEBIAN_SECURITY_MIRROR, default
# http://deb.debian.org/debian-security). SANDBOX_BASE_REFRESH=<any word>
# enters the key: change it to rebuild the base with today's packages (e.g. a
# date, for security updates) without editing packages.txt.
set -euo pipefail

# Bazel actions get PATH=/bin:/usr/bin:/usr/local/bin; debootstrap and chroot
# live in sbin.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
packages_file=$here/packages.txt
suite=bookworm
arch=$(dpkg --print-architecture)
mirror=${SANDBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${SANDBOX_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
refresh=${SANDBOX_BASE_REFRESH:-}

log() { printf 'build_base: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

packages=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$packages_file" | sort -u)
key=$({
  sha256sum <"$here/build_base.sh"
  printf '%s\n' "$packages" "$suite" "$arch" "$mirror" "$security_mirror" "$refresh"
} | sha256sum | cut -c1-16)

if [[ "${1:-}" == "--print-key" ]]; then
  echo "$key"
  exit 0
fi

if [[ -n "${SANDBOX_IMAGE_CACHE:-}" ]]; then
  cache=$SANDBOX_IMAGE_CACHE
else
  home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
  cache=${XDG_CACHE_HOME:-$home/.cache}/sandbox-gateway
fi
entry=$cache/base-$key

if [[ -f "$entry/ok" ]]; then
  touch "$entry/ok" 2>/dev/null || true  # last use, for pruning
  log "cached base $entry"
  echo "$entry"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || die "building the base layer needs root (debootstrap); run the build as root once, or set SANDBOX_IMAGE_CACHE to a directory holding a built base-$key"
for tool in debootstrap umoci unshare chroot; do
  command -v "$tool" >/dev/null || die "$tool not found (scripts/install-deps.sh installs it)"
done

mkdir -p "$cache"
exec 9>"$cache/base-$key.lock"
flock 9
if [[ -f "$entry/ok" ]]; then  # built by a concurrent build meanwhile
  log "cached base $entry"
  echo "$entry"
  exit 0
fi
# Leftovers of interrupted builds of this key.
rm -rf "$entry" "$cache/base-$key.tmp."*

tmp=$cache/base-$key.tmp.$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
rootfs=$tmp/bundle/rootfs
start=$(date +%s)

log "debootstrap $suite ($arch) from $mirror into $tmp (key $key)"
# umoci creates the bundle (and its empty rootfs) first, so the repack below
# sees every file of the rootfs as new.
umoci init --layout "$tmp/oci"
umoci new --image "$tmp/oci:base"
umoci unpack --image "$tmp/oci:base" "$tmp/bundle" >&2
# A bare minbase first; the packages come from apt inside it, which resolves
# alternatives the way a user's apt-get would (debootstrap --include always
# takes the first alternative: python3-fonttools' "python3-scipy |
# python3-munkres" would drag in scipy, pythran, g++ and the Python headers,
# about 600 MB) and never installs Recommends.
debootstrap --variant=minbase --arch="$arch" "$suite" "$rootfs" "$mirror" >&2 || {
  log "debootstrap failed; its log:"; tail -n 50 "$rootfs/debootstrap/debootstrap.log" >&2 || true; exit 1; }

log "installing the packages (with security and point-release updates)"
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
SOURCES
# In a private mount namespace: /proc for maintainer scripts, gone with it.
# shellcheck disable=SC2086 # the package list is split on purpose
unshare --mount --propagation private /bin/sh -ec '
  root=$1; shift
  mount -t proc proc "$root/proc"
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    /bin/sh -ec "apt-get update -q
      apt-get -y -q -o Dpkg::Options::=--force-confold upgrade
      apt-get -y -q --no-install-recommends install $*
      apt-get clean"
' sh "$rootfs" $packages >&2

log "trimming"
# What the image does not need: package lists and caches (apt-get update
# brings them back), logs, documentation other than the copyright files.
# Future installs keep leaving documentation out.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old \
  "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/var/tmp/* \
  "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/usr/share/lintian "$rootfs"/usr/share/linda
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/sandbox-gateway-slim" <<'DPKG'
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
DPKG
# Per-machine identity and DNS come from the runtime.
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/etc/hostname" "$rootfs/etc/resolv.conf"
chroot "$rootfs" dpkg-query -W -f='${Package} ${Version}\n' >"$tmp/packages.lst"

log "packing the base layer"
umoci repack --image "$tmp/oci:base" \
  --history.created_by "debootstrap --variant=minbase $suite + deploy/base/packages.txt (key $key)" \
  "$tmp/bundle" >&2
umoci gc --layout "$tmp/oci"
mv "$rootfs" "$tmp/rootfs"
rm -rf "$tmp/bundle"
echo "$key" >"$tmp/ok"
mv "$tmp" "$entry"
trap - EXIT
# Keep the SANDBOX_BASE_KEEP (default 3) most recently used entries.
keep=${SANDBOX_BASE_KEEP:-3}
ls -1dt "$cache"/base-*/ok 2>/dev/null | tail -n +"$((keep + 1))" | while read -r old; do
  old=$(dirname "$old")
  log "pruning $old (least recently used)"
  rm -rf "$old" "$old.lock"
done
log "built $entry in $(($(date +%s) - start)) s ($(du -sh "$entry/oci" | cut -f1) packed)"
echo "$entry"
