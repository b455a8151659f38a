#!/usr/bin/env bash
# One entry point for a fresh clone:
#   ./dev.sh up     install, then run everything locally (Temporal UI on http://localhost:8233)
#   ./dev.sh test   install, then run lint, type checks and the whole test suite
# Extra arguments go to `gpu-remediate up` or to pytest.
set -euo pipefail
# The banner of `up` names commands relative to the caller's shell, not to this directory.
export GPU_REMEDIATE_SHELL_DIR=${GPU_REMEDIATE_SHELL_DIR:-$PWD}
cd "$(dirname "$0")"

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

ensure_env() {
  local extra=$1
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: Python 3.11 or newer is required ($PYTHON is $("$PYTHON" -V 2>&1))" >&2
    exit 2
  fi
  if [[ ! -x $VENV/bin/python ]]; then
    echo "==> creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  if [[ ! -x $VENV/bin/uv ]]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
  fi
  echo "==> installing gpu-remediate[$extra] (pinned by constraints.txt)"
  "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
    -c constraints.txt -e ".[$extra]"
}

case "${1:-}" in
  up)
    shift
    ensure_env local
    exec "$VENV/bin/gpu-remediate" up "$@"
    ;;
  test)
    shift
    ensure_env test
    echo "==> ruff"
    "$VENV/bin/ruff" check .
    echo "==> mypy"
    "$VENV/bin/mypy" policy activities workflows worker sim tools
    echo "==> import layers (lint-imports)"
    "$VENV/bin/lint-imports" --no-cache
    echo "==> shellcheck"
    # Every shell script: *.sh, and files whose first line is a shell shebang (.ci/run).
    scripts=()
    while IFS= read -r -d '' file; do
      first=
      [[ $file == *.sh ]] || IFS= read -r first < "$file" || true
      if [[ $file == *.sh || $first =~ ^\#!.*[/\ ](ba|da|k)?sh([[:space:]]|$) ]]; then
        scripts+=("$file")
      fi
    done < <(find . \( -name .git -o -name "$(basename "$VENV")" -o -name node_modules \
                      -o -name .gpu-remediate -o -name '*.egg-info' \) -prune \
                    -o -type f -print0 | LC_ALL=C sort -z)
    "$VENV/bin/shellcheck" "${scripts[@]}"
    pytest=("$VENV/bin/pytest" -q -p no:cacheprovider --durations=25)
    if [[ $# -gt 0 ]]; then
      # Named tests or options: one run, as asked.
      echo "==> pytest"
      set +e
      "${pytest[@]}" "$@"
      status=$?
      set -e
      if [[ $status -eq 5 ]]; then
        echo "error: pytest collected no tests" >&2
        exit 1
      fi
      exit $status
    fi
    # The whole suite in two phases. Unit, workflow and deploy tests do not depend on the
    # wall clock: two processes share them (pytest-xdist). The tiers that run processes
    # against real time (end-to-end, chaos, control plane, production, browser) run one at
    # a time afterwards, with the machine to themselves.
    tiers="e2e or controlplane or production or browser"
    echo "==> pytest: unit, workflow and deploy tests (2 processes)"
    set +e
    "${pytest[@]}" -n 2 -m "not ($tiers)"
    first=$?
    echo "==> pytest: end-to-end tiers (one at a time)"
    "${pytest[@]}" -m "$tiers"
    second=$?
    set -e
    if [[ $first -eq 5 || $second -eq 5 ]]; then
      echo "error: a pytest phase collected no tests" >&2
      exit 1
    fi
    if [[ $first -ne 0 || $second -ne 0 ]]; then
      echo "error: pytest failed (unit phase exit $first, tier phase exit $second)" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: ./dev.sh up [gpu-remediate up options] | ./dev.sh test [pytest options]" >&2
    exit 2
    ;;
esac
