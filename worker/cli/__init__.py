"""The operator CLI, ``gpu-remediate``: every command an SRE types (``commands``), the
Temporal calls behind them (``operator``) and the offline admission plan (``plan``).

Each command imports what it runs when it runs: ``worker`` loads the worker process,
``check`` the node probe, ``up`` the laptop stack, ``sim`` the simulators; ``--help``
loads none of them.
"""

from worker.cli.commands import app, main

__all__ = ["app", "main"]
