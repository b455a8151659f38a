"""The repair ledger: what each remediation did and how it ended, kept for the fleet.

One entry per outcome a remediation writes (returned to service, quarantined, released,
aborted): the node's name and UID, the GPUs the fault named (UUID, serial, index), the
fault (the strongest finding's rule), the action taken, the time spent in each state, the
outcome, and which earlier entry it relapses (the same node or GPU flagged again within
``ledger.relapse_window`` of that entry's return to service). The store is
activities/ledger.py (ConfigMaps the worker owns; a node cannot write them); this module
is pure: the entry, the relapse and lemon rules, and the report's figures, used alike by
the activity that writes, the observation that reads for admission, and `report`.

Serials are exporter text. They identify a lemon candidate; they never make a node that
shows no fault act: a lemon's evidence changes the action only of a node flagged on its
own, on the GPU that reports that serial (workflows/probation.py), and a serial reported
by two nodes in one window is shown as a conflict (docs/operations.md).

No I/O imports: workflow code imports this module through the sandbox.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from policy.models import Verdict

MAX_TEXT = 300
MAX_KEY = 128
MAX_GPUS_PER_ENTRY = 16
"""A node has at most 16 GPUs (MIG aside): more named in one entry is cut."""
MAX_STEPS = 16
"""Distinct states a remediation passes through (workflows/transitions.py has fewer)."""
MAX_ENTRY_BYTES = 8 * 1024
"""The largest entry within the bounds above (tests/workflows/test_ledger.py)."""
MAX_EVIDENCE = 12
"""Earlier faults kept as evidence per serial in one observation (``ledger.lemon_faults``
is at most ``MAX_EVIDENCE - 2``, so a lemon is always seen)."""

REPAIR_ACTIONS = ("reset", "reboot")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class LedgerGpu(_Model):
    """A GPU the fault named: its UUID and serial as the exporter showed them (node input)."""

    index: str = ""
    uuid: str = ""
    serial: str = ""


class StepTime(_Model):
    """Time spent in one state of the state machine (summed over its visits)."""

    state: str
    seconds: float = Field(ge=0)


class LedgerEntry(_Model):
    """One remediation outcome, as stored (one key of a ledger shard)."""

    schema_version: int = 1
    id: str
    node: str
    node_uid: str = ""
    gpus: list[LedgerGpu] = Field(default_factory=list)
    gpu_count: int = Field(default=0, ge=0, description="GPUs of the node out of service.")
    fault: str = ""
    verdict_action: str = ""
    action: str = Field(description="What was done: reset, reboot, quarantine, thermal, or "
                                    "the verdict's action when no repair ran.")
    outcome: str
    why: str = ""
    started: datetime
    finished: datetime
    accounted_from: datetime | None = Field(
        default=None, description="Start of the out-of-service time this entry accounts for "
                                  "(after a quarantine's own entry: its end).")
    steps: list[StepTime] = Field(default_factory=list)
    attempts: int = 0
    workflow_id: str = ""
    relapse_of: str = Field(default="", description="The earlier entry this one relapses.")
    relapse_by: Literal["", "node", "gpu"] = ""

    @property
    def seconds(self) -> float:
        return max(0.0, (self.finished - self.started).total_seconds())

    @property
    def gpu_hours_lost(self) -> float:
        since = self.accounted_from or self.started
        return max(0.0, (self.finished - since).total_seconds()) / 3600 * self.gpu_count

    @property
    def returned(self) -> bool:
        """Returned to service after a repair: what a later fault relapses."""
        return self.outcome == "healthy"

    def serials(self) -> set[str]:
        return {g.serial for g in self.gpus if g.serial}

    def uuids(self) -> set[str]:
        return {g.uuid for g in self.gpus if g.uuid}

    def bounded(self) -> LedgerEntry:
        return self.model_copy(update={
            "id": self.id[:MAX_KEY], "node": self.node[:253], "node_uid": self.node_uid[:MAX_KEY],
            "gpus": [g.model_copy(update={"index": g.index[:16], "uuid": g.uuid[:MAX_KEY],
                                          "serial": g.serial[:64]})
                     for g in self.gpus[:MAX_GPUS_PER_ENTRY]],
            "fault": self.fault[:MAX_KEY], "verdict_action": self.verdict_action[:32],
            "action": self.action[:32], "outcome": self.outcome[:32], "why": self.why[:MAX_TEXT],
            "steps": [t.model_copy(update={"state": t.state[:32]})
                      for t in self.steps[:MAX_STEPS]], "workflow_id": self.workflow_id[:300],
            "relapse_of": self.relapse_of[:MAX_KEY]})


def entry_id(workflow_id: str, started: datetime, finished: datetime) -> str:
    """Stable across retries of the write: a retried write finds its own entry."""
    text = f"{workflow_id}|{started.isoformat()}|{finished.isoformat()}"
    return "e-" + hashlib.sha256(text.encode()).hexdigest()[:20]


def fault_of(verdict: Verdict) -> str:
    """The rule of the strongest finding (the one that chose the action)."""
    for f in verdict.findings:
        if f.action == verdict.action:
            return f.rule
    return verdict.findings[0].rule if verdict.findings else ""


def gpus_of(verdict: Verdict) -> list[LedgerGpu]:
    """The GPUs the verdict's findings name (not "all"), once each."""
    out: dict[str, LedgerGpu] = {}
    for f in verdict.findings:
        if f.gpu == "all" and not f.uuid:
            continue
        key = f.uuid or f"index:{f.gpu}"
        if key not in out:
            out[key] = LedgerGpu(index=f.gpu, uuid=f.uuid, serial=f.serial)
    return list(out.values())[:MAX_GPUS_PER_ENTRY]


_REPAIR_STEPS = {"gpu-reset": "reset", "reboot": "reboot", "rebooted": "reboot"}


def action_taken(steps: Sequence[tuple[datetime, str, str]], verdict_action: str,
                 outcome: str) -> str:
    """Quarantine for a node that was held (its release, validated, returns it: what fixed
    it was a human's), else the last repair that ran (from the transitions' steps), else
    the verdict's action."""
    if outcome == "quarantined" or any(state == "quarantined" for _, state, _ in steps):
        return "quarantine"
    taken = ""
    for _, _, step in steps:
        taken = _REPAIR_STEPS.get(step, taken)
    return taken or verdict_action


def step_times(transitions: Sequence[tuple[datetime, str, str]],
               until: datetime) -> list[StepTime]:
    """Seconds per state out of service, in the order first entered, from (at, state, step)
    transitions (healthy, before the claim and at the release, is not a step)."""
    totals: dict[str, float] = {}
    for (at, state, _), nxt in zip(transitions, [*transitions[1:], None], strict=True):
        if state == "healthy":
            continue
        end = nxt[0] if nxt is not None else until
        totals[state] = totals.get(state, 0.0) + max(0.0, (end - at).total_seconds())
    return [StepTime(state=s, seconds=round(v, 3)) for s, v in totals.items()][:MAX_STEPS]


class LedgerInput(_Model):
    entry: LedgerEntry


class LedgerResult(_Model):
    entry: str
    written: bool = Field(description="False: a retried write found the entry already there.")
    relapse_of: str = ""
    relapse_by: Literal["", "node", "gpu"] = ""


# ------------------------------------------------------------------ relapses


def same_node(a: LedgerEntry, b: LedgerEntry) -> bool:
    """The same machine: the same UID, a GPU UUID in common (re-created under another UID),
    or, without UIDs, the same name."""
    if a.node_uid and a.node_uid == b.node_uid:
        return True
    if a.uuids() & b.uuids():
        return True
    return not (a.node_uid and b.node_uid) and a.node == b.node


def relapse(new: LedgerEntry, earlier: Iterable[LedgerEntry],
            window: timedelta) -> tuple[str, Literal["", "node", "gpu"]]:
    """The latest earlier entry that returned its node to service within ``window`` before
    ``new`` started, on the same node or sharing a GPU serial, and by which."""
    best: tuple[datetime, str, Literal["", "node", "gpu"]] | None = None
    for e in earlier:
        if e.id == new.id or (e.workflow_id == new.workflow_id and e.started == new.started):
            continue
        if not e.returned or e.finished > new.started or new.started - e.finished > window:
            continue
        by: Literal["", "node", "gpu"] = (
            "node" if same_node(e, new) else "gpu" if e.serials() & new.serials() else "")
        if by and (best is None or e.finished > best[0]):
            best = (e.finished, e.id, by)
    return ("", "") if best is None else (best[1], best[2])


def one_per_remediation(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """One entry per remediation (the latest): a quarantine and the release that validated
    it later are two entries of one fault, never two faults."""
    latest: dict[tuple[str, datetime], LedgerEntry] = {}
    for e in entries:
        key = (e.workflow_id or e.id, e.started)
        if key not in latest or e.finished > latest[key].finished:
            latest[key] = e
    return list(latest.values())


# ------------------------------------------------------------------ what admission reads


class LastRepair(_Model):
    """A node's latest return to service after a repair (from the ledger)."""

    action: str
    fault: str = ""
    finished: datetime
    entry: str = ""


class SerialFault(_Model):
    """An earlier fault of a GPU, by serial: one ledger entry that named it."""

    at: datetime
    node: str
    node_uid: str = ""
    fault: str = ""
    entry: str = ""


class LedgerNote(_Model):
    """What the ledger says about one flagged node, for admission (workflows/probation.py)."""

    last_repair: LastRepair | None = None
    serial_faults: dict[str, list[SerialFault]] = Field(
        default_factory=dict, description="Serial of a GPU the verdict names -> its earlier "
                                          "faults in the lookback, newest last.")


def note_for(verdict: Verdict, node_uid: str, entries: Sequence[LedgerEntry],
             since: datetime) -> LedgerNote:
    """The node's last repair and the earlier faults of the serials its verdict names,
    from ``entries`` (any order) finished at or after ``since``."""
    return notes_for([verdict], {verdict.node: node_uid}, entries, since)[verdict.node]


def notes_for(verdicts: Sequence[Verdict], uids: Mapping[str, str],
              entries: Sequence[LedgerEntry], since: datetime) -> dict[str, LedgerNote]:
    """``note_for`` of every verdict, indexing the entries once (a tick with many flagged
    nodes reads a month of entries once, not once per node)."""
    recent = sorted((e for e in entries if e.finished >= since), key=lambda e: e.finished)
    repairs: dict[str, list[LedgerEntry]] = {}
    for e in recent:
        if e.returned and e.action in REPAIR_ACTIONS:
            for key in {f"uid:{e.node_uid}", f"name:{e.node}", *(f"gpu:{u}" for u in e.uuids())}:
                repairs.setdefault(key, []).append(e)
    by_serial: dict[str, list[LedgerEntry]] = {}
    for e in sorted(one_per_remediation(recent), key=lambda e: e.finished):
        for serial in e.serials():
            by_serial.setdefault(serial, []).append(e)
    out: dict[str, LedgerNote] = {}
    for v in verdicts:
        probe = LedgerEntry(id="", node=v.node, node_uid=uids.get(v.node, ""), gpus=gpus_of(v),
                            action="", outcome="", started=since, finished=since)
        keys = {f"uid:{probe.node_uid}", f"name:{probe.node}",
                *(f"gpu:{u}" for u in probe.uuids())}
        mine = [e for k in keys for e in repairs.get(k, []) if same_node(e, probe)]
        last = max(mine, key=lambda e: e.finished, default=None)
        out[v.node] = LedgerNote(
            last_repair=None if last is None else LastRepair(
                action=last.action, fault=last.fault, finished=last.finished, entry=last.id),
            serial_faults={s: [SerialFault(at=e.started, node=e.node, node_uid=e.node_uid,
                                           fault=e.fault, entry=e.id)
                               for e in by_serial[s][-MAX_EVIDENCE:]]
                           for s in sorted(probe.serials()) if s in by_serial})
    return out


# ------------------------------------------------------------------ the report


class ActionFigures(_Model):
    action: str
    repairs: int
    mttr_seconds: float | None = None
    relapses: int = 0
    relapse_rate: float | None = None


class FaultFigures(_Model):
    action: str
    fault: str
    repairs: int
    relapses: int
    relapse_rate: float | None = None


class Lemon(_Model):
    kind: Literal["gpu", "node"]
    key: str = Field(description="The GPU's serial or the node's UID (its name without one).")
    faults: int
    nodes: list[str] = Field(default_factory=list)
    conflict: bool = Field(default=False, description="A serial two nodes reported at once.")
    entries: list[str] = Field(default_factory=list)


class RepairReport(_Model):
    since: datetime
    until: datetime
    entries: int
    unreadable: int = 0
    actions: list[ActionFigures] = Field(default_factory=list)
    faults: list[FaultFigures] = Field(default_factory=list)
    lemons: list[Lemon] = Field(default_factory=list)
    gpu_hours_lost: float = 0.0
    availability_lost: float | None = Field(
        default=None, description="GPU-hours lost / GPU-hours of the fleet in the period "
                                  "(when the fleet's GPU count is known).")


def relapsed_ids(entries: Iterable[LedgerEntry]) -> set[str]:
    return {e.relapse_of for e in entries if e.relapse_of}


def lemons(entries: Sequence[LedgerEntry], *, faults: int, window: timedelta,
           now: datetime) -> list[Lemon]:
    """GPUs (by serial) and nodes (by UID) with more than ``faults`` entries started within
    ``window`` before ``now``. A serial reported by two nodes within one hour is marked as a
    conflict: one of them may be claiming another's GPU."""
    since = now - window
    recent = sorted((e for e in one_per_remediation(entries) if e.started >= since),
                    key=lambda e: e.started)
    by_serial: dict[str, list[LedgerEntry]] = {}
    by_node: dict[str, list[LedgerEntry]] = {}
    for e in recent:
        for s in e.serials():
            by_serial.setdefault(s, []).append(e)
        by_node.setdefault(e.node_uid or e.node, []).append(e)
    out: list[Lemon] = []
    for serial, es in sorted(by_serial.items()):
        if len(es) > faults:
            out.append(Lemon(kind="gpu", key=serial, faults=len(es),
                             nodes=sorted({e.node for e in es}), conflict=_conflict(es),
                             entries=[e.id for e in es][-MAX_EVIDENCE:]))
    for key, es in sorted(by_node.items()):
        if len(es) > faults:
            out.append(Lemon(kind="node", key=key, faults=len(es),
                             nodes=sorted({e.node for e in es}),
                             entries=[e.id for e in es][-MAX_EVIDENCE:]))
    return out


def _conflict(entries: Sequence[LedgerEntry]) -> bool:
    """Two different nodes with the same serial in remediation at overlapping times."""
    return any((a.node_uid != b.node_uid or a.node != b.node)
               and a.started <= b.finished and b.started <= a.finished
               for i, a in enumerate(entries) for b in entries[i + 1:])


def report(entries: Sequence[LedgerEntry], *, since: datetime, until: datetime,
           lemon_faults: int, lemon_window: timedelta, unreadable: int = 0,
           fleet_gpus: int = 0) -> RepairReport:
    """MTTR and relapse rate per action, relapse rate per action and fault, the lemons,
    and the GPU-hours lost, over the remediations started in [since, until)."""
    every = list(entries)
    relapsed = relapsed_ids(every)
    period = [e for e in every if since <= e.started < until]
    actions: dict[str, list[LedgerEntry]] = {}
    pairs: dict[tuple[str, str], list[LedgerEntry]] = {}
    # A remediation counts once, by its latest outcome (a quarantine released later: the
    # release, timed from the start); GPU-hours add up over every entry (each accounts for
    # its own part of the time).
    for e in one_per_remediation(period):
        actions.setdefault(e.action, []).append(e)
        pairs.setdefault((e.action, e.fault), []).append(e)

    def rate(n: int, d: int) -> float | None:
        return round(n / d, 4) if d else None

    figures = []
    for action, es in sorted(actions.items()):
        back = [e for e in es if e.returned]
        rel = sum(1 for e in back if e.id in relapsed)
        figures.append(ActionFigures(
            action=action, repairs=len(es),
            mttr_seconds=round(sum(e.seconds for e in back) / len(back), 1) if back else None,
            relapses=rel, relapse_rate=rate(rel, len(back))))
    faults = []
    for (action, fault), es in sorted(pairs.items()):
        back = [e for e in es if e.returned]
        rel = sum(1 for e in back if e.id in relapsed)
        faults.append(FaultFigures(action=action, fault=fault, repairs=len(es), relapses=rel,
                                   relapse_rate=rate(rel, len(back))))
    lost = sum(e.gpu_hours_lost for e in period)
    hours = (until - since).total_seconds() / 3600
    return RepairReport(
        since=since, until=until, entries=len(period), unreadable=unreadable,
        actions=figures, faults=faults,
        lemons=lemons(every, faults=lemon_faults, window=lemon_window, now=until),
        gpu_hours_lost=round(lost, 2),
        availability_lost=round(lost / (fleet_gpus * hours), 6)
        if fleet_gpus and hours > 0 else None)
