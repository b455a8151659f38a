#!/bin/sh
# Register, or wait for, the custom search attributes that gpu-remediate's workflows set:
# GpuNode, RemediationState and RemediationAction (all Keyword).
#
#   search-attributes.sh register   create the missing ones, then wait until all are visible
#   search-attributes.sh check      wait until all are visible (never creates anything)
#
# Runs in the temporalio/admin-tools image (POSIX sh and the temporal CLI).
# Connection, all from the environment:
#   TEMPORAL_ADDRESS     host:port of the frontend (required)
#   TEMPORAL_NAMESPACE   namespace (default: default)
#   TEMPORAL_API_KEY     API key (Temporal Cloud); turns TLS on
#   TEMPORAL_TLS_DIR     folder holding tls.crt + tls.key (mTLS) and/or ca.crt; each optional
#   TEMPORAL_TLS_SERVER_NAME  server name to verify, when it differs from the address
#   WAIT_SECONDS         how long to wait for the attributes to show up (default 600)
set -eu

mode="${1:-register}"
names="GpuNode RemediationState RemediationAction"
wait_seconds="${WAIT_SECONDS:-600}"

set -- --address "${TEMPORAL_ADDRESS:?TEMPORAL_ADDRESS is not set}" \
       --namespace "${TEMPORAL_NAMESPACE:-default}"
tls_dir="${TEMPORAL_TLS_DIR:-/etc/gpu-remediate/temporal}"
if [ -f "$tls_dir/tls.crt" ] && [ -f "$tls_dir/tls.key" ]; then
  set -- "$@" --tls --tls-cert-path "$tls_dir/tls.crt" --tls-key-path "$tls_dir/tls.key"
fi
if [ -f "$tls_dir/ca.crt" ]; then
  set -- "$@" --tls --tls-ca-path "$tls_dir/ca.crt"
fi
if [ -n "${TEMPORAL_TLS_SERVER_NAME:-}" ]; then
  set -- "$@" --tls --tls-server-name "$TEMPORAL_TLS_SERVER_NAME"
fi
if [ -n "${TEMPORAL_API_KEY:-}" ]; then
  set -- "$@" --tls --api-key "$TEMPORAL_API_KEY"
fi

# Prints the names not yet registered; fails when the server cannot be asked.
missing() {
  listed="$(temporal operator search-attribute list "$@")" || return 1
  for name in $names; do
    printf '%s\n' "$listed" | grep -qw "$name" || printf '%s ' "$name"
  done
}

wait_for_all() {
  waited=0
  while :; do
    if left="$(missing "$@")" && [ -z "$left" ]; then
      echo "search attributes present: $names"
      return 0
    fi
    if [ "$waited" -ge "$wait_seconds" ]; then
      echo "search attributes still missing after ${wait_seconds}s: ${left:-(server not reachable)}" >&2
      return 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
}

case "$mode" in
  check)
    wait_for_all "$@"
    ;;
  register)
    attempt=0
    until left="$(missing "$@")"; do
      attempt=$((attempt + 1))
      if [ "$attempt" -ge 60 ]; then
        echo "cannot list search attributes at ${TEMPORAL_ADDRESS}" >&2
        exit 1
      fi
      sleep 5
    done
    for name in $left; do
      echo "creating Keyword search attribute $name"
      # One call per attribute: given several --name, temporal CLI 1.9 created only the first.
      # "Already exists" from a concurrent run is fine: the wait below decides.
      temporal operator search-attribute create "$@" --name "$name" --type Keyword \
        || echo "creating $name reported an error; checking what is registered" >&2
    done
    wait_for_all "$@"
    ;;
  *)
    echo "usage: $0 register|check" >&2
    exit 2
    ;;
esac
