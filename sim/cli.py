"""`gpu-remediate sim`: the simulators' command line (a GPU fleet, a cluster, its machines).

Loaded only when a `sim` command runs (worker/cli/commands.py mounts it lazily), so the operator CLI
and the worker never import a simulator.
"""

from __future__ import annotations

import typer

from sim.cluster.cli import cluster_app
from sim.cluster.node_cli import node_app
from sim.gpu.cli import gpu_app

sim_app = typer.Typer(help="Simulators for laptops and tests: a GPU fleet and a cluster.",
                      no_args_is_help=True, add_completion=False)
sim_app.add_typer(gpu_app, name="gpu")
sim_app.add_typer(cluster_app, name="cluster")
sim_app.add_typer(node_app, name="node")
