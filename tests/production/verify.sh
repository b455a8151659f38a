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
cd "$here/../.."

TIER=production
INPUTS=(tests/production docker-compose.yml deploy/compose/temporal-schema.sh
        deploy/compose/temporal-setup.sh deploy/compose/temporal-dynamicconfig.yaml
        deploy/base/scripts/search-attributes.sh workflows activities worker
        pyproject.toml constraints.txt tests/e2e/conftest.py tests/e2e/kit.py tests/polling.py
        tests/chaos/invariants.py)
# shellcheck source=tests/tier.sh
source tests/tier.sh
tier_main "$@"

server=$(tests/production/build.sh | tail -n1)
tier_pytest GPU_REMEDIATE_PRODUCTION="$server" -- tests/production
temporal=$(basename "$server")
postgres=$("$("$tier_py" -c 'from tests.production.topology import postgres_bindir; print(postgres_bindir())')/postgres" --version 2>/dev/null || true)
tier_record "temporal ${temporal%%-*}" "postgresql ${postgres:-unknown}"
