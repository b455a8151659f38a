"""Contract-test support: the same tests run against the simulator or a real cluster.

With GPU_REMEDIATE_CONTRACT_KUBECONFIG set, `Contract.open` talks to that
cluster and simulator-only helpers refuse; otherwise it starts the simulator
in a background thread and writes a kubeconfig for it. Test objects are made
through the API only (own namespace, own Node objects without a kubelet, pod
status set through pods/status), so they mean the same thing on both.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config

from sim.cluster.threaded import ThreadedClusterSim
from tests.polling import wait_for

REAL_CLUSTER_ENV = "GPU_REMEDIATE_CONTRACT_KUBECONFIG"


def real_cluster() -> str | None:
    return os.environ.get(REAL_CLUSTER_ENV) or None


class Contract:
    def __init__(
        self, api: client.ApiClient, sim: ThreadedClusterSim | None, kubeconfig: Path
    ) -> None:
        self.api = api
        self.sim = sim
        self.kubeconfig = kubeconfig
        # Typed as Any: the client accepts plain dict bodies, which its stubs do not admit.
        self.core: Any = client.CoreV1Api(api)
        self.batch: Any = client.BatchV1Api(api)
        self.policy: Any = client.PolicyV1Api(api)
        self.apps: Any = client.AppsV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.events: Any = client.EventsV1Api(api)
        self._namespaces: list[str] = []
        self._nodes: list[str] = []

    @classmethod
    def open(cls, workdir: Path, **sim_options: Any) -> Contract:
        real = real_cluster()
        if real:
            return cls(config.new_client_from_config(config_file=real), None, Path(real))
        sim = ThreadedClusterSim(**sim_options)
        sim.start()
        path = sim.kubeconfig(workdir / "kubeconfig")
        return cls(config.new_client_from_config(config_file=str(path)), sim, path)

    def close(self) -> None:
        for ns in self._namespaces:
            with contextlib.suppress(client.ApiException):
                self.core.delete_namespace(ns)
        for node in self._nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(node)
        self.api.close()
        if self.sim is not None:
            self.sim.stop()

    # -- simulator-only ---------------------------------------------------------------

    def sim_url(self) -> str:
        if self.sim is None:
            raise RuntimeError("simulator-only helper used against a real cluster")
        return self.sim.url

    def writes(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.sim_url()}/sim/v1/writes").json()["writes"])

    def clear_writes(self) -> None:
        httpx.delete(f"{self.sim_url()}/sim/v1/writes").raise_for_status()

    def set_faults(self, rules: list[dict[str, Any]], seed: int = 1) -> None:
        httpx.put(
            f"{self.sim_url()}/sim/v1/faults", json={"rules": rules, "seed": seed}
        ).raise_for_status()

    def clear_faults(self) -> None:
        httpx.delete(f"{self.sim_url()}/sim/v1/faults").raise_for_status()

    # -- objects through the API ---------------------------------------------------------

    @staticmethod
    def unique(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:6]}"

    def namespace(self) -> str:
        name = self.unique("contract")
        self.core.create_namespace({"metadata": {"name": name}})
        self._namespaces.append(name)
        return name

    def node(self, gpus: int = 8, labels: dict[str, str] | None = None) -> str:
        """A Node object with no kubelet behind it, reporting Ready."""
        name = self.unique("contract-node")
        # The taint keeps a real cluster's scheduler from placing real pods here.
        self.core.create_node({"metadata": {"name": name, "labels": labels or {}},
                               "spec": {"taints": [{"key": "gpu-remediate.io/contract-test",
                                                    "effect": "NoSchedule"}]}})
        self._nodes.append(name)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_node_status(
            name,
            {
                "status": {
                    "capacity": {"nvidia.com/gpu": str(gpus), "pods": "110"},
                    "allocatable": {"nvidia.com/gpu": str(gpus), "pods": "110"},
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "contract test",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            },
        )
        return name

    def pod(
        self,
        namespace: str,
        node: str | None,
        labels: dict[str, str] | None = None,
        *,
        running: bool = True,
        ready: bool = True,
        name: str | None = None,
    ) -> Any:
        """A pod bound to `node` whose status says Running/Ready, set via pods/status."""
        name = name or self.unique("pod")
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "image": "registry.sim.local/x"}],
            "terminationGracePeriodSeconds": 30,
        }
        if node:
            spec["nodeName"] = node
        else:
            # No scheduler by this name exists, so the pod stays unbound on any cluster.
            spec["schedulerName"] = "contract-test-no-scheduler"
        self.core.create_namespaced_pod(
            namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}
        )
        if running:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.core.patch_namespaced_pod_status(
                name,
                namespace,
                {
                    "status": {
                        "phase": "Running",
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True" if ready else "False",
                                "lastTransitionTime": now,
                            }
                        ],
                    }
                },
            )
        return self.core.read_namespaced_pod(name, namespace)

    def pdb(self, namespace: str, labels: dict[str, str], **budget: Any) -> Any:
        name = self.unique("pdb")
        self.policy.create_namespaced_pod_disruption_budget(
            namespace,
            {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": labels}, **budget}},
        )
        return name

    def settled_pdb(self, namespace: str, name: str, **expect: int) -> Any:
        """Wait for the disruption controller to report the expected status."""

        def check() -> Any:
            pdb = self.policy.read_namespaced_pod_disruption_budget(name, namespace)
            st = pdb.status
            if st is None or (st.observed_generation or 0) < (pdb.metadata.generation or 0):
                return None
            ok = all(getattr(st, k) == v for k, v in expect.items())
            return pdb if ok else None

        return wait_for(check, timeout=15)
