# shellcheck shell=bash
# Shared by the opt-in tiers' verify.sh (tests/controlplane, tests/production, tests/browser):
# the inputs hash, --check/--hash, and the run that records VERIFIED only when every test
# passed and no input changed meanwhile. Sourced, never run; the caller sets TIER (its name),
# INPUTS (paths, relative to the repository root) and runs from the repository root.
#
#   tier_main "$@"          handles --check / --hash / usage (exits), returns for a run
#   tier_pytest ENV... -- ARGS   runs pytest (ARGS), sets tier_summary, fails the script unless
#                           every test passed and the inputs are as they were at the start
#   tier_record LINE...     writes VERIFIED: the inputs, the LINEs, the result and its time

tier_stamp="tests/$TIER/VERIFIED"
tier_py=${PYTHON:-$PWD/.venv/bin/python}

tier_hash() {
  # Tracked files only (plus new files not ignored), contents as in the working tree.
  git ls-files --cached --others --exclude-standard -- "${INPUTS[@]}" tests/tier.sh \
    | grep -v -e "^$tier_stamp\$" -e '__pycache__' | LC_ALL=C sort -u \
    | while IFS= read -r f; do
        [[ -f "$f" ]] || continue
        printf '%s\n' "$f"
        sha256sum < "$f" | cut -d' ' -f1
      done | sha256sum | cut -c1-16
}

tier_main() {
  local now was
  case "${1:-}" in
    --hash) tier_hash; exit 0 ;;
    --check)
      now=$(tier_hash)
      was=$([[ -f "$tier_stamp" ]] && awk '$1 == "inputs" {print $2}' "$tier_stamp" || true)
      if [[ "$now" == "$was" ]]; then
        echo "$TIER tier: verified for these inputs ($now)"
        exit 0
      fi
      echo "$TIER tier: inputs changed (${was:-never verified} -> $now)"
      exit 1
      ;;
    "") ;;
    *) echo "usage: $0 [--check|--hash]" >&2; exit 2 ;;
  esac
  tier_before=$(tier_hash)
  tier_start=$(date +%s)
}

tier_pytest() {
  local envs=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  tier_log=$(mktemp)
  trap 'rm -f "$tier_log"' EXIT
  env "${envs[@]}" "$tier_py" -m pytest -q -p no:cacheprovider "$@" | tee "$tier_log"
  tier_summary=$(grep -E '^[0-9]+ (passed|failed)' "$tier_log" | tail -n1 || true)
  if grep -qE '(failed|error|skipped)' <<<"$tier_summary" || [[ -z "$tier_summary" ]]; then
    echo "$TIER tier: not every test passed ($tier_summary); VERIFIED left as it was" >&2
    exit 1
  fi
  if [[ "$(tier_hash)" != "$tier_before" ]]; then
    echo "$TIER tier: inputs changed while it ran; run it again" >&2
    exit 1
  fi
}

tier_record() {
  {
    echo "inputs $tier_before"
    printf '%s\n' "$@"
    echo "result $tier_summary in $(( $(date +%s) - tier_start )) s"
  } > "$tier_stamp"
  echo "$TIER tier: recorded $tier_stamp"
  cat "$tier_stamp"
}
