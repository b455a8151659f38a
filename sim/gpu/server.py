"""HTTP face of the GPU simulator: per-node dcgm-exporter endpoints plus a JSON control API.

One process stands in for the dcgm-exporter DaemonSet of a whole fleet: node N's exporter
is `GET /nodes/N/metrics`. Exporter failure modes as a scraper sees them:

- `down`: the connection is closed without any HTTP response (clients report
  "server disconnected"). A real dead exporter refuses the TCP connection, which one
  shared listener cannot do per node; both are transport errors, not HTTP statuses.
- `slow`: the answer is delayed by `delay_seconds` (default 5), so scrape timeouts fire.
- `empty`: 200 with the right content type and an empty body.
- `garbled`: 200 with a body cut mid-line followed by non-exposition bytes.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim.gpu.exposition import CONTENT_TYPE, garble, render_chunks, render_node
from sim.gpu.faults import FaultError
from sim.gpu.fleet import Fleet, UnknownGpu, UnknownNode
from sim.scenario import Scenario, load_scenario

log = logging.getLogger("sim.gpu")

FLEET = web.AppKey("fleet", Fleet)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _BadRequest(Exception):
    pass


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _api(handler: _Handler) -> _Handler:
    """Turn the fleet's exceptions into JSON errors with the right status code."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except UnknownNode as err:
            return _error(404, f"{err}; list them with GET /api/v1/nodes")
        except UnknownGpu as err:
            return _error(404, str(err))
        except (FaultError, ValueError) as err:
            return _error(422, str(err))
        except _BadRequest as err:
            return _error(400, str(err))

    return wrapped


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    raw = await request.text()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise _BadRequest(f"request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise _BadRequest("request body must be a JSON object")
    return data


def _fleet(request: web.Request) -> Fleet:
    return request.app[FLEET]


# -- exporter endpoints ----------------------------------------------------------------
async def node_metrics(request: web.Request) -> web.StreamResponse:
    fleet = _fleet(request)
    name = request.match_info["node"]
    try:
        node = fleet.node(name)
    except UnknownNode as err:
        return web.Response(status=404, text=f"{err}\n")
    mode, delay = node.exporter.mode, node.exporter.delay_seconds
    if mode == "down":
        if request.transport is not None:
            request.transport.abort()
        return web.Response()  # never sent: the connection is already gone
    if mode == "slow" and delay > 0:
        await asyncio.sleep(delay)
    text = "" if mode == "empty" else render_node(fleet, name)
    if mode == "garbled":
        text = garble(text)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


def _next_chunk(chunks: Iterator[str]) -> bytes | None:
    chunk = next(chunks, None)
    return None if chunk is None else chunk.encode()


async def fleet_metrics(request: web.Request) -> web.StreamResponse:
    """Every reachable node in one exposition (what a federating Prometheus shows).

    Nodes whose exporter is down, empty or garbled contribute nothing; slow ones are
    included without their delay. Rendering runs in a worker thread one family at a
    time so a 10,000-node render neither blocks the event loop nor sits in memory whole.
    """
    fleet = _fleet(request)
    nodes = [n for n in fleet.nodes.values() if n.exporter.mode in ("up", "slow")]
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    await response.prepare(request)
    chunks = render_chunks(fleet, nodes)
    loop = asyncio.get_running_loop()
    while (chunk := await loop.run_in_executor(None, _next_chunk, chunks)) is not None:
        await response.write(chunk)
    await response.write_eof()
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "nodes": len(_fleet(request).nodes)})


# -- JSON control API ------------------------------------------------------------------
@_api
async def list_nodes(request: web.Request) -> web.Response:
    fleet = _fleet(request)
    nodes = [fleet.node_json(name) for name in fleet.nodes]
    return web.json_response({"count": len(nodes), "switches": fleet.switches(), "nodes": nodes})


@_api
async def get_node(request: web.Request) -> web.Response:
    return web.json_response(_fleet(request).node_json(request.match_info["node"]))


@_api
async def inject_fault(request: web.Request) -> web.Response:
    node, gpu = request.match_info["node"], request.match_info["gpu"]
    fleet = _fleet(request)
    fleet.gpu(node, gpu)  # unknown node/GPU is a 404 even when the body is also wrong
    body = await _body(request)
    fault = fleet.inject(node, gpu, body.get("kind"), body.get("value"), body.get("clears_on"))
    return web.json_response({"node": node, "gpu": int(gpu), **fault.to_json()}, status=201)


@_api
async def clear_faults(request: web.Request) -> web.Response:
    node = request.match_info["node"]
    removed = _fleet(request).clear(node, request.query.get("gpu"))
    return web.json_response(
        {"node": node, "cleared": [{"gpu": i, **f.to_json()} for i, f in removed]}
    )


@_api
async def reset(request: web.Request) -> web.Response:
    node = request.match_info["node"]
    gpu = (await _body(request)).get("gpu")
    result = _fleet(request).reset(node, None if gpu is None else str(gpu))
    if not result.ok:
        return web.json_response({"ok": False, "error": result.reason}, status=409)
    cleared = [{"gpu": i, **f.to_json()} for i, f in result.cleared]
    return web.json_response({"ok": True, "node": node, "cleared": cleared})


@_api
async def reboot(request: web.Request) -> web.Response:
    node = request.match_info["node"]
    result = _fleet(request).reboot(node)
    cleared = [{"gpu": i, **f.to_json()} for i, f in result.cleared]
    return web.json_response({"ok": True, "node": node, "cleared": cleared})


@_api
async def set_persistence(request: web.Request) -> web.Response:
    node = request.match_info["node"]
    body = await _body(request)
    gpu = body.get("gpu")
    changed = _fleet(request).set_persistence(node, None if gpu is None else str(gpu),
                                              body.get("enabled"))
    return web.json_response({"node": node, "gpus": [
        {"index": g.index, "uuid": g.uuid, "persistence_mode": g.persistence_mode}
        for g in changed]})


@_api
async def health(request: web.Request) -> web.Response:
    report = _fleet(request).health(request.match_info["node"])
    return web.json_response(
        {"node": report.node, "healthy": report.healthy, "problems": report.problems}
    )


@_api
async def set_exporter(request: web.Request) -> web.Response:
    node = request.match_info["node"]
    fleet = _fleet(request)
    fleet.node(node)
    body = await _body(request)
    state = fleet.set_exporter(node, body.get("mode"), body.get("delay_seconds"))
    return web.json_response({"node": node, **state.to_json()})


@_api
async def set_pod(request: web.Request) -> web.Response:
    node, gpu = request.match_info["node"], request.match_info["gpu"]
    fleet = _fleet(request)
    fleet.gpu(node, gpu)
    body = await _body(request)
    if body.get("pod") is None:
        fleet.unassign(node, gpu)
        return web.json_response({"node": node, "gpu": int(gpu), "pod": None})
    fields: dict[str, str] = {}
    for key, default in (("namespace", None), ("pod", None), ("container", "main")):
        value = body.get(key, default)
        if not isinstance(value, str) or not value:
            raise ValueError(f"pod assignment needs a non-empty string {key!r}, got {value!r}")
        fields[key] = value
    fleet.assign(node, gpu, fields["namespace"], fields["pod"], fields["container"])
    return web.json_response({"node": node, "gpu": int(gpu), "pod": fields})


def create_app(fleet: Fleet) -> web.Application:
    app = web.Application()
    app[FLEET] = fleet
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", fleet_metrics)
    r.add_get("/nodes/{node}/metrics", node_metrics)
    r.add_get("/api/v1/nodes", list_nodes)
    r.add_get("/api/v1/nodes/{node}", get_node)
    r.add_post("/api/v1/nodes/{node}/gpus/{gpu}/faults", inject_fault)
    r.add_delete("/api/v1/nodes/{node}/faults", clear_faults)
    r.add_post("/api/v1/nodes/{node}/reset", reset)
    r.add_post("/api/v1/nodes/{node}/reboot", reboot)
    r.add_post("/api/v1/nodes/{node}/persistence", set_persistence)
    r.add_get("/api/v1/nodes/{node}/health", health)
    r.add_put("/api/v1/nodes/{node}/exporter", set_exporter)
    r.add_put("/api/v1/nodes/{node}/gpus/{gpu}/pod", set_pod)
    return app


def build_fleet(source: Fleet | Scenario | str, **switches: Any) -> Fleet:
    """A fleet from a Fleet (used as is), a Scenario, or a scenario name/path."""
    if isinstance(source, Fleet):
        return source
    scenario = source if isinstance(source, Scenario) else load_scenario(source)
    return Fleet.from_scenario(scenario, **switches)


def _announce(fleet: Fleet, host: str, port: int) -> None:
    gpus = sum(len(n.gpus) for n in fleet.nodes.values())
    log.warning(
        "GPU SIMULATOR (simulated dcgm-exporter, no real GPUs): %d nodes, %d GPUs on "
        "http://%s:%d (per-node metrics at /nodes/<node>/metrics, control API at /api/v1)",
        len(fleet.nodes),
        gpus,
        host,
        port,
    )
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        log.warning(
            "GPU simulator listening on non-loopback %s: anyone who can reach it can inject faults",
            host,
        )


@dataclass
class RunningSimulator:
    runner: web.AppRunner
    url: str
    fleet: Fleet

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_gpu_simulator(
    source: Fleet | Scenario | str, host: str = "127.0.0.1", port: int = 0, **switches: Any
) -> RunningSimulator:
    """Start inside a running event loop (tests, embedding); port 0 picks a free port."""
    fleet = build_fleet(source, **switches)
    runner = web.AppRunner(create_app(fleet), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server  # aiohttp offers no public accessor for the bound port
    bound = server.sockets[0].getsockname()[1] if isinstance(server, asyncio.Server) else port
    _announce(fleet, host, bound)
    return RunningSimulator(runner, f"http://{host}:{bound}", fleet)


def run_gpu_simulator(
    host: str = "127.0.0.1",
    port: int = 9400,
    scenario_or_fleet: Fleet | Scenario | str = "small",
    **switches: Any,
) -> None:
    """Serve until interrupted.

    Switches: hostname_label, xid_series, extra_fields, xid_count_window_ms, serial_label.
    """
    fleet = build_fleet(scenario_or_fleet, **switches)
    # The fleet lives as long as the process; moving it out of the collector's view keeps
    # full GC passes (which hold the GIL) short while a big render allocates heavily.
    gc.collect()
    gc.freeze()
    _announce(fleet, host, port)
    web.run_app(create_app(fleet), host=host, port=port, print=None, access_log=None)
