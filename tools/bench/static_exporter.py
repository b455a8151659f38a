"""A tiny static dcgm-exporter fleet for benchmarks: pre-rendered per-node bodies.

Run: ``.venv/bin/python -m tools.bench.static_exporter --nodes 10000 --gpus 8 --port 0``

At start it renders every node of ``Fleet.synthetic(nodes, gpus)`` once with the GPU
simulator's renderer and keeps the encoded bodies; ``GET /nodes/<node>/metrics`` then only
copies bytes. Scraping it measures the product's side of a fleet observation (HTTP client,
parser, policy) without the simulator's per-request render cost, which otherwise shares
the same CPUs. It prints ``port <n>`` once it listens. Not a product component.
"""

from __future__ import annotations

import argparse
import gc
import socket
import time

from aiohttp import web

from sim.gpu.exposition import CONTENT_TYPE, render_node
from sim.gpu.fleet import Fleet


def build(nodes: int, gpus: int, extra_fields: bool) -> dict[str, bytes]:
    fleet = Fleet.synthetic(nodes, gpus, extra_fields=extra_fields)
    return {name: render_node(fleet, name).encode() for name in fleet.nodes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--extra-fields", action="store_true",
                   help="also the opt-in health fields (default: the stock counter set)")
    args = p.parse_args()

    started = time.monotonic()
    bodies = build(args.nodes, args.gpus, args.extra_fields)
    gc.collect()
    gc.freeze()
    total = sum(len(b) for b in bodies.values())

    async def node_metrics(request: web.Request) -> web.Response:
        body = bodies.get(request.match_info["node"])
        if body is None:
            return web.Response(status=404, text="unknown node\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True, "nodes": len(bodies)})

    app = web.Application()
    app.router.add_get("/nodes/{node}/metrics", node_metrics)
    app.router.add_get("/healthz", healthz)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"static exporter: {len(bodies)} nodes, {total / 1e6:.0f} MB pre-rendered in "
          f"{time.monotonic() - started:.1f}s", flush=True)
    print(f"port {sock.getsockname()[1]}", flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
