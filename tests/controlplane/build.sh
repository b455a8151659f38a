#!/usr/bin/env bash
# Build the one-process Kubernetes control plane (tests/controlplane/main.go) once and
# cache the binary outside git:
#   ${GPU_REMEDIATE_CONTROLPLANE_CACHE:-~/.cache/gpu-remediate/controlplane}/<hash>/controlplane
# where <hash> covers go.mod, go.sum and *.go (the Kubernetes version is pinned in go.mod).
# The last line printed is the binary's path.
#
#   tests/controlplane/build.sh               build if not cached, print the path
#   tests/controlplane/build.sh --print-path  print the path; exit 1 if it is not built
#   tests/controlplane/build.sh --force       rebuild even if cached
#
# Environment: GO (the go command), GOMAXPROCS, NICE (default 19), MODULE (a subdirectory
# with another go.mod: another Kubernetes version).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# MODULE=k8s137: the module in that subdirectory (the tier's second Kubernetes version,
# which serves DeviceTaintRule); unset: this directory's (the tier's first).
here="$here${MODULE:+/$MODULE}"
cd "$here"

mapfile -t sources < <(printf '%s\n' ./*.go | LC_ALL=C sort)
hash=$(cat go.mod go.sum "${sources[@]}" | sha256sum | cut -c1-16)
k8s=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' go.mod)
if [[ -z "$k8s" ]]; then
  k8s=$(awk '/k8s.io\/kubernetes v[0-9]/ {for (i = 1; i <= NF; i++) if ($i ~ /^v[0-9]/) {print $i; exit}}' go.mod)
fi
cache=${GPU_REMEDIATE_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-remediate/controlplane}
out="$cache/$k8s-$hash/controlplane"

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
  echo "controlplane: cached ($k8s): $out" >&2
  echo "$out"
  exit 0
fi

go=${GO:-$(command -v go || true)}
if [[ -z "$go" && -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go; fi
if [[ -z "$go" ]] || ! "$go" version >/dev/null 2>&1; then
  echo "error: Go is not installed (need Go >= 1.24 to build Kubernetes $k8s)." >&2
  echo "       Install it (https://go.dev/dl/) or set GO=/path/to/go, then run $0 again." >&2
  exit 2
fi

export GOMAXPROCS=${GOMAXPROCS:-2} GOFLAGS=${GOFLAGS:--buildvcs=false}
nice=(nice -n "${NICE:-19}")
minor=$(echo "$k8s" | cut -d. -f2)
ldflags="-s -w -X main.buildKubeVersion=$k8s"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

start=$(date +%s)
echo "controlplane: $("$go" version); Kubernetes $k8s; GOMAXPROCS=$GOMAXPROCS" >&2
echo "controlplane: [1/2] go mod download (module cache: $("$go" env GOMODCACHE))" >&2
"${nice[@]}" "$go" mod download -x 2>&1 | grep -E '^# get .*\.zip$' | sed 's/^/controlplane:   /' >&2 || true
echo "controlplane: [2/2] go build (cold: many minutes; build cache: $("$go" env GOCACHE))" >&2
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
(
  while sleep 30; do
    echo "controlplane:   ... still building ($(( $(date +%s) - start ))s)" >&2
  done
) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true; rm -f "$tmp"' EXIT
"${nice[@]}" "$go" build -trimpath -ldflags "$ldflags" -o "$tmp" .
mv -f "$tmp" "$out"
echo "controlplane: built in $(( $(date +%s) - start ))s, $(du -h "$out" | cut -f1): $out" >&2
echo "$out"
