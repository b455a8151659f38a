"""Every ``workflow.patched("<id>")`` has a recorded history that took its new branch.

test_replay.py replays what is in tests/histories/; a patched branch no history took is
never replayed, so a later change to it could break running workflows unseen. The ids
are read from workflows/ and its subpackages by AST (a string literal, or a module-level
constant of that module or imported from another workflows module), and each must be a
``core_patch`` marker in some history. ``python -m tests.histories.record --missing`` records them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.histories.record import SCENARIOS, patch_ids, recorded
from workflows import versions

RECORD = ".venv/bin/python -m tests.histories.record --missing"


def test_every_patch_id_has_a_history_that_took_its_branch() -> None:
    ids = patch_ids()
    taken = recorded()
    lacking = {pid: where for pid, where in sorted(ids.items()) if pid not in taken}
    assert not lacking, (
        f"{len(lacking)} workflow.patched id(s) without a recorded history that takes the "
        "new branch (no core_patch marker in tests/histories/*.json): "
        + "; ".join(f"{pid} ({', '.join(where)})" for pid, where in lacking.items())
        + f". Record them: {RECORD} (add a scenario to SCENARIOS in "
        "tests/histories/record.py if none goes down that branch).")


def test_every_folded_id_shipped_with_a_marker_of_its_own() -> None:
    """The release marker answers only for ids that existed before it (workflows/
    versions.py). A run under this release never records a folded id, so an id folded
    after runs recorded the release marker could have no history with its own marker:
    this is the check that refuses it (ask a new id with ``versions.patched`` unfolded)."""
    own = recorded(folded=False)
    unproven = sorted(versions.FOLDED - set(own))
    assert not unproven, (
        f"folded patch id(s) with no history that recorded them on their own: {unproven}; "
        "a patch added after the release marker must stay out of versions.FOLDED")
    assert set(patch_ids()) >= versions.FOLDED, "a folded id the workflows no longer ask"
    assert versions.RELEASE_PATCH in patch_ids()


def test_the_workflows_hold_the_ids_this_check_is_known_to_need() -> None:
    """The collector sees all three spellings: a literal, a module constant, and a constant
    imported from another workflows module (inside the passed-through imports block)."""
    ids = patch_ids()
    assert "jobs-polled-by-retry" in ids                # literal
    assert "remediation-holds-a-lease" in ids           # LEASE_PATCH, same module
    assert "detector-node-reports" in ids               # NODE_REPORT_PATCH from reports.py
    assert any(w.startswith("workflows/commands.py:") for w in ids["operator-command-rules"])


def test_every_scenario_names_real_patch_ids() -> None:
    """A scenario that claims an id the code no longer has is stale: --missing would pick
    the wrong one first."""
    ids = set(patch_ids())
    stale = {s.name: sorted(set(s.takes) - ids) for s in SCENARIOS if set(s.takes) - ids}
    assert not stale, stale


def _workflows(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "workflows"
    root.mkdir()
    (root / "ids.py").write_text('OTHER_PATCH = "from-another-module"\n')
    (root / "flow.py").write_text(source)
    return root


def test_a_new_patch_id_without_a_history_is_found(tmp_path: Path) -> None:
    """What makes the check fail: an id in the sources that no history took."""
    root = _workflows(tmp_path, (
        "from temporalio import workflow\n"
        "with workflow.unsafe.imports_passed_through():\n"
        "    from workflows.ids import OTHER_PATCH\n"
        'MINE = "a-module-constant"\n'
        "def f():\n"
        '    if workflow.patched("brand-new-branch"):\n'
        "        return workflow.patched(MINE) or workflow.patched(OTHER_PATCH)\n"))
    found = patch_ids(root)
    assert found == {"brand-new-branch": ["workflows/flow.py:6"],
                     "a-module-constant": ["workflows/flow.py:7"],
                     "from-another-module": ["workflows/flow.py:7"]}
    assert set(found) - set(recorded()) == set(found)


def test_a_patch_id_in_a_subpackage_is_found(tmp_path: Path) -> None:
    """The remediation's step modules live in a subpackage: an id there, from a constant
    of a sibling module, is found under its dotted module name."""
    root = _workflows(tmp_path, "")
    (root / "steps").mkdir()
    (root / "steps" / "base.py").write_text('SIBLING_PATCH = "from-a-sibling"\n')
    (root / "steps" / "drain.py").write_text(
        "from temporalio import workflow\n"
        "from workflows.steps.base import SIBLING_PATCH\n"
        "def f():\n"
        "    return workflow.patched(SIBLING_PATCH) or workflow.patched(\"nested-literal\")\n")
    assert patch_ids(root) == {"from-a-sibling": ["workflows/steps/drain.py:4"],
                               "nested-literal": ["workflows/steps/drain.py:4"]}


def test_a_patch_id_the_check_cannot_read_is_an_error(tmp_path: Path) -> None:
    """An id built at run time would hide from the check: refused, with where it is."""
    root = _workflows(tmp_path, (
        "from temporalio import workflow\n"
        "def f(kind):\n"
        '    return workflow.patched(f"{kind}-patch")\n'))
    with pytest.raises(ValueError, match=r"workflows/flow.py:3: .*string literal"):
        patch_ids(root)
