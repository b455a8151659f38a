"""Which code path a workflow run takes: one marker per run for this release's patches.

Every behaviour change to a running workflow is guarded by a patch id, so a history
written by an older worker replays down the branch it took. ``workflow.patched`` records
a ``core_patch`` marker the first time each id is asked in a run, and the Temporal UI
shows every marker as a row of its own: a remediation asked about 40 ids and showed a
step as its activity plus the markers of the branches it passed, rows named only
``core_patch``.

This release folds the ids it shipped with into one: a run that starts under this code
records the single marker ``RELEASE_PATCH`` first thing and takes every folded branch
with no marker of its own. A run started by an older worker has no such marker; its
replay answers ``RELEASE_PATCH`` False, and each folded id is asked as before, so it
replays, and continues, exactly as it ran.

Why this is safe: ``RELEASE_PATCH`` is always asked before any folded id in a run
(``patched`` asks it first), and the answer is kept for the run. Asked during replay of
an old history it is False for good; asked live, every folded id asked later in that run
would be live too, and a live ``workflow.patched`` is always True.

A patch added after this release must not join ``FOLDED``: runs that recorded this
release's marker ran without it. Ask it with ``patched`` like the others; it records its
own marker until a later release folds it under a new ``RELEASE_PATCH`` (and keeps this
one's set for the runs that recorded this one).
"""

from __future__ import annotations

from temporalio import workflow

RELEASE_PATCH = "release-2026-12-folds-earlier-patches"

FOLDED: frozenset[str] = frozenset({
    "abort-acknowledges-shown-xids", "abort-carried-past-continue-as-new",
    "approval-wait-bounded", "continue-as-new-in-loops", "detector-bounded-by-limits",
    "detector-node-reports", "detector-seeds-pending-from-visibility",
    "drain-before-release-validation", "external-wait-bounded", "fault-domains-and-incidents",
    "gpu-counts-reported", "gpu-isolation-dra", "gpu-lease-waits-for-the-node",
    "gpu-scoped-leases", "gpu-validation-pinned", "heat-cordon-drains-in-a-slot",
    "job-not-started-reported", "job-wait-says-last-look", "jobs-polled-by-retry",
    "node-gone-event", "node-only-woken-tick", "one-dcgm-host-engine",
    "operands-pause-answer-may-be-lost", "operands-paused-recorded-before-abort",
    "operator-command-rules", "operator-marked-unverified", "out-of-service-taint",
    "policy-quarantine-awaits-approval", "probation-at-admission",
    "quarantine-interrupts-the-heat-watch", "reboot-confirmed-by-the-node",
    "reboot-timed-from-request", "release-clear-bounded", "remediation-holds-a-lease",
    "repair-ledger", "repaired-accepted-is-kept", "repeat-offender-counts-repairs",
    "repeat-offender-quarantine-gated-as-quarantine", "reset-beside-gpu-operator",
    "reset-by-uuid", "slots-are-leases", "state-mirror-rewritten",
    "thermal-cordons-outside-budget", "thermal-polled-by-retry",
    "validation-proves-the-node",
})


def begin() -> bool:
    """Ask the release marker at the very start of a run, so that a new run's one
    ``core_patch`` row is its first and not in the middle of a step. True for a run
    started under this release."""
    return workflow.patched(RELEASE_PATCH)


def patched(patch_id: str) -> bool:
    """``workflow.patched(patch_id)``, answered by the release marker for a folded id."""
    if patch_id in FOLDED and workflow.patched(RELEASE_PATCH):
        return True
    return workflow.patched(patch_id)
