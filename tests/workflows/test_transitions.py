"""The state machine's table (workflows/transitions.py) is the diagram in docs/architecture.md:
same edges, same labels; and what the table allows beyond its edges."""

from __future__ import annotations

import re
from pathlib import Path

from workflows.transitions import TRANSITIONS, NodeState, allowed, why

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
EDGE = re.compile(r"^\s*(\w+) --> (\w+): (.+)$")


def _state(camel: str) -> NodeState:
    return NodeState(re.sub(r"(?<!^)([A-Z])", r"-\1", camel).lower())


def diagram_edges() -> dict[tuple[NodeState, NodeState], str]:
    text = ARCHITECTURE.read_text()
    block = text[text.index("stateDiagram-v2"):]
    block = block[:block.index("```")]
    return {(_state(m[1]), _state(m[2])): m[3].strip()
            for line in block.splitlines() if (m := EDGE.match(line))}


def test_the_diagram_and_the_table_have_the_same_edges_and_labels() -> None:
    table = {(a, b): label for a, to in TRANSITIONS.items() for b, label in to.items()}
    assert diagram_edges() == table


def test_every_state_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(NodeState)


def test_an_abort_may_release_from_anywhere_and_a_step_may_follow_a_step() -> None:
    for state in NodeState:
        assert allowed(state, NodeState.HEALTHY), state
        assert allowed(state, state), state
    assert why(NodeState.REPAIRING, NodeState.HEALTHY).startswith("released")


def test_edges_that_skip_the_drain_or_the_validation_are_refused() -> None:
    assert not allowed(NodeState.HEALTHY, NodeState.REPAIRING), "repair before the drain"
    assert not allowed(NodeState.AWAITING_APPROVAL, NodeState.REPAIRING), "no drain, no repair"
    assert not allowed(NodeState.CORDONED, NodeState.REPAIRING), "a hot node drains first"
    assert not allowed(NodeState.QUARANTINED, NodeState.DRAINING)
    assert why(NodeState.HEALTHY, NodeState.VALIDATING) == "not an edge of the state machine"


def test_every_failure_type_raised_or_matched_is_in_the_table() -> None:
    """workflows/errors.py names every ApplicationError type the code raises or matches: no
    string literal types left in the product."""
    import subprocess

    from workflows.errors import ERROR_TYPES

    root = ARCHITECTURE.parents[1]
    found = subprocess.run(
        ["git", "grep", "-n", "-E", r'(^|[^_a-z])type="[A-Z]|error_types=\[.*"[A-Z]',
         "--", "activities", "workflows", "worker"],
        cwd=root, capture_output=True, text=True).stdout
    assert found == "", f"literal failure types:\n{found}"
    assert all(why for why in ERROR_TYPES.values())
