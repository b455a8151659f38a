"""Issue 15, what one node or one exporter can no longer do to the others: annotations that
used to fail every tick, naive timestamps that blocked a release, observations too large for
Temporal, redirects, and a big body that held the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment

from activities import annotations as node_annotations
from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_keys import A_ACK_XIDS, A_HISTORY, A_TRANSITION, A_XID_SIGHTINGS, STATE_LABEL
from activities.nodes import NodeActivities
from activities.observation_budget import MAX_OBSERVATION_BYTES, bound_observation
from activities.parse_pool import PARSE_ON_LOOP_BYTES, BodyError, ParsePool, read_body
from policy.config import PolicySettings
from policy.models import Action, Finding, Verdict
from tests.activities.conftest import Cluster, ThreadedGpuSim, metric
from tests.fuzz.hostile import CATEGORIES
from workflows.messages import (
    ClaimInput,
    FleetObservation,
    HistoryEntry,
    NodeStatus,
    ObserveInput,
    ReleaseInput,
    merge_observations,
)
from workflows.transitions import NodeState

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

# --- the defensive readers --------------------------------------------------------------------

BAD_ACKS = {
    '{"x":1e999}': "out of range",
    "[" * 100_000: "more than 65536",
    "[" * 5000: "nested deeper",
    '{"x":NaN}': "non-JSON number",
    '{"x":true}': "not an integer",
    '{"x":-1}': "not an integer",
    '{"x":70000}': "not an integer",
    '{"x":"79"}': "not an integer",
    '{"x":' + "9" * 5000 + "}": "not JSON",
    '["GPU-1", 79]': "not a JSON object",
    '{"' + "k" * 300 + '":79}': "GPU key longer",
    "{not json": "not JSON",
}


@pytest.mark.parametrize("text", list(BAD_ACKS))
def test_a_bad_acknowledged_xids_annotation_is_unreadable_with_the_reason(text: str) -> None:
    read = node_annotations.parse_acknowledged(A_ACK_XIDS, text)
    assert read.value == {} and read.problem is not None
    assert BAD_ACKS[text] in str(read.problem) and A_ACK_XIDS in str(read.problem)


def test_good_annotations_read_as_written() -> None:
    assert node_annotations.parse_acknowledged(A_ACK_XIDS, '{"GPU-1": 79}').value == {"GPU-1": 79}
    assert node_annotations.parse_acknowledged(A_ACK_XIDS, None).problem is None
    when = node_annotations.parse_timestamp(A_TRANSITION, "2026-12-01T11:00:00+00:00", now=NOW)
    assert when.value == datetime(2026, 12, 1, 11, 0, tzinfo=UTC) and when.problem is None
    entry = HistoryEntry(started=NOW, finished=NOW, action="reboot", reason="r", outcome="ok")
    text = json.dumps([entry.model_dump(mode="json")])
    assert node_annotations.parse_history(A_HISTORY, text, now=NOW).value == [entry]


@pytest.mark.parametrize(("text", "why"), [
    ("2026-12-01T11:00:00", "no UTC offset"),
    ("yesterday", "not an ISO 8601 time"),
    ("1970-01-01T00:00:00+00:00", "out of range"),
    ("2999-01-01T00:00:00+00:00", "out of range"),
    ("2026-12-01T11:00:00+00:00" + " " * 100, "longer than 64"),
])
def test_naive_or_absurd_timestamps_are_unreadable(text: str, why: str) -> None:
    read = node_annotations.parse_timestamp(A_TRANSITION, text, now=NOW)
    assert read.value is None and why in str(read.problem)


def test_history_with_a_naive_time_is_unreadable() -> None:
    naive = '[{"started":"2026-12-01T11:00:00","action":"reboot","reason":"r","outcome":"ok"}]'
    read = node_annotations.parse_history(A_HISTORY, naive, now=NOW)
    assert read.value == [] and "no UTC offset" in str(read.problem)
    for text in ("[" * 100_000, '[{"started": 1e999}]', '{"a": 1}'):
        assert node_annotations.parse_history(A_HISTORY, text, now=NOW).problem is not None


def test_bad_xid_sightings_are_unreadable() -> None:
    for text in ("[" * 100_000, '{"GPU-1": {"shown": 1e999}}', '{"GPU-1": {"shown": -3}}',
                 '{"GPU-1": {"seen": [[13, "x"]]}}', '{"GPU-1": {"counts": {"13": -1}}}'):
        read = node_annotations.parse_tracks(A_XID_SIGHTINGS, text)
        assert read.value == {} and read.problem is not None, text


# --- the tick goes on, that node is unreadable ------------------------------------------------


def template(gpu: ThreadedGpuSim) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=2.0,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


async def test_hostile_annotations_change_no_decision_and_are_rewritten(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """Annotations only mirror the record (activities/record.py): garbled ones decide
    nothing, every node stays readable, and the mirror is rewritten with a StateMismatch."""
    cluster.core.patch_node("gpu-node-01", {"metadata": {"annotations": {
        A_ACK_XIDS: '{"x":1e999}'}}})
    cluster.core.patch_node("gpu-node-02", {"metadata": {"annotations": {
        A_XID_SIGHTINGS: "[" * 100_000}}})
    gpu_sim.client.inject_fault("gpu-node-03", 3, "xid", 79)
    before = metric("gpu_remediate_state_mismatch_total", kind="acknowledged-xids") or 0.0
    obs = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).observe_fleet,
        ObserveInput(policy=PolicySettings()))
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-03", Action.REBOOT)]
    assert obs.readable_nodes == 4 and obs.errors == []
    for node in ("gpu-node-01", "gpu-node-02"):
        ann = cluster.node(node).metadata.annotations or {}
        assert A_ACK_XIDS not in ann and A_XID_SIGHTINGS not in ann, node
        assert [e.message for e in cluster.events(node, "StateMismatch")], node
    assert "garbled" in cluster.events("gpu-node-01", "StateMismatch")[0].message
    after = metric("gpu_remediate_state_mismatch_total", kind="acknowledged-xids")
    assert after == before + 1


def test_a_release_finishes_whatever_the_node_wrote(cluster: Cluster) -> None:
    """Naive last-transition, a 100,000-deep history and an overflowing acknowledgement:
    the remediation still ends, the node is back in service with our history."""
    acts = NodeActivities(cluster.api)
    env = ActivityEnvironment()
    node = "gpu-node-01"
    env.run(acts.claim_node, ClaimInput(
        node=node, state=NodeState.DRAINING, reason="XID 79", action=Action.REBOOT,
        workflow_id="remediation-x", run_id="run-1", now=NOW))
    cluster.core.patch_node(node, {"metadata": {"annotations": {
        A_TRANSITION: "2026-12-01T11:00:00", A_HISTORY: "[" * 100_000,
        A_ACK_XIDS: '{"x":1e999}', A_XID_SIGHTINGS: '{"GPU-1": {"shown": 1e999}}'}}})
    entry = HistoryEntry(started=NOW, finished=NOW + timedelta(minutes=5), action="reboot",
                         reason="XID 79", outcome="healthy", workflow_id="remediation-x")
    env.run(acts.release_node, ReleaseInput(
        node=node, outcome="healthy", uncordon=True, history=entry,
        acknowledged_xids={"GPU-3": 79}, event_reason="RemediationFinished",
        event_message="finished"))
    after = cluster.core.read_node(node)
    assert after.metadata.labels.get(STATE_LABEL) in (None, "healthy")
    assert not after.spec.unschedulable
    ann = after.metadata.annotations
    assert json.loads(ann[A_ACK_XIDS]) == {"GPU-3": 79}
    assert len(json.loads(ann[A_HISTORY])) == 1


# --- the observation fits in a Temporal payload -----------------------------------------------

PAYLOAD_LIMIT = 2 * 1024 * 1024
"""Temporal's default blob size limit: a larger activity result is refused."""


def _worst_verdict() -> Verdict:
    """A node name of 253 characters, 64 GPUs (the per-node cap) with 256-character UUIDs, a
    finding per signal on each."""
    node = "n" * 253
    findings = [Finding(gpu=str(g), uuid=f"{g:03d}" + "U" * 253, signal=signal, value=1e300,
                        rule=f"{signal}-rule-with-a-long-name", action=action)
                for g in range(64)
                for signal, action in (("xid", Action.REBOOT), ("ecc_dbe_volatile",
                                                                 Action.RESET),
                                       ("gpu_temp", Action.THERMAL))]
    return Verdict(node=node, action=Action.REBOOT, findings=findings)


WORST = _worst_verdict()


def _shard(first: int, count: int) -> FleetObservation:
    # The same findings list shared by every verdict: only the node names differ.
    verdicts = [WORST.model_copy(update={"node": f"{i:05d}-" + "n" * 247})
                for i in range(first, first + count)]
    remediating = [NodeStatus(node=verdicts[i].node, state=NodeState.DRAINING,
                              workflow_id="w") for i in range(3)]
    errors = [f"node-{i}: " + "e" * 5000 for i in range(50)]
    return FleetObservation(managed_nodes=count, readable_nodes=count, verdicts=verdicts,
                            remediating=remediating, errors=errors)


def test_ten_thousand_worst_case_nodes_fit_in_the_payload_limit() -> None:
    """10,000 nodes, every one flagged with the most findings its exporter may produce, in
    the default two shards of 5,000: each shard's result stays under Temporal's limit, the
    budget's view (remediating) is whole, and the most severe verdicts are kept."""
    converter = pydantic_data_converter.payload_converter  # what the worker uses
    for first in (0, 5000):
        raw = _shard(first, 5000)
        # Unbounded, it was refused: about 80 KB per verdict.
        assert 5000 * len(WORST.model_dump_json()) > 100 * PAYLOAD_LIMIT
        bounded = bound_observation(raw)
        size = len(converter.to_payloads([bounded])[0].SerializeToString())
        assert size <= MAX_OBSERVATION_BYTES < PAYLOAD_LIMIT
        assert bounded.remediating == raw.remediating
        assert 0 < len(bounded.verdicts) < 5000
        assert all(len(v.findings) <= 16 for v in bounded.verdicts)
        assert all(f.action == Action.REBOOT for v in bounded.verdicts for f in v.findings)
        left_out = 5000 - len(bounded.verdicts)
        assert bounded.errors[-1].startswith(f"{left_out} flagged nodes left out")
        assert all(len(e) <= 300 for e in bounded.errors)
    merged = merge_observations([bound_observation(_shard(0, 5000)),
                                 bound_observation(_shard(5000, 5000))])
    assert len(merged.verdicts) > 50  # far past the breaker's default of 50 flagged nodes


def test_a_small_observation_is_unchanged() -> None:
    obs = FleetObservation(managed_nodes=2, readable_nodes=2, verdicts=[Verdict(
        node="a", action=Action.REBOOT, findings=[Finding(
            gpu="0", uuid="GPU-1", signal="xid", value=79, rule="xid-79",
            action=Action.REBOOT)])], errors=["b: timed out"])
    assert bound_observation(obs) == obs


# --- exporters: redirects, and a big body on the event loop -----------------------------------


@pytest_asyncio.fixture
async def exporter() -> AsyncIterator[tuple[str, dict[str, int], dict[str, bytes]]]:
    """An exporter under test control: path -> body; /moved redirects to /secret."""
    hits: dict[str, int] = {}
    bodies: dict[str, bytes] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        if request.path == "/moved":
            raise web.HTTPFound("/secret")
        return web.Response(body=bodies.get(request.path, b""), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", hits, bodies
    finally:
        await runner.cleanup()


async def test_redirects_are_not_followed(
        exporter: tuple[str, dict[str, int], dict[str, bytes]]) -> None:
    url, hits, _ = exporter
    fleet = FleetActivities.__new__(FleetActivities)
    fleet.exporter = ExporterSettings(mode="template", timeout_seconds=2)
    readings, errors = await fleet.scrape_many({"n1": f"{url}/moved"})
    assert readings == {} and "HTTP 302 (redirects are not followed)" in errors["n1"]
    from worker.probe.evaluate import PolicySettings as EvalPolicy
    from worker.probe.evaluate import evaluate_sources

    report = await asyncio.to_thread(evaluate_sources, [f"{url}/moved"], node="n1",
                                     config=EvalPolicy())
    assert "HTTP 302" in report.errors[0].message and "not followed" in report.errors[0].message
    assert "/secret" not in hits


TICKS_DURING_PARSE = 5
"""How often the event loop must tick while a big body's parse is in progress."""


def _parse_that_waits_for_the_loop(
        real: Callable[[bytes, str], Any], monkeypatch: pytest.MonkeyPatch, module: Any,
        deadline: float = 60.0) -> tuple[Callable[[], None], list[bool]]:
    """Replace ``module.read_body`` by the real parse that first waits until the event loop
    has ticked TICKS_DURING_PARSE times. The test, not the machine, makes the parse last:
    on a thread the loop ticks and the parse goes on; on the loop itself no tick can come
    while the parse waits, so it records that it was held (after a deadline far above
    any loaded machine's scheduling delay) instead of hanging."""
    ticked = threading.Event()
    held: list[bool] = []
    ticks = [0]

    def tick() -> None:
        ticks[0] += 1
        if ticks[0] >= TICKS_DURING_PARSE:
            ticked.set()

    def waiting(raw: bytes, node: str) -> Any:
        ticks[0] = 0
        ticked.clear()
        held.append(not ticked.wait(deadline))
        return real(raw, node)

    monkeypatch.setattr(module, "read_body", waiting)
    return tick, held


async def _tick_until(done: asyncio.Event, tick: Callable[[], None]) -> None:
    while not done.is_set():
        await asyncio.sleep(0.001)
        tick()


async def test_a_big_hostile_body_does_not_hold_the_event_loop(
        exporter: tuple[str, dict[str, int], dict[str, bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A small fleet parses on the event loop only bodies up to PARSE_ON_LOOP_BYTES; this
    3.5 MiB one (just under the 4 MiB cap: one line of 350,000 labels) is parsed in a thread
    while the loop keeps ticking."""
    from activities import scrape

    url, _, bodies = exporter
    bodies["/big"] = CATEGORIES["many_labels"](3_500_000)
    assert len(bodies["/big"]) > PARSE_ON_LOOP_BYTES
    tick, held = _parse_that_waits_for_the_loop(read_body, monkeypatch, scrape)
    fleet = FleetActivities.__new__(FleetActivities)
    fleet.exporter = ExporterSettings(mode="template", timeout_seconds=120)
    done = asyncio.Event()
    ticker = asyncio.create_task(_tick_until(done, tick))
    readings, errors = await fleet.scrape_many({"n1": f"{url}/big"})
    done.set()
    await ticker
    assert list(readings) + list(errors) == ["n1"]
    assert held == [False], "the parse ran on the event loop: it never ticked meanwhile"


async def test_a_small_body_is_parsed_on_the_loop(
        exporter: tuple[str, dict[str, int], dict[str, bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The counterpart, which shows the check above can fail: a body under
    PARSE_ON_LOOP_BYTES is parsed on the loop (no thread hop per node), so no tick comes
    while it parses."""
    from activities import scrape

    url, _, bodies = exporter
    bodies["/small"] = CATEGORIES["many_labels"](64 * 1024)
    # On the loop no tick can come while the parse waits, however long: a short deadline.
    tick, held = _parse_that_waits_for_the_loop(read_body, monkeypatch, scrape, deadline=0.2)
    fleet = FleetActivities.__new__(FleetActivities)
    fleet.exporter = ExporterSettings(mode="template", timeout_seconds=120)
    done = asyncio.Event()
    ticker = asyncio.create_task(_tick_until(done, tick))
    await fleet.scrape_many({"n1": f"{url}/small"})
    done.set()
    await ticker
    assert held == [True]


async def test_a_big_body_read_here_by_the_pool_does_not_hold_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In a large fleet, a body the helper process cannot take (not started, busy or gone) is
    read in this process: a big one in a thread, not on the loop."""
    from activities import parse_pool

    raw = CATEGORIES["many_labels"](3_500_000)
    tick, held = _parse_that_waits_for_the_loop(read_body, monkeypatch, parse_pool)
    pool = ParsePool()  # never started: every body is read here
    done = asyncio.Event()
    ticker = asyncio.create_task(_tick_until(done, tick))
    with contextlib.suppress(BodyError):
        await pool.read(raw, "n1")
    done.set()
    await ticker
    await pool.close()
    assert pool.here == 1
    assert held == [False], "the parse ran on the event loop: it never ticked meanwhile"


def test_a_node_naming_another_nodes_workflow_is_not_shown_as_running_it() -> None:
    """The workflow-id annotation is node-writable: only this node's own remediation id is
    taken from it, so `status` never points an operator at another node's workflow."""
    from kubernetes import client

    from activities.fleet_nodes import _gpu_node
    from activities.node_keys import A_WORKFLOW
    from workflows.ids import remediation_workflow_id

    def node(name: str, wid: str) -> client.V1Node:
        return client.V1Node(metadata=client.V1ObjectMeta(
            name=name, labels={STATE_LABEL: "draining"}, annotations={A_WORKFLOW: wid}))

    own = remediation_workflow_id("gpu-node-01")
    assert _gpu_node(node("gpu-node-01", own)).workflow_id == own
    assert _gpu_node(node("gpu-node-02", own)).workflow_id == ""
