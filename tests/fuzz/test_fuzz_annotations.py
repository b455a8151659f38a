"""Fuzz: node annotations (the node writes them). Properties: the readers never raise; what
they return is typed and in range, or empty with a reason; and a node carrying any of them
is listed by the detector (unreadable at worst), never an exception out of the tick."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from activities import annotations as node_annotations
from activities.exposition import MAX_XID
from activities.fleet_nodes import _gpu_node
from activities.node_keys import A_ACK_XIDS, A_HISTORY, A_TRANSITION, A_XID_SIGHTINGS
from activities.nodes import _observe_state_time, parse_acknowledged, parse_history
from activities.xid_sightings import parse_tracks
from tests.fuzz.strategies import annotation_texts, budget, corpus

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def check(text: str) -> None:
    acked = node_annotations.parse_acknowledged(A_ACK_XIDS, text)
    assert (acked.problem is None) or acked.value == {}
    assert all(isinstance(k, str) and type(v) is int and 0 <= v <= MAX_XID
               for k, v in acked.value.items())
    history = node_annotations.parse_history(A_HISTORY, text, now=NOW)
    assert (history.problem is None) or history.value == []
    for entry in history.value:
        assert entry.started.tzinfo is not None
        assert (NOW - entry.started).total_seconds() > -86400 * 2  # aware: subtraction works
    tracks = node_annotations.parse_tracks(A_XID_SIGHTINGS, text)
    for track in tracks.value.values():
        assert 0 <= track.shown <= MAX_XID and all(math.isfinite(t) for _, t in track.seen)
    when = node_annotations.parse_timestamp(A_TRANSITION, text, now=NOW)
    assert when.value is None or when.value.tzinfo is not None
    # The wrappers the release path uses: never raise either.
    parse_acknowledged(text)
    parse_history(text)
    parse_tracks(text)
    node = SimpleNamespace(metadata=SimpleNamespace(
        name="n1", resource_version="1", labels={"gpu-remediate.io/state": "draining"},
        annotations={A_ACK_XIDS: text, A_XID_SIGHTINGS: text, A_TRANSITION: text,
                     A_HISTORY: text}))
    listed = _gpu_node(node)  # type: ignore[arg-type]
    assert listed.name == "n1"
    assert bool(listed.unreadable) == bool(
        node_annotations.parse_acknowledged(A_ACK_XIDS, text).problem
        or node_annotations.parse_tracks(A_XID_SIGHTINGS, text).problem)
    _observe_state_time(node, NOW)


@budget(800)
@given(annotation_texts)
def test_annotation_values(text: str) -> None:
    check(text)


@budget(100)
@given(st.sampled_from(["[", "{", '{"a":', '[{"started":']), st.integers(1, 200_000))
def test_deep_and_long_values(opening: str, times: int) -> None:
    check(opening * times)


def test_every_corpus_annotation() -> None:
    for raw in corpus("annotations"):
        check(raw.decode())
