#!/usr/bin/env bash
# The production tier (the real Temporal server on PostgreSQL, several workers, a rolling
# upgrade), run when its inputs change.
#
# The tier's inputs are the files whose behaviour it checks against the production topology:
# the tier itself (tests/production: the server's pin, the topology, the scenarios), the
# compose stack's Temporal configuration and scripts, the product (workflows, activities,
# worker), the Python dependencies' pins, and the shared end-to-end helpers it uses. Their
# hash at the last passing run is kept in tests/production/VERIFIED (committed).
#
#   tests/production/verify.sh           build (cached), run the tier, record the hash on success
#   tests/production/verify.sh --check   exit 0 when VERIFIED matches the current inputs
#   tests/production/verify.sh --hash    print the current inputs hash
#
# CI (.ci/run) runs the tier only when --check fails, so a change to any input either comes
# with a fresh VERIFIED from this script or pays the cold build (~7 minutes) and the tier
# (~7 minutes) in CI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
stamp="$here/VERIFIED"
cd "$repo"

INPUTS=(tests/production docker-compose.yml deploy/compose/temporal-schema.sh
        deploy/compose/temporal-setup.sh deploy/compose/temporal-dynamicconfig.yaml
        deploy/base/scripts/search-attributes.sh workflows activities worker
        pyproject.toml constraints.txt tests/e2e/conftest.py tests/e2e/kit.py tests/polling.py
        tests/chaos/invariants.py)

inputs_hash() {
  # Tracked files only (plus new files not ignored), contents as in the working tree.
  git ls-files --cached --others --exclude-standard -- "${INPUTS[@]}" \
    | grep -v -e '^tests/production/VERIFIED$' -e '__pycache__' | LC_ALL=C sort -u \
    | while IFS= read -r f; do
        [[ -f "$f" ]] || continue
        printf '%s\n' "$f"
        sha256sum < "$f" | cut -d' ' -f1
      done | sha256sum | cut -c1-16
}

recorded() { [[ -f "$stamp" ]] && awk '$1 == "inputs" {print $2}' "$stamp"; }

case "${1:-}" in
  --hash) inputs_hash; exit 0 ;;
  --check)
    now=$(inputs_hash) was=$(recorded || true)
    if [[ "$now" == "$was" ]]; then
      echo "production tier: verified for these inputs ($now)"
      exit 0
    fi
    echo "production tier: inputs changed (${was:-never verified} -> $now)"
    exit 1
    ;;
  "") ;;
  *) echo "usage: $0 [--check|--hash]" >&2; exit 2 ;;
esac

before=$(inputs_hash)
server=$("$here/build.sh" | tail -n1)
py=${PYTHON:-$repo/.venv/bin/python}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
GPU_REMEDIATE_PRODUCTION="$server" "$py" -m pytest -q -p no:cacheprovider tests/production \
  | tee "$log"
summary=$(grep -E '^[0-9]+ (passed|failed)' "$log" | tail -n1 || true)
if grep -qE '(failed|error|skipped)' <<<"$summary" || [[ -z "$summary" ]]; then
  echo "production tier: not every test passed ($summary); VERIFIED left as it was" >&2
  exit 1
fi
if [[ "$(inputs_hash)" != "$before" ]]; then
  echo "production tier: inputs changed while it ran; run it again" >&2
  exit 1
fi
temporal=$(basename "$server")
postgres=$("$("$py" -c 'from tests.production.topology import postgres_bindir; print(postgres_bindir())')/postgres" --version 2>/dev/null || true)
cat > "$stamp" <<EOF
inputs $before
temporal ${temporal%%-*}
postgresql ${postgres:-unknown}
result $summary in $(( $(date +%s) - start )) s
EOF
echo "production tier: recorded $stamp"
cat "$stamp"
