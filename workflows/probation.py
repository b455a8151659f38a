"""Probation and lemons: what the ledger changes about a flagged node's action, and why.

Pure code over one verdict and what the ledger says of its node (``LedgerNote``), run by
admission (workflows/admission.py) and so alike by the detector and `gpu-remediate plan`:

- Lemon: a GPU (by serial) whose earlier faults within ``ledger.lemon_window`` and this one
  are more than ``ledger.lemon_faults`` is quarantined for review, with the entries as
  evidence. Only a node flagged on its own is changed, and only for a GPU its verdict names:
  a serial is exporter text, so a node claiming another GPU's serial can at worst get
  itself quarantined, never a healthy node elsewhere.
- Probation: a node flagged again within ``ledger.probation`` of its last return to service
  after a repair goes to the next rung (reset -> reboot -> quarantine) instead of repeating
  the action that did not hold.

No I/O imports: workflow code imports this module through the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from policy.models import Action, Finding, Verdict
from workflows.ledger import LedgerNote, gpus_of
from workflows.settings import LedgerSettings

RUNGS = (Action.RESET, Action.REBOOT, Action.QUARANTINE)
"""The repair ladder, gentlest first."""
RULE_PROBATION = "probation-relapse"
RULE_LEMON = "lemon-gpu"


@dataclass(frozen=True)
class ProbationDecision:
    verdict: Verdict
    why: str = ""
    """Empty: the verdict stands as the policy made it."""


def next_rung(action: str) -> Action:
    """The rung above ``action`` (quarantine stays quarantine)."""
    names = [r.value for r in RUNGS]
    i = names.index(action) if action in names else -1
    return RUNGS[min(i + 1, len(RUNGS) - 1)] if i >= 0 else RUNGS[0]


def decide(verdict: Verdict, note: LedgerNote | None, now: datetime,
           settings: LedgerSettings) -> ProbationDecision:
    """The verdict admission acts on: the policy's, a lemon's quarantine, or the next rung
    for a relapse in probation; ``why`` says which and names the evidence."""
    if note is None or verdict.action not in (Action.RESET, Action.REBOOT):
        return ProbationDecision(verdict)
    since = now - settings.lemon_window
    for gpu in gpus_of(verdict):
        earlier = [f for f in note.serial_faults.get(gpu.serial, []) if f.at >= since] \
            if gpu.serial else []
        if len(earlier) + 1 > settings.lemon_faults:
            nodes = sorted({f.node for f in earlier})
            why = (f"lemon: GPU serial {gpu.serial} (gpu {gpu.index}) has {len(earlier) + 1} "
                   f"faults within {_span(settings.lemon_window)} (more than "
                   f"{settings.lemon_faults}; "
                   f"earlier on {', '.join(nodes)[:200]}; entries "
                   f"{', '.join(f.entry for f in earlier[-5:])}): quarantined for review")
            return ProbationDecision(_changed(verdict, Action.QUARANTINE, RULE_LEMON, why,
                                              gpu.index, gpu.uuid, gpu.serial), why)
    last = note.last_repair
    if last is None or settings.probation <= timedelta(0) \
            or not timedelta(0) <= now - last.finished <= settings.probation:
        return ProbationDecision(verdict)
    rung = next_rung(last.action)
    if RUNGS.index(rung) <= RUNGS.index(verdict.action):
        return ProbationDecision(verdict)
    why = (f"probation: {last.action} for {last.fault or 'a fault'} returned the node "
           f"{_ago(now - last.finished)} ago (within {_span(settings.probation)} of probation) "
           f"and it is flagged again ({verdict.action.value}); next rung: {rung.value}")
    return ProbationDecision(_changed(verdict, rung, RULE_PROBATION, why), why)


def _changed(verdict: Verdict, action: Action, rule: str, why: str, gpu: str = "all",
             uuid: str = "", serial: str = "") -> Verdict:
    return verdict.model_copy(update={"action": action, "findings": [
        Finding(gpu=gpu or "all", uuid=uuid, serial=serial, signal="ledger", value=0,
                rule=rule, action=action, detail=why[:500]),
        *verdict.findings]})


def _span(delta: timedelta) -> str:
    """A setting's duration the way the config writes it: 30d, 24h, 90m, 45s."""
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        # Days from two on: a day's probation reads as the config's PT24H.
        if seconds and seconds % size == 0 and (unit != "d" or seconds >= 2 * size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m"
