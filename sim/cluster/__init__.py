"""A Kubernetes API server simulator for gpu-remediate's tests and demos.

It serves the subset of the real REST API the product uses, over HTTP, with
the real semantics (resourceVersion conflicts, graceful deletion, the
Eviction API and PodDisruptionBudgets, Jobs), so the official `kubernetes`
client works against it unchanged. See docs/simulators-cluster.md.
"""

from sim.cluster.kubeconfig import write_kubeconfig
from sim.cluster.runtime import RunningClusterSim, start_cluster_simulator
from sim.cluster.threaded import ThreadedClusterSim

__all__ = ["RunningClusterSim", "ThreadedClusterSim", "start_cluster_simulator", "write_kubeconfig"]
