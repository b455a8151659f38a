"""`gpu-remediate sim cluster ...`: serve the simulator and drive its control API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from sim.cluster.kubeconfig import write_kubeconfig
from sim.cluster.machines import NodeTiming
from sim.cluster.runtime import BANNER, start_cluster_simulator

cluster_app = typer.Typer(
    name="cluster",
    help="Kubernetes API server simulator (loopback only; never a production component).",
    no_args_is_help=True,
)
console = Console()
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_URL = "http://127.0.0.1:6443"


async def _serve(
    host: str,
    port: int,
    scenario: str,
    gpu_sim_url: str | None,
    kubeconfig_out: Path | None,
    job_seconds: float,
    node_timing: NodeTiming,
    kubernetes_version: str,
) -> None:
    sim = await start_cluster_simulator(
        host=host,
        port=port,
        scenario=scenario,
        gpu_sim_url=gpu_sim_url,
        job_seconds=job_seconds,
        node_timing=node_timing,
        kubernetes_version=kubernetes_version,
    )
    # Plain, flushed lines: scripts read the chosen port from them.
    print(BANNER.format(url=sim.url), flush=True)
    print(f"port {sim.port}", flush=True)
    if kubeconfig_out is not None:
        write_kubeconfig(kubeconfig_out, sim.url)
        print(f"kubeconfig written to {kubeconfig_out}", flush=True)
    if not gpu_sim_url:
        print("no --gpu-sim-url: validation Jobs succeed and repair Jobs are no-ops", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await sim.stop()


@cluster_app.command()
def serve(
    host: Annotated[str, typer.Option(help="Loopback address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one and prints it.")] = 6443,
    scenario: Annotated[str, typer.Option(
        help="small|training|inference|gpu-operator|gb200 or a YAML path.")] = (
        "small"
    ),
    gpu_sim_url: Annotated[str | None, typer.Option(help="GPU simulator base URL.")] = None,
    kubeconfig_out: Annotated[Path | None, typer.Option(help="Write a kubeconfig here.")] = None,
    job_seconds: Annotated[float, typer.Option(help="Run time of simulated Job pods.")] = 2.0,
    reboot_seconds: Annotated[
        float, typer.Option(help="How long a reboot keeps a node NotReady.")
    ] = 3.0,
    shutdown_seconds: Annotated[
        float, typer.Option(help="Longest delay from a reboot command to the shutdown.")
    ] = 1.0,
    device_plugin_seconds: Annotated[
        float, typer.Option(help="After boot, how long nvidia.com/gpu stays 0 allocatable.")
    ] = 1.0,
    status_grace_seconds: Annotated[
        float, typer.Option(help="A silent kubelet's node turns Unknown after this long.")
    ] = 4.0,
    reregister_seconds: Annotated[
        float, typer.Option(help="A replaced node is absent this long before it registers.")
    ] = 1.0,
    operand_seconds: Annotated[
        float, typer.Option(help="A GPU Operator operand pod's start to Ready (device plugin, "
                                 "DCGM, dcgm-exporter, GPU feature discovery).")
    ] = 1.0,
    plugin_health_seconds: Annotated[
        float, typer.Option(help="How often the device plugins' health check learns XIDs "
                                 "from the GPU simulator.")
    ] = 1.0,
    reboot_seed: Annotated[
        int, typer.Option(help="Seed of the draw: reboot command returns first or is killed.")
    ] = 0,
    kubernetes_version: Annotated[
        str, typer.Option(help="The release the API server poses as (1.33, 1.36 or 1.37): "
                               "which resource.k8s.io versions exist (DeviceTaintRule: "
                               "v1beta2 from 1.36, v1 from 1.37).")
    ] = "1.33",
) -> None:
    """Serve a simulated cluster seeded from a scenario until interrupted."""
    if host not in LOOPBACK:
        # No authentication or authorization exists here, so never expose it.
        raise typer.BadParameter(f"{host!r} is not a loopback address", param_hint="--host")
    try:
        timing = NodeTiming(
            reboot_seconds=reboot_seconds, shutdown_seconds=shutdown_seconds,
            device_plugin_seconds=device_plugin_seconds,
            status_grace_seconds=status_grace_seconds, reregister_seconds=reregister_seconds,
            operand_seconds=operand_seconds, plugin_health_seconds=plugin_health_seconds,
            seed=reboot_seed,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    try:
        asyncio.run(
            _serve(host, port, scenario, gpu_sim_url, kubeconfig_out, job_seconds, timing,
                   kubernetes_version)
        )
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--scenario") from err


def _rules(text: str) -> Any:
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    data = json.loads(raw)
    return data if isinstance(data, dict) else {"rules": data}


@cluster_app.command()
def faults(
    url: Annotated[str, typer.Option(help="Simulator URL.")] = DEFAULT_URL,
    rules: Annotated[
        str | None,
        typer.Option(help='JSON rules (a list, or {"rules": [...], "seed": N}), or @file.'),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="RNG seed for rule rates.")] = None,
    clear: Annotated[bool, typer.Option(help="Remove all fault rules.")] = False,
) -> None:
    """Show, set or clear API fault injection rules."""
    with httpx.Client(base_url=url, timeout=10) as http:
        if clear:
            resp = http.delete("/sim/v1/faults")
        elif rules is not None:
            body = _rules(rules)
            if seed is not None:
                body["seed"] = seed
            resp = http.put("/sim/v1/faults", json=body)
        else:
            resp = http.get("/sim/v1/faults")
    if resp.status_code >= 400:
        console.print(f"[red]{resp.status_code}[/red] {resp.text}")
        raise typer.Exit(1)
    console.print_json(resp.text)


@cluster_app.command()
def writes(
    url: Annotated[str, typer.Option(help="Simulator URL.")] = DEFAULT_URL,
    clear: Annotated[bool, typer.Option(help="Empty the write log.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show (or clear) every mutating API request the simulator received."""
    with httpx.Client(base_url=url, timeout=10) as http:
        if clear:
            http.delete("/sim/v1/writes").raise_for_status()
            console.print("write log cleared")
            return
        entries = http.get("/sim/v1/writes").json()["writes"]
    if as_json:
        console.print_json(json.dumps(entries))
        return
    table = Table("time", "verb", "resource", "namespace", "name", "code", "dry run")
    for w in entries:
        table.add_row(
            w["time"],
            w["verb"],
            w["resource"],
            w["namespace"],
            w["name"],
            str(w["code"]),
            "yes" if w["dryRun"] else "",
        )
    console.print(table)
    console.print(f"{len(entries)} mutating request(s)")
