#!/usr/bin/env bash
# Installs every Debian 12 package the build and the tests need (with
# --run: only what building and running the system needs). Idempotent:
# when everything is already installed it changes nothing and does not touch
# the network.
set -euo pipefail

# What building and running the gateway and the shim need
# (scripts/run-local.sh installs only these: --run).
RUN_PACKAGES=(
  # Build
  bazel-bootstrap bazel-rules-java
  gcc g++ pkg-config ca-certificates
  # gRPC and protobuf (C core, protobuf-c, code generators, standard protos)
  libgrpc-dev grpc-proto
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  protobuf-c-compiler libprotobuf-c-dev
  # Libraries of the gateway and the shim
  libssl-dev openssl libarchive-dev libcurl4-openssl-dev libmicrohttpd-dev
  libjansson-dev libseccomp-dev libwslay-dev libzmq3-dev
  # Code contexts: the Jupyter kernel sandboxes run (SANDBOX_ROOTFS / by
  # default), with the libraries their charts and tables come from
  python3-ipykernel python3-matplotlib python3-pandas
  # Sandbox runtime: user-mode networking for egress
  slirp4netns
  iproute2 procps
)

# What the tests add (the test command installs them).
TEST_PACKAGES=(
  # Fuzzing (libFuzzer)
  clang libclang-rt-14-dev
  # Container image (//deploy:image) and its test
  debootstrap debian-archive-keyring gpgv umoci skopeo crun
  # Layout check (scripts/format.sh --check)
  clang-format
  # Tests
  libcmocka-dev python3 python3-grpcio python3-protobuf python3-pytest python3-pip
  # A real browser through a preview link (tests/integration/test_ports_browser.py)
  chromium
  # SRV records for the gateway set (tests/integration/test_scaleout.py)
  python3-dnslib
  # Images: a real registry on loopback, and a static shell for tiny test
  # images (tests/integration/test_images.py)
  docker-registry busybox-static
)

PACKAGES=("${RUN_PACKAGES[@]}")
if [[ "${1:-}" != "--run" ]]; then
  PACKAGES+=("${TEST_PACKAGES[@]}")
  # The GCS cross-check runs Google's Node.js client and the API check runs
  # buf (both from npm): Node.js from Debian unless the machine has one.
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    PACKAGES+=(nodejs npm)
  fi
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  SUDO=()
else
  SUDO=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
