#!/usr/bin/env bash
# Starts the whole system locally: installs the dependencies, builds, starts
# sandbox-gateway (and, once it serves, sandbox-shim), prints the secret and
# example calls, and stops everything on Ctrl-C.
#
# Settings come from the environment as documented in README.md; by default
# the gateway listens on 127.0.0.1:50051 with a fresh random secret.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-deps.sh
bazel build //gateway:sandbox-gateway //shim:sandbox-shim

GATEWAY_BIN=bazel-bin/gateway/sandbox-gateway

export SANDBOX_LISTEN="${SANDBOX_LISTEN:-127.0.0.1:50051}"
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
# SHIM: start bazel-bin/shim/sandbox-shim here once it serves HTTP (it only
# prints --help for now): run it in the background pointing at
# 127.0.0.1:$GATEWAY_PORT with the same secret, add its pid to PIDS, wait for
# it to listen, and print a curl example below.
# -----------------------------------------------------------------------------

if [[ -n "${SANDBOX_TLS_CERT:-}" && -n "${SANDBOX_TLS_KEY:-}" ]]; then
  GRPCURL="grpcurl -cacert $SANDBOX_TLS_CERT"
else
  GRPCURL="grpcurl -plaintext"
fi
ADDR="localhost:$GATEWAY_PORT"

cat <<EOF

sandbox-gateway is running on ${SANDBOX_LISTEN%:*}:$GATEWAY_PORT (pid $GATEWAY_PID)

  Secret: $CLOUD_RUN_SANDBOX_GATEWAY_SECRET
  Logs:   $GATEWAY_LOG

Example calls (grpcurl is not a Debian package: install it separately):

  SECRET=$CLOUD_RUN_SANDBOX_GATEWAY_SECRET
  $GRPCURL $ADDR list
  $GRPCURL $ADDR describe sandbox.v1.Sandbox
  $GRPCURL $ADDR grpc.health.v1.Health/Check
  $GRPCURL -H "authorization: Bearer \$SECRET" -d '{"sandbox_id": "demo"}' $ADDR sandbox.v1.Sandbox/Launch
  $GRPCURL -H "authorization: Bearer \$SECRET" $ADDR sandbox.v1.Sandbox/List

Press Ctrl-C to stop.

EOF

# Follow the gateway's log until it exits or Ctrl-C.
tail -n +1 -f "$GATEWAY_LOG" --pid="$GATEWAY_PID" &
PIDS+=("$!")
rc=0
wait "$GATEWAY_PID" || rc=$?
echo "sandbox-gateway exited with status $rc"
exit "$rc"
