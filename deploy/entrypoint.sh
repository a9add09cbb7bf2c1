#!/bin/bash
# The container's entrypoint: starts sandbox-gateway, sandbox-shim or both.
#
#   sandbox-entrypoint [all|gateway|shim|help]
#
#   all      (default) the gateway on $SANDBOX_LISTEN (127.0.0.1:50051) and
#            the shim on $SHIM_HOST:$PORT (0.0.0.0:8080), talking to it.
#            Both are supervised: when either ends, for any reason, the
#            other is stopped and the container exits non-zero, so the
#            platform restarts it. SIGTERM/SIGINT are forwarded to both and
#            the container exits once both have (0 when both exited 0).
#   gateway  the gateway alone (exec'd: it is the entrypoint's process).
#   shim     the shim alone (exec'd), listening on $SHIM_HOST:$PORT.
#
# Fails closed: without CLOUD_RUN_SANDBOX_GATEWAY_SECRET nothing starts
# (exit 78). When it runs as pid 1 it re-executes itself under tini, which
# reaps orphaned processes and forwards signals; the gateway also makes
# itself a child subreaper for the processes of its sandboxes.
#
# Entrypoint-only variables (the programs' own are in their --help):
#   SANDBOX_CGROUP_SETUP  auto (default): make the cgroup hierarchy usable by
#                         the gateway: remount read-only cgroup mounts under
#                         /sys/fs/cgroup read-write (container runtimes mount
#                         them read-only unless privileged; needs
#                         CAP_SYS_ADMIN and no seccomp/AppArmor mount ban),
#                         and on cgroup v2, when /sys/fs/cgroup is the
#                         container's own (non-root) cgroup with processes in
#                         it, move them to a child group "entrypoint" and
#                         enable the controllers for the sandboxes;
#                         off: never touch the cgroup mounts or tree.
#   SANDBOX_BIN_DIR       where the programs are (default: this script's
#                         directory, /usr/local/bin in the image).
#   SANDBOX_UID_BASE_FROM_ORDINAL
#                         true: set SANDBOX_UID_BASE from the number that
#                         ends the host name (a StatefulSet pod's ordinal,
#                         sandbox-gateway-<n>): SANDBOX_UID_BASE (default
#                         1000000) + n x SANDBOX_UID_SLOTS x SANDBOX_UID_RANGE
#                         (defaults: SANDBOX_MAX, 65536), so that the
#                         members sharing a node have blocks of their own.
#                         Refuses to start (exit 78) when the host name does
#                         not end in a number or SANDBOX_UID_SLOTS is unset.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
bin_dir=${SANDBOX_BIN_DIR:-$(dirname "$self")}
readonly self bin_dir
log() { printf 'sandbox-entrypoint: %s\n' "$*" >&2; }

usage() {
  sed -n '2,/^set -euo/p' "$self" | sed -e '$d' -e 's/^# \{0,1\}//'
}

mode=${1:-all}
case "$mode" in
  all | gateway | shim) ;;
  help | -h | --help)
    usage
    exit 0
    ;;
  *)
    log "unknown mode '$mode' (all, gateway, shim or help)"
    exit 64
    ;;
esac

# pid 1 of a container: let tini be pid 1 and run us as its child.
if [[ $$ -eq 1 && -z "${SANDBOX_ENTRYPOINT_UNDER_INIT:-}" ]]; then
  if command -v tini >/dev/null 2>&1; then
    export SANDBOX_ENTRYPOINT_UNDER_INIT=1
    exec tini -- "$self" "$@"
  fi
  log "warning: running as pid 1 without tini; orphaned processes are reaped by bash only"
fi

if [[ -z "${CLOUD_RUN_SANDBOX_GATEWAY_SECRET:-}" ]]; then
  log "CLOUD_RUN_SANDBOX_GATEWAY_SECRET is not set: refusing to start."
  log "Set it to the bearer secret clients must present (Cloud Run: a Secret Manager"
  log "secret; Kubernetes: a Secret via secretKeyRef). Nothing was started."
  exit 78 # EX_CONFIG
fi

# Container runtimes mount the container's cgroups read-only unless it is
# privileged; the gateway creates groups in them. With CAP_SYS_ADMIN a bind
# remount clears the mount's read-only flag (the hierarchy seen is still only
# the container's own with a cgroup namespace, or with v1 bind mounts of
# its cgroup paths).
remount_cgroups_rw() {
  [[ "${SANDBOX_CGROUP_SETUP:-auto}" == "off" ]] && return 0
  local mp
  while read -r mp; do
    if mount -o remount,bind,rw "$mp" 2>/dev/null; then
      log "remounted $mp read-write"
    else
      log "warning: $mp is read-only and cannot be remounted (CAP_SYS_ADMIN? seccomp/AppArmor?): sandboxes will fail to launch"
    fi
  done < <(awk '{
      for (i = 7; i <= NF; i++) if ($i == "-") { fs = $(i + 1); break }
      if ((fs == "cgroup" || fs == "cgroup2") && $5 ~ /^\/sys\/fs\/cgroup/ && ("," $6 ",") ~ /,ro,/) print $5
    }' /proc/self/mountinfo)
}

# cgroup v2 in a container: the container's cgroup is the root of its cgroup
# namespace and holds our processes, so controllers cannot be enabled for
# child groups ("no internal processes"). Move every process of it into a
# leaf group and enable the controllers, as Docker-in-Docker does. Never on
# the machine's real root cgroup (it has no cgroup.freeze), never on v1.
setup_cgroup_v2() {
  local cg=/sys/fs/cgroup
  [[ "${SANDBOX_CGROUP_SETUP:-auto}" == "off" ]] && return 0
  [[ -f $cg/cgroup.controllers && -f $cg/cgroup.freeze ]] || return 0
  [[ $(cat /proc/self/cgroup) == "0::/" ]] || return 0
  if ! [[ -w $cg/cgroup.procs ]] || ! mkdir -p "$cg/entrypoint" 2>/dev/null; then
    log "warning: /sys/fs/cgroup (cgroup v2) is not writable: sandboxes cannot get cgroups"
    return 0
  fi
  local pid
  while read -r pid; do
    echo "$pid" >"$cg/entrypoint/cgroup.procs" 2>/dev/null || true
  done <"$cg/cgroup.procs"
  local want="" c
  for c in $(cat "$cg/cgroup.controllers"); do
    case "$c" in pids | memory | cpu) want+=" +$c" ;; esac
  done
  if [[ -n $want ]] && ! echo "${want# }" >"$cg/cgroup.subtree_control" 2>/dev/null; then
    log "warning: could not enable${want} in /sys/fs/cgroup/cgroup.subtree_control"
  fi
}

# Each member of a StatefulSet gets the uid block after its predecessor's.
uid_base_from_ordinal() {
  [[ "${SANDBOX_UID_BASE_FROM_ORDINAL:-false}" == "true" ]] || return 0
  local host ordinal slots=${SANDBOX_UID_SLOTS:-${SANDBOX_MAX:-}}
  host=$(hostname)
  ordinal=${host##*-}
  if ! [[ $ordinal =~ ^[0-9]+$ && $slots =~ ^[1-9][0-9]*$ ]]; then
    log "SANDBOX_UID_BASE_FROM_ORDINAL: the host name '$host' must end in -<number> and SANDBOX_UID_SLOTS (or SANDBOX_MAX) be set"
    exit 78 # EX_CONFIG
  fi
  export SANDBOX_UID_SLOTS=$slots
  export SANDBOX_UID_BASE=$((${SANDBOX_UID_BASE:-1000000} + 10#$ordinal * slots * ${SANDBOX_UID_RANGE:-65536}))
  log "uid block of member $ordinal: SANDBOX_UID_BASE=$SANDBOX_UID_BASE, $slots ranges"
}
uid_base_from_ordinal

case "$mode" in
  gateway)
    remount_cgroups_rw
    setup_cgroup_v2
    exec "$bin_dir/sandbox-gateway"
    ;;
  shim)
    export SHIM_HOST=${SHIM_HOST:-0.0.0.0}
    exec "$bin_dir/sandbox-shim"
    ;;
esac

# ---- all: both, supervised ------------------------------------------------
remount_cgroups_rw
setup_cgroup_v2
export SANDBOX_LISTEN=${SANDBOX_LISTEN:-127.0.0.1:50051}
if [[ -z "${SHIM_GATEWAY_TARGET:-}" ]]; then
  gw_host=${SANDBOX_LISTEN%:*}
  case "$gw_host" in
    "" | 0.0.0.0) gw_host=127.0.0.1 ;;
    "[::]" | "::") gw_host="[::1]" ;;
  esac
  export SHIM_GATEWAY_TARGET=$gw_host:${SANDBOX_LISTEN##*:}
fi
export SHIM_HOST=${SHIM_HOST:-0.0.0.0}

stopping=0
gateway_pid="" shim_pid=""
# shellcheck disable=SC2317 # called by the traps below
forward() {
  stopping=1
  log "$1: stopping the gateway and the shim"
  kill -TERM "$gateway_pid" "$shim_pid" 2>/dev/null || true
}
trap 'forward SIGTERM' TERM
trap 'forward SIGINT' INT

"$bin_dir/sandbox-gateway" &
gateway_pid=$!
"$bin_dir/sandbox-shim" &
shim_pid=$!
log "gateway (pid $gateway_pid) on $SANDBOX_LISTEN, shim (pid $shim_pid) on $SHIM_HOST:${PORT:-8080}"

# Wait until one of them ends (or a signal interrupts the wait).
status=0
while :; do
  set +e
  wait -n "$gateway_pid" "$shim_pid"
  rc=$?
  set -e
  if ((stopping)); then
    break
  fi
  if ! kill -0 "$gateway_pid" 2>/dev/null; then
    log "the gateway exited (status $rc): stopping the shim"
  elif ! kill -0 "$shim_pid" 2>/dev/null; then
    log "the shim exited (status $rc): stopping the gateway"
  else
    continue # interrupted by a signal that did not stop us
  fi
  status=$((rc == 0 ? 70 : rc))
  stopping=1
  kill -TERM "$gateway_pid" "$shim_pid" 2>/dev/null || true
  break
done

# Collect both (a second SIGTERM just forwards again).
for pid in "$gateway_pid" "$shim_pid"; do
  while kill -0 "$pid" 2>/dev/null; do
    set +e
    wait "$pid"
    rc=$?
    set -e
    if ! kill -0 "$pid" 2>/dev/null && ((rc != 0 && status == 0)); then
      status=$rc
    fi
  done
done
# wait after the process was already reaped by `wait -n` returns 127: only
# statuses collected here count, plus the first one above.
log "exiting with status $status"
exit "$status"
