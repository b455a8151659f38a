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
repo=$(cd "$here/../.." && pwd)
stamp="$here/VERIFIED"
cd "$repo"

INPUTS=(tests/browser workflows/remediation.py workflows/messages.py workflows/ui_text.py
        workflows/search_attributes.py worker/ui_links.py worker/stack pyproject.toml
        constraints.txt tests/e2e/conftest.py tests/e2e/kit.py tests/polling.py)

inputs_hash() {
  # Tracked files only (plus new files not ignored), contents as in the working tree.
  git ls-files --cached --others --exclude-standard -- "${INPUTS[@]}" \
    | grep -v -e '^tests/browser/VERIFIED$' -e '__pycache__' | LC_ALL=C sort -u \
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
      echo "browser tier: verified for these inputs ($now)"
      exit 0
    fi
    echo "browser tier: inputs changed (${was:-never verified} -> $now)"
    exit 1
    ;;
  "") ;;
  *) echo "usage: $0 [--check|--hash]" >&2; exit 2 ;;
esac

before=$(inputs_hash)
py=${PYTHON:-$repo/.venv/bin/python}
browser=${GPU_REMEDIATE_BROWSER:-system}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
GPU_REMEDIATE_BROWSER="$browser" "$py" -m pytest -q -p no:cacheprovider tests/browser \
  | tee "$log"
summary=$(grep -E '^[0-9]+ (passed|failed)' "$log" | tail -n1 || true)
if grep -qE '(failed|error|skipped)' <<<"$summary" || [[ -z "$summary" ]]; then
  echo "browser tier: not every test passed ($summary); VERIFIED left as it was" >&2
  exit 1
fi
if [[ "$(inputs_hash)" != "$before" ]]; then
  echo "browser tier: inputs changed while it ran; run it again" >&2
  exit 1
fi
if [[ "$browser" == system ]]; then
  browser=$(command -v chromium || command -v chromium-browser || echo chromium)
fi
chromium=$("$browser" --version 2>/dev/null | grep -o 'Chromium [0-9.]*' | head -n1 || true)
ui=$("$(dirname "$py")/temporal" --version 2>/dev/null | grep -o 'UI [0-9.]*' || true)
cat > "$stamp" <<EOF2
inputs $before
browser ${chromium:-unknown}
temporal ${ui:-unknown}
result $summary in $(( $(date +%s) - start )) s
EOF2
echo "browser tier: recorded $stamp"
cat "$stamp"
