"""The repair ledger's store: ConfigMaps the worker owns, one month per shard.

Where. The record namespace (``kubernetes.record_namespace``), beside the node records
(activities/record.py): a kubelet cannot write there, so no node can edit, forge or wipe
its own repair history. A remediation, a node re-created under another UID, a
continue-as-new or a worker restart changes nothing in it.

Shape. A shard is ``gpu-remediate-ledger-<YYYY-MM>-<NN>`` labelled with its month; each
entry (workflows/ledger.py) is one key of its data (``<entry id>.json``), so one entry that
cannot be read is counted (``gpu_remediate_ledger_unreadable_total``) and skipped, never
fatal to a write, an observation or a report, and never overwritten. `report` reads the
fleet's ledger with one List; admission reads the months of its lookback with one List.

Size and retention. An entry is at most ``MAX_ENTRY_BYTES`` (8 KiB; about 1 KiB in
practice); a shard holds at most ``ENTRIES_PER_SHARD`` (120) and never more than 1 MiB less
4 KiB of data, under the API server's 1 MiB for a ConfigMap; a month with more entries rolls
over to the next shard number. Shards whose month ended more than ``ledger.retention`` ago
(default 400 days) are deleted by the writer, at most once a day per worker.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import annotations as node_annotations
from activities.kube import REQUEST_TIMEOUT, raise_typed
from activities.metrics import (
    GPU_HOURS_LOST,
    LEDGER_UNREADABLE,
    LEDGER_WRITE_FAILURES,
    REPAIR_DURATION,
    REPAIR_RELAPSES,
)
from activities.record import MANAGED_BY, MANAGED_BY_LABEL, record_namespace
from workflows import errors
from workflows.ledger import (
    MAX_ENTRY_BYTES,
    LedgerEntry,
    LedgerInput,
    LedgerResult,
    relapse,
)
from workflows.settings import LedgerSettings

log = logging.getLogger(__name__)

SHARD_PREFIX = "gpu-remediate-ledger-"
MONTH_LABEL = "gpu-remediate.io/ledger-month"
LEDGER_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{MONTH_LABEL}"
ENTRIES_PER_SHARD = 120
MAX_SHARD_BYTES = 1024 * 1024
CONFLICT_RETRIES = 8
PRUNE_EVERY = 24 * 3600.0
PARSED_SHARDS_KEPT = 64
"""Parsed shards kept per store, by name and resourceVersion (oldest dropped first)."""

def month_of(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m}"


def months_between(since: datetime, until: datetime) -> list[str]:
    """Every month from ``since``'s to ``until``'s, oldest first."""
    out: list[str] = []
    y, m = since.astimezone(UTC).year, since.astimezone(UTC).month
    end = until.astimezone(UTC)
    while (y, m) <= (end.year, end.month):
        out.append(f"{y:04d}-{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def month_end(month: str) -> datetime:
    y, m = (int(p) for p in month.split("-"))
    return datetime(y + (m == 12), 1 if m == 12 else m + 1, 1, tzinfo=UTC)


def shard_name(month: str, number: int) -> str:
    return f"{SHARD_PREFIX}{month}-{number:02d}"


@dataclass
class Shard:
    name: str
    month: str
    number: int
    resource_version: str
    keys: set[str] = field(default_factory=set)
    raw: dict[str, str] = field(default_factory=dict)


@dataclass
class LedgerRead:
    entries: list[LedgerEntry]
    unreadable: int
    shards: list[Shard]


_counted_unreadable: set[tuple[str, str]] = set()
_counted_lock = threading.Lock()


def _count_unreadable(shard: str, key: str, problem: str) -> None:
    with _counted_lock:
        if (shard, key) in _counted_unreadable:
            return
        _counted_unreadable.add((shard, key))
    LEDGER_UNREADABLE.inc()
    log.warning("ledger entry %s/%s unreadable (skipped): %s", shard, key, problem)


def parse_entry(shard: str, key: str, text: Any) -> LedgerEntry | None:
    """One entry, or None (counted) when it cannot be read."""
    problem = ""
    if not isinstance(text, str):
        problem = "not text"
    elif len(text) > MAX_ENTRY_BYTES * 2:
        problem = f"{len(text)} characters, more than an entry may be"
    elif node_annotations.depth(text) > node_annotations.MAX_DEPTH:
        problem = f"nested deeper than {node_annotations.MAX_DEPTH}"
    if not problem:
        try:
            return LedgerEntry.model_validate_json(text)
        except ValidationError as err:
            first = err.errors()[0]
            problem = f"{'.'.join(str(p) for p in first['loc']) or '(top)'}: {first['msg']}"
    _count_unreadable(shard, key, problem[:200])
    return None


def parse_shard(obj: dict[str, Any]) -> tuple[Shard | None, list[LedgerEntry], int]:
    md = obj.get("metadata") or {}
    name = str(md.get("name") or "")
    month = str((md.get("labels") or {}).get(MONTH_LABEL) or "")
    try:
        number = int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None, [], 0
    data = obj.get("data") or {}
    shard = Shard(name=name, month=month, number=number,
                  resource_version=str(md.get("resourceVersion") or ""),
                  keys=set(data) if isinstance(data, dict) else set(),
                  raw=dict(data) if isinstance(data, dict) else {})
    entries: list[LedgerEntry] = []
    bad = 0
    for key, text in sorted(shard.raw.items()):
        entry = parse_entry(name, key, text)
        if entry is None:
            bad += 1
        else:
            entries.append(entry)
    return shard, entries, bad


class LedgerStore:
    """Read and append the ledger (sync: called from the worker's thread pool)."""

    core: client.CoreV1Api

    def __init__(self, core: client.CoreV1Api, namespace: str | None = None) -> None:
        self.core = core
        self.namespace = namespace
        self._cache: dict[tuple[str, str], tuple[Shard | None, list[LedgerEntry], int]] = {}
        self._cache_lock = threading.Lock()

    @property
    def ns(self) -> str:
        return self.namespace or record_namespace()

    def read(self, months: list[str] | None = None) -> LedgerRead:
        """The entries of ``months`` (None: every shard), with one List."""
        selector = LEDGER_SELECTOR if months is None else (
            f"{MANAGED_BY_LABEL}={MANAGED_BY},{MONTH_LABEL} in ({','.join(months)})")
        try:
            raw: Any = self.core.list_namespaced_config_map(
                self.ns, label_selector=selector, _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False)
        except ApiException as err:
            raise_typed(err, f"list the repair ledger in {self.ns}")
        entries: list[LedgerEntry] = []
        shards: list[Shard] = []
        bad = 0
        for item in json.loads(raw.data).get("items") or []:
            shard, found, unreadable = self._parsed(item)
            if shard is None:
                continue
            shards.append(shard)
            entries += found
            bad += unreadable
        return LedgerRead(entries, bad, sorted(shards, key=lambda s: (s.month, s.number)))

    def _parsed(self, item: dict[str, Any]) -> tuple[Shard | None, list[LedgerEntry], int]:
        """``parse_shard``, once per shard version: a shard that has not changed since the
        last tick is not parsed again (entries are immutable; only new keys change it)."""
        md = item.get("metadata") or {}
        key = (str(md.get("name") or ""), str(md.get("resourceVersion") or ""))
        if not key[1]:
            return parse_shard(item)
        with self._cache_lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        parsed = parse_shard(item)
        with self._cache_lock:
            if len(self._cache) >= PARSED_SHARDS_KEPT:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = parsed
        return parsed

    def append(self, entry: LedgerEntry, settings: LedgerSettings,
               now: datetime) -> tuple[LedgerEntry, LedgerEntry | None, bool]:
        """Write ``entry`` with its relapse found; returns (entry as stored, the entry it
        relapses, whether this call wrote it: False when a retried write finds it)."""
        entry = entry.bounded()
        text = entry.model_dump_json(exclude_none=True)
        if len(text.encode()) > MAX_ENTRY_BYTES:
            raise ApplicationError(f"ledger entry {entry.id} would be {len(text)} bytes",
                                   type=errors.INVALID, non_retryable=True)
        month = month_of(entry.finished)
        for _ in range(CONFLICT_RETRIES):
            read = self.read(months_between(
                min(entry.started, entry.finished) - settings.relapse_window, now))
            for e in read.entries:
                if e.id == entry.id:
                    return e, None, False
            of, by = relapse(entry, read.entries, settings.relapse_window)
            earlier = next((e for e in read.entries if e.id == of), None)
            stored = entry.model_copy(update={"relapse_of": of, "relapse_by": by})
            key = f"{stored.id}.json"
            value = stored.model_dump_json(exclude_none=True)
            mine = [s for s in read.shards if s.month == month]
            target = mine[-1] if mine else None
            if target is not None and (
                    len(target.keys) >= ENTRIES_PER_SHARD
                    or _bytes(target.raw) + len(value) + len(key) > MAX_SHARD_BYTES - 4096):
                target = None
            number = (mine[-1].number + 1) if mine and target is None else \
                (target.number if target is not None else 0)
            md: dict[str, Any] = {
                "name": shard_name(month, number), "namespace": self.ns,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, MONTH_LABEL: month}}
            if target is not None:
                md["resourceVersion"] = target.resource_version
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md,
                    "data": {**(target.raw if target else {}), key: value}}
            cm = client.V1ConfigMap.model_validate(body)
            try:
                if target is not None:
                    self.core.replace_namespaced_config_map(
                        target.name, self.ns, cm, _request_timeout=REQUEST_TIMEOUT)
                else:
                    self.core.create_namespaced_config_map(
                        self.ns, cm, _request_timeout=REQUEST_TIMEOUT)
                return stored, earlier, True
            except ApiException as err:
                if err.status == 409:
                    continue  # another writer: read again (the entry may be there now)
                raise_typed(err, f"write the repair ledger shard {shard_name(month, number)}")
        raise ApplicationError("the repair ledger kept changing under us", type=errors.CONFLICT)

    def prune(self, retention: timedelta, now: datetime) -> list[str]:
        """Delete the shards whose month ended more than ``retention`` ago."""
        read = self.read()
        gone = []
        for s in read.shards:
            if s.month and month_end(s.month) < now - retention:
                try:
                    self.core.delete_namespaced_config_map(
                        s.name, self.ns, _request_timeout=REQUEST_TIMEOUT)
                except ApiException as err:
                    if err.status != 404:
                        raise_typed(err, f"delete the expired ledger shard {s.name}")
                gone.append(s.name)
        return gone


def _bytes(data: dict[str, str]) -> int:
    return sum(len(k) + len(str(v).encode()) for k, v in data.items())


class LedgerActivities:
    """``record_repair``: the remediation's outcome into the ledger, with its metrics."""

    def __init__(self, api: client.ApiClient, settings: LedgerSettings,
                 namespace: str | None = None) -> None:
        self.store = LedgerStore(client.CoreV1Api(api), namespace)
        self.settings = settings
        self._pruned = 0.0

    @activity.defn
    def record_repair(self, inp: LedgerInput) -> LedgerResult:
        try:
            stored, earlier, wrote = self.store.append(inp.entry, self.settings,
                                                       datetime.now(UTC))
        except Exception:
            LEDGER_WRITE_FAILURES.inc()
            raise
        if wrote:
            e = stored
            REPAIR_DURATION.labels(e.action[:32], e.outcome[:32]).observe(e.seconds)
            GPU_HOURS_LOST.inc(e.gpu_hours_lost)
            if earlier is not None:
                REPAIR_RELAPSES.labels(earlier.action[:32], earlier.fault[:64]).inc()
        self._prune_if_due()
        return LedgerResult(entry=stored.id, written=wrote, relapse_of=stored.relapse_of,
                            relapse_by=stored.relapse_by)

    def _prune_if_due(self) -> None:
        if time.monotonic() - self._pruned < PRUNE_EVERY and self._pruned:
            return
        self._pruned = time.monotonic()
        try:
            gone = self.store.prune(self.settings.retention, datetime.now(UTC))
        except Exception as err:  # retention is housekeeping: never the remediation's failure
            log.warning("could not prune the repair ledger: %s", err)
            return
        if gone:
            log.info("repair ledger: deleted %d expired shards (%s)", len(gone),
                     ", ".join(gone[:10]))
