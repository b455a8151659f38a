#!/usr/bin/env bash
# Build the Temporal server and its SQL schema tool from the Go module proxy once and cache
# both binaries outside git:
#   ${GPU_REMEDIATE_PRODUCTION_CACHE:-~/.cache/gpu-remediate/temporal}/<version>-<hash>/
#       temporal-server      (./server: go.temporal.io/server with a worker-only polls check)
#       temporal-sql-tool    (go.temporal.io/server/cmd/tools/sql)
#       config/docker.yaml   the server image's config template (docker-compose.yml's server)
#       schema/postgresql/v12  the SQL schemas the admin-tools image carries
# where <version> is the go.temporal.io/server version pinned in go.mod (`tool` directives)
# and <hash> covers go.mod, go.sum and server/. The last line printed is the folder's path.
#
#   tests/production/build.sh               build if not cached, print the folder
#   tests/production/build.sh --print-path  print the folder; exit 1 if it is not built
#   tests/production/build.sh --force       rebuild even if cached
#
# Environment: GO (the go command), GOMAXPROCS, NICE (default 19).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

hash=$(cat go.mod go.sum server/*.go | sha256sum | cut -c1-16)
version=$(awk '$1 == "go.temporal.io/server" && $2 ~ /^v/ {print $2; exit}' go.mod)
if [[ -z "$version" ]]; then
  echo "error: $here/go.mod pins no go.temporal.io/server version" >&2
  exit 2
fi
cache=${GPU_REMEDIATE_PRODUCTION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-remediate/temporal}
out="$cache/$version-$hash"
built() { [[ -x "$out/temporal-server" && -x "$out/temporal-sql-tool" && -f "$out/config/docker.yaml" ]]; }

case "${1:-}" in
  --print-path)
    echo "$out"
    built
    exit
    ;;
  --force) rm -rf "$out" ;;
  "") ;;
  *) echo "usage: $0 [--print-path|--force]" >&2; exit 2 ;;
esac

if built; then
  echo "temporal: cached ($version): $out" >&2
  echo "$out"
  exit 0
fi

go=${GO:-$(command -v go || true)}
if [[ -z "$go" && -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go; fi
if [[ -z "$go" ]] || ! "$go" version >/dev/null 2>&1; then
  echo "error: Go is not installed (need Go >= 1.26 to build Temporal $version)." >&2
  echo "       Install it (https://go.dev/dl/) or set GO=/path/to/go, then run $0 again." >&2
  exit 2
fi

# -mod=mod: go.sum is checked in, so this only lets the go command fill its module cache;
# a changed dependency would still fail against go.sum.
export GOMAXPROCS=${GOMAXPROCS:-2} GOFLAGS="${GOFLAGS:--buildvcs=false} -mod=mod"
nice=(nice -n "${NICE:-19}")

start=$(date +%s)
echo "temporal: $("$go" version); Temporal server $version; GOMAXPROCS=$GOMAXPROCS" >&2
echo "temporal: [1/2] go mod download (module cache: $("$go" env GOMODCACHE))" >&2
"${nice[@]}" "$go" mod download -x 2>&1 | grep -E '^# get .*\.zip$' | sed 's/^/temporal:   /' >&2 || true
echo "temporal: [2/2] go build (cold: many minutes; build cache: $("$go" env GOCACHE))" >&2
mkdir -p "$out"
tmp="$out/.tmp.$$"
mkdir -p "$tmp"
(
  while sleep 30; do
    echo "temporal:   ... still building ($(( $(date +%s) - start ))s)" >&2
  done
) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true; rm -rf "$tmp"' EXIT
"${nice[@]}" "$go" build -trimpath -ldflags "-s -w" -o "$tmp/temporal-server" ./server
"${nice[@]}" "$go" build -trimpath -ldflags "-s -w" -o "$tmp/temporal-sql-tool" \
  go.temporal.io/server/cmd/tools/sql
src=$("$go" list -m -f '{{.Dir}}' go.temporal.io/server)
mkdir -p "$tmp/config" "$tmp/schema"
cp "$src/config/docker.yaml" "$tmp/config/"
cp -r "$src/schema/postgresql" "$tmp/schema/"
chmod -R u+w "$tmp/config" "$tmp/schema"
rm -rf "$out/config" "$out/schema"
mv -f "$tmp/temporal-server" "$tmp/temporal-sql-tool" "$tmp/config" "$tmp/schema" "$out/"
echo "temporal: built in $(( $(date +%s) - start ))s, $(du -ch "$out"/temporal-* | tail -n1 | cut -f1): $out" >&2
echo "$out"
