"""The worker process: what the Deployment runs (``gpu-remediate worker``).

``run`` is the process (Temporal workers, metrics, graceful shutdown), ``wiring`` what it
registers, ``health`` its probes' endpoints.
"""

from worker.service.run import run_worker
from worker.service.wiring import build_fleet, kube_client, worker_activities

__all__ = ["build_fleet", "kube_client", "run_worker", "worker_activities"]
