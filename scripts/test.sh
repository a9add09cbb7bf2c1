#!/usr/bin/env bash
# The single test command: installs the dependencies, checks the API (buf lint
# and breaking), builds everything, runs the Bazel unit tests (plain and under
# AddressSanitizer/UBSan), then the Python integration tests against the built
# binaries. Exits non-zero on any failure; the last line printed is pytest's
# summary.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=/usr/bin/python3  # Debian's interpreter, which has python3-grpcio

step() { printf '\n==> %s\n' "$*"; }

step "Installing dependencies"
scripts/install-deps.sh

step "Formatting and API checks"
scripts/check-api.sh
scripts/format.sh --check

step "Building"
bazel build //...

step "Unit tests"
bazel test //...

step "Unit tests under AddressSanitizer and UndefinedBehaviorSanitizer"
bazel test --config=asan //...

# After --config=asan, bazel-bin points at the sanitizer build: point it back
# at the plain binaries (already built) so the integration tests run what
# `bazel build` ships.
step "Selecting the plain build for the integration tests"
bazel build //...

step "Container image (Debian base layer cached in ~/.cache/sandbox-gateway)"
bazel build --workspace_status_command=deploy/workspace_status.sh //deploy:image

step "Fuzzing (libFuzzer, 60 s per target)"
tests/fuzz/run --seconds "${SANDBOX_FUZZ_SECONDS:-60}"

step "Integration tests"
exec "$PYTHON" -m pytest -v tests/integration tests/gcs tests/security tests/reliability tests/deploy
