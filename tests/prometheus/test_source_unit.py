"""PrometheusSource against a tiny fake Prometheus (aiohttp): error shapes, garbage values,
node labels, XID choice and clock-reason folding. No prometheus binary needed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from activities.prometheus_source import (
    PrometheusSource,
    choose_xid,
    node_of,
    promql_duration,
)
from policy.config import PolicySettings
from policy.models import Action, Verdict
from policy.rules import evaluate_node

HOLD = timedelta(seconds=60)
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"


def labels(node: str = "n1", gpu: str = "0", uuid: str = UUID0, **extra: str) -> dict[str, str]:
    return {
        "gpu": gpu,
        "UUID": uuid,
        "modelName": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0",
        "Hostname": node,  # the exporter's own word: never read as the node
        "instance": node,  # the target label Prometheus attaches (ServiceMonitor relabelling)
        **extra,
    }


def kind_of(query: str) -> str:
    """Which of the source's queries this is (see PrometheusSource.queries)."""
    if query.startswith("count by"):
        return "present"
    if query.startswith("DCGM_FI_DEV_XID_ERRORS["):
        return "xid"
    if "CLOCKS_EVENT_REASONS" in query:
        return "clocks"
    if "DCGM_EXP_XID_ERRORS_COUNT" in query:
        return "xid_count"
    for metric, name in [
        ("GPU_TEMP", "gpu_temp"),
        ("MEMORY_TEMP", "memory_temp"),
        ("ECC_DBE_VOL", "ecc_dbe_volatile"),
        ("ECC_SBE_VOL", "ecc_sbe_volatile"),
        ("ROW_REMAP_PENDING", "row_remap_pending"),
        ("ROW_REMAP_FAILURE", "row_remap_failure"),
        ("UNCORRECTABLE_REMAPPED_ROWS", "uncorrectable_remapped_rows"),
        ("GET_GPU_RECOVERY_ACTION", "recovery_action"),
    ]:
        if f"DCGM_FI_DEV_{metric}" in query:
            return name
    raise AssertionError(f"unexpected query {query}")


@dataclass
class FakePrometheus:
    url: str = ""
    vectors: dict[str, list[tuple[dict[str, str], Any]]] = field(default_factory=dict)
    matrices: dict[str, list[tuple[dict[str, str], list[tuple[float, Any]]]]] = field(
        default_factory=dict
    )
    override: dict[str, web.Response] = field(default_factory=dict)
    """kind (or "*") -> canned response replacing the normal answer."""
    warnings: list[str] = field(default_factory=list)
    delay: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def present(self, *label_sets: dict[str, str]) -> None:
        self.vectors["present"] = [(ls, "1") for ls in label_sets]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        query = str(form["query"])
        kind = kind_of(query)
        self.requests.append(
            {
                "method": request.method,
                "kind": kind,
                "form": dict(form),
                "headers": dict(request.headers),
            }
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        canned = self.override.get(kind) or self.override.get("*")
        if canned is not None:
            return web.Response(
                body=canned.body, status=canned.status, content_type=canned.content_type
            )
        at = float(str(form["time"]))
        if kind in ("xid", "clocks"):
            result: list[dict[str, Any]] = [
                {"metric": ls, "values": [[t, str(v)] for t, v in samples]}
                for ls, samples in self.matrices.get(kind, [])
            ]
            rtype = "matrix"
        else:
            result = [{"metric": ls, "value": [at, str(v)]} for ls, v in self.vectors.get(kind, [])]
            rtype = "vector"
        body: dict[str, Any] = {
            "status": "success",
            "data": {"resultType": rtype, "result": result},
        }
        if self.warnings:
            body["warnings"] = self.warnings
        return web.json_response(body)


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakePrometheus]:
    prom = FakePrometheus()
    app = web.Application()
    app.router.add_route("*", "/api/v1/query", prom.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    prom.url = f"http://127.0.0.1:{port}"
    yield prom
    await runner.cleanup()


def src(fake: FakePrometheus, **kwargs: Any) -> PrometheusSource:
    return PrometheusSource(url=fake.url, timeout_seconds=2, **kwargs)


def verdict(readings: dict[str, Any], node: str = "n1") -> Verdict:
    return evaluate_node(readings[node], PolicySettings())


# --- error shapes: every node errors, nobody is sick --------------------------------------------


@pytest.mark.parametrize(
    ("response", "expect"),
    [
        (
            web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            ),
            "HTTP 400: bad_data: parse error",
        ),
        (
            web.json_response({"status": "error", "errorType": "execution", "error": "boom"}),
            "query failed: execution: boom",
        ),
        (web.Response(text="Service Unavailable", status=503), "HTTP 503: Service Unavailable"),
        (web.Response(text="{not json", content_type="application/json"), "not valid JSON"),
        (web.Response(text="<html>login</html>", content_type="text/html"), "not valid JSON"),
        (
            web.json_response(
                {"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}
            ),
            "expected a vector result",
        ),
        (
            web.json_response(
                {
                    "status": "success",
                    "data": {
                        "resultType": "vector",
                        "result": [{"metric": {"a": "b"}, "value": [1, "x"]}],
                    },
                }
            ),
            "not a number",
        ),
        (web.json_response(["a list"]), "not a JSON object"),
    ],
)
async def test_bad_answers_make_every_node_an_error(
    fake: FakePrometheus, response: web.Response, expect: str
) -> None:
    fake.present(labels("n1"), labels("n2"))
    fake.vectors["ecc_dbe_volatile"] = [(labels("n1"), "5")]
    fake.override["*"] = response
    readings, errors = await src(fake).read(["n1", "n2"], thermal_hold=HOLD)
    assert readings == {}
    assert sorted(errors) == ["n1", "n2"]
    for node, message in errors.items():
        assert message.startswith(f"{node}: Prometheus at {fake.url}: ")
        assert expect in message


async def test_one_failed_query_fails_the_whole_read(fake: FakePrometheus) -> None:
    fake.present(labels("n1"))
    fake.vectors["row_remap_failure"] = [(labels("n1"), "1")]
    fake.override["xid"] = web.json_response(
        {"status": "error", "errorType": "timeout", "error": "query timed out"}, status=503
    )
    readings, errors = await src(fake).read(["n1"], thermal_hold=HOLD)
    assert readings == {}
    assert "HTTP 503: timeout: query timed out" in errors["n1"]


async def test_slow_prometheus_times_out(fake: FakePrometheus) -> None:
    fake.present(labels("n1"))
    fake.delay = 1
    source = PrometheusSource(url=fake.url, timeout_seconds=0.3)
    readings, errors = await source.read(["n1"], thermal_hold=HOLD)
    assert readings == {} and "timed out" in errors["n1"]


async def test_warnings_are_logged_and_data_kept(
    fake: FakePrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    fake.present(labels("n1"))
    fake.warnings = ["store gateway unreachable: partial response"]
    with caplog.at_level(logging.WARNING, logger="activities.prometheus_source"):
        result = await src(fake).read_detailed(["n1"], thermal_hold=HOLD)
    assert result.errors == {} and "n1" in result.readings
    assert result.warnings == ["store gateway unreachable: partial response"]
    assert "partial results" in caplog.text


async def test_requests_are_post_forms_with_the_token(fake: FakePrometheus) -> None:
    fake.present(labels("n1"))
    source = src(fake, headers={"Authorization": "Bearer s3cret"})
    await source.read(["n1"], thermal_hold=HOLD)
    assert len(fake.requests) == len(source.queries(HOLD)) == 12
    assert {r["method"] for r in fake.requests} == {"POST"}
    assert all(r["headers"]["Authorization"] == "Bearer s3cret" for r in fake.requests)
    assert all(
        r["headers"]["Content-Type"].startswith("application/x-www-form-urlencoded")
        for r in fake.requests
    )
    # One evaluation time for every query, so the answers are consistent with each other.
    assert len({r["form"]["time"] for r in fake.requests}) == 1


async def test_no_nodes_no_requests(fake: FakePrometheus) -> None:
    assert await src(fake).read([], thermal_hold=HOLD) == ({}, {})
    assert fake.requests == []


# --- values --------------------------------------------------------------------------------------


async def test_garbage_values_never_make_a_node_sick(fake: FakePrometheus) -> None:
    now = time.time()
    fake.present(labels("n1"))
    for kind in (
        "ecc_dbe_volatile",
        "row_remap_failure",
        "row_remap_pending",
        "uncorrectable_remapped_rows",
        "recovery_action",
    ):
        fake.vectors[kind] = [(labels("n1"), "NaN"), (labels("n1", pod="p"), "9223372036854775794")]
    fake.vectors["gpu_temp"] = [(labels("n1"), "+Inf")]
    fake.vectors["memory_temp"] = [(labels("n1"), "-5")]
    fake.matrices["xid"] = [
        (
            labels("n1"),
            [
                (now - 5, "NaN"),
                (now - 4, "-79"),
                (now - 2, "1e300"),  # past the DCGM sentinel floor: no data
                (now - 1, "0"),
            ],
        )
    ]
    fake.matrices["clocks"] = [(labels("n1"), [(now - 90, "NaN"), (now - 1, "-1")])]
    readings, errors = await src(fake).read(["n1"], thermal_hold=HOLD)
    assert errors == {}
    gpu = readings["n1"].gpus[0]
    assert gpu.ecc_dbe_volatile is None and gpu.row_remap_failure is None
    assert gpu.gpu_temp is None and gpu.memory_temp is None
    assert gpu.recovery_action is None and gpu.clock_event_reasons is None
    assert gpu.xid == 0  # the gauge exists; none of its values is an XID
    assert verdict(readings).action == Action.NONE


async def test_last_values_fill_the_reading(fake: FakePrometheus) -> None:
    fake.present(labels("n1"), labels("n1", gpu="1", uuid=UUID1))
    fake.vectors["ecc_dbe_volatile"] = [
        (labels("n1"), "0"),
        (labels("n1", gpu="1", uuid=UUID1), "3"),
    ]
    fake.vectors["row_remap_pending"] = [(labels("n1"), "1")]
    fake.vectors["recovery_action"] = [(labels("n1"), "2")]
    readings, _ = await src(fake).read(["n1"], thermal_hold=HOLD)
    g0, g1 = readings["n1"].gpus
    assert (g0.gpu, g0.uuid, g0.model_name) == ("0", UUID0, "NVIDIA H100 80GB HBM3")
    assert g0.row_remap_pending == 1 and g0.recovery_action == 2 and g1.ecc_dbe_volatile == 3
    assert verdict(readings).action == Action.REBOOT


async def test_xid_count_family_fills_xid_counts(fake: FakePrometheus) -> None:
    fake.present(labels("n1"), labels("n1", gpu="1", uuid=UUID1), labels("n2"))
    window = {"window_size_in_ms": "300000"}
    fake.vectors["xid_count"] = [
        (labels("n1", **window, xid="13"), "3"),
        (labels("n1", **window, xid="31"), "1"),
        # The exporter's "none in the window" series: no xid label, value 0.
        (labels("n1", gpu="1", uuid=UUID1, **window), "0"),
    ]
    readings, errors = await src(fake).read(["n1", "n2"], thermal_hold=HOLD)
    assert not errors
    g0, g1 = readings["n1"].gpus
    assert g0.xid_counts == {13: 3, 31: 1}
    assert g1.xid_counts == {}  # exported, nothing in the window
    assert readings["n2"].gpus[0].xid_counts is None  # family not exported
    assert verdict(readings).action == Action.NONE  # counts alone never act


async def test_xid_most_severe_in_window_and_acknowledged(fake: FakePrometheus) -> None:
    now = time.time()
    fake.present(labels("n1"))
    # Two series (err_code labels differ per value), 13 -> 48 -> 13 again.
    fake.matrices["xid"] = [
        (labels("n1", err_code="13"), [(now - 50, "13"), (now - 49, "13")]),
        (labels("n1", err_code="48"), [(now - 30, "48")]),
        (labels("n1", err_code="13"), [(now - 10, "13")]),
    ]
    source = src(fake)
    result = await source.read_detailed(["n1"], thermal_hold=HOLD)
    assert result.readings["n1"].gpus[0].xid == 48
    assert result.xids_seen == {"n1": {UUID0: [13, 48]}}
    acked = await source.read_detailed(["n1"], thermal_hold=HOLD,
                                       acknowledged_by_node={"n1": {UUID0: 48}})
    assert acked.readings["n1"].gpus[0].xid == 13


async def test_an_acknowledgement_is_of_one_node_never_of_a_uuid_on_another(
        fake: FakePrometheus) -> None:
    """Keyed by (node, GPU UUID): another node acknowledging the same UUID (a forged
    annotation, a GPU moved between machines) hides nothing here."""
    now = time.time()
    fake.present(labels("n1"))
    fake.matrices["xid"] = [
        (labels("n1", err_code="13"), [(now - 50, "13")]),
        (labels("n1", err_code="48"), [(now - 30, "48")]),
    ]
    result = await src(fake).read_detailed(["n1"], thermal_hold=HOLD,
                                           acknowledged_by_node={"n2": {UUID0: 48}})
    assert result.readings["n1"].gpus[0].xid == 48


def test_choose_xid() -> None:
    config = PolicySettings()
    assert choose_xid({13: 1.0, 79: 0.5, 48: 2.0}, config) == 79  # reboot beats reset
    assert choose_xid({48: 1.0, 95: 2.0}, config) == 95  # equal severity: the latest
    assert choose_xid({79: 1.0}, config, acknowledged=79) == 79  # nothing else to report
    assert choose_xid({79: 1.0, 43: 2.0}, config, acknowledged=79) == 43
    overridden = PolicySettings(xid_overrides={13: Action.QUARANTINE})
    assert choose_xid({13: 1.0, 79: 0.5}, overridden) == 13


async def test_clock_reasons_held_versus_seen(fake: FakePrometheus) -> None:
    now = time.time()
    fake.present(labels("n1"), labels("n1", gpu="1", uuid=UUID1))
    idle = [(now - 120 + i * 10, "1") for i in range(11)]  # up to now - 20
    fake.matrices["clocks"] = [
        # GPU 0: HW thermal (0x40) only in the last two samples: a blip.
        (labels("n1"), [*idle, (now - 15, "65"), (now - 5, "65")]),
        # GPU 1: HW thermal for the whole hold (and before it).
        (labels("n1", gpu="1", uuid=UUID1), [(now - 120 + i * 10, "64") for i in range(12)]),
    ]
    held = await src(fake).read_detailed(["n1"], thermal_hold=timedelta(seconds=30))
    g0, g1 = held.readings["n1"].gpus
    assert g0.clock_event_reasons == 1 and g1.clock_event_reasons == 64
    assert held.clock_reasons_seen["n1"] == {UUID0: 65, UUID1: 64}
    seen = await src(fake, clock_mode="seen").read_detailed(
        ["n1"], thermal_hold=timedelta(seconds=30)
    )
    assert seen.readings["n1"].gpus[0].clock_event_reasons == 65
    # A series younger than the hold proves nothing in held mode.
    fake.matrices["clocks"] = [(labels("n1"), [(now - 5, "64")])]
    young = await src(fake).read_detailed(["n1"], thermal_hold=timedelta(seconds=30))
    assert young.readings["n1"].gpus[0].clock_event_reasons is None


# --- nodes ---------------------------------------------------------------------------------------


async def test_nodes_without_current_series(fake: FakePrometheus) -> None:
    fake.present(labels("n1"))
    # n2 still has history in the window but no current series: its exporter went away.
    fake.vectors["ecc_dbe_volatile"] = [(labels("n2"), "4")]
    readings, errors = await src(fake).read(["n1", "n2", "n3"], thermal_hold=HOLD)
    assert list(readings) == ["n1"]
    assert errors == {
        "n2": "DCGM series in Prometheus for node n2 are stale (exporter down or no longer "
        "scraped)",
        "n3": "no DCGM series in Prometheus for node n3",
    }


async def test_node_label_candidates(fake: FakePrometheus) -> None:
    pod = {"gpu": "0", "UUID": UUID0, "Hostname": "dcgm-exporter-abc", "node": "n1"}
    lower = {"gpu": "0", "UUID": UUID1, "hostname": "n2", "node": "n2"}
    fake.present(pod, lower, {"gpu": "0", "UUID": "GPU-x"})  # the last one has no node label
    readings, errors = await src(fake, node_label=("kubernetes_node", "node")).read(
        ["n1", "n2"], thermal_hold=HOLD)
    assert errors == {}
    assert [g.uuid for g in readings["n1"].gpus] == [UUID0]
    assert [g.uuid for g in readings["n2"].gpus] == [UUID1]
    default = src(fake)
    assert "instance" in default.queries(HOLD)["present"][0]
    _, errors = await default.read(["n1"], thermal_hold=HOLD)
    assert errors == {"n1": "no DCGM series in Prometheus for node n1"}


async def test_an_exporter_cannot_speak_for_another_node(fake: FakePrometheus) -> None:
    """A compromised exporter on n2 writes Hostname="n1" and an XID 79; Prometheus attaches
    instance="n2" to everything it scrapes there. n1 stays healthy, and the XID is n2's."""
    now = time.time()
    forged = labels("n1", uuid=UUID1, instance="n2")
    fake.present(labels("n1"), forged)
    fake.matrices["xid"] = [(forged, [(now - 1, "79")])]
    readings, errors = await src(fake).read(["n1", "n2"], thermal_hold=HOLD)
    assert errors == {}
    assert verdict(readings, "n1").action == Action.NONE
    assert verdict(readings, "n2").action == Action.REBOOT
    for own in ("Hostname", "hostname", ("instance", "Hostname")):
        with pytest.raises(ValueError, match="written by the exporter itself"):
            src(fake, node_label=own)


@pytest.mark.parametrize(("series", "why"), [
    ({"xid": [(0, "79.5")]}, "XID value 79.5 is not an integer"),
    ({"xid": [(0, "70000")]}, "XID value 70000.0 is not an integer"),
    ({"count": "\u0667\u0669"}, "xid label '\u0667\u0669' is not an XID"),
    ({"count": "7" * 200}, "xid label '77777777777777777777' is not an XID"),
    ({"count": "7" * 5000}, "label xid longer than 256 characters"),
    ({"gpu": "\uff10"}, "gpu label '\uff10' is not a GPU index"),
    ({"gpu": "\u0966"}, "gpu label '\u0966' is not a GPU index"),
    ({"uuid": "G" * 300}, "label UUID longer than 256 characters"),
])
async def test_malformed_series_make_their_node_an_error(
        fake: FakePrometheus, series: dict[str, Any], why: str) -> None:
    """Garbage from one exporter: that node is an error (never a verdict), the others read."""
    now = time.time()
    ls = labels("n1", gpu=series.get("gpu", "0"), uuid=series.get("uuid", UUID0))
    fake.present(ls, labels("n2", uuid=UUID1))
    fake.matrices["xid"] = [(ls, [(now - 1, v) for _, v in series.get("xid", [(0, "0")])]),
                            (labels("n2", uuid=UUID1), [(now - 1, "0")])]
    if "count" in series:
        fake.vectors["xid_count"] = [(labels("n1", xid=series["count"]), "2")]
    readings, errors = await src(fake).read(["n1", "n2"], thermal_hold=HOLD)
    assert list(errors) == ["n1"] and why in errors["n1"], errors
    assert "n1" not in readings and verdict(readings, "n2").action == Action.NONE


@pytest.mark.parametrize(("kind", "value", "field_name"), [
    ("ecc_dbe_volatile", "1e-300", "ecc_dbe_volatile"),
    ("row_remap_pending", "0.5", "row_remap_pending"),
    ("recovery_action", "2.5", "recovery_action"),
    ("xid_count", "1.5", "xid_counts"),
    ("clocks", "64.25", "clock_event_reasons"),
])
async def test_a_count_or_flag_with_a_fraction_is_malformed_not_a_fault(
        fake: FakePrometheus, kind: str, value: str, field_name: str) -> None:
    """The direct scrape's rule through Prometheus too: ``1e-300`` double-bit errors is a
    broken exporter or a forged series, never "> 0"; the node is an error, the others read."""
    now = time.time()
    fake.present(labels("n1"), labels("n2", uuid=UUID1))
    if kind == "clocks":
        fake.matrices["clocks"] = [(labels("n1"), [(now - 1, value)])]
    elif kind == "xid_count":
        fake.vectors["xid_count"] = [(labels("n1", xid="79"), value)]
    else:
        fake.vectors[kind] = [(labels("n1"), value)]
    fake.vectors.setdefault("ecc_dbe_volatile", []).append((labels("n2", uuid=UUID1), "0"))
    readings, errors = await src(fake).read(["n1", "n2"], thermal_hold=HOLD)
    assert list(errors) == ["n1"], errors
    assert f"{field_name} value" in errors["n1"] and "whole number" in errors["n1"]
    assert "n1" not in readings and verdict(readings, "n2").action == Action.NONE


def test_node_of_prefers_candidate_order() -> None:
    ls = {"Hostname": "a", "node": "b"}
    assert node_of(ls, {"a", "b"}, ("Hostname", "node")) == "a"
    assert node_of(ls, {"b"}, ("Hostname", "node")) == "b"
    assert node_of(ls, {"c"}, ("Hostname", "node")) is None


def test_constructor_validation_and_durations() -> None:
    with pytest.raises(ValueError, match="invalid Prometheus label"):
        PrometheusSource(url="http://p", node_label=("Hostname", 'x"}) or vector(1'))
    with pytest.raises(ValueError, match="window"):
        PrometheusSource(url="http://p", window=timedelta(0))
    assert promql_duration(timedelta(minutes=5)) == "300s"
    assert promql_duration(timedelta(milliseconds=1500)) == "1500ms"
    source = PrometheusSource(url="http://p/prometheus/", window=timedelta(minutes=5))
    assert source.url == "http://p/prometheus"
    queries = source.queries(timedelta(minutes=2))
    assert queries["xid"] == ("DCGM_FI_DEV_XID_ERRORS[300s]", "matrix")
    assert (
        "min_over_time(DCGM_FI_DEV_GPU_TEMP[120s]) and DCGM_FI_DEV_GPU_TEMP offset 120s"
        in (queries["gpu_temp"][0])
    )
    # A zero hold reads the last temperature instead.
    assert (
        "last_over_time(DCGM_FI_DEV_GPU_TEMP[300s])" in source.queries(timedelta(0))["gpu_temp"][0]
    )
    json.dumps(queries)  # plain strings, loggable
