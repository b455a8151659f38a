"""The health policy: pure functions from DCGM readings to a verdict per node.

Nothing in this package does I/O, so workflows can import it inside the Temporal sandbox.
"""

from policy.config import PolicySettings
from policy.models import Action, Finding, GpuReading, NodeReadings, Verdict
from policy.rules import evaluate_fleet, evaluate_node, is_thermal_recovered
from policy.xid import DEFAULT_XID_TABLE, Bucket, XidRule

__all__ = [
    "DEFAULT_XID_TABLE",
    "Action",
    "Bucket",
    "Finding",
    "GpuReading",
    "NodeReadings",
    "PolicySettings",
    "Verdict",
    "XidRule",
    "evaluate_fleet",
    "evaluate_node",
    "is_thermal_recovered",
]
