"""The GPU Operator's MIG manager on MIG nodes, as unkind as the real one.

A MIG node names its layout in the node label ``nvidia.com/mig.config``. MIG mode survives
a GPU reset and a reboot; the GPU and compute instances of the layout do not. The real MIG
manager (NVIDIA mig-parted's k8s-mig-manager) applies the layout when its pod starts and
again only when the label's value changes, and reports in ``nvidia.com/mig.config.state``:
``pending`` while it applies, then ``success`` or ``failed``. So after a reset the label
still says ``success`` while no instance exists, until something restarts the MIG manager
(the GPU Operator restarts it through ``nvidia.com/gpu.deploy.mig-manager``).

Here: a reset or a boot clears the machine's instances (``Machine.mig_instances``), the
state label is left as it was; each new MIG manager instance (a new pod, or a container
restart) on a MIG node applies the layout: ``pending`` for ``apply_seconds``, then the
instances exist and ``success``, or ``failed`` for a layout named ``invalid-...`` (one the
MIG manager's config file does not have). A validation on a MIG node without its instances
fails (sim/cluster/jobs.py).
"""

from __future__ import annotations

from sim.cluster import resources as r
from sim.cluster.fleet import (
    MIG_CONFIG_LABEL,
    MIG_MANAGER,
    MIG_STATE_LABEL,
    OPERATOR_NAMESPACE,
    is_mig_layout,
)
from sim.cluster.machines import Machines
from sim.cluster.podutil import is_ready, is_terminating
from sim.cluster.store import Obj, Store

APPLY_SECONDS = 0.5


def node_labels(store: Store, node: str) -> dict[str, str]:
    obj = store.find(r.NODES, "", node) or {}
    return dict((obj.get("metadata") or {}).get("labels") or {})


class MigManager:
    def __init__(self, store: Store, machines: Machines,
                 apply_seconds: float = APPLY_SECONDS) -> None:
        self.store = store
        self.machines = machines
        self.apply_seconds = apply_seconds
        self._instance: dict[str, tuple[str, int]] = {}
        self._due: dict[str, float] = {}

    def _set_state(self, node: str, state: str) -> None:
        obj = self.store.find(r.NODES, "", node)
        if obj is None:
            return
        labels = obj["metadata"].setdefault("labels", {})
        if labels.get(MIG_STATE_LABEL) != state:
            labels[MIG_STATE_LABEL] = state
            self.store.put_internal(r.NODES, obj)

    def _running(self) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for pod in self.store.list(r.PODS, OPERATOR_NAMESPACE):
            labels = (pod.get("metadata") or {}).get("labels") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if (labels.get("app") == MIG_MANAGER.name and node and is_ready(pod)
                    and not is_terminating(pod)):
                out[node] = pod
        return out

    def reconcile(self, now: float) -> None:
        running = self._running()
        for node in list(self._due):
            if node not in running:
                del self._due[node]  # stopped mid-apply: the next instance starts over
        for node, pod in running.items():
            if node not in self.machines.by_node:
                continue
            labels = node_labels(self.store, node)
            if not is_mig_layout(labels):
                continue
            restarts = sum(cs.get("restartCount", 0) for cs in
                           (pod.get("status") or {}).get("containerStatuses") or [])
            instance = (pod["metadata"]["uid"], restarts)
            m = self.machines.get(node)
            if self._instance.get(node) != instance:
                self._instance[node] = instance
                if m.mig_instances:
                    self._set_state(node, "success")  # already applied: nothing to do
                else:
                    self._set_state(node, "pending")
                    self._due[node] = now + self.apply_seconds
            due = self._due.get(node)
            if due is not None and now >= due:
                del self._due[node]
                if labels.get(MIG_CONFIG_LABEL, "").startswith("invalid-"):
                    self._set_state(node, "failed")
                else:
                    m.mig_instances = True
                    self._set_state(node, "success")


def destroy_instances(store: Store, machines: Machines, node: str) -> bool:
    """A GPU reset on the node: a MIG node loses its instances (the state label is left
    as it was). True when the node is a MIG node."""
    if node not in machines.by_node or not is_mig_layout(node_labels(store, node)):
        return False
    machines.get(node).mig_instances = False
    return True


def missing_instances(store: Store, machines: Machines, node: str) -> str | None:
    """Why a validation on the node finds no MIG devices, or None."""
    labels = node_labels(store, node)
    if (node in machines.by_node and is_mig_layout(labels)
            and not machines.get(node).mig_instances):
        return (f"MIG layout {labels.get(MIG_CONFIG_LABEL)!r} not applied on {node}: MIG mode "
                "is enabled but no GPU instance exists (a GPU reset or a reboot destroyed "
                "them)")
    return None
