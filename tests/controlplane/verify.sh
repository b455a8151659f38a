#!/usr/bin/env bash
# The real control-plane tier, run when its inputs change.
#
# The tier's inputs are the files whose behaviour it checks against a real kube-apiserver:
# the control plane itself (tests/controlplane), the cluster simulator and its contract suite,
# the activities that call the Kubernetes API, and the RBAC the worker runs with. Their hash
# at the last passing run is kept in tests/controlplane/VERIFIED (committed).
#
#   tests/controlplane/verify.sh           build (cached), run the tier, record the hash on success
#   tests/controlplane/verify.sh --check   exit 0 when VERIFIED matches the current inputs
#   tests/controlplane/verify.sh --hash    print the current inputs hash
#
# CI (.ci/run) runs the tier only when --check fails, so a change to any input either comes
# with a fresh VERIFIED from this script or pays the cold build (~10 minutes) in CI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
stamp="$here/VERIFIED"
cd "$repo"

INPUTS=(tests/controlplane sim/cluster tests/sim/testkit.py tests/polling.py tests/sim/test_cluster_api.py
        tests/sim/test_cluster_tables.py tests/sim/test_cluster_dra.py
        tests/sim/test_cluster_eviction.py tests/sim/test_cluster_authn.py
        worker/service/reports.py activities deploy/base/rbac.yaml)

inputs_hash() {
  # Tracked files only (plus new files not ignored), contents as in the working tree.
  git ls-files --cached --others --exclude-standard -- "${INPUTS[@]}" \
    | grep -v -e '^tests/controlplane/VERIFIED$' -e '__pycache__' | LC_ALL=C sort -u \
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
      echo "controlplane tier: verified for these inputs ($now)"
      exit 0
    fi
    echo "controlplane tier: inputs changed (${was:-never verified} -> $now)"
    exit 1
    ;;
  "") ;;
  *) echo "usage: $0 [--check|--hash]" >&2; exit 2 ;;
esac

before=$(inputs_hash)
binary=$("$here/build.sh" | tail -n1)
# The second version (DeviceTaintRule; tests/controlplane/k8s137): both stay tested.
binary_dra=$(MODULE=k8s137 "$here/build.sh" | tail -n1)
py=${PYTHON:-$repo/.venv/bin/python}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
GPU_REMEDIATE_CONTROLPLANE="$binary" GPU_REMEDIATE_CONTROLPLANE_DRA="$binary_dra" \
  "$py" -m pytest -q -p no:cacheprovider tests/controlplane \
  | tee "$log"
summary=$(grep -E '^[0-9]+ (passed|failed)' "$log" | tail -n1 || true)
if grep -qE '(failed|error|skipped)' <<<"$summary" || [[ -z "$summary" ]]; then
  echo "controlplane tier: not every test passed ($summary); VERIFIED left as it was" >&2
  exit 1
fi
if [[ "$(inputs_hash)" != "$before" ]]; then
  echo "controlplane tier: inputs changed while it ran; run it again" >&2
  exit 1
fi
k8s=$("$binary" --version 2>/dev/null | head -n1 || true)
k8s="$k8s, $("$binary_dra" --version 2>/dev/null | head -n1 || true)"
cat > "$stamp" <<EOF
inputs $before
kubernetes ${k8s:-unknown}
result $summary in $(( $(date +%s) - start )) s
EOF
echo "controlplane tier: recorded $stamp"
cat "$stamp"
