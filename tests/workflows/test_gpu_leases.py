"""GPU-scoped leases as pure code: a verdict the remediation isolates on one GPU holds no
node slot at any level and one GPU of every GPU budget; its fallback to the whole node
waits for a slot through every budget, and widens the lease only then."""

from __future__ import annotations

from datetime import timedelta

from policy.models import Action, Finding, Verdict
from tests.workflows.test_domain_admission import NOW, RACK, calm, fleet, racks
from workflows.admission import Admission
from workflows.leases import Lease, widened
from workflows.messages import DetectorState
from workflows.settings import FaultDomain
from workflows.transitions import NodeState

DRA = {"gpu_isolation": "dra"}


def one_gpu(node: str, action: Action = Action.RESET) -> Verdict:
    """A fault on one GPU with its UUID: the remediation isolates it under dra."""
    return Verdict(node=node, action=action, findings=[Finding(
        gpu="3", uuid="GPU-5d1a3c2e-8d0b-4c1e-9a57-6b1f3c2d9e41",
        signal="DCGM_FI_DEV_XID_ERRORS", value=48, rule="xid-48-drain-and-reset",
        action=action)])


def lease(node: str, *, scope: str = "node", gpus: int = 8, rack: str = "a",
          state: NodeState = NodeState.DRAINING) -> Lease:
    return Lease(node=node, token=f"t-{node}", granted_at=NOW, workflow_id=f"remediation-{node}",
                 state=state, slot=scope == "node", scope=scope, gpus=gpus,
                 domains={RACK: rack})


def run(adm: Admission) -> tuple[list[str], list[str]]:
    """Admit what fits, in queue order, like the detector."""
    started, waiting = [], []
    for c in adm.queue:
        why = adm.blocked(c)
        if why is None:
            adm.admit(c)
            started.append(f"{c.node}:{adm.scope_of(c)}")
        else:
            waiting.append(f"{c.node}: {why}")
    return started, waiting


def test_an_isolated_gpu_and_a_whole_node_fault_are_both_admitted_under_a_budget_of_one() -> None:
    nodes = racks(a=2, b=2)
    o = fleet(nodes, flagged=["b-0"])  # b-0: XID 79, a reboot (whole node)
    o.verdicts.insert(0, one_gpu("a-0"))
    o.domains_of["a-0"], o.gpus_of["a-0"] = {RACK: "a"}, 8
    s = calm(max_unavailable=1, remediation=DRA)
    adm = Admission(s, DetectorState(), o, NOW)
    started, waiting = run(adm)
    assert sorted(started) == ["a-0:gpu", "b-0:node"] and waiting == []
    assert adm.in_use == ["b-0"] and adm.isolated == ["a-0"]


def test_with_isolation_off_the_same_gpu_fault_takes_the_node_slot() -> None:
    nodes = racks(a=2, b=2)
    o = fleet(nodes, flagged=["b-0"])
    o.verdicts.insert(0, one_gpu("a-0"))
    o.domains_of["a-0"], o.gpus_of["a-0"] = {RACK: "a"}, 8
    # The reboot (more severe) first, then the reset waits for the node slot.
    started, waiting = run(Admission(calm(max_unavailable=1), DetectorState(), o, NOW))
    assert started == ["b-0:node"] and waiting == ["a-0: budget full (1/1)"]
    # A detector run recorded before GPU-scoped leases replays as it ran.
    s = calm(max_unavailable=1, remediation=DRA)
    started, waiting = run(Admission(s, DetectorState(), o, NOW, gpu_scope=False))
    assert started == ["b-0:node"] and waiting == ["a-0: budget full (1/1)"]


def test_a_gpu_scoped_lease_holds_no_node_slot_at_any_level_but_one_gpu_at_every_one() -> None:
    nodes = racks(a=2, b=2)
    s = calm(max_unavailable=1, max_unavailable_gpus=9, remediation=DRA,
             fault_domains=[FaultDomain(label=RACK, max_unavailable=1, max_unavailable_gpus=8)])
    state = DetectorState(leases={"a-0": lease("a-0", scope="gpu", gpus=1,
                                               state=NodeState.HEALTHY)})
    o = fleet(nodes, flagged=["a-1", "b-0"])
    adm = Admission(s, state, o, NOW)
    assert adm.in_use == [] and adm.isolated == ["a-0"]
    started, waiting = run(adm)
    # Rack a has no node out (a-0 is in service), but its GPU budget holds 1 + 8 > 8.
    assert waiting == [f"a-1: domain {RACK}=a GPU budget full (1 + 8 > 8 GPUs)"]
    assert started == ["b-0:node"]
    uses = {(u.domain, u.in_use, u.gpus_in_use) for u in adm.domain_uses()}
    assert uses == {("a", 0, 1), ("b", 1, 8)}
    # The fleet's GPU budget counts the isolated GPU too: 1 + 8 of 9, nothing more fits.
    o2 = fleet(nodes, flagged=["b-1"])
    o2.verdicts = [one_gpu("b-1")]
    state.leases["b-0"] = lease("b-0", rack="b")
    adm = Admission(s.model_copy(update={"max_unavailable": 2}), state, o2, NOW)
    assert [adm.blocked(c) for c in adm.queue] == ["GPU budget full (9 + 1 > 9 GPUs)"]


def test_a_gpu_scoped_start_counts_one_gpu_not_the_nodes_eight() -> None:
    nodes = racks(a=2)
    o = fleet(nodes, flagged=[])
    o.verdicts = [one_gpu("a-0"), one_gpu("a-1")]
    o.domains_of = {n: {RACK: "a"} for n in nodes}
    o.gpus_of = {n: 8 for n in nodes}
    s = calm(max_unavailable=1, max_unavailable_gpus=1, remediation=DRA)
    started, waiting = run(Admission(s, DetectorState(), o, NOW))
    assert started == ["a-0:gpu"]
    assert waiting == ["a-1: GPU budget full (1 + 1 > 1 GPUs)"]


def test_the_fallback_waits_for_a_node_slot_while_the_budget_is_full() -> None:
    nodes = racks(a=2, b=2)
    s = calm(max_unavailable=1, remediation=DRA)
    state = DetectorState(leases={"a-0": lease("a-0", scope="gpu", gpus=1,
                                               state=NodeState.HEALTHY),
                                  "b-0": lease("b-0", rack="b")},
                          slot_requests={"a-0": NOW - timedelta(seconds=5)})
    o = fleet(nodes, flagged=[])
    o.gpus_of = {"a-0": 8}
    adm = Admission(s, state, o, NOW)
    assert [(c.node, c.widen, c.label) for c in adm.queue] == [
        ("a-0", True, "whole node after GPU isolation failed")]
    assert adm.blocked(adm.queue[0]) == "budget full (1/1)"
    assert state.slot_requests == {"a-0": NOW - timedelta(seconds=5)}  # it stands
    # b-0's remediation closed: the slot is a-0's, its lease the node's with every GPU.
    del state.leases["b-0"]
    adm = Admission(s, state, o, NOW)
    c = adm.queue[0]
    assert adm.blocked(c) is None
    adm.admit(c)
    assert adm.in_use == ["a-0"] and adm.isolated == [] and state.slot_requests == {}
    state.leases["a-0"] = widened(state.leases["a-0"], 8)
    after = state.leases["a-0"]
    assert (after.scope, after.slot, after.gpus) == ("node", True, 8)
    assert after.holds_slot(cordoned_counts=False)


def test_a_widened_lease_needs_the_nodes_gpus_not_only_the_one_it_held() -> None:
    nodes = racks(a=2)
    s = calm(max_unavailable=2, max_unavailable_gpus=8, remediation=DRA)
    state = DetectorState(leases={"a-0": lease("a-0", scope="gpu", gpus=1,
                                               state=NodeState.HEALTHY),
                                  "a-1": lease("a-1", scope="gpu", gpus=1,
                                               state=NodeState.HEALTHY)},
                          slot_requests={"a-0": NOW})
    o = fleet(nodes, flagged=[])
    o.gpus_of = {"a-0": 8, "a-1": 8}
    adm = Admission(s, state, o, NOW)
    assert adm.blocked(adm.queue[0]) == "GPU budget full (1 + 8 > 8 GPUs)"


def test_a_gpu_scoped_lease_never_counts_as_a_heat_cordon() -> None:
    gpu = lease("a-0", scope="gpu", gpus=1, state=NodeState.HEALTHY)
    assert not gpu.holds_slot(cordoned_counts=True) and not gpu.slot
    s = calm(max_unavailable=1, remediation=DRA, cordoned_counts_against_budget=True)
    adm = Admission(s, DetectorState(leases={"a-0": gpu}), fleet(racks(a=2), flagged=[]), NOW)
    assert adm.in_use == [] and adm.cordoned == []


def test_a_lease_recorded_before_scopes_reads_as_the_nodes() -> None:
    old = Lease.model_validate({"node": "n", "token": "t", "granted_at": NOW.isoformat(),
                                "workflow_id": "remediation-n"})
    assert old.scope == "node" and old.holds_slot(cordoned_counts=False)
    assert widened(old, 8).scope == "node"


def test_an_adopted_lease_that_asks_for_the_node_is_granted_what_it_holds() -> None:
    """A detector started again adopts a GPU-scoped remediation as a node lease (its scope
    unknown: a node slot, failing closed); when that remediation asks for the node, it is
    granted at once, not left waiting for a slot it already holds."""
    s = calm(max_unavailable=1, remediation=DRA)
    adopted = lease("a-0", state=NodeState.HEALTHY).model_copy(
        update={"adopted": True, "token": ""})
    state = DetectorState(leases={"a-0": adopted}, slot_requests={"a-0": NOW})
    adm = Admission(s, state, fleet(racks(a=2), flagged=[]), NOW)
    assert adm.in_use == ["a-0"] and [c.node for c in adm.queue] == ["a-0"]
    assert adm.blocked(adm.queue[0]) is None
    adm.admit(adm.queue[0])
    assert adm.in_use == ["a-0"] and state.slot_requests == {}
    # Without GPU-scoped leases (a run recorded before them) the request is dropped as before.
    state = DetectorState(leases={"a-0": adopted}, slot_requests={"a-0": NOW})
    adm = Admission(s, state, fleet(racks(a=2), flagged=[]), NOW, gpu_scope=False)
    assert adm.queue == [] and state.slot_requests == {}


def test_gpus_out_of_service_count_node_leases_gpus_and_each_isolated_gpu() -> None:
    nodes = racks(a=2, b=2)
    s = calm(max_unavailable=2, max_unavailable_gpus=12, remediation=DRA)
    state = DetectorState(leases={"a-0": lease("a-0", scope="gpu", gpus=1,
                                               state=NodeState.HEALTHY),
                                  "b-0": lease("b-0", rack="b", gpus=4)})
    o = fleet(nodes, flagged=[])
    o.verdicts = [one_gpu("a-1"), one_gpu("b-1")]
    adm = Admission(s, state, o, NOW)
    # The node lease's 4 GPUs (as recorded, not the 8 observed) and one isolated GPU.
    use = adm.gpu_use()
    assert (use.gpus, use.out_of_service, use.isolated, use.budget) == (32, 5, 1, 12)
    started, waiting = run(adm)
    assert sorted(started) == ["a-1:gpu", "b-1:gpu"] and waiting == []
    # This tick's GPU-scoped starts count one GPU each, before their leases are written.
    use = adm.gpu_use()
    assert (use.out_of_service, use.isolated) == (7, 3)


def test_without_a_gpu_budget_the_gpus_out_are_still_counted() -> None:
    nodes = racks(a=2)
    state = DetectorState(leases={"a-0": lease("a-0", gpus=8)})
    use = Admission(calm(), state, fleet(nodes, flagged=[]), NOW).gpu_use()
    assert (use.out_of_service, use.isolated, use.budget) == (8, 0, None)


POOL = "node-restriction.kubernetes.io/pool"


def test_a_pool_gpu_budget_counts_node_leases_and_isolated_gpus_of_that_pool_only() -> None:
    nodes = racks(a=4, b=2)
    pools = {n: ("p1" if n.startswith("a") else "p2") for n in nodes}
    s = calm(max_unavailable=4, pool_label=POOL, remediation=DRA,
             pool_max_unavailable_gpus={"p1": 9, "*": "50%"})
    isolated = lease("a-0", scope="gpu", gpus=1, state=NodeState.HEALTHY)
    isolated.pool = "p1"
    state = DetectorState(leases={"a-0": isolated})
    o = fleet(nodes, flagged=["a-1", "a-2", "b-0", "b-1"], pools=pools)
    o.pool_gpus = {"p1": 32, "p2": 16}
    o.verdicts.append(one_gpu("a-3"))
    o.pool_of["a-3"] = "p1"
    adm = Admission(s, state, o, NOW)
    assert (adm.gpu_use().pools, adm.gpu_use().pool_budgets) == ({"p1": 1}, {"p1": 9})
    started, waiting = run(adm)
    # p1: the isolated GPU and a-1's eight make nine; p2: 50% of 16 GPUs is one node.
    assert sorted(started) == ["a-1:node", "b-0:node"]
    assert (adm.gpu_use().pools, adm.gpu_use().pool_budgets) == ({"p1": 9, "p2": 8},
                                                                 {"p1": 9, "p2": 8})
    assert sorted(waiting) == ["a-2: pool p1 GPU budget full (9 + 8 > 9 GPUs)",
                               "a-3: pool p1 GPU budget full (9 + 1 > 9 GPUs)",
                               "b-1: pool p2 GPU budget full (8 + 8 > 8 GPUs)"]
    # Without a pool label there are no pools to count.
    unpooled = s.model_copy(update={"pool_label": None})
    started, waiting = run(Admission(unpooled, DetectorState(leases={"a-0": isolated}), o, NOW))
    assert waiting == [] and len(started) == 5
