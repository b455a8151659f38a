"""The operator CLI, ``gpu-remediate``: every command an SRE types (``commands``), the
Temporal calls behind them (``operator``), the admission plan (``plan``), which installation
a command talks to and how to say it could not (``locate``), and output that fits a shell:
exit codes, whole-value tables, text without terminal escapes (``output``).

Each command imports what it runs when it runs: ``worker`` loads the worker process,
``check`` the node probe, ``up`` the laptop stack, ``sim`` the simulators; ``--help``
loads none of them.
"""

from worker.cli.commands import app, main

__all__ = ["app", "main"]
