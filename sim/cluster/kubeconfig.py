"""A kubeconfig pointing at the simulator, loadable by `kubernetes.config`."""

from __future__ import annotations

from pathlib import Path

import yaml

CLUSTER = "gpu-sim"
USER = "gpu-sim-admin"
# The simulator accepts any bearer token; a fixed one keeps kubeconfigs reproducible.
TOKEN = "gpu-sim-token"


def write_kubeconfig(path: str | Path, server_url: str, namespace: str = "default") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": CLUSTER, "cluster": {"server": server_url}}],
        "users": [{"name": USER, "user": {"token": TOKEN}}],
        "contexts": [
            {"name": CLUSTER, "context": {"cluster": CLUSTER, "user": USER, "namespace": namespace}}
        ],
        "current-context": CLUSTER,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    out.chmod(0o600)
    return out
