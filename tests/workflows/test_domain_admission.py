"""Fault domains as pure code: every level at once (domain, pool, fleet), GPU budgets,
the unlabelled domain, domains recorded in the lease at grant, and domain incidents (a
burst inside one domain is one incident; a burst spread over many trips the breaker)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.workflows.fakes import xid_verdict
from tests.workflows.test_admission_rules import recorded
from workflows.admission import Admission
from workflows.incidents import DomainIncident, find
from workflows.leases import Lease
from workflows.messages import DetectorState, FleetObservation, NodeStatus
from workflows.settings import DetectorSettings, FaultDomain
from workflows.transitions import NodeState

NOW = datetime(2026, 12, 1, tzinfo=UTC)
RACK = "node-restriction.kubernetes.io/rack"
CLIQUE = "nvidia.com/gpu.clique"


def fleet(racks: dict[str, str], *, flagged: list[str], out: list[str] | None = None,
          gpus: int = 8, gpus_of: dict[str, int] | None = None,
          pools: dict[str, str] | None = None,
          cliques: dict[str, str] | None = None) -> FleetObservation:
    """``racks``: node -> rack ('' : no rack label); every node has ``gpus`` GPUs unless
    ``gpus_of`` says otherwise."""
    each = {n: (gpus_of or {}).get(n, gpus) for n in racks}
    labels = {RACK: racks, **({CLIQUE: cliques} if cliques else {})}
    sizes: dict[str, dict[str, int]] = {}
    gpu_sizes: dict[str, dict[str, int]] = {}
    for label, values in labels.items():
        for n in racks:
            v = values.get(n, "")
            mine, gmine = sizes.setdefault(label, {}), gpu_sizes.setdefault(label, {})
            mine[v] = mine.get(v, 0) + 1
            gmine[v] = gmine.get(v, 0) + each[n]
    named = set(flagged) | set(out or [])
    pool_sizes: dict[str, int] = {}
    for p in (pools or {}).values():
        pool_sizes[p] = pool_sizes.get(p, 0) + 1
    return FleetObservation(
        managed_nodes=len(racks), readable_nodes=len(racks),
        verdicts=[xid_verdict(n) for n in flagged],
        remediating=[NodeStatus(node=n, state=NodeState.DRAINING) for n in out or []],
        domains_of={n: {label: values.get(n, "") for label, values in labels.items()}
                    for n in named},
        domain_sizes=sizes, domain_gpus=gpu_sizes,
        gpus_of={n: each[n] for n in named}, managed_gpus=sum(each.values()),
        pool_of={n: p for n, p in (pools or {}).items() if n in named},
        pool_sizes=pool_sizes)


def decide(settings: DetectorSettings, o: FleetObservation, state: DetectorState | None = None,
           now: datetime = NOW) -> tuple[list[str], list[str], Admission]:
    state = state if state is not None else DetectorState()
    recorded(state, o, now)
    for node, lease in state.leases.items():  # the record, as _start writes it
        lease.domains = dict(o.domains_of.get(node, {}))
        lease.gpus = o.gpus_of.get(node, 0)
    adm = Admission(settings, state, o, now)
    started, waiting = [], []
    for c in adm.queue:
        why = adm.blocked(c)
        if why is None:
            adm.admit(c)
            started.append(c.node)
        else:
            waiting.append(f"{c.node}: {why}")
    return started, waiting, adm


def calm(**kw: object) -> DetectorSettings:
    """Settings whose breaker stays out of these budget tests."""
    return DetectorSettings.model_validate({"breaker_max_flagged_percent": 100.0, **kw})


def racks(**sizes: int) -> dict[str, str]:
    return {f"{rack}-{i}": rack for rack, n in sizes.items() for i in range(n)}


def test_every_level_holds_at_once_domain_pool_and_fleet() -> None:
    nodes = racks(a=4, b=4, c=4)
    pools = {n: ("p1" if n.startswith(("a", "b")) else "p2") for n in nodes}
    flagged = ["a-0", "a-1", "b-0", "c-0", "c-1", "c-2"]
    s = calm(max_unavailable=3, pool_label="node-restriction.kubernetes.io/pool",
             pool_max_unavailable={"p1": 2},
             fault_domains=[FaultDomain(label=RACK, max_unavailable=1)])
    started, waiting, _ = decide(s, fleet(nodes, flagged=flagged, pools=pools))
    assert started == ["a-0", "b-0", "c-0"]  # then the fleet is full
    assert waiting == [f"a-1: domain {RACK}=a full (1/1)", "c-1: budget full (3/3)",
                       "c-2: budget full (3/3)"]
    s = s.model_copy(update={"max_unavailable": 10,
                             "fault_domains": [FaultDomain(label=RACK, max_unavailable=2)]})
    started, waiting, _ = decide(s, fleet(nodes, flagged=flagged, pools=pools))
    assert started == ["a-0", "a-1", "c-0", "c-1"]
    assert waiting == ["b-0: pool p1 full (2/2)", f"c-2: domain {RACK}=c full (2/2)"]


def test_a_domain_budget_counts_nodes_already_out_from_their_leases() -> None:
    nodes = racks(a=4, b=4)
    s = calm(max_unavailable=5, fault_domains=[FaultDomain(label=RACK,
                                                                       max_unavailable="50%")])
    o = fleet(nodes, flagged=["a-2", "b-0"], out=["a-0", "a-1"])
    started, waiting, _ = decide(s, o)
    assert started == ["b-0"]
    assert waiting == [f"a-2: domain {RACK}=a full (2/2)"]


def test_a_lease_keeps_the_domain_it_was_granted_in() -> None:
    """A node that relabels itself into another rack after its grant moves nothing."""
    nodes = racks(a=2, b=2)
    s = calm(max_unavailable=5, fault_domains=[FaultDomain(label=RACK,
                                                                       max_unavailable=1)])
    state = DetectorState()
    state.leases["a-0"] = Lease(node="a-0", token="t", granted_at=NOW, workflow_id="w",
                                state=NodeState.DRAINING, domains={RACK: "a"}, gpus=8)
    o = fleet(nodes, flagged=["a-1"], out=["a-0"])
    o.domains_of["a-0"] = {RACK: "b"}  # what the node says now
    adm = Admission(s, state, o, NOW)
    assert [adm.blocked(c) for c in adm.queue] == [f"domain {RACK}=a full (1/1)"]


def test_gpu_budgets_count_every_gpu_of_a_node_out_of_service() -> None:
    nodes = racks(a=3, b=3)
    sizes = {"a-0": 8, "a-1": 4, "a-2": 4, "b-0": 8, "b-1": 8, "b-2": 8}
    s = calm(max_unavailable=10, max_unavailable_gpus=16,
                         fault_domains=[FaultDomain(label=RACK, max_unavailable_gpus=8)])
    o = fleet(nodes, flagged=["a-0", "a-1", "a-2", "b-0", "b-1"], gpus_of=sizes)
    started, waiting, adm = decide(s, o)
    assert started == ["a-0", "b-0"]
    assert waiting == [f"a-1: domain {RACK}=a GPU budget full (8 + 4 > 8 GPUs)",
                       f"a-2: domain {RACK}=a GPU budget full (8 + 4 > 8 GPUs)",
                       "b-1: GPU budget full (16 + 8 > 16 GPUs)"]
    s = s.model_copy(update={"max_unavailable_gpus": "100%"})
    started, waiting, adm = decide(s, o)
    assert started == ["a-0", "b-0"]
    assert waiting[2] == f"b-1: domain {RACK}=b GPU budget full (8 + 8 > 8 GPUs)"
    uses = {(u.domain, u.gpus_in_use, u.gpu_budget) for u in adm.domain_uses()}
    assert uses == {("a", 8, 8), ("b", 8, 8)}


def test_nodes_without_the_label_are_one_unlabelled_domain_counted_and_limited() -> None:
    nodes = {**racks(a=2), "x-0": "", "x-1": "", "x-2": ""}
    s = calm(max_unavailable=10,
                         fault_domains=[FaultDomain(label=RACK, max_unavailable=1)])
    o = fleet(nodes, flagged=["x-0", "x-1", "a-0"])
    started, waiting, adm = decide(s, o)
    assert started == ["a-0", "x-0"]
    assert waiting == [f"x-1: domain {RACK}=unlabelled full (1/1)"]
    shown = {(u.domain, u.nodes, u.in_use, u.budget) for u in adm.domain_uses()}
    assert ("", 3, 1, 1) in shown


def test_without_fault_domains_nothing_changes() -> None:
    nodes = racks(a=4)
    started, waiting, adm = decide(calm(max_unavailable=2),
                                   fleet(nodes, flagged=["a-0", "a-1", "a-2"]))
    assert (started, waiting) == (["a-0", "a-1"], ["a-2: budget full (2/2)"])
    assert adm.watch is None and adm.domain_uses() == []


# ------------------------------------------------------------------ incidents

INCIDENTS = DetectorSettings(
    max_unavailable=10, breaker_min_flagged_nodes=3, breaker_max_flagged_nodes=3,
    fault_domains=[FaultDomain(label=CLIQUE, max_unavailable=2, incident_threshold=3,
                               incident_window=timedelta(minutes=5))])


def cliques(**sizes: int) -> tuple[dict[str, str], dict[str, str]]:
    nodes = racks(**sizes)
    return {n: "" for n in nodes}, {n: n.split("-")[0] for n in nodes}


def test_a_burst_inside_one_domain_opens_one_incident_and_holds_its_nodes() -> None:
    nodes, clique_of = cliques(d1=4, d2=4)
    o = fleet(nodes, flagged=["d1-0", "d1-1", "d1-2", "d1-3", "d2-0"], cliques=clique_of)
    state = DetectorState()
    started, waiting, adm = decide(INCIDENTS, o, state)
    assert started == ["d2-0"]  # remediation continues in every other domain
    assert all("domain incident nvidia.com/gpu.clique=d1" in w for w in waiting), waiting
    assert not state.breaker_open  # 5 newly flagged > 3, but 4 of them are one incident
    inc = state.incidents[f"{CLIQUE}=d1"]
    assert inc.nodes == ["d1-0", "d1-1", "d1-2", "d1-3"] and inc.holding
    assert "4 nodes of nvidia.com/gpu.clique=d1 flagged" in inc.reason
    assert adm.watch is not None and adm.watch.to_cordon == {f"{CLIQUE}=d1": inc.nodes}


def test_a_burst_spread_over_many_domains_trips_the_breaker_instead() -> None:
    nodes, clique_of = cliques(d1=2, d2=2, d3=2, d4=2)
    o = fleet(nodes, flagged=["d1-0", "d2-0", "d3-0", "d4-0"], cliques=clique_of)
    state = DetectorState()
    started, waiting, _ = decide(INCIDENTS, o, state)
    assert started == [] and state.breaker_open and state.incidents == {}
    assert all(w.endswith("breaker open") for w in waiting)


def test_the_threshold_counts_within_the_window_only() -> None:
    nodes, clique_of = cliques(d1=4)
    state = DetectorState()
    s = INCIDENTS.model_copy(update={"breaker_min_flagged_nodes": 50})
    decide(s, fleet(nodes, flagged=["d1-0", "d1-1"], cliques=clique_of), state)
    assert state.incidents == {}
    # A third node 6 minutes later: the first two are outside the 5-minute window.
    state.leases.clear()
    later = NOW + timedelta(minutes=6)
    decide(s, fleet(nodes, flagged=["d1-2"], cliques=clique_of), state, later)
    assert state.incidents == {}
    # Two more within the window of the third: three in 5 minutes.
    decide(s, fleet(nodes, flagged=["d1-2", "d1-3", "d1-0"], cliques=clique_of), state,
           later + timedelta(minutes=1))
    assert list(state.incidents) == [f"{CLIQUE}=d1"]


def test_unlabelled_nodes_never_make_an_incident() -> None:
    nodes = {f"x-{i}": "" for i in range(4)}
    state = DetectorState()
    decide(INCIDENTS.model_copy(update={"breaker_min_flagged_nodes": 50}),
           fleet(nodes, flagged=list(nodes)), state)
    assert state.incidents == {}


def held(state: DetectorState, o: FleetObservation, now: datetime) -> tuple[list[str], Admission]:
    started, _, adm = decide(INCIDENTS, o, state, now)
    return started, adm


def test_faults_clearing_close_the_incident_and_uncordon_its_nodes() -> None:
    nodes, clique_of = cliques(d1=3)
    state = DetectorState()
    decide(INCIDENTS, fleet(nodes, flagged=list(nodes), cliques=clique_of), state)
    state.incident_cordons = {n: f"{CLIQUE}=d1" for n in nodes}
    # One clears: the incident holds (the shared part is not fixed), its cordon stays.
    started, adm = held(state, fleet(nodes, flagged=["d1-0", "d1-1"], cliques=clique_of),
                        NOW + timedelta(minutes=1))
    assert started == [] and adm.watch is not None and adm.watch.to_uncordon == []
    # All clear: closed by itself, every cordon of ours comes off.
    started, adm = held(state, fleet(nodes, flagged=[], cliques=clique_of),
                        NOW + timedelta(minutes=2))
    inc = state.incidents[f"{CLIQUE}=d1"]
    assert inc.closed_at is not None and "no node of it is flagged" in inc.closed_by
    assert adm.watch is not None and adm.watch.to_uncordon == sorted(nodes)


def test_resolve_uncordons_the_cleared_nodes_and_the_rest_go_node_by_node() -> None:
    nodes, clique_of = cliques(d1=3)
    state = DetectorState()
    decide(INCIDENTS, fleet(nodes, flagged=list(nodes), cliques=clique_of), state)
    state.incident_cordons = {n: f"{CLIQUE}=d1" for n in nodes}
    inc, why = find(state.incidents, "d1")
    assert inc is not None and why == ""
    inc.closed_at, inc.closed_by = NOW + timedelta(minutes=1), "resolved by ops: fixed"
    started, adm = held(state, fleet(nodes, flagged=["d1-2"], cliques=clique_of),
                        NOW + timedelta(minutes=2))
    assert started == ["d1-2"]  # not a new incident: it was counted in the resolved one
    assert adm.watch is not None and adm.watch.to_uncordon == ["d1-0", "d1-1"]


def test_release_lets_the_incidents_nodes_be_remediated_one_by_one() -> None:
    nodes, clique_of = cliques(d1=3)
    state = DetectorState()
    decide(INCIDENTS, fleet(nodes, flagged=list(nodes), cliques=clique_of), state)
    state.incidents[f"{CLIQUE}=d1"].released_by = "ops: the switch is fine"
    started, waiting, _ = decide(INCIDENTS, fleet(nodes, flagged=list(nodes),
                                                  cliques=clique_of), state,
                                 NOW + timedelta(minutes=1))
    assert started == ["d1-0", "d1-1"]  # the domain's own budget (2) still holds
    assert waiting == [f"d1-2: domain {CLIQUE}=d1 full (2/2)"]
    assert state.incidents[f"{CLIQUE}=d1"].closed_at is None  # open until faults clear


def test_an_operator_names_an_incident_by_value_or_label_and_value() -> None:
    a = DomainIncident(label=RACK, domain="r1", opened_at=NOW)
    b = DomainIncident(label=CLIQUE, domain="r1", opened_at=NOW)
    c = DomainIncident(label=CLIQUE, domain="d7", opened_at=NOW)
    incidents = {i.key: i for i in (a, b, c)}
    assert find(incidents, "d7") == (c, "")
    assert find(incidents, f"{RACK}=r1") == (a, "")
    none, why = find(incidents, "r1")
    assert none is None and "several levels" in why
    none, why = find(incidents, "d9")
    assert none is None and "no open incident in domain 'd9'" in why and "d7" in why
