"""GPU Operator operands off and on around a GPU reset, against the cluster simulator.

The tests make their own operand DaemonSets (``test-<operand>``) in ``gpu-operator``, each
selecting its ``nvidia.com/gpu.deploy.<operand>: "true"`` label, and set the node's labels
themselves, so they hold whether or not the simulator ships the GPU Operator's own
DaemonSets and labels: those select the same labels and come and go with ours, so pods are
compared as "ours among those seen", never as the whole list.

The waits (``check_operands_gone`` / ``check_operands_back``) rely on the simulator's
DaemonSet controller removing a pod whose node stops matching the nodeSelector and
creating one when it matches again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment

from activities.operands import (
    A_OPERANDS_PAUSED,
    OPERANDS_NOT_READY,
    OPERANDS_RUNNING,
    REASON_PAUSED,
    REASON_PLUGIN_RESTARTED,
    REASON_RESTORED,
    OperandActivities,
    blocking_taints,
    parse_record,
    quantity,
)
from sim.cluster.objects import READINESS_DELAY
from tests.activities.conftest import Cluster, _cluster
from tests.polling import wait_for
from workflows.errors import NODE_GONE
from workflows.operands import (
    DEFAULT_OPERANDS,
    OperandsInput,
    OperandsWaitInput,
    deploy_label,
    pause_in_flight,
    plan_pause,
)

NODE = "gpu-node-04"  # runs no workload
NS = "gpu-operator"
OPERANDS = list(DEFAULT_OPERANDS)
DP, DCGM, EXPORTER, GFD = (deploy_label(o) for o in OPERANDS)
LABELS = [DP, DCGM, EXPORTER, GFD]
MIG = deploy_label("mig-manager")


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster with only the operand DaemonSets a test makes: the simulator's own GPU
    Operator DaemonSets, where it ships them, are deleted first (without a device-plugin
    DaemonSet the simulated kubelet leaves allocatable GPUs to the test)."""
    for cluster in _cluster(tmp_path):
        for name in daemonsets(cluster):
            cluster.apps.delete_namespaced_daemon_set(name, NS)
        yield cluster


@pytest.fixture
def k_operator(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster as the simulator ships it, GPU Operator included."""
    yield from _cluster(tmp_path)


@pytest.fixture
def acts(k: Cluster) -> OperandActivities:
    return OperandActivities(k.api)


@pytest.fixture
def acts_operator(k_operator: Cluster) -> OperandActivities:
    return OperandActivities(k_operator.api)


# ------------------------------------------------------------------ helpers


def daemonsets(k: Cluster) -> list[str]:
    # Raw: the typed model refuses a DaemonSet whose status the controller has not filled.
    resp = k.apps.list_namespaced_daemon_set(NS, _preload_content=False)
    return [ds["metadata"]["name"] for ds in json.loads(resp.data)["items"]]


def make_ds(k: Cluster, name: str, selector: dict[str, str], *, grace: int = 0,
            ready_delay: float = 0, tolerations: list[dict[str, Any]] | None = None) -> None:
    spec: dict[str, Any] = {"nodeSelector": selector, "terminationGracePeriodSeconds": grace,
                            "containers": [{"name": "main", "image": "busybox:1.37"}]}
    if tolerations:
        spec["tolerations"] = tolerations
    k.apps.create_namespaced_daemon_set(NS, {"metadata": {"name": name}, "spec": {
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name},
                                  "annotations": {READINESS_DELAY: str(ready_delay)}},
                     "spec": spec}}}, _preload_content=False)  # status {} at creation


def operator(k: Cluster, **kw: Any) -> None:
    """One DaemonSet per operand, as the GPU Operator deploys them."""
    for op in OPERANDS:
        make_ds(k, f"test-{op}", {deploy_label(op): "true"}, **kw)


def set_labels(k: Cluster, values: dict[str, str | None], node: str = NODE) -> None:
    k.core.patch_node(node, {"metadata": {"labels": values}})


def labels(k: Cluster, node: str = NODE) -> dict[str, str]:
    return dict(k.node(node).metadata.labels or {})


def record(k: Cluster, node: str = NODE) -> str | None:
    return (k.node(node).metadata.annotations or {}).get(A_OPERANDS_PAUSED)


def our_pods(k: Cluster, prefix: str = "test-") -> dict[str, Any]:
    """Pods of our DaemonSets on the node, by DaemonSet name."""
    out: dict[str, Any] = {}
    for p in k.pods_on(NODE):
        owner = next((r.name for r in p.metadata.owner_references or []
                      if r.kind == "DaemonSet"), "")
        if p.metadata.namespace == NS and owner.startswith(prefix):
            out[owner] = p
    return out


def ready(pod: Any) -> bool:
    return (pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True"
                    for c in pod.status.conditions or []))


def all_ready(k: Cluster, names: list[str]) -> bool:
    pods = our_pods(k)
    return all(n in pods and ready(pods[n]) for n in names)


def node_writes(k: Cluster) -> list[dict[str, Any]]:
    return [w for w in k.writes("nodes") if w["verb"] != "get"]


def pause_in(node: str = NODE, *, dry_run: bool = False,
             operands: list[str] | None = None) -> OperandsInput:
    return OperandsInput(node=node, operands=operands or OPERANDS, namespace=NS,
                         dry_run=dry_run)


def wait_in(node: str = NODE, *, expected_gpus: int = 0,
            labels_: list[str] | None = None) -> OperandsWaitInput:
    return OperandsWaitInput(node=node, labels=labels_ or LABELS, namespace=NS,
                             expected_gpus=expected_gpus)


async def run(fn: Any, inp: Any) -> Any:
    return await ActivityEnvironment().run(fn, inp)


async def refused(fn: Any, inp: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as err:
        await run(fn, inp)
    return err.value


def all_on(k: Cluster) -> None:
    set_labels(k, dict.fromkeys(LABELS, "true"))


# ------------------------------------------------------------------ pure


def test_plan_pause_turns_off_only_the_exact_value_true() -> None:
    now = {DP: "true", DCGM: "false", EXPORTER: "True", MIG: "yes", "other": "true"}
    changed, left = plan_pause(now, [*OPERANDS, "mig-manager", "device-plugin"])
    assert changed == {DP: "true"}
    assert left == {DCGM: "false", EXPORTER: "True", GFD: None, MIG: "yes"}


def test_the_pause_record_on_the_node_is_read_strictly() -> None:
    text = json.dumps({DP: "true", DCGM: "false", "example.com/x": "true", GFD: 1})
    assert parse_record(text) == {DP: "true"}
    for damaged in ("{", "[]", '"x"', json.dumps({DP: "true", "pad": "x" * 9000})):
        assert parse_record(damaged) == {}


def test_allocatable_is_read_as_plain_digits_only() -> None:
    assert [quantity(v) for v in ("8", "0", "8k", "-1", "", " 8", "٨", None, 8, "1" * 20)] \
        == [8, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def test_a_daemonset_is_held_off_by_a_taint_it_does_not_tolerate() -> None:
    node = {"spec": {"taints": [
        {"key": "gpu-remediate.io/remediation", "value": "true", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "example.com/soft", "effect": "PreferNoSchedule"}]}}

    def ds(*tolerations: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"template": {"spec": {"tolerations": list(tolerations)}}}}

    assert blocking_taints(ds(), node) == ["gpu-remediate.io/remediation=true:NoSchedule"]
    assert blocking_taints(ds({"key": "nvidia.com/gpu", "operator": "Exists"}), node) \
        == ["gpu-remediate.io/remediation=true:NoSchedule"]
    assert blocking_taints(ds({"operator": "Exists"}), node) == []
    assert blocking_taints(ds({"key": "gpu-remediate.io/remediation", "value": "true",
                               "effect": "NoSchedule"}), node) == []


# ------------------------------------------------------------------ pause


async def test_pause_writes_exactly_the_plan_and_records_it(
        k: Cluster, acts: OperandActivities) -> None:
    set_labels(k, {DP: "true", DCGM: "true", EXPORTER: "false", GFD: None})
    before = labels(k)
    k.clear_writes()
    result = await run(acts.pause_gpu_operands, pause_in())
    assert result.changed == {DP: "true", DCGM: "true"}
    assert result.left == {EXPORTER: "false", GFD: None}
    assert not result.dry_run
    assert labels(k) == {**before, DP: "false", DCGM: "false"}
    assert json.loads(record(k) or "") == {DP: "true", DCGM: "true"}
    patches = node_writes(k)
    assert [(w["verb"], w["name"]) for w in patches] == [("patch", NODE)]
    event = k.events(NODE, REASON_PAUSED)[0]
    assert event.type == "Normal"
    assert f"turned off {DP}, {DCGM}" in event.message
    assert f"left as found: {EXPORTER}='false', {GFD} (absent)" in event.message


async def test_pause_keeps_the_entries_of_an_earlier_record(
        k: Cluster, acts: OperandActivities) -> None:
    all_on(k)
    set_labels(k, {MIG: "false", GFD: "false"})
    k.core.patch_node(NODE, {"metadata": {"annotations": {A_OPERANDS_PAUSED: json.dumps(
        {MIG: "true", EXPORTER: "true", GFD: "true",
         "example.com/not-a-deploy-label": "true"})}}})
    result = await run(acts.pause_gpu_operands, pause_in(operands=["dcgm"]))
    assert result.changed == {DCGM: "true"} and result.left == {}
    # MIG and GFD are still off: kept. EXPORTER is "true" again (someone turned it back
    # on): no longer ours to restore. The foreign key is not read at all.
    assert json.loads(record(k) or "") == {MIG: "true", GFD: "true", DCGM: "true"}


async def test_a_retried_pause_after_a_partial_write_still_reports_what_it_changed(
        k: Cluster, acts: OperandActivities) -> None:
    """The first try's patch landed but its answer was lost: the label now reads "false",
    as if found so, but the record on the node says the pause turned it off."""
    set_labels(k, {DP: "false", DCGM: "true", EXPORTER: "false", GFD: "true"})
    k.core.patch_node(NODE, {"metadata": {"annotations": {
        A_OPERANDS_PAUSED: json.dumps({DP: "true"})}}})
    result = await run(acts.pause_gpu_operands, pause_in())
    assert result.changed == {DP: "true", DCGM: "true", GFD: "true"}
    assert result.left == {EXPORTER: "false"}
    k.clear_writes()
    again = await run(acts.pause_gpu_operands, pause_in())
    assert (again.changed, again.left) == (result.changed, result.left)
    assert node_writes(k) == [], "nothing left to write"


async def test_pause_recomputes_after_a_conflict(k: Cluster, acts: OperandActivities) -> None:
    all_on(k)
    k.clear_writes()
    k.faults({"verb": "patch", "resource": "nodes", "status": 409, "times": 1})
    result = await run(acts.pause_gpu_operands, pause_in())
    assert result.changed == dict.fromkeys(LABELS, "true")
    assert [w["code"] for w in node_writes(k)] == [409, 200]
    assert all(labels(k)[lb] == "false" for lb in LABELS)


async def test_a_dry_run_pause_plans_and_writes_nothing(
        k: Cluster, acts: OperandActivities) -> None:
    set_labels(k, {DP: "true", DCGM: "true", EXPORTER: "false", GFD: "true"})
    before = labels(k)
    k.clear_writes()
    result = await run(acts.pause_gpu_operands, pause_in(dry_run=True))
    assert result.dry_run and result.message.startswith("[dry-run] would turn off")
    assert result.changed == {DP: "true", DCGM: "true", GFD: "true"}
    assert k.writes() == []
    assert labels(k) == before and record(k) is None
    # Its plan given to the restore writes nothing either.
    await run(acts.restore_gpu_operands, result)
    assert k.writes() == []


# ------------------------------------------------------------------ restore


async def test_restore_puts_back_what_was_there_and_leaves_another_writers_label(
        k: Cluster, acts: OperandActivities) -> None:
    set_labels(k, {DP: "true", DCGM: "true", EXPORTER: "true", GFD: "false", MIG: "false"})
    k.core.patch_node(NODE, {"metadata": {"annotations": {
        A_OPERANDS_PAUSED: json.dumps({MIG: "true"})}}})
    before = labels(k)
    paused = await run(acts.pause_gpu_operands, pause_in())
    assert paused.changed == {DP: "true", DCGM: "true", EXPORTER: "true"}
    set_labels(k, {DCGM: "True"})  # someone else's decision while it was off
    await run(acts.restore_gpu_operands, paused)
    assert labels(k) == {**before, DCGM: "True"}
    assert json.loads(record(k) or "") == {MIG: "true"}, "only our entries go"
    event = k.events(NODE, REASON_RESTORED)[0]
    assert event.type == "Warning"
    assert f"restored {DP}=true, {EXPORTER}=true" in event.message
    assert f"left as changed by someone else since the pause: {DCGM}='True'" in event.message
    # Idempotent: a retry writes nothing to the node.
    k.clear_writes()
    await run(acts.restore_gpu_operands, paused)
    assert node_writes(k) == []
    assert labels(k) == {**before, DCGM: "True"}
    assert any(f"already as before the pause: {DP}, {EXPORTER}" in e.message
               for e in k.events(NODE, REASON_RESTORED)), "our own restore, not another's"


async def test_restore_removes_the_record_and_retries_a_conflict(
        k: Cluster, acts: OperandActivities) -> None:
    all_on(k)
    before = labels(k)
    paused = await run(acts.pause_gpu_operands, pause_in())
    k.clear_writes()
    k.faults({"verb": "patch", "resource": "nodes", "status": 409, "times": 1})
    await run(acts.restore_gpu_operands, paused)
    assert [w["code"] for w in node_writes(k)] == [409, 200]
    assert labels(k) == before and record(k) is None
    assert k.events(NODE, REASON_RESTORED)[0].type == "Normal"


async def test_a_pause_whose_answer_was_lost_is_restored_from_the_nodes_record(
        k: Cluster, acts: OperandActivities) -> None:
    """The workflow never saw what the pause changed (its answer was lost to an abort): the
    restore goes by the pause record on the node, puts back exactly those labels (not one an
    admin had turned off before the pause) and removes the record."""
    all_on(k)
    set_labels(k, {GFD: "false"})  # off before the pause: not ours
    before = labels(k)
    await run(acts.pause_gpu_operands, pause_in())
    assert labels(k)[DP] == "false" and record(k) is not None
    await run(acts.restore_gpu_operands, pause_in_flight(NODE))
    assert labels(k) == before and record(k) is None
    assert f"restored {DCGM}=true, {EXPORTER}=true, {DP}=true" in \
        k.events(NODE, REASON_RESTORED)[0].message
    # With no pause on record, nothing is written and the Event says so.
    k.clear_writes()
    await run(acts.restore_gpu_operands, pause_in_flight(NODE))
    assert node_writes(k) == []
    assert any("nothing to restore" in e.message for e in k.events(NODE, REASON_RESTORED))


@pytest.mark.parametrize("which", ["pause", "restore", "gone", "back"])
async def test_a_deleted_node_is_gone_for_good(
        k: Cluster, acts: OperandActivities, which: str) -> None:
    all_on(k)
    paused = await run(acts.pause_gpu_operands, pause_in())
    k.core.delete_node(NODE)
    calls: dict[str, tuple[Any, Any]] = {
        "pause": (acts.pause_gpu_operands, pause_in()),
        "restore": (acts.restore_gpu_operands, paused),
        "gone": (acts.check_operands_gone, wait_in()),
        "back": (acts.check_operands_back, wait_in()),
    }
    fn, inp = calls[which]
    err = await refused(fn, inp)
    assert err.type == NODE_GONE and err.non_retryable


# ------------------------------------------------------------------ waits


async def test_operands_are_running_until_every_selected_pod_has_left(
        k: Cluster, acts: OperandActivities) -> None:
    """Depends on the simulator's DaemonSet controller removing a pod whose node stops
    matching its nodeSelector."""
    operator(k)
    make_ds(k, "test-slow-dcgm", {DCGM: "true"}, grace=60)  # stays Terminating
    make_ds(k, "test-bystander", {})  # selects no deploy label: never waited for
    all_on(k)
    wait_for(lambda: all_ready(k, [f"test-{o}" for o in OPERANDS]
                                + ["test-slow-dcgm", "test-bystander"]))
    err = await refused(acts.check_operands_gone, wait_in())
    assert err.type == OPERANDS_RUNNING and not err.non_retryable
    assert err.category == ApplicationErrorCategory.BENIGN, "no error noise per look"
    paused = await run(acts.pause_gpu_operands, pause_in())
    assert set(paused.changed) == set(LABELS)
    wait_for(lambda: set(our_pods(k)) == {"test-slow-dcgm", "test-bystander"})
    slow = our_pods(k)["test-slow-dcgm"]
    assert slow.metadata.deletion_timestamp is not None
    err = await refused(acts.check_operands_gone, wait_in())
    assert err.type == OPERANDS_RUNNING
    assert f"{NS}/{slow.metadata.name} (terminating)" in err.details
    assert "bystander" not in str(err)
    k.core.delete_namespaced_pod(slow.metadata.name, NS, grace_period_seconds=0)
    state = await gone_within(acts, 10)
    assert state.pods == [] and "left on the node" in state.message
    assert "test-bystander" in our_pods(k), "other DaemonSets are not touched"


async def back_within(acts: OperandActivities, seconds: float, seen: list[str]) -> Any:
    """Poll check_operands_back (8 GPUs expected) as the workflow's retry would; each
    "not yet" is kept in ``seen``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await run(acts.check_operands_back, wait_in(expected_gpus=8))
        except ApplicationError as err:
            assert err.type == OPERANDS_NOT_READY, err
            seen.append(str(err))
            assert time.monotonic() < deadline, seen[-1]
            await asyncio.sleep(0.05)


async def gone_within(acts: OperandActivities, seconds: float) -> Any:
    """Poll check_operands_gone as the workflow's retry would (the simulator's own GPU
    Operator pods, if it ships them, take their own grace period to go)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await run(acts.check_operands_gone, wait_in())
        except ApplicationError as err:
            assert err.type == OPERANDS_RUNNING, err
            assert "test-" not in str(err), err
            assert time.monotonic() < deadline, err
            await asyncio.sleep(0.1)


async def test_operands_are_back_once_ready_and_the_gpus_allocatable(
        k: Cluster, acts: OperandActivities) -> None:
    """Depends on the simulator's DaemonSet controller removing pods when the labels go
    "false" and creating them again when they are back."""
    operator(k, ready_delay=1.5)
    all_on(k)
    names = [f"test-{o}" for o in OPERANDS]
    wait_for(lambda: all_ready(k, names))
    paused = await run(acts.pause_gpu_operands, pause_in())
    wait_for(lambda: not our_pods(k))
    err = await refused(acts.check_operands_back, wait_in(expected_gpus=8))
    assert err.type == OPERANDS_NOT_READY and not err.non_retryable
    assert err.category == ApplicationErrorCategory.BENIGN
    assert f"{NS}/test-device-plugin (no pod on the node; node label {DP}='false')" in str(err)
    k.core.patch_node_status(NODE, {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    await run(acts.restore_gpu_operands, paused)
    # Running, not yet Ready (the readiness delay), then Ready.
    wait_for(lambda: len(our_pods(k)) == 4)
    err = await refused(acts.check_operands_back, wait_in(expected_gpus=8))
    assert err.type == OPERANDS_NOT_READY and "test-dcgm" in str(err)
    wait_for(lambda: all_ready(k, names))
    err = await refused(acts.check_operands_back, wait_in(expected_gpus=8))
    assert err.details == ("allocatable nvidia.com/gpu 0 of 8 expected",)
    k.core.patch_node_status(NODE, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    state = await run(acts.check_operands_back, wait_in(expected_gpus=8))
    assert state.allocatable_gpus == 8
    assert {f"{NS}/{p.metadata.name}" for p in our_pods(k).values()} <= set(state.pods)
    err = await refused(acts.check_operands_back, wait_in(expected_gpus=9))
    assert err.details == ("allocatable nvidia.com/gpu 8 of 9 expected",)


async def test_an_operand_not_meant_for_the_node_is_not_expected(
        k: Cluster, acts: OperandActivities) -> None:
    make_ds(k, "test-device-plugin", {DP: "true"})
    make_ds(k, "test-elsewhere", {DP: "true", "example.com/pool": "other"}, ready_delay=30)
    set_labels(k, {DP: "true"})
    wait_for(lambda: all_ready(k, ["test-device-plugin"]))
    state = await run(acts.check_operands_back, wait_in(labels_=[DP]))
    assert "elsewhere" not in " ".join(state.pods)
    set_labels(k, {"example.com/pool": "other"})
    err = await refused(acts.check_operands_back, wait_in(labels_=[DP]))
    assert err.type == OPERANDS_NOT_READY and f"{NS}/test-elsewhere" in str(err)


async def test_an_operand_kept_off_by_a_taint_names_the_taint(
        k: Cluster, acts: OperandActivities) -> None:
    # Tainted first: the node may already carry the labels (the simulator's GPU Operator).
    k.core.patch_node(NODE, {"spec": {"taints": [
        {"key": "gpu-remediate.io/remediation", "value": "true", "effect": "NoSchedule"}]}})
    make_ds(k, "test-device-plugin", {DP: "true"})
    make_ds(k, "test-dcgm", {DCGM: "true"}, tolerations=[{"operator": "Exists"}])
    set_labels(k, {DP: "true", DCGM: "true"})
    wait_for(lambda: all_ready(k, ["test-dcgm"]))
    err = await refused(acts.check_operands_back, wait_in(labels_=[DP, DCGM]))
    assert (
        f"{NS}/test-device-plugin (no pod on the node; "
        "taint gpu-remediate.io/remediation=true:NoSchedule not tolerated)") in str(err)
    assert "test-dcgm" not in str(err)


SIM_OPERATOR = ("nvidia-device-plugin-daemonset", "nvidia-dcgm", "nvidia-dcgm-exporter",
                "gpu-feature-discovery")


async def test_a_round_trip_with_the_simulated_gpu_operator(
        k_operator: Cluster, acts_operator: OperandActivities) -> None:
    """The simulator's own GPU Operator: the device plugin stopping takes the GPUs off
    allocatable, and they come back only some time after its pod is Ready again.

    Needs the simulator change that ships the GPU Operator DaemonSets and labels every
    node's deploy labels "true" (skipped before it)."""
    k, acts = k_operator, acts_operator
    shipped = set(daemonsets(k))
    if not set(SIM_OPERATOR) <= shipped:
        pytest.skip("the simulator does not ship the GPU Operator DaemonSets yet")

    def sim_pods() -> dict[str, Any]:
        # The operands a reset turns off (the operator's validator holds no GPU: it stays).
        return {n: p for n, p in our_pods(k, prefix="").items() if n in SIM_OPERATOR}

    wait_for(lambda: all(n in sim_pods() and ready(sim_pods()[n]) for n in SIM_OPERATOR))
    assert all(labels(k).get(lb) == "true" for lb in LABELS)
    paused = await run(acts.pause_gpu_operands, pause_in())
    assert paused.changed == dict.fromkeys(LABELS, "true") and paused.left == {}
    state = await gone_within(acts, 15)
    assert state.pods == [] and not sim_pods()
    gpus = int(k.node(NODE).status.allocatable["nvidia.com/gpu"])
    await run(acts.restore_gpu_operands, paused)
    assert all(labels(k).get(lb) == "true" for lb in LABELS)
    seen: list[str] = []
    back = await back_within(acts, 20, seen)
    assert gpus == 0, "no device plugin, no allocatable GPUs"
    assert any(s.endswith("allocatable nvidia.com/gpu 0 of 8 expected")
               and "operands not Ready" not in s for s in seen), seen
    assert back.allocatable_gpus == 8
    assert {f"{NS}/{p.metadata.name}" for p in sim_pods().values()} == set(back.pods)


async def test_under_our_claim_the_restore_lifts_our_taint_so_the_operands_can_start(
        k_operator: Cluster, acts_operator: OperandActivities) -> None:
    """The GPU Operator's DaemonSets tolerate the GPU taint, not ours: restored under our
    NoSchedule taint, no operand could start again. The restore lifts our taint (the node
    stays cordoned) and the next state write (activities/nodes.py) puts it back."""
    from activities.node_keys import TAINT_KEY
    from activities.nodes import NodeActivities
    from policy.models import Action
    from workflows.messages import ClaimInput, StateInput
    from workflows.transitions import NodeState
    k, acts = k_operator, acts_operator
    if not set(SIM_OPERATOR) <= set(daemonsets(k)):
        pytest.skip("the simulator does not ship the GPU Operator DaemonSets yet")
    nodes = NodeActivities(k.api)
    t0 = datetime.now(UTC)
    env = ActivityEnvironment()
    env.run(nodes.claim_node, ClaimInput(node=NODE, state=NodeState.DRAINING, reason="xid 48",
                                         action=Action.RESET, workflow_id="remediation-x",
                                         run_id="r", now=t0))
    # Running operand pods stay under a NoSchedule taint they do not tolerate.
    time.sleep(0.5)
    assert all(n in our_pods(k, prefix="") for n in SIM_OPERATOR)
    paused = await run(acts.pause_gpu_operands, pause_in())
    await gone_within(acts, 15)
    await run(acts.restore_gpu_operands, paused)
    node = k.node(NODE)
    assert node.spec.unschedulable is True, "still cordoned"
    assert TAINT_KEY not in {t.key for t in node.spec.taints or []}
    restored = [e for e in k.events(NODE, "GpuOperandsRestored")]
    assert restored and "taint lifted" in restored[-1].message
    back = await back_within(acts, 20, [])
    assert back.allocatable_gpus == 8
    env.run(nodes.set_node_state, StateInput(
        node=NODE, state=NodeState.VALIDATING, reason="xid 48", step="validate",
        now=datetime.now(UTC), attempt=1, event_reason="ValidationStarted",
        event_message="validating"))
    node = k.node(NODE)
    assert TAINT_KEY in {t.key for t in node.spec.taints or []} and node.spec.unschedulable


# ------------------------------------------------------------------ device plugin


PLUGIN = "nvidia-device-plugin-daemonset"


def plugin_in(node: str = NODE, *, expected_gpus: int = 8, uid: str = "") -> Any:
    from workflows.operands import DevicePluginInput
    return DevicePluginInput(node=node, uid=uid, namespace=NS, expected_gpus=expected_gpus)


def allocatable(k: Cluster, node: str = NODE) -> str:
    return str((k.node(node).status.allocatable or {}).get("nvidia.com/gpu"))


@pytest.fixture
def k_gpus(tmp_path: Path, gpu_sim: Any) -> Iterator[Cluster]:
    """The simulated GPU Operator, its device plugin reading the GPU simulator's XIDs."""
    yield from _cluster(tmp_path, gpu_sim_url=gpu_sim.url)


async def test_a_device_plugin_holding_a_repaired_gpu_unhealthy_is_restarted(
        k_gpus: Cluster, gpu_sim: Any) -> None:
    """The simulated device plugin learns XIDs from the GPU simulator and, like NVIDIA's,
    keeps a GPU that had a critical XID unhealthy until it restarts, even once the fault is
    gone. With every GPU allocatable it is left alone; short of GPUs, its pod is evicted
    (exactly that pod: the uid precondition), the DaemonSet starts a new one and the GPUs
    come back."""
    k = k_gpus
    acts = OperandActivities(k.api)
    wait_for(lambda: PLUGIN in our_pods(k, "") and ready(our_pods(k, "")[PLUGIN])
             and allocatable(k) == "8", timeout=15)
    old = our_pods(k, "")[PLUGIN].metadata
    before = old.uid
    left = await run(acts.restart_device_plugin, plugin_in())
    assert left.evicted == [] and left.allocatable_gpus == 8 and "left alone" in left.message
    assert our_pods(k, "")[PLUGIN].metadata.uid == before
    gpu_sim.client.inject_fault(NODE, 3, "xid", 48)
    wait_for(lambda: allocatable(k) == "7", timeout=15)
    gpu_sim.client.clear(NODE)
    time.sleep(2.5)  # two health checks: the fault is gone, the plugin still holds it
    assert allocatable(k) == "7"
    other = await refused(acts.restart_device_plugin, plugin_in(uid="another-machine"))
    assert other.type == NODE_GONE and other.non_retryable
    done = await run(acts.restart_device_plugin, plugin_in())
    assert done.evicted == [f"{NS}/{old.name}"]
    assert done.allocatable_gpus == 7 and "restarted the device plugin" in done.message
    wait_for(lambda: allocatable(k) == "8", timeout=15)
    pod = our_pods(k, "")[PLUGIN]
    assert pod.metadata.uid != before, "a new pod, started by the DaemonSet"
    events = k.events(NODE, REASON_PLUGIN_RESTARTED)
    assert len(events) == 1 and "7 of 8" in events[0].message


async def test_without_a_device_plugin_pod_nothing_is_restarted(
        k: Cluster, acts: OperandActivities) -> None:
    """A node whose GPUs are not served by the GPU Operator's device plugin (none runs in
    the namespace): nothing to evict, and the answer says so."""
    gpus = int(allocatable(k))
    done = await run(acts.restart_device_plugin, plugin_in(expected_gpus=gpus + 1))
    assert done.evicted == [] and "no device-plugin pod" in done.message
    assert k.events(NODE, "DevicePluginRestarted") == []


@pytest.mark.parametrize("which", ["gone", "back"])
async def test_a_wait_that_finds_no_daemonset_for_an_operand_fails_naming_where_it_looked(
        k: Cluster, acts: OperandActivities, which: str) -> None:
    """A wrong operator namespace must not look like operands that left or came back."""
    operator(k)
    fn = acts.check_operands_gone if which == "gone" else acts.check_operands_back
    wrong = OperandsWaitInput(node=NODE, labels=LABELS, namespace="gpu-operator-resources")
    err = await refused(fn, wrong)
    assert err.type == "OperandsNotFound" and err.non_retryable
    assert "namespace gpu-operator-resources" in str(err)
    assert f"{LABELS[0]}=true" in str(err)
    # One operand of several without its DaemonSet is named alone.
    extra = "nvidia.com/gpu.deploy.sandbox-validator"
    err = await refused(fn, wait_in(labels_=[*LABELS, extra]))
    assert err.type == "OperandsNotFound" and f"{extra}=true" in str(err)
    assert LABELS[0] not in str(err)


# ------------------------------------------------------------------ MIG nodes

MIG_NODE = "mig-01"
LAYOUT = "all-1g.10gb"
MIG_SCENARIO = {"name": "mig", "pools": [
    {"name": "mig", "nodes": 1, "gpus": 8, "labels": {"nvidia.com/mig.config": LAYOUT}},
    {"name": "gpu", "nodes": 1, "gpus": 8}]}


@pytest.fixture
def k_mig(tmp_path: Path) -> Iterator[Cluster]:
    """The simulator's GPU Operator, MIG manager included, with one MIG node."""
    from sim.scenario import Scenario

    yield from _cluster(tmp_path, scenario=Scenario.model_validate(MIG_SCENARIO),
                        job_seconds=0.1)


def _node_job(k: Cluster, name: str, kind: str, node: str = MIG_NODE) -> str:
    k.batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {"gpu-remediate.io/job": kind}}, "spec": {
            "restartPolicy": "Never", "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.sim.local/x:1"}]}}}})

    def done() -> str | None:
        pods = k.core.list_namespaced_pod("default", label_selector=f"job-name={name}").items
        phase = pods[0].status.phase if pods else None
        return phase if phase in ("Succeeded", "Failed") else None

    return str(wait_for(done, 30, f"Job {name} finished"))


async def _reset_with_operands(k: Cluster, acts: OperandActivities, name: str) -> Any:
    """What the reset step does: pause, wait gone, reset, restore."""
    paused = await run(acts.pause_gpu_operands, pause_in(MIG_NODE))
    labels_ = sorted(paused.changed)
    wait_in_ = wait_in(MIG_NODE, labels_=labels_)
    deadline = time.monotonic() + 30
    while True:
        try:
            await run(acts.check_operands_gone, wait_in_)
            break
        except ApplicationError:
            assert time.monotonic() < deadline, "operands never left"
            await asyncio.sleep(0.2)
    assert _node_job(k, name, "gpu-reset") == "Succeeded"
    await run(acts.restore_gpu_operands, paused)
    return paused, wait_in_


async def test_on_a_mig_node_the_reset_pauses_the_mig_manager_too(k_mig: Cluster) -> None:
    acts = OperandActivities(k_mig.api)
    paused = await run(acts.pause_gpu_operands, pause_in(MIG_NODE))
    assert paused.changed == dict.fromkeys([*LABELS, MIG], "true")
    assert labels(k_mig, MIG_NODE)[MIG] == "false"
    await run(acts.restore_gpu_operands, paused)
    other = await run(acts.pause_gpu_operands, pause_in("gpu-01"))
    assert MIG not in other.changed and MIG not in other.left, "not a MIG node"


async def test_after_a_reset_the_mig_manager_reapplies_the_layout_before_operands_count_back(
        k_mig: Cluster) -> None:
    acts = OperandActivities(k_mig.api)
    paused, wait_ = await _reset_with_operands(k_mig, acts, "reset")
    assert MIG in wait_.labels and paused.changed[MIG] == "true"
    after = labels(k_mig, MIG_NODE)
    assert after[MIG] == "true", "restored exactly as found"
    assert after["nvidia.com/mig.config.state"] in ("pending", "success")
    restored = k_mig.events(MIG_NODE, REASON_RESTORED)[-1].message
    assert f"the MIG manager re-applies MIG layout '{LAYOUT}'" in restored
    # Not back while the MIG manager applies; back once it reports success.
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while True:
        try:
            state = await run(acts.check_operands_back, wait_)
            break
        except ApplicationError as err:
            assert err.type == OPERANDS_NOT_READY
            seen.append(str(err))
            assert time.monotonic() < deadline, seen[-1]
            await asyncio.sleep(0.1)
    assert labels(k_mig, MIG_NODE)["nvidia.com/mig.config.state"] == "success"
    assert "nvidia-mig-manager" in " ".join(state.pods)
    assert _node_job(k_mig, "validate", "validate") == "Succeeded"


async def test_without_the_mig_manager_restart_the_validation_finds_no_instances(
        k_mig: Cluster) -> None:
    """A MIG manager that does not restart after the reset (back on before it, as with a
    pause that left it alone): the reset destroys the instances, the stale label still
    says success, and the validation fails. What makes the step above necessary."""
    acts = OperandActivities(k_mig.api)
    paused = await run(acts.pause_gpu_operands, pause_in(MIG_NODE))
    assert MIG in paused.changed
    # Put the MIG manager back at once, before the reset: it never restarts after it.
    set_labels(k_mig, {MIG: "true"}, MIG_NODE)
    wait_for(lambda: not [p for p in k_mig.pods_on(MIG_NODE)
                          if p.metadata.labels.get("app") in (
                              "nvidia-device-plugin-daemonset", "nvidia-dcgm",
                              "nvidia-dcgm-exporter")], 30, "holders gone")
    assert _node_job(k_mig, "reset", "gpu-reset") == "Succeeded"
    assert labels(k_mig, MIG_NODE)["nvidia.com/mig.config.state"] == "success"
    assert _node_job(k_mig, "validate", "validate") == "Failed"
