"""Settings that travel inside workflow inputs: the detector's and the remediation's, read
from the worker's configuration file; the detector hands the remediation's to every
remediation it starts.

No I/O imports: workflow code imports this module through the sandbox.
Durations are ``timedelta``; fields only ever get added with defaults so that
in-flight workflows keep decoding their history after an upgrade.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from policy.config import PolicySettings
from policy.models import Action
from policy.operands import operand_name_problem
from workflows.isolation import GpuIsolation

POOL_LABEL = "node-restriction.kubernetes.io/gpu-remediate-pool"
"""The pool label the docs and deploy configuration ship: the NodeRestriction admission
plugin forbids a kubelet to set labels under this prefix on its own Node."""
NODE_RESTRICTED_PREFIX = "node-restriction.kubernetes.io/"


def node_writable_label(key: str) -> bool:
    """Whether a kubelet may set this label on its own Node. Kept to the prefix rule: labels
    under node-restriction.kubernetes.io/ are not; everything else counts as writable (the
    few other keys a kubelet cannot set are not worth a list that drifts)."""
    return not key.startswith(NODE_RESTRICTED_PREFIX)


class _Model(BaseModel):
    """Settings that travel inside workflow inputs. Decoded from a payload, an unknown field
    is ignored (a worker of the previous release must decode what a newer detector or CLI
    wrote, and the other way round); read from a configuration file, it is a typo and fails
    at start with its dotted name (``unknown_fields``, called by the config loader)."""

    model_config = ConfigDict(extra="ignore")


class DrainSettings(_Model):
    deadline: timedelta = Field(
        default=timedelta(minutes=30), gt=timedelta(0), le=timedelta(days=7),
        description="How long evictions may be refused by PDBs.",
    )
    deadline_policy: Literal["wait", "force", "release"] = Field(
        default="wait",
        description=(
            "At the deadline: wait (keep trying and alert), force (delete the remaining pods "
            "with their grace period) or release (give up and return the node untouched)."
        ),
    )
    gpu_pods_only: bool = Field(default=False, description="Evict only pods that request GPUs.")
    retry_interval: timedelta = Field(
        default=timedelta(seconds=5), gt=timedelta(0), le=timedelta(hours=1),
        description="Pause between eviction rounds.",
    )
    report_after: timedelta = Field(
        default=timedelta(seconds=15), gt=timedelta(0), le=timedelta(days=1),
        description="While pods are left (refused by a PDB, Terminating, landing again), "
                    "report progress to the workflow after this long at first; the interval "
                    "doubles each round up to report_max, so a drain stuck for days stays "
                    "cheap.",
    )
    report_max: timedelta = Field(
        default=timedelta(minutes=10), gt=timedelta(0), le=timedelta(days=1),
        description="The longest interval between progress reports of a blocked drain.",
    )
    not_ready_terminating_timeout: timedelta = Field(
        default=timedelta(minutes=5), gt=timedelta(0), le=timedelta(days=1),
        description="On a node that is not Ready (its kubelet stopped, often the fault being "
                    "repaired), a pod still Terminating this long past the end of its grace "
                    "period counts as gone: that kubelet will never confirm the deletion "
                    "(kubectl drain's --skip-wait-for-delete-timeout).",
    )
    out_of_service_taint: bool = Field(
        default=False,
        description="A node that stays NotReady (did not return from its reboot) gets "
                    "node.kubernetes.io/out-of-service:NoExecute (non-graceful node shutdown, "
                    "GA in Kubernetes 1.28): its pods are force-deleted and their volumes "
                    "detached, so StatefulSets and Jobs elsewhere can go on. Taken off when "
                    "it returns. Only for nodes known to be off: the taint tells Kubernetes "
                    "the node will not write to its volumes again.",
    )


class JobTemplateNames(_Model):
    """Which of the worker's Job templates (its configuration's ``jobs.templates``) each
    step runs. Names only: what a Job runs is the cluster operator's, never a workflow's."""

    validation: str = Field(default="validation", max_length=63)
    gpu_reset: str = Field(default="gpu-reset", max_length=63)
    reboot: str = Field(default="reboot", max_length=63)

    def for_kind(self, kind: str) -> str:
        return {"validate": self.validation, "gpu-reset": self.gpu_reset,
                "reboot": self.reboot}[kind]


class ApprovalSettings(_Model):
    required_for: list[Action] = Field(
        default_factory=list,
        description="Actions that wait for an operator's approve before draining (supervised).",
    )
    timeout: timedelta = Field(default=timedelta(hours=24), gt=timedelta(0),
                               le=timedelta(days=30))
    on_timeout: Literal["reject", "approve"] = "reject"


class ThermalSettings(_Model):
    poll_interval: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0),
                                     le=timedelta(hours=1))
    hold: timedelta = Field(
        default=timedelta(minutes=10), ge=timedelta(0), le=timedelta(days=1),
        description="How long temperatures must stay below recovery before uncordoning.",
    )
    escalate_after: timedelta | None = Field(
        default=timedelta(hours=1), gt=timedelta(0), le=timedelta(days=7),
        description="Drain and repair a node still hot after this long; null never escalates.",
    )


class GpuOperatorSettings(_Model):
    """The GPU Operator's operands around a GPU reset (they hold the GPUs)."""

    operands: list[str] = Field(
        default_factory=lambda: ["device-plugin", "dcgm", "dcgm-exporter",
                                 "gpu-feature-discovery"],
        max_length=16,
        description="Operands turned off (node label nvidia.com/gpu.deploy.<operand>=false) "
                    "before a GPU reset and restored after; only labels found \"true\" are "
                    "touched. Empty: the node's GPU software is not managed by the GPU "
                    "Operator (stop its GPU clients another way, e.g. in the reset template).")
    namespace: str = Field(default="gpu-operator", min_length=1, max_length=63,
                           description="Where the operand DaemonSets run.")
    stop_timeout: timedelta = Field(
        default=timedelta(minutes=10), gt=timedelta(0), le=timedelta(hours=2),
        description="How long the operand pods may take to leave the node; past it the reset "
                    "counts as failed (and escalates to a reboot).")
    start_timeout: timedelta = Field(
        default=timedelta(minutes=10), gt=timedelta(0), le=timedelta(hours=2),
        description="How long the operands may take to be Ready again, with every GPU "
                    "allocatable, after the reset; past it the reset counts as failed.")
    device_plugin_restart_after: timedelta | None = Field(
        default=timedelta(minutes=1), gt=timedelta(0), le=timedelta(hours=2),
        description="Before validation, when fewer GPUs than expected are still allocatable "
                    "after this long, evict the node's device-plugin pod once (the NVIDIA "
                    "device plugin keeps a GPU that had a critical XID unhealthy until it "
                    "restarts) and give the GPUs as long again; null: never restart it, "
                    "wait out gpus_free_timeout.")

    @field_validator("operands")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?", name):
                raise ValueError(f"{name[:60]!r} is not an operand name (e.g. device-plugin)")
            if problem := operand_name_problem(name):
                raise ValueError(problem)
        return value


class LedgerSettings(_Model):
    """The repair ledger (workflows/ledger.py, activities/ledger.py): how relapses, probation
    and lemons are judged, and how long entries are kept."""

    relapse_window: timedelta = Field(
        default=timedelta(days=7), gt=timedelta(0), le=timedelta(days=31),
        description="A node or GPU flagged again this soon after its return to service is a "
                    "relapse of that repair.")
    probation: timedelta = Field(
        default=timedelta(hours=24), ge=timedelta(0), le=timedelta(days=31),
        description="After a repair, a node flagged again within this goes to the next rung "
                    "(reset -> reboot -> quarantine) instead of the action that did not hold; "
                    "0 turns probation off.")
    lemon_faults: int = Field(
        default=3, ge=1, le=10,
        description="A GPU (by serial) with more faults than this within lemon_window is a "
                    "lemon: its next fault quarantines its node for review.")
    lemon_window: timedelta = Field(
        default=timedelta(days=30), gt=timedelta(0), le=timedelta(days=92),
        description="The window lemon faults are counted over.")
    retention: timedelta = Field(
        default=timedelta(days=400), ge=timedelta(days=31), le=timedelta(days=3660),
        description="Ledger shards (one month each) wholly older than this are deleted.")

    def lookback(self) -> timedelta:
        """How far back admission reads the ledger."""
        return max(self.probation, self.lemon_window)


class RemediationSettings(_Model):
    heartbeat_timeout: timedelta = Field(
        default=timedelta(seconds=30), gt=timedelta(0), le=timedelta(hours=1),
        description="A drain, Job or thermal watch whose worker died is retried on another "
                    "worker after this long without a heartbeat.",
    )
    drain: DrainSettings = Field(default_factory=DrainSettings)
    job_templates: JobTemplateNames = Field(
        default_factory=JobTemplateNames,
        description="The worker's Job template for each step, by name (jobs.templates).")
    job_timeout: timedelta = Field(
        default=timedelta(hours=2), gt=timedelta(0), le=timedelta(hours=24),
        description="Backstop for a node Job: its template's deadline fails it first; past "
                    "this the remediation stops waiting for it.")
    reset_method: Literal["gpu-reset", "external"] = Field(
        default="gpu-reset",
        description="How a GPU reset is done: a privileged Job, or handed to a human or another "
                    "system that reports back with the `repaired` update.",
    )
    reboot_method: Literal["reboot", "external"] = Field(
        default="reboot", description="How a reboot is done (see reset_method)."
    )
    external_timeout: timedelta | None = Field(
        default=None, description="Quarantine if an external repair is not reported in time."
    )
    reboot_return_timeout: timedelta = Field(
        default=timedelta(minutes=20), gt=timedelta(0),
        description="After a reboot, how long the node has to come back (new boot ID, Ready, "
                    "GPUs allocatable, exporter answering) before it is quarantined.",
    )
    gpus_free_timeout: timedelta = Field(
        default=timedelta(minutes=10), gt=timedelta(0), le=timedelta(hours=2),
        description="Before validation, how long to wait for every expected GPU to be "
                    "allocatable and free (device plugin registered, nothing else holding "
                    "one); past it the validation fails with the reason.")
    reset_scope: Literal["gpu", "node"] = Field(
        default="gpu",
        description="gpu: reset the flagged GPU (GPU_INDEX) when the finding names one; "
                    "node: every GPU of the node at once (NVSwitch/HGX baseboards reset "
                    "together).")
    gpu_operator: GpuOperatorSettings = Field(default_factory=GpuOperatorSettings)
    gpu_isolation: GpuIsolation = Field(
        default=GpuIsolation.OFF,
        description="dra: a fault confined to one GPU whose catalog action is a reset, a "
                    "GPU quarantine or an application-level escalation isolates that GPU "
                    "with a DRA DeviceTaintRule (Kubernetes 1.36+, NVIDIA's DRA driver for "
                    "GPUs) and leaves the node schedulable for its other GPUs; where no rule "
                    "can be created, the whole-node path with a Warning Event saying why. "
                    "off: every remediation is a whole-node one.")

    @field_validator("gpu_isolation", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        # YAML 1.1 reads a bare `off` as false: that is the documented value, not a mistake.
        return "off" if v is False else v
    max_repair_attempts: int = Field(
        default=2, ge=1, description="Repair + validation rounds before quarantine."
    )
    repeat_offender_count: int = Field(
        default=3, ge=1,
        description="Earlier repairs within the window that mean quarantine: remediations in "
                    "which a reset or reboot ran (not rejected, released, aborted or thermal).")
    repeat_offender_window: timedelta = Field(default=timedelta(days=7), gt=timedelta(0),
                                              le=timedelta(days=365))
    approval: ApprovalSettings = Field(default_factory=ApprovalSettings)
    thermal: ThermalSettings = Field(default_factory=ThermalSettings)
    job_poll_interval: timedelta = Field(
        default=timedelta(seconds=10), gt=timedelta(0), le=timedelta(minutes=5),
        description="How often a running node Job is looked at. Each look is a short "
                    "activity retried at this interval: a Job's minutes hold no worker slot.",
    )
    node_poll_interval: timedelta = Field(
        default=timedelta(seconds=5), gt=timedelta(0), le=timedelta(minutes=5),
        description="How often a wait on the node is looked at: back from a reboot, GPU "
                    "Operator operands gone or back, every GPU free before validation. Each "
                    "look is a short activity retried at this interval.",
    )
    history_events_per_run: int = Field(
        default=2000, ge=200, le=40000,
        description="A remediation waiting in a loop (blocked drain, thermal watch, quarantine "
                    "hold) continues as new past this many history events, or sooner when "
                    "the server suggests it, so a run never outgrows its history.",
    )
    claim_timeout: timedelta = Field(
        default=timedelta(minutes=10), gt=timedelta(0), le=timedelta(hours=24),
        description="A claim (or a confirmation of the remediation's lease with the "
                    "detector) that cannot complete within this ends the remediation without "
                    "touching the node, frees its lease and says why (Event ClaimFailed). "
                    "Its lease holds the slot meanwhile, however long the API browns out.",
    )
    server_authorizes: bool = Field(
        default=False,
        description="Whether the Temporal server is known to authenticate every caller of "
                    "the namespace (JWT authorizer, or Temporal Cloud): set by whoever "
                    "deployed it. False: every operator name a remediation or the detector "
                    "records is shown as 'NAME (unverified)', since a client can claim any "
                    "name. A reconfigure may turn it off, never on past the limits.",
    )

    @model_validator(mode="after")
    def _heartbeats_outlast_pauses(self) -> RemediationSettings:
        if self.heartbeat_timeout < 2 * self.drain.retry_interval:
            raise ValueError("heartbeat_timeout must be at least twice drain.retry_interval: a "
                             "drain heartbeats once per eviction round")
        return self


class FaultDomain(_Model):
    """One level of nodes that fail together (an NVLink domain, a rack, a placement group):
    its own budget, and when a burst inside it is one incident (docs/fault-domains.md)."""

    label: str = Field(
        min_length=1, max_length=317,
        description="The node label whose value names the node's domain. Nodes without it "
                    "are in the 'unlabelled' domain of this level (counted and limited like "
                    "any other). A label a kubelet can write is refused at start unless "
                    "trust_node_writable_labels.")
    max_unavailable: int | str | None = Field(
        default=None,
        description="Nodes of one domain out of service at once: a count or a percent of "
                    "the domain's nodes; null: no node budget at this level.")
    max_unavailable_gpus: int | str | None = Field(
        default=None,
        description="GPUs of one domain out of service at once (a node in remediation counts "
                    "all its GPUs): a count or a percent of the domain's GPUs; null: none.")
    incident_threshold: int = Field(
        default=0, ge=0,
        description="This many nodes of one domain flagged within incident_window open one "
                    "DomainIncident: they are cordoned, not drained or repaired node by node, "
                    "until an operator resolves or releases it or their faults clear. 0: "
                    "never (each node is remediated alone).")
    incident_window: timedelta = Field(
        default=timedelta(minutes=5), gt=timedelta(0), le=timedelta(days=1),
        description="The window incident_threshold counts flagged nodes over.")

    @field_validator("max_unavailable", "max_unavailable_gpus")
    @classmethod
    def _budget(cls, v: int | str | None) -> int | str | None:
        return None if v is None else parse_limit(v)

    @field_validator("incident_threshold")
    @classmethod
    def _threshold(cls, v: int) -> int:
        if v == 1:
            raise ValueError("1 would make every flagged node an incident: use 0 (never) or "
                             "at least 2")
        return v


UNLABELLED = ""
"""The domain of a node without the level's label: shown as 'unlabelled'."""


def domain_name(value: str) -> str:
    return value or "unlabelled"


class DetectorSettings(_Model):
    # Positive (0 made the detector tick without pause) and at most a day.
    interval: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0),
                                le=timedelta(days=1))
    max_unavailable: int | str = Field(
        default=1, description="Nodes out of service at once: a count or a percent like '10%'."
    )
    cordoned_counts_against_budget: bool = Field(
        default=False,
        description="A thermal cordon takes a drain slot. false (default): heat is cordoned "
                    "on detection, whatever the drain budget, under max_thermal_cordoned; "
                    "a hot node that must then be drained waits for a slot.")
    max_thermal_cordoned: int | str = Field(
        default="10%",
        description="Nodes cordoned for heat at once (count or percent of the managed nodes, "
                    "never below 1 unless 0%), when cordons take no drain slot.")
    thermal_debounce: timedelta = Field(
        default=timedelta(minutes=1), ge=timedelta(0), le=timedelta(hours=1),
        description="A node is cordoned for heat once it has been flagged hot this long "
                    "without a break (a single hot scrape is often a sensor blip). 0: at the "
                    "first hot reading.")
    dry_run: bool = False
    policy: PolicySettings = Field(default_factory=PolicySettings)
    remediation: RemediationSettings = Field(default_factory=RemediationSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    breaker_max_flagged_percent: float = Field(default=20.0, gt=0, le=100)
    breaker_max_flagged_nodes: int = Field(default=50, ge=1)
    breaker_min_flagged_nodes: int = Field(
        default=3, ge=1, description="Fewer newly flagged nodes than this never trip the breaker."
    )
    breaker_window: timedelta = Field(
        default=timedelta(0), ge=timedelta(0), le=timedelta(days=7),
        description="Count newly flagged nodes over this sliding window instead of one tick, "
                    "so a fault spreading over several ticks trips the breaker too.",
    )
    observe_timeout: timedelta = Field(default=timedelta(minutes=5), gt=timedelta(0),
                                       le=timedelta(hours=1))
    observe_heartbeat_timeout: timedelta = Field(
        default=timedelta(seconds=30), gt=timedelta(0), le=timedelta(minutes=10),
        description="An observation whose worker stops heartbeating this long is retried on "
                    "another worker (it heartbeats every 5 s).")
    observe_task_queue: str | None = Field(
        default=None,
        description="Task queue of the fleet observation, polled by its own worker so that "
                    "it never queues behind remediation activities (the worker process "
                    "sets it to '<task_queue>-observe'); null: the workflow's own queue.")
    observe_shard_size: int = Field(
        default=5000, ge=1,
        description="Past this many GPU nodes, the fleet is observed by several activities in "
                    "parallel (one per this many nodes), which spread over worker replicas.",
    )
    ticks_per_run: int = Field(
        default=500, ge=1, description="Continue-as-new after this many ticks at the latest."
    )

    pool_label: str | None = Field(
        default=None,
        description="Node label that names a node's pool (node pool, rack, NVLink domain); "
                    f"null: no pools. Use a label a kubelet cannot set, e.g. {POOL_LABEL}: "
                    "one under node-restriction.kubernetes.io/ (any other is refused at start "
                    "unless trust_node_writable_labels).",
    )
    trust_node_writable_labels: bool = Field(
        default=False,
        description="Accept a pool_label a kubelet can write on its own Node (outside "
                    "node-restriction.kubernetes.io/). The risk: a node that moves itself "
                    "from pool A to pool B lets pool A admit past its limit.",
    )
    pool_max_unavailable: dict[str, int | str] = Field(
        default_factory=dict,
        description="Per-pool limits (count or percent of the pool) under the fleet-wide one; "
                    "the key '*' applies to pools not named.",
    )
    max_unavailable_gpus: int | str | None = Field(
        default=None,
        description="GPUs out of service at once, fleet-wide (a node in remediation counts "
                    "all its GPUs, as its observation said when it was admitted): a count or "
                    "a percent of the managed GPUs; null: only the node budget.")
    fault_domains: list[FaultDomain] = Field(
        default_factory=list, max_length=8,
        description="Nested fault domains (NVLink domain, rack, placement group), each with "
                    "its own budget and incident rule; admission honours every level, the "
                    "pool's and the fleet's at once.")
    max_quarantined: int | str | None = Field(
        default="5%",
        description="Quarantined nodes hold no budget slot; at this many (count or percent "
                    "of the managed nodes, never below 1) no remediation starts, since any "
                    "may end in quarantine. null: no cap.",
    )
    breaker_max_quarantines: int = Field(
        default=3, ge=0,
        description="Outcome breaker: this many remediations ending in quarantine within "
                    "breaker_quarantine_window stop admissions until resume (a broken Job "
                    "template or repair would otherwise quarantine the fleet one slot at a "
                    "time). 0: off.",
    )
    breaker_quarantine_window: timedelta = Field(
        default=timedelta(hours=1), gt=timedelta(0), le=timedelta(days=7),
        description="The window the outcome breaker counts new quarantines over.",
    )

    @field_validator("max_unavailable", "max_quarantined", "max_thermal_cordoned",
                     "max_unavailable_gpus")
    @classmethod
    def _budget(cls, v: int | str | None) -> int | str | None:
        return None if v is None else parse_limit(v)

    @field_validator("fault_domains")
    @classmethod
    def _one_level_per_label(cls, v: list[FaultDomain]) -> list[FaultDomain]:
        seen = [d.label for d in v]
        twice = sorted({label for label in seen if seen.count(label) > 1})
        if twice:
            raise ValueError(f"label {twice[0]!r} is given twice: one level per label")
        return v

    def gpu_budget_for(self, managed_gpus: int) -> int | None:
        """The fleet-wide GPU count out of service at once, or None (no GPU budget)."""
        spec = self.max_unavailable_gpus
        return None if spec is None else limit_for(spec, managed_gpus)

    def domain_labels(self) -> list[str]:
        return [d.label for d in self.fault_domains]

    @field_validator("pool_max_unavailable")
    @classmethod
    def _pool_budgets(cls, v: dict[str, int | str]) -> dict[str, int | str]:
        return {pool: parse_limit(limit) for pool, limit in v.items()}

    def budget_for(self, managed_nodes: int) -> int:
        """The fleet-wide slot count."""
        return limit_for(self.max_unavailable, managed_nodes)

    def pool_budget_for(self, pool: str, pool_nodes: int) -> int | None:
        """The slot count of one pool, or None when the pool has no limit of its own."""
        spec = self.pool_max_unavailable.get(pool, self.pool_max_unavailable.get("*"))
        return None if spec is None else limit_for(spec, pool_nodes)

    pool_max_unavailable_gpus: dict[str, int | str] = Field(
        default_factory=dict,
        description="Per-pool GPU budgets (count or percent of the pool's GPUs) under the "
                    "fleet's: GPUs of one pool out of service at once, a node in remediation "
                    "counting all its GPUs and an isolated GPU one; the key '*' applies to "
                    "pools not named. Needs pool_label.")

    @field_validator("pool_max_unavailable_gpus")
    @classmethod
    def _pool_gpu_budgets(cls, v: dict[str, int | str]) -> dict[str, int | str]:
        return {pool: parse_limit(limit) for pool, limit in v.items()}

    def pool_gpu_budget_for(self, pool: str, pool_gpus: int) -> int | None:
        """The GPU budget of one pool, or None when the pool has none of its own."""
        spec = self.pool_max_unavailable_gpus.get(
            pool, self.pool_max_unavailable_gpus.get("*"))
        return None if spec is None else limit_for(spec, pool_gpus)


def parse_limit(v: int | str) -> int | str:
    """A count (>= 0) or a percent string like '10%'."""
    if isinstance(v, int):
        if v < 0:
            raise ValueError("must be >= 0")
        return v
    text = v.strip()
    if text.endswith("%") and text[:-1].isdecimal() and 0 <= int(text[:-1]) <= 100:
        return text
    if text.isdecimal():
        return int(text)
    raise ValueError("must be a count like 2 or a percent like '10%'")


def limit_for(spec: int | str, nodes: int) -> int:
    """A count as is; a percent of ``nodes`` rounded down, but at least 1 unless 0%."""
    if isinstance(spec, int):
        return spec
    pct = int(spec[:-1])
    if pct == 0:
        return 0
    return max(1, nodes * pct // 100)

