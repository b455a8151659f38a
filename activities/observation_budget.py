"""Keep one tick's ``FleetObservation`` within what Temporal accepts as an activity result.

Temporal refuses a payload over 2 MB (the server's default blob size limit; it warns from
512 KB), and a refused observation blinds the detector for the whole fleet: a real XID 79
elsewhere is never acted on. Hostile or broken exporters decide how many nodes are flagged
and how many findings each has, so the observation is bounded here, whatever the fleet:

1. each verdict carries at most ``MAX_FINDINGS`` findings, the most severe first (its action
   is unchanged: it comes from the most severe finding, which is kept);
2. each error line is cut to ``MAX_ERROR_CHARS``;
3. if the result is still over ``MAX_OBSERVATION_BYTES``, the most severe verdicts that fit are
   kept and the others are left out of this tick, named in one error line. They are flagged
   again next tick; so many flagged nodes at once also trip the circuit breaker long before
   (``breaker_max_flagged_nodes``, default 50).

What holds budget slots (``remediating``, ``orphans``) is never cut: the budget must count
every node out of service.
"""

from __future__ import annotations

from policy.models import SEVERITY, Verdict
from workflows.messages import FleetObservation

MAX_OBSERVATION_BYTES = 1_000_000
"""Half Temporal's default limit: room for the envelope and for shards merged elsewhere."""
MAX_FINDINGS = 16
"""Findings per verdict in the observation: an 8-GPU node with every signal bad has about
this many; the remediation needs the XID findings of each GPU, which rank first."""
MAX_ERROR_CHARS = 300


def _size(obs: FleetObservation) -> int:
    return len(obs.model_dump_json())


def _trimmed(verdict: Verdict) -> Verdict:
    if len(verdict.findings) <= MAX_FINDINGS:
        return verdict
    ranked = sorted(verdict.findings, key=lambda f: -SEVERITY[f.action])
    return verdict.model_copy(update={"findings": ranked[:MAX_FINDINGS]})


def bound_observation(obs: FleetObservation, *,
                      max_bytes: int = MAX_OBSERVATION_BYTES) -> FleetObservation:
    """``obs`` with its verdicts and errors cut so that its JSON is at most ``max_bytes``
    (unless what holds budget slots alone is larger: that is never cut)."""
    errors = [e if len(e) <= MAX_ERROR_CHARS else e[: MAX_ERROR_CHARS - 1] + "…"
              for e in obs.errors]
    verdicts = [_trimmed(v) for v in obs.verdicts]
    out = obs.model_copy(update={"verdicts": verdicts, "errors": errors})
    if _size(out) <= max_bytes:
        return out
    note = ("{} flagged nodes left out of this observation (over its size budget of "
            f"{max_bytes} bytes); they are flagged again next tick")
    base = out.model_copy(update={"verdicts": [], "errors": [*errors, note.format(len(verdicts))]})
    room = max_bytes - _size(base)
    kept: list[Verdict] = []
    for v in sorted(verdicts, key=lambda v: (-SEVERITY[v.action], v.node)):
        cost = len(v.model_dump_json()) + 1
        if cost > room:
            continue
        room -= cost
        kept.append(v)
    left_out = len(verdicts) - len(kept)
    names = {v.node for v in kept} | {r.node for r in obs.remediating} | \
        {h.node for h in obs.held}
    return out.model_copy(update={
        "verdicts": sorted(kept, key=lambda v: v.node),
        "errors": [*errors, note.format(left_out)],
        "pool_of": {n: p for n, p in obs.pool_of.items() if n in names},
        "ledger": {n: x for n, x in obs.ledger.items() if n in names},
        "domains_of": {n: d for n, d in obs.domains_of.items() if n in names},
        "gpus_of": {n: g for n, g in obs.gpus_of.items() if n in names},
    })
