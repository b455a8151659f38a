"""`gpu-remediate report`: repair quality from the repair ledger (activities/ledger.py).

One List of the ledger's shards, then workflows/ledger.report: MTTR and relapse rate per
action, relapse rate per action and fault, the lemons, and the GPU-hours lost.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError

from activities.ledger import LedgerStore
from worker.config import Settings
from workflows.ledger import RepairReport, report

_SHORT = re.compile(r"^(\d{1,5})([hdw])$")
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}
MAX_SINCE = timedelta(days=3660)


def parse_since(text: str) -> timedelta:
    """``30d``, ``12h``, ``2w`` or an ISO 8601 duration (``P30D``); ValueError says why."""
    m = _SHORT.match(text.strip())
    if m:
        value = int(m.group(1)) * _UNITS[m.group(2)]
    else:
        try:
            value = TypeAdapter(timedelta).validate_python(text.strip())
        except ValidationError:
            raise ValueError(f"--since {text[:40]!r}: not a duration (30d, 12h, 2w or ISO "
                             "8601 such as P30D)") from None
    if not timedelta(0) < value <= MAX_SINCE:
        raise ValueError(f"--since {text[:40]!r}: must be more than 0 and at most "
                         f"{MAX_SINCE.days} days")
    return value


def fleet_gpus(core: Any) -> int:
    """GPUs the fleet has now (nvidia.com/gpu capacity of every node); 0 when unknown."""
    try:
        nodes = core.list_node(_request_timeout=30)
    except Exception:
        return 0
    total = 0
    for n in nodes.items or []:
        raw = ((n.status and n.status.capacity) or {}).get("nvidia.com/gpu", "0")
        total += int(raw) if str(raw).isdecimal() else 0
    return total


def make_report(settings: Settings, since: timedelta, *, now: datetime | None = None,
                gpus: int | None = None, core: Any = None) -> RepairReport:
    from kubernetes import client

    from worker.service import kube_client

    now = now or datetime.now(UTC)
    core = core or client.CoreV1Api(kube_client(settings))
    read = LedgerStore(core, settings.record_namespace()).read()
    ledger = settings.ledger
    return report(read.entries, since=now - since, until=now,
                  lemon_faults=ledger.lemon_faults, lemon_window=ledger.lemon_window,
                  unreadable=read.unreadable,
                  fleet_gpus=fleet_gpus(core) if gpus is None else gpus)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def report_tables(r: RepairReport) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]]:
    """(title, columns, rows) of each table `report` prints."""
    return [
        ("per action", ("action", "repairs", "MTTR", "relapses", "relapse rate"),
         [(a.action, str(a.repairs), _duration(a.mttr_seconds), str(a.relapses),
           _pct(a.relapse_rate)) for a in r.actions]),
        ("per action and fault", ("action", "fault", "repairs", "relapses", "relapse rate"),
         [(f.action, f.fault, str(f.repairs), str(f.relapses), _pct(f.relapse_rate))
          for f in r.faults]),
        ("lemons", ("kind", "serial or node", "faults", "nodes", "note"),
         [(lemon.kind, lemon.key, str(lemon.faults), ", ".join(lemon.nodes[:5]),
           "serial reported by two nodes at once: check before acting" if lemon.conflict
           else "") for lemon in r.lemons]),
    ]
