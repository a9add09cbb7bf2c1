#!/usr/bin/env bash
# Starts the whole system locally: installs the dependencies, builds, starts
# sandbox-gateway and sandbox-shim, prints the secret and example calls, and
# stops everything on Ctrl-C. Needs root (sandboxes use namespaces, mounts
# and cgroups).
#
# Settings come from the environment as documented in README.md; by default
# the gateway listens on 127.0.0.1:50051 with a fresh random secret.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $(id -u) -ne 0 ]]; then
  echo "run-local: the gateway makes sandboxes (namespaces, mounts, cgroups): run this as root" >&2
  exit 1
fi

# Only what building and running needs (the test command installs the rest).
scripts/install-deps.sh --run
bazel build //gateway:sandbox-gateway //shim:sandbox-shim

# The plain build's outputs (bazel-bin follows the last configuration built).
GATEWAY_BIN=bazel-out/k8-fastbuild/bin/gateway/sandbox-gateway
SHIM_BIN=bazel-out/k8-fastbuild/bin/shim/sandbox-shim

# The image sandboxes see: the prepared Debian base by default, never the
# host's own / unless asked for by name (scripts/local-rootfs.sh).
SANDBOX_ROOTFS="$(scripts/local-rootfs.sh)"
export SANDBOX_ROOTFS
export SANDBOX_LISTEN="${SANDBOX_LISTEN:-127.0.0.1:50051}"
export SANDBOX_STATE_DIR="${SANDBOX_STATE_DIR:-/var/lib/sandbox-gateway}"
if [[ -z "${CLOUD_RUN_SANDBOX_GATEWAY_SECRET:-}" ]]; then
  CLOUD_RUN_SANDBOX_GATEWAY_SECRET="$(openssl rand -hex 32)"
fi
export CLOUD_RUN_SANDBOX_GATEWAY_SECRET

RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/sandbox-local.XXXXXX")"
GATEWAY_LOG="$RUN_DIR/gateway.log"
PIDS=()

stop_all() {
  trap - INT TERM EXIT
  echo
  echo "Stopping..."
  # In start order, one at a time: the gateway's last log lines still show.
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "Stopped. Logs are in $RUN_DIR"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

# --- sandbox-gateway -------------------------------------------------------
"$GATEWAY_BIN" 2>"$GATEWAY_LOG" &
GATEWAY_PID=$!
PIDS+=("$GATEWAY_PID")

# Wait (at most 30 s) for the JSON log line {"message":"listening","port":N}.
GATEWAY_PORT=""
for _ in $(seq 1 300); do
  line="$(grep -m1 -E '"message" *: *"listening"' "$GATEWAY_LOG" || true)"
  if [[ -n "$line" ]]; then
    GATEWAY_PORT="$(sed -nE 's/.*"port" *: *([0-9]+).*/\1/p' <<<"$line")"
    break
  fi
  if ! kill -0 "$GATEWAY_PID" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
if [[ -z "$GATEWAY_PORT" ]]; then
  echo "sandbox-gateway did not start; its log:" >&2
  cat "$GATEWAY_LOG" >&2
  exit 1
fi

# --- sandbox-shim ------------------------------------------------------------
SHIM_LOG="$RUN_DIR/shim.log"
export PORT="${PORT:-8080}"
SHIM_GATEWAY_TARGET="127.0.0.1:$GATEWAY_PORT" "$SHIM_BIN" 2>"$SHIM_LOG" &
SHIM_PID=$!
PIDS=("$SHIM_PID" "${PIDS[@]}")  # stopped first
for _ in $(seq 1 300); do
  if grep -q '"message" *: *"listening"' "$SHIM_LOG"; then
    break
  fi
  if ! kill -0 "$SHIM_PID" 2>/dev/null; then
    echo "sandbox-shim did not start; its log:" >&2
    cat "$SHIM_LOG" >&2
    exit 1
  fi
  sleep 0.1
done

if [[ -n "${SANDBOX_TLS_CERT:-}" && -n "${SANDBOX_TLS_KEY:-}" ]]; then
  GRPCURL="grpcurl -cacert $SANDBOX_TLS_CERT"
else
  GRPCURL="grpcurl -plaintext"
fi
ADDR="localhost:$GATEWAY_PORT"

cat <<EOF

sandbox-gateway is running on ${SANDBOX_LISTEN%:*}:$GATEWAY_PORT (pid $GATEWAY_PID)
sandbox-shim is running on http://127.0.0.1:$PORT (pid $SHIM_PID)

  Secret: $CLOUD_RUN_SANDBOX_GATEWAY_SECRET
  Logs:   $GATEWAY_LOG $SHIM_LOG

REST calls through the shim:

  SECRET=$CLOUD_RUN_SANDBOX_GATEWAY_SECRET
  curl -s http://127.0.0.1:$PORT/health
  curl -s -H "Authorization: Bearer \$SECRET" -H 'Content-Type: application/json' \\
       -d '{"sandbox_id": "demo"}' http://127.0.0.1:$PORT/sandboxes
  curl -s -H "Authorization: Bearer \$SECRET" -H 'Content-Type: application/json' \\
       -d '{"argv": ["bash", "-lc", "echo hello; uname -a"]}' http://127.0.0.1:$PORT/sandboxes/demo/exec
  curl -s -H "Authorization: Bearer \$SECRET" -o demo.tar http://127.0.0.1:$PORT/sandboxes/demo/tar
  curl -s -X DELETE -H "Authorization: Bearer \$SECRET" http://127.0.0.1:$PORT/sandboxes/demo

gRPC calls to the gateway (grpcurl is not a Debian package: install it separately):

  SECRET=$CLOUD_RUN_SANDBOX_GATEWAY_SECRET
  $GRPCURL $ADDR list
  $GRPCURL $ADDR describe sandbox.v1.Sandbox
  $GRPCURL $ADDR grpc.health.v1.Health/Check
  $GRPCURL -H "authorization: Bearer \$SECRET" -d '{"sandbox_id": "demo"}' $ADDR sandbox.v1.Sandbox/Launch
  $GRPCURL -H "authorization: Bearer \$SECRET" $ADDR sandbox.v1.Sandbox/List

Press Ctrl-C to stop.

EOF

# Follow the gateway's log until either program exits or Ctrl-C.
tail -n +1 -f "$GATEWAY_LOG" --pid="$GATEWAY_PID" &
PIDS+=("$!")
rc=0
wait -n "$GATEWAY_PID" "$SHIM_PID" || rc=$?
echo "a program exited (status $rc); stopping the other"
exit "$rc"
