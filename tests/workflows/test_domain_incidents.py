"""Domain incidents in the detector workflow (dev server, for updates): a domain failing as
a unit is one incident, its nodes cordoned and not drained while every other domain is
remediated; an operator's resolve or release (each refused without a reason or for an
unknown domain), faults clearing, and continue-as-new carrying the incident."""

from __future__ import annotations

import threading
from datetime import timedelta

from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from tests.workflows.fakes import until, worker_for, xid_verdict
from tests.workflows.test_detector import cleanup, dview, fleet, settings, start, ticks
from workflows.detector import DetectorWorkflow
from workflows.messages import IncidentCommand
from workflows.settings import FaultDomain
from workflows.transitions import NodeState

CLIQUE = "nvidia.com/gpu.clique"


def domain_fleet(per_domain: int = 4, domains: int = 3):
    cluster, names = fleet(per_domain * domains)
    for i, name in enumerate(names):
        cluster.nodes[name].labels = {CLIQUE: f"d{i // per_domain}"}
    return cluster, names


def incident_settings(**kw):
    kw.setdefault("max_unavailable", 3)
    return settings(
        trust_node_writable_labels=True, breaker_min_flagged_nodes=3,
        breaker_max_flagged_nodes=3,
        fault_domains=[FaultDomain(label=CLIQUE, max_unavailable=1, incident_threshold=3,
                                   incident_window=timedelta(minutes=5))], **kw)


async def refused(handle, update, cmd: IncidentCommand) -> str:
    try:
        await handle.execute_update(update, cmd)
    except WorkflowUpdateFailedError as failed:
        cause = failed.cause
        assert isinstance(cause, ApplicationError) and cause.type == "Rejected", cause
        return cause.message
    raise AssertionError("not refused")


async def test_a_domain_failing_together_is_one_incident_beside_an_unrelated_repair(local_env):
    cluster, names = domain_fleet()
    d0, other = names[:4], names[8]
    cluster.verdicts = [xid_verdict(n) for n in [*d0, other]]
    gate = threading.Event()
    cluster.claim_gates[other] = gate  # its lease stays visible until the gate opens
    s = incident_settings(ticks_per_run=4)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            first_run = (await detector.describe()).run_id
            await until(lambda: all(cluster.nodes[n].incident for n in d0), 20,
                        "the domain's nodes cordoned for the incident")
            # The other node's lease records its domain and GPUs as granted.
            async def leased() -> bool:
                return any(le.node == other for le in (await dview(detector)).leases)
            await until(leased, 20, "the other node admitted")
            [lease] = [le for le in (await dview(detector)).leases if le.node == other]
            assert (lease.domains, lease.gpus) == ({CLIQUE: "d2"}, 8)
            gate.set()
            await until(lambda: other in cluster.claimed, 20, "the other node remediated")
            view = await ticks(detector, 2)
            assert not view.breaker_open, "five flagged, four of them one incident"
            [inc] = view.incidents
            assert (inc.label, inc.domain, inc.nodes) == (CLIQUE, "d0", sorted(d0))
            assert inc.closed_at is None and "4 nodes of" in inc.reason
            assert all(f"domain incident {CLIQUE}=d0" in w for w in view.waiting
                       if w.split()[0] in d0)
            with cluster.lock:
                assert not set(d0) & set(cluster.claimed), "not drained node by node"
                events = [(n, r) for n, r, _ in cluster.events if r == "DomainIncident"]
            assert sorted(events) == sorted((n, "DomainIncident") for n in d0)
            # The incident is reported for the metric and the alert.
            assert any(f"{CLIQUE}=d0" in r.incidents for r in cluster.reports)
            # Carried across continue-as-new, its cordons too: nothing is cordoned twice.
            async def new_run() -> bool:
                return (await detector.describe()).run_id != first_run
            await until(new_run, 20, "continue-as-new")
            view = await ticks(detector, 2)
            assert [i.key for i in view.incidents] == [f"{CLIQUE}=d0"]
            with cluster.lock:
                cordons = [c for c in cluster.calls if c[0] == "cordon_for_incident"]
            assert len(cordons) == 1, cordons

            # Refused without a reason, and for a domain with no incident, saying why.
            # (model_construct: what a client that skips the CLI's checks would send.)
            why = await refused(detector, DetectorWorkflow.resolve_incident,
                                IncidentCommand.model_construct(domain="d0", operator="alice",
                                                                reason=""))
            assert "reason: required" in why
            why = await refused(detector, DetectorWorkflow.release_incident,
                                IncidentCommand(domain="d7", operator="alice", reason="x"))
            assert "no open incident in domain 'd7'" in why and f"{CLIQUE}=d0" in why

            # The shared part is fixed: two nodes' faults cleared with it, two remain.
            cluster.verdicts = [xid_verdict(n) for n in d0[2:]]
            await detector.execute_update(DetectorWorkflow.resolve_incident, IncidentCommand(
                domain="d0", operator="alice", reason="NVLink switch tray replaced"))
            await until(lambda: not cluster.nodes[d0[0]].cordoned
                        and not cluster.nodes[d0[1]].cordoned, 20, "cleared nodes uncordoned")
            # The rest go one by one, under the domain's budget of 1.
            await until(lambda: d0[2] in cluster.claimed, 20, "a remaining node remediated")
            view = await dview(detector)
            assert view.incidents[0].closed_by.startswith("resolved by alice (unverified): ")
            with cluster.lock:
                assert d0[3] not in cluster.claimed
                assert cluster.nodes[d0[3]].cordoned, "still held by our cordon until its turn"
        finally:
            await cleanup(local_env.client, detector, cluster)


async def test_release_remediates_one_by_one_and_returns_nodes_uncordoned(local_env):
    cluster, names = domain_fleet(per_domain=3, domains=2)
    d0 = names[:3]
    cluster.verdicts = [xid_verdict(n) for n in d0]
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, incident_settings())
        try:
            await until(lambda: all(cluster.nodes[n].incident for n in d0), 20, "cordoned")
            await detector.execute_update(DetectorWorkflow.release_incident, IncidentCommand(
                domain=f"{CLIQUE}=d0", operator="bob", reason="not the switch: node faults"))
            why = await refused(detector, DetectorWorkflow.release_incident,
                                IncidentCommand(domain="d0", operator="bob", reason="again"))
            assert "already released" in why
            await until(lambda: d0[0] in cluster.claimed, 20, "the first node remediated")
            with cluster.lock:
                first = cluster.calls.index(next(c for c in cluster.calls
                                                 if c[0] == "claim_node"))
                lifted = [c for c in cluster.calls[:first] if c[0] == "cordon_for_incident"
                          and d0[0] in c[1].uncordon]
            assert lifted, "our cordon came off before its remediation claimed it"
            # Its remediation returns it uncordoned: the claim did not see our cordon.
            await until(lambda: cluster.nodes[d0[0]].state == NodeState.HEALTHY
                        and d0[1] in cluster.claimed, 30, "the first one repaired, the next")
            with cluster.lock:
                assert not cluster.nodes[d0[0]].cordoned
            assert max(o for o, _ in cluster.oos_samples) <= 1, "the domain's budget of 1"
        finally:
            await cleanup(local_env.client, detector, cluster)


async def test_faults_clearing_close_the_incident_by_itself(local_env):
    cluster, names = domain_fleet(per_domain=3, domains=2)
    d0 = names[:3]
    cluster.verdicts = [xid_verdict(n) for n in d0]
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, incident_settings())
        try:
            await until(lambda: all(cluster.nodes[n].incident for n in d0), 20, "cordoned")
            cluster.verdicts = []
            await until(lambda: not any(cluster.nodes[n].cordoned for n in d0), 20,
                        "uncordoned once the faults cleared")
            view = await dview(detector)
            assert view.incidents[0].closed_by == "no node of it is flagged any more"
            assert cluster.claimed == []
            # The tick that closed it publishes its figures after the uncordon: wait for them.
            await until(lambda: cluster.reports and not cluster.reports[-1].incidents, 20,
                        "a report without the incident")
        finally:
            await cleanup(local_env.client, detector, cluster)
