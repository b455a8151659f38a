"""LocalStack with a real control plane in place of the cluster simulator.

``ControlPlaneStack`` keeps everything of ``worker.stack.LocalStack`` (Temporal dev
server, GPU simulator, worker, detector) and replaces only ``start_simulators``'
cluster half: the control plane binary (kube-apiserver with embedded etcd, the
controllers, the scheduler), then ``node_agent.py`` as the nodes' kubelets, which
also creates the scenario's workloads through the API.

With ``service_account=True`` the worker does not get the admin kubeconfig: the
objects in deploy/base/rbac.yaml are applied and the worker runs with a
TokenRequest token for ``gpu-remediate/gpu-remediate``, so a missing permission is
a real 403. The API server's audit log records every request of that identity.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, utils

from tests.controlplane.controlplane import ControlPlane
from worker.stack import LocalStack

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "base" / "rbac.yaml"
SA_NAMESPACE, SA_NAME = "gpu-remediate", "gpu-remediate"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [SA_USER]}, {"level": "None"}],
}


@dataclass
class ControlPlaneStack(LocalStack):
    binary: Path = Path("controlplane")
    service_account: bool = True
    controlplane_args: list[str] = field(default_factory=list)
    """More flags of the control plane binary (ControlPlane.args)."""
    controlplane: ControlPlane | None = None
    _rbac_objects: list[str] = field(default_factory=list)

    @property
    def audit_log(self) -> Path:
        return self.data_dir / "controlplane" / "audit.log"

    def start_cluster(self) -> None:
        cp_dir = self.data_dir / "controlplane"
        cp_dir.mkdir(parents=True, exist_ok=True)
        policy = cp_dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.controlplane = ControlPlane(self.binary, cp_dir, apiserver_args=[
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            # The node agent serves every node's kubelet API (pod logs) on the loopback and
            # adds that address to each node as its ExternalIP.
            "--kubelet-preferred-address-types=ExternalIP"],
            args=self.controlplane_args).start()
        self.kubeconfig.unlink(missing_ok=True)
        self.kubeconfig.write_text(self.controlplane.kubeconfig.read_text())
        agent = self._spawn("node-agent", [
            sys.executable, "-m", "tests.controlplane.node_agent",
            "--kubeconfig", str(self.kubeconfig), "--scenario", self.scenario,
            "--gpu-sim-url", self.gpu_url, "--seed",
            "--job-seconds", str(self.job_seconds),
            "--reboot-seconds", str(self.reboot_seconds),
            # The API server's own self-signed certificate (127.0.0.1) serves the kubelet API.
            "--kubelet-cert", str(cp_dir / "pki" / "apiserver.crt"),
            "--kubelet-key", str(cp_dir / "pki" / "apiserver.key")],
            env={"PYTHONPATH": str(REPO)})
        self._wait(agent, lambda: "READY" in agent.log.read_text(errors="replace"),
                   timeout=150)

    def _create_job_namespace(self) -> None:
        super()._create_job_namespace()
        if self.service_account:
            # After the namespace exists: the worker's token is bound to the RBAC there.
            self.worker_kubeconfig = self._service_account_kubeconfig()

    def _service_account_kubeconfig(self) -> Path:
        """Apply deploy/base/rbac.yaml and mint a token for its ServiceAccount."""
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        with api:
            core: Any = client.CoreV1Api(api)
            core.create_namespace({"metadata": {"name": SA_NAMESPACE}})
            for doc in yaml.safe_load_all(RBAC.read_text()):
                if doc:
                    utils.create_from_dict(api, doc)
                    self._rbac_objects.append(f"{doc['kind']}/{doc['metadata']['name']}")
            token = core.create_namespaced_service_account_token(
                SA_NAME, SA_NAMESPACE, {"spec": {"expirationSeconds": 7200}}).status.token
        kubeconfig = yaml.safe_load(self.kubeconfig.read_text())
        kubeconfig["users"] = [{"name": SA_NAME, "user": {"token": token}}]
        for ctx in kubeconfig["contexts"]:
            ctx["context"]["user"] = SA_NAME
        path = self.data_dir / "worker-kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        return path

    def audit_events(self) -> list[dict[str, Any]]:
        """The API server's audit events for the worker's identity, one per request."""
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]
        return [e for e in events if e.get("user", {}).get("username") == SA_USER]

    def stop(self) -> None:
        super().stop()
        if self.controlplane is not None:
            self.controlplane.stop()

