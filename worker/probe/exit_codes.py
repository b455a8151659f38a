"""``gpu-remediate check``'s exit codes: what a script gates on. Kept apart from the probe so
that ``check --help`` can print the table without loading NVML or the parsers."""

from __future__ import annotations

from policy.models import Action

EXIT_HEALTHY = 0
EXIT_ALERT = 1
EXIT_THERMAL = 2
EXIT_REPAIR = 3
EXIT_QUARANTINE = 4
EXIT_ERROR = 10
EXIT_NO_DRIVER = 11
EXIT_USAGE = 64
"""``EX_USAGE`` of sysexits.h: 2 (click's usage code) is a severity here."""

EXIT_BY_ACTION: dict[Action, int] = {
    # The application restarts; the node is fine: "none" in the original tool too.
    Action.NONE: EXIT_HEALTHY,
    Action.APP: EXIT_HEALTHY,
    # Both leave the node in service and ask a human to look (an XID outside the catalog, an
    # application XID that keeps coming back): the original's "watch".
    Action.ALERT: EXIT_ALERT,
    Action.DIAGNOSE: EXIT_ALERT,
    Action.THERMAL: EXIT_THERMAL,
    Action.RESET: EXIT_REPAIR,
    Action.REBOOT: EXIT_REPAIR,
    Action.QUARANTINE: EXIT_QUARANTINE,
}
"""The original's five levels: none, watch, cordon, drain and repair, quarantine. Reset and
reboot share 3, its "drain and repair": a script's ``-ge 3`` means "take it out of service" in
both tools; the JSON says which action."""

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_HEALTHY, "healthy: action none or app (restart the application), every GPU and "
                   "health field read"),
    (EXIT_ALERT, "alert or diagnose: the node stays in service; a human looks (diagnose: run "
                 "dcgmi diag -r 3)"),
    (EXIT_THERMAL, "thermal: cordon, no drain"),
    (EXIT_REPAIR, "reset or reboot: drain and repair"),
    (EXIT_QUARANTINE, "quarantine"),
    (EXIT_ERROR, "error: the check is incomplete or the GPUs cannot be read"),
    (EXIT_NO_DRIVER, "no NVIDIA driver or no NVIDIA GPU"),
    (EXIT_USAGE, "bad usage: option, config file, --from-file or --xid-log"),
)
"""The table ``check --help`` and docs/check.md print (tests compare them)."""
