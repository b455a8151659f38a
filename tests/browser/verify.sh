#!/usr/bin/env bash
# The browser tier (the Temporal UI paths in Debian's Chromium), run when its inputs change.
#
# The tier's inputs are the files whose behaviour it checks in the UI: the tier itself
# (tests/browser), what the remediation shows and accepts there (its handlers and their
# descriptions, its current details, the operator rules, the search attributes), the link the
# CLI prints, the local stack that serves the UI, the pins of the dev server (and so of the UI
# it bundles) and of Playwright, and the shared end-to-end helpers it uses. Their hash at the
# last passing run is kept in tests/browser/VERIFIED (committed).
#
#   tests/browser/verify.sh           run the tier (Chromium from PATH), record the hash on success
#   tests/browser/verify.sh --check   exit 0 when VERIFIED matches the current inputs
#   tests/browser/verify.sh --hash    print the current inputs hash
#
# CI (.ci/run) runs the tier only when --check fails: it installs Debian's chromium then
# (Playwright never downloads a browser) and the tier takes about 3 minutes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here/../.."

TIER=browser
INPUTS=(tests/browser workflows/remediation.py workflows/steps workflows/messages.py
        workflows/ui_text.py workflows/search_attributes.py worker/ui_links.py worker/stack
        pyproject.toml constraints.txt tests/e2e/conftest.py tests/e2e/kit.py tests/polling.py)
# shellcheck source=tests/tier.sh
source tests/tier.sh
tier_main "$@"

browser=${GPU_REMEDIATE_BROWSER:-system}
tier_pytest GPU_REMEDIATE_BROWSER="$browser" -- tests/browser
if [[ "$browser" == system ]]; then
  browser=$(command -v chromium || command -v chromium-browser || echo chromium)
fi
chromium=$("$browser" --version 2>/dev/null | grep -o 'Chromium [0-9.]*' | head -n1 || true)
ui=$("$(dirname "$tier_py")/temporal" --version 2>/dev/null | grep -o 'UI [0-9.]*' || true)
tier_record "browser ${chromium:-unknown}" "temporal ${ui:-unknown}"
