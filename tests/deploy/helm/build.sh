#!/usr/bin/env bash
# Build the Helm CLI from the Go module proxy once and cache the binary outside git:
#   ${GPU_REMEDIATE_HELM_CACHE:-~/.cache/gpu-remediate/helm}/<version>-<hash>/helm
# where <version> is the helm.sh/helm/v4 version pinned in go.mod (a `tool` directive) and
# <hash> covers go.mod and go.sum, so a new pin builds a new binary and an old one stays put.
# The last line printed is the binary's path.
#
#   tests/deploy/helm/build.sh               build if not cached, print the path
#   tests/deploy/helm/build.sh --print-path  print the path; exit 1 if it is not built
#   tests/deploy/helm/build.sh --force       rebuild even if cached
#
# Environment: GO (the go command), GOMAXPROCS, NICE (default 19).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

hash=$(cat go.mod go.sum | sha256sum | cut -c1-16)
version=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ {print $2; exit}' go.mod)
if [[ -z "$version" ]]; then
  echo "error: $here/go.mod pins no helm.sh/helm/v4 version" >&2
  exit 2
fi
cache=${GPU_REMEDIATE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-remediate/helm}
out="$cache/$version-$hash/helm"

case "${1:-}" in
  --print-path)
    echo "$out"
    [[ -x "$out" ]]
    exit
    ;;
  --force) rm -f "$out" ;;
  "") ;;
  *) echo "usage: $0 [--print-path|--force]" >&2; exit 2 ;;
esac

if [[ -x "$out" ]]; then
  echo "helm: cached ($version): $out" >&2
  echo "$out"
  exit 0
fi

go=${GO:-$(command -v go || true)}
if [[ -z "$go" && -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go; fi
if [[ -z "$go" ]] || ! "$go" version >/dev/null 2>&1; then
  echo "error: Go is not installed (need Go >= 1.26 to build Helm $version)." >&2
  echo "       Install it (https://go.dev/dl/) or set GO=/path/to/go, then run $0 again." >&2
  exit 2
fi

# -mod=mod: go.sum is checked in, so this only lets the go command fill its module cache;
# a changed dependency would still fail against go.sum.
export GOMAXPROCS=${GOMAXPROCS:-2} GOFLAGS="${GOFLAGS:--buildvcs=false} -mod=mod"
nice=(nice -n "${NICE:-19}")
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version"
ldflags+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

start=$(date +%s)
echo "helm: $("$go" version); Helm $version; GOMAXPROCS=$GOMAXPROCS" >&2
echo "helm: [1/2] go mod download (module cache: $("$go" env GOMODCACHE))" >&2
"${nice[@]}" "$go" mod download -x 2>&1 | grep -E '^# get .*\.zip$' | sed 's/^/helm:   /' >&2 || true
echo "helm: [2/2] go build (cold: a few minutes; build cache: $("$go" env GOCACHE))" >&2
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
(
  while sleep 30; do
    echo "helm:   ... still building ($(( $(date +%s) - start ))s)" >&2
  done
) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true; rm -f "$tmp"' EXIT
"${nice[@]}" "$go" build -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v4/cmd/helm
mv -f "$tmp" "$out"
echo "helm: built in $(( $(date +%s) - start ))s, $(du -h "$out" | cut -f1): $out" >&2
echo "$out"
