"""Per-GPU isolation with DRA device taints: which faults stay on one GPU, and what then.

A fault confined to one GPU of a node whose catalog action is a reset, a GPU quarantine or
an application-level escalation need not cost the node's other GPUs a drain: with
``remediation.gpu_isolation: dra`` the remediation creates one ``DeviceTaintRule``
(resource.k8s.io, KEP-5055) selecting exactly that GPU as NVIDIA's DRA driver publishes it
(driver ``gpu.nvidia.com``, pool = the node, device ``gpu-<minor>`` found by its UUID),
and the node stays schedulable for the rest.

``IsolationDecision.decide`` is pure, like ``workflows/admission.py``: the workflow and the
dry-run plan run the same code, and it says why a verdict takes the whole-node path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from policy.models import SEVERITY, Action, Verdict

DRA_DRIVER = "gpu.nvidia.com"
TAINT_KEY = "gpu-remediate.io/isolated"
DEVICE_NAME = re.compile(r"gpu-[0-9]{1,4}")
_UUID = re.compile(r"GPU-[0-9a-fA-F][0-9a-fA-F-]{7,63}")


class GpuIsolation(StrEnum):
    OFF = "off"
    DRA = "dra"


Effect = Literal["NoSchedule", "NoExecute"]


@dataclass(frozen=True)
class IsolationRule:
    """What isolating one GPU means for one catalog action, and why."""

    evict: bool
    """Whether the running claim must go: the rule's effect becomes NoExecute after the
    NoSchedule it starts with (the DRA eviction controller then deletes the pods using it)."""
    then: Literal["validate", "quarantine"]
    """validate: a validation pinned to the GPU; it passes, the rule goes; it fails, the GPU
    stays isolated as a per-GPU quarantine. quarantine: held until an operator's release."""
    why: str


POLICY: dict[Action, IsolationRule] = {
    Action.RESET: IsolationRule(
        evict=True, then="validate",
        why="the catalog resets this GPU (XID 48 and row-remap pending are among them): its "
            "memory may have corrupted the work on it, and a reset needs it idle, so the "
            "claim using it goes; the other GPUs keep theirs"),
    Action.QUARANTINE: IsolationRule(
        evict=True, then="quarantine",
        why="an RMA-class fault on one GPU (a row-remap failure): nothing should run on it "
            "again until someone replaces or clears it; it is held as a per-GPU quarantine "
            "with its own release"),
    Action.APP: IsolationRule(
        evict=False, then="validate",
        why="an application-level escalation: the application restarts its own work, so "
            "the running claim may finish; new claims stay off the GPU until it validates"),
}
"""Catalog actions that may stay on one GPU. Every other action (reboot, thermal, a fault
on several GPUs) is a whole-node repair."""


class IsolationPlan(BaseModel):
    """The GPU to isolate and what follows."""

    gpu: str = Field(description="The exporter's GPU index (for messages).")
    uuid: str = Field(description="The GPU's UUID: the DRA device is found by it.")
    evict: bool
    then: Literal["validate", "quarantine"]
    why: str


class IsolationDecision:
    """Whether a verdict can be handled on one GPU (pure: the workflow and `plan` share it)."""

    def __init__(self, mode: GpuIsolation) -> None:
        self.mode = mode

    def decide(self, verdict: Verdict) -> IsolationPlan | str:
        """The plan, or why the whole-node path is taken."""
        if self.mode != GpuIsolation.DRA:
            return "remediation.gpu_isolation is off"
        rule = POLICY.get(verdict.action)
        if rule is None:
            return f"action {verdict.action.value} is a whole-node repair"
        # Every finding that asks for anything is on the same GPU; a second sick GPU, or a
        # node-wide one, makes it a node's problem.
        serious = [f for f in verdict.findings if SEVERITY[f.action] >= SEVERITY[Action.APP]]
        gpus = {f.gpu for f in serious}
        if len(gpus) != 1:
            return f"the fault is on {len(gpus)} GPUs, not one"
        uuids = {f.uuid for f in serious}
        uuid = next(iter(uuids)) if len(uuids) == 1 else ""
        if not _UUID.fullmatch(uuid):
            # The device is found by UUID, which survives re-enumeration; an index alone
            # could name another GPU.
            return "the exporter gave no GPU UUID for the fault"
        return IsolationPlan(gpu=next(iter(gpus)), uuid=uuid, evict=rule.evict,
                             then=rule.then, why=rule.why)


def rule_name(node: str, device: str) -> str:
    """The DeviceTaintRule's name: one per node and device (a DNS subdomain, <= 253)."""
    name = f"gpu-remediate.{device}.{node}"
    return name[:253].rstrip(".-")


class IsolateGpuInput(BaseModel):
    node: str
    uuid: str
    gpu: str = ""
    value: str = Field(default="", description="The taint's value: the catalog rule.")
    reason: str = ""
    workflow_id: str = ""
    dry_run: bool = False


class IsolateGpuResult(BaseModel):
    isolated: bool
    rule: str = ""
    device: str = ""
    api_version: str = ""
    why_not: str = Field(default="", description="Why no rule could be created: the "
                                                 "remediation falls back to the whole node.")


class GpuTaintInput(BaseModel):
    rule: str
    api_version: str
    node: str
    effect: Effect | None = Field(default=None, description="None: remove the rule.")
    dry_run: bool = False


class GpuIsolationView(BaseModel):
    """What `status NODE` shows of an isolated GPU."""

    rule: str
    api_version: str
    device: str
    gpu: str
    uuid: str
    effect: str
    owner: str
    reason: str
