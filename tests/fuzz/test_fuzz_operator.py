"""Fuzz: operator payloads (what a Temporal client sends with an update or signal) and what
the CLI prints of them. Properties: a payload decodes or is refused with a ValidationError,
the reason and operator are capped, and any text renders literally (no markup, no crash)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from rich.console import Console

from policy.models import Action
from tests.fuzz.strategies import budget, corpus, json_values
from worker.cli import commands as cli
from workflows.ids import MAX_OPERATOR_CHARS, MAX_REASON_CHARS
from workflows.messages import DetectorView, OperatorCommand, RemediationView
from workflows.transitions import NodeState, Step

texts = st.one_of(st.text(max_size=60), st.sampled_from(
    ["[/x]", "[bold]", "[link=http://x]y[/link]", ":smile:", "[/]", "\x1b[31m", "]["]),
    st.text(alphabet="[]/=:abc", max_size=20))
payloads = st.one_of(
    st.sampled_from([c.decode() for c in corpus("operator")]),
    st.fixed_dictionaries({"operator": st.one_of(texts, json_values),
                           "reason": st.one_of(texts, json_values)}).map(json.dumps),
    st.text(max_size=40),
)


def rendered(print_to: Console, call: Callable[[], object]) -> str:
    """What ``call`` prints on ``print_to`` (the CLI's own console, its settings as they are)."""
    # Rich's capture, not a swapped file: reading ``console.file`` resolves sys.stderr, and
    # writing it back would pin the console to this test's stream for every later test.
    with print_to.capture() as captured, contextlib.suppress(typer.Exit):
        call()
    return captured.get()


@budget(500)
@given(payloads)
def test_operator_payloads_decode_or_are_refused(text: str) -> None:
    try:
        cmd = OperatorCommand.model_validate_json(text)
    except ValidationError:
        return
    assert 1 <= len(cmd.operator) <= MAX_OPERATOR_CHARS and len(cmd.reason) <= MAX_REASON_CHARS


@budget(300)
@given(node=texts, reason=texts, error=texts)
def test_any_text_renders_literally(node: str, reason: str, error: str) -> None:
    view = RemediationView(node=node, state=NodeState.DRAINING, step=Step.DRAIN,
                           action=Action.REBOOT, reason=reason, dry_run=False,
                           since=datetime(2026, 1, 1, tzinfo=UTC))
    printed = rendered(cli.out, lambda: cli.out.print(cli._status_table([view]), width=400))
    assert "reboot" in printed
    printed = rendered(cli.err, lambda: cli.fail(error))
    if error.isprintable() and error == error.strip():  # rich drops control characters
        assert f"error: {error}" in printed.replace("\n", "")


def test_markup_in_a_detector_view_prints_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    view = DetectorView(paused=False, breaker_open=True, breaker_reason="[/x] tripped",
                        budget=1, in_flight=["[bold]n1"], waiting=[], last_tick=None,
                        last_errors=["n2: [/x]"], ticks_total=1, started_total=0)
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write": view)
    printed = rendered(cli.out, lambda: cli.detector_status(None, "table"))
    assert "[/x] tripped" in printed and "[bold]n1" in printed and "n2: [/x]" in printed
    assert "error: bad [/x] label" in rendered(cli.err, lambda: cli.fail("bad [/x] label"))
