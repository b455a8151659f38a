"""HTTP API, exporter modes as a scraper sees them, the sync client and the CLI."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from sim.gpu.cli import gpu_app
from sim.gpu.client import GpuSimClient, GpuSimError
from sim.gpu.exposition import CONTENT_TYPE
from sim.gpu.fleet import Fleet, NodeSpec
from sim.gpu.server import RunningSimulator, start_gpu_simulator

NODE = "gpu-node-01"


class ThreadedSimulator:
    """The simulator on its own event loop in a thread, so sync clients can call it."""

    def __init__(self, fleet: Fleet) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.sim: RunningSimulator = asyncio.run_coroutine_threadsafe(
            start_gpu_simulator(fleet, "127.0.0.1", 0), self.loop
        ).result(10)
        self.url = self.sim.url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.sim.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def sim() -> Iterator[ThreadedSimulator]:
    fleet = Fleet([NodeSpec(NODE), NodeSpec("gpu-node-02", gpus=4)])
    fleet.set_persistence(NODE, None, False)  # resets here are about what they clear
    server = ThreadedSimulator(fleet)
    yield server
    server.stop()


@pytest.fixture
def http(sim: ThreadedSimulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        yield client


@pytest.fixture
def client(sim: ThreadedSimulator) -> Iterator[GpuSimClient]:
    with GpuSimClient(sim.url) as c:
        yield c


def test_node_metrics_endpoint(http: httpx.Client) -> None:
    r = http.get(f"/nodes/{NODE}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE
    families = list(text_string_to_metric_families(r.text))
    assert families[0].name == "DCGM_FI_DEV_SM_CLOCK" and len(families[0].samples) == 8


def test_unknown_node_metrics_is_404_text(http: httpx.Client) -> None:
    r = http.get("/nodes/ghost/metrics")
    assert r.status_code == 404 and "unknown node 'ghost'" in r.text


def test_fleet_metrics_skips_unreachable_exporters(http: httpx.Client) -> None:
    http.put("/api/v1/nodes/gpu-node-02/exporter", json={"mode": "down"})
    text = http.get("/metrics").text
    fam = next(iter(text_string_to_metric_families(text)))
    assert {s.labels["Hostname"] for s in fam.samples} == {NODE}
    assert text.count("# HELP DCGM_FI_DEV_GPU_TEMP ") == 1


def test_inject_then_health_reset_and_metrics(http: httpx.Client) -> None:
    r = http.post(f"/api/v1/nodes/{NODE}/gpus/3/faults", json={"kind": "xid", "value": 48})
    assert r.status_code == 201
    assert r.json() | {"id": 0} == {
        "id": 0,
        "node": NODE,
        "gpu": 3,
        "kind": "xid",
        "value": 48,
        "clears_on": "reset",
        "description": "XID 48 (Double Bit ECC Error)",
    }
    assert 'err_code="48"' in http.get(f"/nodes/{NODE}/metrics").text
    health = http.get(f"/api/v1/nodes/{NODE}/health").json()
    assert health["node"] == NODE and health["healthy"] is False
    assert "XID 48" in health["problems"][0]
    r = http.post(f"/api/v1/nodes/{NODE}/reset", json={"gpu": "3"})
    assert r.status_code == 200 and r.json()["ok"] is True
    assert http.get(f"/api/v1/nodes/{NODE}/health").json() == {
        "node": NODE,
        "healthy": True,
        "problems": [],
    }


def test_reset_refused_when_off_the_bus(http: httpx.Client) -> None:
    http.post(f"/api/v1/nodes/{NODE}/gpus/5/faults", json={"kind": "fallen-off-bus"})
    r = http.post(f"/api/v1/nodes/{NODE}/reset", json={})
    assert r.status_code == 409
    assert r.json()["ok"] is False and "fallen off the bus" in r.json()["error"]
    assert http.post(f"/api/v1/nodes/{NODE}/reboot").status_code == 200
    assert http.get(f"/api/v1/nodes/{NODE}/health").json()["healthy"] is True


def test_clear_with_gpu_query(http: httpx.Client) -> None:
    for gpu in (1, 2):
        http.post(f"/api/v1/nodes/{NODE}/gpus/{gpu}/faults", json={"kind": "gpu-temp", "value": 99})
    r = http.delete(f"/api/v1/nodes/{NODE}/faults", params={"gpu": "2"})
    assert [c["gpu"] for c in r.json()["cleared"]] == [2]
    problems = http.get(f"/api/v1/nodes/{NODE}/health").json()["problems"]
    assert len(problems) == 1 and problems[0].startswith("GPU 1 ")


def test_listing_and_node_detail(http: httpx.Client) -> None:
    http.post(f"/api/v1/nodes/{NODE}/gpus/0/faults", json={"kind": "ecc-dbe"})
    listing = http.get("/api/v1/nodes").json()
    assert listing["count"] == 2 and listing["switches"]["hostname_label"] == "Hostname"
    node = listing["nodes"][0]
    assert node["name"] == NODE and node["exporter"] == {"mode": "up", "delay_seconds": 0.0}
    assert node["gpus"][0]["faults"][0]["kind"] == "ecc-dbe"
    assert http.get("/api/v1/nodes/gpu-node-02").json()["healthy"] is True
    assert http.get("/healthz").json() == {"ok": True, "nodes": 2}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "needle"),
    [
        (
            "GET",
            "/api/v1/nodes/ghost",
            None,
            404,
            "unknown node 'ghost'; the simulated fleet has 2 "
            "nodes; list them with GET /api/v1/nodes",
        ),
        ("POST", "/api/v1/nodes/ghost/reboot", None, 404, "GET /api/v1/nodes"),
        (
            "POST",
            f"/api/v1/nodes/{NODE}/gpus/8/faults",
            {"kind": "xid", "value": 1},
            404,
            "valid GPU indices are 0-7",
        ),
        (
            "POST",
            f"/api/v1/nodes/{NODE}/gpus/x/faults",
            {"kind": "xid", "value": 1},
            404,
            "valid GPU indices are 0-7",
        ),
        (
            "POST",
            f"/api/v1/nodes/{NODE}/gpus/0/faults",
            {"kind": "melt"},
            422,
            "valid kinds: xid, ecc-dbe",
        ),
        (
            "POST",
            f"/api/v1/nodes/{NODE}/gpus/0/faults",
            {"kind": "xid", "value": -1},
            422,
            "positive integer",
        ),
        (
            "POST",
            f"/api/v1/nodes/{NODE}/gpus/0/faults",
            {"kind": "gpu-temp", "value": 200},
            422,
            "between 0 and 150",
        ),
        (
            "PUT",
            f"/api/v1/nodes/{NODE}/exporter",
            {"mode": "sideways"},
            422,
            "up, down, slow, empty, garbled",
        ),
        ("PUT", f"/api/v1/nodes/{NODE}/gpus/0/pod", {"pod": "p"}, 422, "'namespace'"),
    ],
)
def test_api_errors(
    http: httpx.Client, method: str, path: str, body: object, status: int, needle: str
) -> None:
    r = http.request(method, path, json=body)
    assert r.status_code == status
    assert needle in r.json()["error"]


def test_invalid_json_body(http: httpx.Client) -> None:
    r = http.post(
        f"/api/v1/nodes/{NODE}/gpus/0/faults",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_pod_labels_via_api(http: httpx.Client) -> None:
    r = http.put(
        f"/api/v1/nodes/{NODE}/gpus/2/pod",
        json={"namespace": "ml", "pod": "job-1", "container": "trainer"},
    )
    assert r.status_code == 200
    text = http.get(f"/nodes/{NODE}/metrics").text
    assert text.count('container="trainer",namespace="ml",pod="job-1"}') >= 25
    http.put(f"/api/v1/nodes/{NODE}/gpus/2/pod", json={"pod": None})
    assert 'pod="job-1"' not in http.get(f"/nodes/{NODE}/metrics").text


def test_exporter_down_closes_connection(http: httpx.Client) -> None:
    http.put(f"/api/v1/nodes/{NODE}/exporter", json={"mode": "down"})
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(f"/nodes/{NODE}/metrics")
    assert http.get("/nodes/gpu-node-02/metrics").status_code == 200  # only that node


def test_exporter_slow_times_out_a_short_scrape(http: httpx.Client) -> None:
    http.put(f"/api/v1/nodes/{NODE}/exporter", json={"mode": "slow", "delay_seconds": 0.6})
    with pytest.raises(httpx.ReadTimeout):
        http.get(f"/nodes/{NODE}/metrics", timeout=0.2)
    start = time.monotonic()
    r = http.get(f"/nodes/{NODE}/metrics", timeout=5)
    assert r.status_code == 200 and time.monotonic() - start >= 0.55


def test_exporter_empty_and_garbled(http: httpx.Client) -> None:
    http.put(f"/api/v1/nodes/{NODE}/exporter", json={"mode": "empty"})
    r = http.get(f"/nodes/{NODE}/metrics")
    assert (r.status_code, r.text, r.headers["content-type"]) == (200, "", CONTENT_TYPE)
    http.put(f"/api/v1/nodes/{NODE}/exporter", json={"mode": "garbled"})
    r = http.get(f"/nodes/{NODE}/metrics")
    assert r.status_code == 200 and r.text
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(r.text))
    http.put(f"/api/v1/nodes/{NODE}/exporter", json={"mode": "up"})
    assert list(text_string_to_metric_families(http.get(f"/nodes/{NODE}/metrics").text))


def test_client_round_trip(client: GpuSimClient) -> None:
    fault = client.inject_fault(NODE, 1, "row-remap-pending")
    assert fault["clears_on"] == "reset"
    assert client.health(NODE)["healthy"] is False
    assert len(client.reset(NODE, 1)["cleared"]) == 1
    client.inject_fault(NODE, 1, "xid", 79)
    with pytest.raises(GpuSimError) as err:
        client.reset(NODE, 1)
    assert err.value.status == 409 and "reboot the node" in err.value.message
    assert client.reboot(NODE)["ok"] is True
    assert client.set_exporter_mode(NODE, "slow", 2)["delay_seconds"] == 2.0
    assert client.assign_pod(NODE, 0, "ml", "p")["pod"]["container"] == "main"
    assert [n["name"] for n in client.list_nodes()] == [NODE, "gpu-node-02"]
    assert client.clear(NODE)["cleared"] == []


def test_client_errors_carry_server_text(client: GpuSimClient) -> None:
    with pytest.raises(GpuSimError, match="unknown node 'ghost'") as err:
        client.health("ghost")
    assert err.value.status == 404
    with pytest.raises(GpuSimError, match="valid kinds"):
        client.inject_fault(NODE, 0, "melt")


def test_client_unreachable() -> None:
    with (
        GpuSimClient("http://127.0.0.1:9", timeout=1) as c,
        pytest.raises(GpuSimError, match="cannot reach the GPU simulator"),
    ):
        c.health(NODE)


def test_cli_commands(sim: ThreadedSimulator) -> None:
    runner = CliRunner()
    url = ["--url", sim.url]
    r = runner.invoke(
        gpu_app, ["inject", NODE, "--gpu", "3", "--kind", "xid", "--value", "79", *url]
    )
    assert r.exit_code == 0 and "XID 79" in r.output and "reboot" in r.output
    r = runner.invoke(gpu_app, ["health", NODE, *url])
    assert r.exit_code == 2 and "GPU 3" in r.output
    r = runner.invoke(gpu_app, ["reset", NODE, "--gpu", "3", *url])
    assert r.exit_code == 1 and "fallen off the bus" in r.output
    r = runner.invoke(gpu_app, ["list", *url])
    assert r.exit_code == 0 and NODE in r.output and "XID 79" in r.output
    assert runner.invoke(gpu_app, ["reboot", NODE, *url]).exit_code == 0
    r = runner.invoke(gpu_app, ["exporter", NODE, "slow", "--delay", "3", *url])
    assert r.exit_code == 0 and "slow" in r.output
    assert runner.invoke(gpu_app, ["health", NODE, *url]).exit_code == 0
    assert runner.invoke(gpu_app, ["clear", NODE, *url]).exit_code == 0


def test_cli_errors_exit_1_with_server_message(sim: ThreadedSimulator) -> None:
    r = CliRunner().invoke(
        gpu_app, ["inject", "ghost", "--kind", "xid", "--value", "1", "--url", sim.url]
    )
    assert r.exit_code == 1 and "unknown node 'ghost'" in r.output


def test_persistence_mode_shown_per_gpu_and_a_reset_refused_while_on(
        http: httpx.Client) -> None:
    gpus = http.get("/api/v1/nodes/gpu-node-02").json()["gpus"]
    assert [g["persistence_mode"] for g in gpus] == [True] * 4
    r = http.post("/api/v1/nodes/gpu-node-02/reset", json={"gpu": "2"})
    assert r.status_code == 409 and "persistence mode is Enabled" in r.json()["error"]
    r = http.post("/api/v1/nodes/gpu-node-02/persistence", json={"gpu": "2", "enabled": "no"})
    assert r.status_code == 422 and "enabled" in r.json()["error"]
    uuid = gpus[2]["uuid"]
    r = http.post("/api/v1/nodes/gpu-node-02/persistence", json={"gpu": uuid, "enabled": False})
    assert r.json()["gpus"] == [{"index": 2, "uuid": uuid, "persistence_mode": False}]
    assert http.post("/api/v1/nodes/gpu-node-02/reset", json={"gpu": uuid}).status_code == 200


def test_cli_lists_persistence_mode_as_json_and_refuses_a_reset(sim: ThreadedSimulator) -> None:
    import json

    from typer.testing import CliRunner

    from sim.gpu.cli import gpu_app

    runner = CliRunner()
    out = runner.invoke(gpu_app, ["list", "-o", "json", "--url", sim.url])
    assert out.exit_code == 0, out.output
    nodes = {n["name"]: n for n in json.loads(out.stdout)["nodes"]}
    assert all(g["persistence_mode"] for g in nodes["gpu-node-02"]["gpus"])
    refused = runner.invoke(gpu_app, ["reset", "gpu-node-02", "--gpu", "1", "--url", sim.url])
    assert refused.exit_code == 1 and "persistence mode" in refused.output
    runner.invoke(gpu_app, ["persistence", "gpu-node-02", "--gpu", "1", "--off",
                            "--url", sim.url])
    done = runner.invoke(gpu_app, ["reset", "gpu-node-02", "--gpu", "1", "--url", sim.url])
    assert done.exit_code == 0, done.output
