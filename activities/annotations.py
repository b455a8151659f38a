"""Defensive reading of the annotations a node carries.

A node's kubelet can write every annotation of its own Node object, so what we read back from
one is input from that node, not our record (design invariant 8). Each reader here bounds the
size, the nesting, the types and the ranges of a value before anything trusts it, and answers
``Unreadable`` (with the reason) instead of raising: ``json.loads`` alone raises
``RecursionError`` on ``"[" * 100000``, turns ``1e999`` into ``inf`` (and ``int(inf)`` raises
``OverflowError``), and a naive timestamp makes every later subtraction raise ``TypeError``.

What decides is the node's record (activities/record.py), not these annotations: they mirror
it. They are read for two things only: seeding a record once, on the upgrade to records
(unreadable parts seed nothing), and noticing a mirror that disagrees with its record
(``StateMismatch``: the record wins and rewrites it). A release whose record is unreadable
writes its history here only, reading an unreadable annotation as empty, so a bad
annotation never keeps a node out of service.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from activities.exposition import MAX_XID
from workflows.messages import HistoryEntry

T = TypeVar("T")

MAX_ANNOTATION_BYTES = 64 * 1024
"""Larger than anything this controller writes (history: 20 entries; sightings: 64 per GPU);
the API server itself allows 256 KiB for all of a node's annotations together."""
MAX_DEPTH = 8
"""Deeper JSON than any of our annotations has (sightings: object, object, list, pair)."""
MAX_KEY_CHARS = 256
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
"""Timestamps before this (or more than a day ahead of now) are not ones we wrote."""


@dataclass(frozen=True)
class Unreadable:
    """Why an annotation could not be used."""

    annotation: str
    reason: str

    def __str__(self) -> str:
        return f"annotation {self.annotation} is unreadable: {self.reason}"


@dataclass(frozen=True)
class Read(Generic[T]):
    """An annotation's value (the empty value when absent or unreadable) and, when it was
    unreadable, why."""

    value: T
    problem: Unreadable | None = None


class _BadValue(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN, Infinity and -Infinity, which JSON itself does not.
    raise _BadValue(f"non-JSON number {name}")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadValue(f"number {text[:40]} is out of range")
    return value


def depth(text: str) -> int:
    """Deepest bracket nesting, counted without recursion (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def load_json(annotation: str, text: str) -> Any:
    """``text`` as JSON within the size and depth caps, finite numbers only; ``_BadValue``
    (a ``ValueError``) otherwise."""
    if len(text) > MAX_ANNOTATION_BYTES:
        raise _BadValue(f"{len(text)} characters, more than {MAX_ANNOTATION_BYTES}")
    if depth(text) > MAX_DEPTH:
        raise _BadValue(f"nested deeper than {MAX_DEPTH}")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_parse_float)
    except _BadValue:
        raise
    except (ValueError, RecursionError) as err:
        raise _BadValue(f"not JSON ({type(err).__name__})") from None


def _int_in(value: Any, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _BadValue(f"{what} {str(value)[:40]} is not an integer in {low}..{high}")
    return value


def parse_acknowledged(annotation: str, text: str | None) -> Read[dict[str, int]]:
    """``gpu-remediate.io/acknowledged-xids``: GPU key -> XID, as ``{"GPU-…": 79}``."""
    if not text:
        return Read({})
    try:
        raw = load_json(annotation, text)
        if not isinstance(raw, dict):
            raise _BadValue("not a JSON object")
        out: dict[str, int] = {}
        for key, value in raw.items():
            if len(key) > MAX_KEY_CHARS:
                raise _BadValue(f"GPU key longer than {MAX_KEY_CHARS} characters")
            out[key] = _int_in(value, 0, MAX_XID, "XID")
        return Read(out)
    except _BadValue as err:
        return Read({}, Unreadable(annotation, str(err)))


def parse_timestamp(annotation: str, text: str | None, *,
                    now: datetime | None = None) -> Read[datetime | None]:
    """An ISO 8601 timestamp with a UTC offset, between 2000 and a day from now; a naive
    one (no offset) is unreadable: compared with our aware times it raises ``TypeError``."""
    if not text:
        return Read(None)
    try:
        if len(text) > 64:
            raise _BadValue("longer than 64 characters")
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise _BadValue(f"{text[:40]!r} is not an ISO 8601 time") from None
        if when.tzinfo is None or when.utcoffset() is None:
            raise _BadValue(f"{text[:40]!r} has no UTC offset")
        latest = (now or datetime.now(UTC)) + timedelta(days=1)
        if not EARLIEST <= when <= latest:
            raise _BadValue(f"{text[:40]!r} is out of range")
        return Read(when)
    except _BadValue as err:
        return Read(None, Unreadable(annotation, str(err)))


_HISTORY = TypeAdapter(list[HistoryEntry])


def parse_history(annotation: str, text: str | None, *,
                  now: datetime | None = None) -> Read[list[HistoryEntry]]:
    """``gpu-remediate.io/history``: a JSON list of ``HistoryEntry``, every time with a UTC
    offset and in range (a naive one would break the repeat-offender count)."""
    if not text:
        return Read([])
    try:
        load_json(annotation, text)  # the caps, before pydantic parses it
        try:
            entries = _HISTORY.validate_json(text)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise _BadValue(f"{where}: {first['msg']}") from None
        for entry in entries:
            for when in (entry.started, entry.finished):
                if when is None:
                    continue
                checked = parse_timestamp(annotation, when.isoformat(), now=now)
                if checked.problem is not None:
                    raise _BadValue(checked.problem.reason)
        return Read(entries)
    except _BadValue as err:
        return Read([], Unreadable(annotation, str(err)))


MAX_TRACKED_GPUS = 256


def parse_tracks(annotation: str, text: str | None) -> Read[dict[str, Any]]:
    """``gpu-remediate.io/xid-sightings``: GPU key -> ``xid_sightings.GpuXidTrack``."""
    # Imported here: xid_sightings reads its annotation through this module.
    from activities.xid_sightings import GpuXidTrack

    if not text:
        return Read({})
    try:
        raw = load_json(annotation, text)
        if not isinstance(raw, dict):
            raise _BadValue("not a JSON object")
        if len(raw) > MAX_TRACKED_GPUS:
            raise _BadValue(f"more than {MAX_TRACKED_GPUS} GPUs")
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if len(key) > MAX_KEY_CHARS:
                raise _BadValue(f"GPU key longer than {MAX_KEY_CHARS} characters")
            try:
                track = GpuXidTrack.model_validate(value)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in (key, *first["loc"]))
                raise _BadValue(f"{where}: {first['msg']}") from None
            _int_in(track.shown, 0, MAX_XID, "XID")
            for xid, count in track.counts.items():
                _int_in(xid, 0, MAX_XID, "XID")
                _int_in(count, 0, 2**31, "count")
            for xid, _ in track.seen:
                _int_in(xid, 0, MAX_XID, "XID")
            out[key] = track
        return Read(out)
    except _BadValue as err:
        return Read({}, Unreadable(annotation, str(err)))
