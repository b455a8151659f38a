"""Operator commands that arrive as signals: decoding what a person typed into the Temporal
UI (or `temporal workflow signal`, or a script), and who asked for a cancel.

A signal cannot answer its sender, so nothing here raises past the handler: a payload
that is missing, not JSON or not an operator command becomes a ValueError whose text the
workflow records where an operator looks (its view, a Warning Event, the log).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows.messages import OperatorCommand

EXPECTED = '{"operator": "your name", "reason": "why"}'


def decode_command(raw: RawValue) -> OperatorCommand:
    """An operator command from a signal's raw payload; ValueError says what is wrong."""
    try:
        value = workflow.payload_converter().from_payload(raw.payload)
    except Exception as err:  # an undecodable payload is the operator's error to see
        raise ValueError(f"the payload is missing or not JSON; send {EXPECTED}") from err
    if not isinstance(value, dict):
        raise ValueError(f"the payload must be an object like {EXPECTED}, "
                         f"not {type(value).__name__}")
    # The operator-command rules (a reason, a person's name, printable text) hold for a
    # signal as for its update; a history from before them replays as it ran.
    rules = versions.patched("operator-command-rules")
    try:
        return OperatorCommand.model_validate(value, context={"operator_rules": rules})
    except ValidationError as err:
        raise ValueError("; ".join(_problem(e) for e in err.errors(include_input=False))
                         ) from err


def _problem(error: Any) -> str:
    """One validation error as "field: what", its message cleaned of pydantic's prefix."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


CANCEL_REQUESTER = "a cancel request"
"""Who aborted, when a cancel's reason names no one."""


def abort_requester(reason: str) -> tuple[str, str]:
    """Who and why from a cancel request's reason. The CLI sends "by OPERATOR: WHY"; a
    cancel from the UI or `temporal workflow cancel` carries whatever its user typed."""
    if reason.startswith("by ") and ": " in reason:
        who, why = reason[3:].split(": ", 1)
        if who.strip():
            return who.strip()[:100], why[:500] or "no reason given"
    return CANCEL_REQUESTER, reason[:500] or "workflow cancelled (no reason given)"


def checked_command(raw: RawValue, check: Callable[[OperatorCommand], None],
                    ) -> tuple[OperatorCommand | None, str | None]:
    """A signal's command and why it is refused (None when it may be applied): the
    update's validator runs on it, so a signal is held to the same rules as its update."""
    cmd: OperatorCommand | None = None
    try:
        cmd = decode_command(raw)
        check(cmd)
    except (ApplicationError, ValueError) as err:
        return cmd, str(getattr(err, "message", None) or err)
    return cmd, None
