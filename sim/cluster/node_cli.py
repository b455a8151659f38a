"""`gpu-remediate sim node ...`: script what a simulated node's machine does.

Talks to a running cluster simulator's control API over HTTP (`/sim/v1/nodes`); it
imports none of the simulator itself.
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

node_app = typer.Typer(
    name="node",
    help="Script a simulated node: a reboot that never returns, a stopped kubelet, a "
         "machine replaced under the same name, and recovery.",
    no_args_is_help=True,
)
console = Console()
DEFAULT_URL = "http://127.0.0.1:6443"
Url = Annotated[str, typer.Option("--url", help="Base URL of a running cluster simulator.")]
NodeArg = Annotated[str, typer.Argument(help="Node name (a scenario node with a kubelet).")]


def _post(url: str, node: str, command: str, params: dict[str, str] | None = None
          ) -> dict[str, Any]:
    try:
        resp = httpx.post(f"{url.rstrip('/')}/sim/v1/nodes/{node}/{command}", params=params,
                          timeout=10)
    except httpx.HTTPError as err:
        console.print(f"[red]cannot reach the cluster simulator at {url}:[/red] {err}")
        raise typer.Exit(1) from err
    if resp.status_code >= 400:
        try:
            message = resp.json().get("message") or resp.text
        except ValueError:
            message = resp.text
        console.print(f"[red]{resp.status_code}[/red] {message}")
        raise typer.Exit(1)
    result: dict[str, Any] = resp.json()
    return result


def _report(result: dict[str, Any]) -> None:
    console.print(f"{result['node']}: {result['state']}"
                  + (" (next reboot hangs)" if result.get("hang_next_reboot") else ""))


@node_app.command()
def hang(node: NodeArg, url: Url = DEFAULT_URL,
         hard: Annotated[bool, typer.Option(
             "--hard", help="Power lost now: no graceful shutdown, the pods keep their phase "
                            "on a NotReady node, and the node never returns until recover.")]
         = False) -> None:
    """The node's next reboot never returns (already down: this one never does).

    Example: gpu-remediate sim node hang gpu-node-01 --hard
    """
    _report(_post(url, node, "hang", {"hard": "true"} if hard else None))


@node_app.command()
def replace(node: NodeArg, url: Url = DEFAULT_URL) -> None:
    """Delete the node and register a new machine under the same name: a new UID, its pods
    gone, none of gpu-remediate's labels, annotations or taints.

    Example: gpu-remediate sim node replace gpu-node-01
    """
    _report(_post(url, node, "replace"))


@node_app.command()
def wedge(node: NodeArg, url: Url = DEFAULT_URL) -> None:
    """Stop the node's kubelet: NotReady (Unknown), pods stuck Terminating, nothing starts.

    Example: gpu-remediate sim node wedge gpu-node-01
    """
    _report(_post(url, node, "wedge"))


@node_app.command()
def recover(node: NodeArg, url: Url = DEFAULT_URL) -> None:
    """End hang and wedge: the kubelet runs again, a hung reboot completes.

    Example: gpu-remediate sim node recover gpu-node-01
    """
    _report(_post(url, node, "recover"))


@node_app.command("list")
def list_(url: Url = DEFAULT_URL) -> None:
    """Each simulated machine's state and its recent events."""
    try:
        nodes = httpx.get(f"{url.rstrip('/')}/sim/v1/nodes", timeout=10).json()["nodes"]
    except (httpx.HTTPError, ValueError, KeyError) as err:
        console.print(f"[red]cannot read machines from {url}:[/red] {err}")
        raise typer.Exit(1) from err
    table = Table("node", "state", "reboots", "last event")
    for name, m in nodes.items():
        table.add_row(name, m["state"] + (" (next reboot hangs)" if m["hang_next_reboot"] else ""),
                      str(m["reboots"]), (m["events"] or [""])[-1])
    console.print(table)
