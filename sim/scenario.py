"""Scenario files: a simulated fleet (node pools, GPUs, workloads, PDBs).

Both simulators read the same scenario so that the nodes the cluster simulator
serves are the nodes the GPU simulator exports metrics for.
"""

from __future__ import annotations

import uuid
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_GPU_UUID_NS = uuid.UUID("5f0c6a2e-8d0b-4c1e-9a57-6b1f3c2d9e41")


def gpu_uuid(node: str, index: int) -> uuid.UUID:
    """The UUID of a node's GPU: the GPU simulator exports it, the cluster simulator's DRA
    driver publishes it, so the two simulators name the same GPU the same way."""
    return uuid.uuid5(_GPU_UUID_NS, f"{node}/{index}")


class Pool(BaseModel):
    """A group of identical GPU nodes."""

    model_config = ConfigDict(extra="forbid")

    name: str
    nodes: int = Field(default=0, ge=0, description="nodes named <name>-01, <name>-02, ...")
    names: list[str] = Field(default_factory=list, description="explicit node names")
    gpus: int = Field(default=8, ge=1, le=16)
    model: str = "NVIDIA H100 80GB HBM3"
    driver: str = "570.124.06"
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_naming(self) -> Pool:
        if self.nodes and self.names:
            raise ValueError("give either 'nodes' (a count) or 'names', not both")
        if not self.nodes and not self.names:
            raise ValueError("a pool needs 'nodes' (a count) or 'names'")
        return self

    def node_names(self) -> list[str]:
        if self.names:
            return list(self.names)
        return [f"{self.name}-{i:02d}" for i in range(1, self.nodes + 1)]


class DisruptionBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_available: int | str | None = None
    max_unavailable: int | str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DisruptionBudget:
        if (self.min_available is None) == (self.max_unavailable is None):
            raise ValueError("a pdb needs exactly one of min_available or max_unavailable")
        return self


class Workload(BaseModel):
    """Pods of one application, owned like Kubernetes would own them."""

    model_config = ConfigDict(extra="forbid")

    name: str
    namespace: str = "default"
    kind: Literal["ReplicaSet", "StatefulSet", "DaemonSet", "Job", "Pod"] = "ReplicaSet"
    replicas: int = Field(default=1, ge=0)
    gpus_per_pod: int = Field(default=0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    pool: str | None = None
    pdb: DisruptionBudget | None = None
    termination_grace_seconds: int = Field(default=2, ge=0)
    readiness_delay_seconds: float = Field(default=1.0, ge=0)


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    pools: list[Pool]
    workloads: list[Workload] = Field(default_factory=list)

    def nodes(self) -> list[tuple[str, Pool]]:
        """Every node with its pool, in a stable order."""
        return [(n, p) for p in self.pools for n in p.node_names()]


BUILTIN = ("small", "training", "inference", "gpu-operator", "gb200")


def load_scenario(name_or_path: str) -> Scenario:
    """Load a built-in scenario by name or a YAML file by path.

    Raises ValueError naming the file and the bad field.
    """
    if name_or_path in BUILTIN:
        text = resources.files("sim").joinpath(f"scenarios/{name_or_path}.yaml").read_text()
        source = f"built-in scenario {name_or_path!r}"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(
                f"scenario {name_or_path!r} is neither a built-in ({', '.join(BUILTIN)}) nor a file"
            )
        text = path.read_text()
        source = str(path)
    try:
        data = yaml.safe_load(text)
        return Scenario.model_validate(data)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML: {err}") from err
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise ValueError(f"{source}: {problems}") from err
