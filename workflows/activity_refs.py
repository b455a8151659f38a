"""What the workflows call: one typed reference per activity the worker registers.

Each reference has the name the activity is registered under, its parameter type and
its return type, and is declared ``def`` or ``async def`` as the activity is. A workflow
passes the reference to ``workflow.execute_activity`` (or to its own call helpers): the
name goes on the wire, the return annotation becomes the result type, and the type checker
sees what the call returns. The bodies never run: the worker registers the activities in
``activities/``, never these (tests/workflows/test_activity_refs.py keeps the two equal).

No I/O imports: workflow code imports this module through the sandbox.
"""

from __future__ import annotations

from temporalio import activity

from workflows.incidents import IncidentCordon, IncidentCordonResult
from workflows.isolation import GpuTaintInput, IsolateGpuInput, IsolateGpuResult
from workflows.leases import LeaseAnswer, LeaseCheck
from workflows.ledger import LedgerInput, LedgerResult
from workflows.limits import LimitsSettings
from workflows.messages import (
    AdmissionReport,
    ClaimInput,
    ClaimResult,
    DrainInput,
    DrainResult,
    FleetObservation,
    GpusFree,
    GpusFreeInput,
    MirrorRepair,
    NodeEventInput,
    NodeHealth,
    NodeHealthInput,
    NodeJobInput,
    NodeJobResult,
    ObserveInput,
    OrphanRelease,
    OutOfServiceInput,
    ReleaseInput,
    ReturnInput,
    ReturnResult,
    RunningRemediations,
    RunningRemediationsInput,
    StateInput,
    ThermalCheckInput,
    ThermalCheckResult,
    ThermalWatchInput,
    ThermalWatchResult,
)
from workflows.operands import (
    DevicePluginInput,
    DevicePluginRestart,
    OperandsInput,
    OperandsPaused,
    OperandsState,
    OperandsWaitInput,
)


def _reference(name: str) -> NotImplementedError:
    return NotImplementedError(f"{name} is a reference for workflows to call; the worker "
                               "runs the activity of that name")


# ------------------------------------------------------------ the node (activities/nodes.py)

@activity.defn(name="claim_node")
def claim_node(inp: ClaimInput) -> ClaimResult:
    raise _reference("claim_node")


@activity.defn(name="set_node_state")
def set_node_state(inp: StateInput) -> None:
    raise _reference("set_node_state")


@activity.defn(name="release_node")
def release_node(inp: ReleaseInput) -> None:
    raise _reference("release_node")


# ---------------------------------------------------- the repair ledger (activities/ledger.py)

@activity.defn(name="record_repair")
def record_repair(inp: LedgerInput) -> LedgerResult:
    raise _reference("record_repair")


# ------------------------------------------------ one GPU (activities/gpu_isolation.py)

@activity.defn(name="isolate_gpu")
def isolate_gpu(inp: IsolateGpuInput) -> IsolateGpuResult:
    raise _reference("isolate_gpu")


@activity.defn(name="set_gpu_taint")
def set_gpu_taint(inp: GpuTaintInput) -> str:
    raise _reference("set_gpu_taint")


# ------------------------------------------------------------ drain (activities/drain.py)

@activity.defn(name="drain_node")
def drain_node(inp: DrainInput) -> DrainResult:
    raise _reference("drain_node")


# ------------------------------------------------------------ node Jobs (activities/jobs.py)

@activity.defn(name="run_node_job")
def run_node_job(inp: NodeJobInput) -> NodeJobResult:
    raise _reference("run_node_job")


@activity.defn(name="poll_node_job")
def poll_node_job(inp: NodeJobInput) -> NodeJobResult:
    raise _reference("poll_node_job")


@activity.defn(name="delete_node_job")
def delete_node_job(inp: NodeJobInput) -> None:
    raise _reference("delete_node_job")


# ------------------------------------------------------------ the fleet (activities/fleet.py)
# FleetActivities: observe_fleet in fleet.py, release_orphan in orphans.py, read_node_health,
# watch_thermal and check_thermal in thermal.py, report_admission in admission_report.py.

@activity.defn(name="observe_fleet")
async def observe_fleet(inp: ObserveInput) -> FleetObservation:
    raise _reference("observe_fleet")


@activity.defn(name="release_orphan")
async def release_orphan(req: OrphanRelease) -> None:
    raise _reference("release_orphan")


@activity.defn(name="read_node_health")
async def read_node_health(inp: NodeHealthInput) -> NodeHealth:
    raise _reference("read_node_health")


@activity.defn(name="watch_thermal")
async def watch_thermal(inp: ThermalWatchInput) -> ThermalWatchResult:
    raise _reference("watch_thermal")


@activity.defn(name="check_thermal")
async def check_thermal(inp: ThermalCheckInput) -> ThermalCheckResult:
    raise _reference("check_thermal")


@activity.defn(name="report_admission")
async def report_admission(report: AdmissionReport) -> None:
    raise _reference("report_admission")


# ------------------------------------------------------------ incidents (activities/incidents.py)

@activity.defn(name="cordon_for_incident")
def cordon_for_incident(inp: IncidentCordon) -> IncidentCordonResult:
    raise _reference("cordon_for_incident")


# ------------------------------------------------------------ Events (activities/events.py)

@activity.defn(name="record_event")
def record_event(inp: NodeEventInput) -> None:
    raise _reference("record_event")


# ------------------------------------------------------------ return (activities/node_return.py)

@activity.defn(name="check_node_returned")
async def check_node_returned(inp: ReturnInput) -> ReturnResult:
    raise _reference("check_node_returned")


@activity.defn(name="check_gpus_free")
async def check_gpus_free(inp: GpusFreeInput) -> GpusFree:
    raise _reference("check_gpus_free")


# ------------------------------------------------------------ GPU Operator (activities/operands.py)

@activity.defn(name="pause_gpu_operands")
async def pause_gpu_operands(inp: OperandsInput) -> OperandsPaused:
    raise _reference("pause_gpu_operands")


@activity.defn(name="restore_gpu_operands")
async def restore_gpu_operands(inp: OperandsPaused) -> None:
    raise _reference("restore_gpu_operands")


@activity.defn(name="check_operands_gone")
async def check_operands_gone(inp: OperandsWaitInput) -> OperandsState:
    raise _reference("check_operands_gone")


@activity.defn(name="check_operands_back")
async def check_operands_back(inp: OperandsWaitInput) -> OperandsState:
    raise _reference("check_operands_back")


@activity.defn(name="restart_device_plugin")
async def restart_device_plugin(inp: DevicePluginInput) -> DevicePluginRestart:
    raise _reference("restart_device_plugin")


# ------------------------------------------------------------ visibility (activities/visibility.py)

@activity.defn(name="list_running_remediations")
async def list_running_remediations(inp: RunningRemediationsInput) -> RunningRemediations:
    raise _reference("list_running_remediations")


# VisibilityActivities (activities/visibility.py): a remediation's confirmation of its lease
# with the detector.


@activity.defn(name="confirm_lease")
async def confirm_lease(inp: LeaseCheck) -> LeaseAnswer:
    raise _reference("confirm_lease")
# ------------------------------------------------------------ limits (activities/limits.py)

@activity.defn(name="read_limits")
def read_limits() -> LimitsSettings:
    """The worker's ``limits:`` from its own configuration file (never a client's)."""
    raise _reference("read_limits")


# NodeReturnActivities (activities/node_return.py): non-graceful node shutdown.


@activity.defn(name="mark_out_of_service")
async def mark_out_of_service(inp: OutOfServiceInput) -> str:
    raise _reference("mark_out_of_service")



@activity.defn(name="rewrite_state_mirror")
def rewrite_state_mirror(inp: MirrorRepair) -> bool:
    raise _reference("rewrite_state_mirror")
