#!/bin/sh
# One-shot setup of the compose Temporal server: the namespace, then gpu-remediate's
# search attributes (deploy/base/scripts/search-attributes.sh, mounted at /scripts).
set -eu

ns="${TEMPORAL_NAMESPACE:-default}"
attempt=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" | grep -q SERVING; do
  attempt=$((attempt + 1))
  if [ "$attempt" -ge 60 ]; then
    echo "Temporal at $TEMPORAL_ADDRESS is not serving" >&2
    exit 1
  fi
  sleep 2
done
temporal operator namespace describe --address "$TEMPORAL_ADDRESS" --namespace "$ns" >/dev/null 2>&1 \
  || temporal operator namespace create --address "$TEMPORAL_ADDRESS" --namespace "$ns" --retention 72h
exec sh "${SEARCH_ATTRIBUTES_SCRIPT:-/scripts/search-attributes.sh}" register
