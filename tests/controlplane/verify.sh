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
cd "$here/../.."

TIER=controlplane
INPUTS=(tests/controlplane sim/cluster tests/sim/testkit.py tests/polling.py tests/sim/test_cluster_api.py
        tests/sim/test_cluster_tables.py tests/sim/test_cluster_dra.py
        tests/sim/test_cluster_eviction.py tests/sim/test_cluster_authn.py
        tests/sim/test_cluster_runtimeclasses.py
        worker/service/reports.py activities deploy/base/rbac.yaml tests/e2e/test_brownout.py
        tests/e2e/test_walking_skeleton.py tests/e2e/test_budget_under_load.py
        tests/e2e/test_fleet_scenarios.py)
# shellcheck source=tests/tier.sh
source tests/tier.sh
tier_main "$@"

binary=$(tests/controlplane/build.sh | tail -n1)
# The second version (DeviceTaintRule; tests/controlplane/k8s137): both stay tested.
binary_dra=$(MODULE=k8s137 tests/controlplane/build.sh | tail -n1)
tier_pytest GPU_REMEDIATE_CONTROLPLANE="$binary" GPU_REMEDIATE_CONTROLPLANE_DRA="$binary_dra" \
  -- tests/controlplane
k8s=$("$binary" --version 2>/dev/null | head -n1 || true)
k8s="$k8s, $("$binary_dra" --version 2>/dev/null | head -n1 || true)"
tier_record "kubernetes ${k8s:-unknown}"
