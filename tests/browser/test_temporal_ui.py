"""The Temporal UI paths of docs/operations.md, in Chromium: find a node's remediation by
``GpuNode``, read its current details, approve it by "Send a Signal" and by "Send an Update"
with the documented payload and see the node back in service; a signal without a reason is
shown as refused.

The stack is the end-to-end one (real dev server with its UI, worker and detector processes,
both simulators) on two nodes of their own (tests/browser/browser.yaml), in supervised mode
for reboots, so each XID 79 waits for an operator.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

import pytest
from playwright.sync_api import Page

from sim.gpu.client import GpuSimClient
from tests.browser.ui import TemporalUI
from tests.e2e import kit
from tests.e2e.conftest import make_stack
from tests.e2e.kit import Cluster, wait_for
from worker.stack import LocalStack, Ports
from worker.stack.local import free_port
from worker.ui_links import DEV_SERVER_UI_OFFSET, ui_base
from workflows.messages import RemediationResult, RemediationView

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent

# The payload docs/operations.md and the approval instructions give.
PAYLOAD = {"operator": "alice", "reason": "checked dmesg"}
BY_SIGNAL, BY_UPDATE = "gpu-node-01", "gpu-node-02"

P = ParamSpec("P")
T = TypeVar("T")


def _off_playwrights_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` in a thread of its own: Playwright's sync API keeps an event loop
    running in this one, where the kit's ``asyncio.run`` is refused."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def view_state(stack: LocalStack, node: str) -> RemediationView:
    return _off_playwrights_loop(kit.view_state, stack, node)


def result(stack: LocalStack, node: str, timeout: float) -> RemediationResult:
    return _off_playwrights_loop(kit.result, stack, node, timeout)


def _ports_for_the_printed_link() -> Ports:
    """Ephemeral ports with the UI where the CLI's link looks for a local dev server's
    (frontend port + 1000), so the tests open the very link `status NODE` prints."""
    for _ in range(50):
        temporal = free_port()
        ui = temporal + DEV_SERVER_UI_OFFSET
        if ui > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", ui))
            except OSError:
                continue
        ports = Ports.ephemeral()
        ports.temporal, ports.ui = temporal, ui
        return ports
    raise RuntimeError("no free port pair for the dev server and its UI")


@pytest.fixture(scope="module")
def stack(chromium: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Started only once the browser is known (a tier that is off starts nothing)."""
    st = make_stack(tmp_path_factory.mktemp("browser"), str(HERE / "browser.yaml"),
                    **{"detector.max_unavailable": 2,
                       "remediation.approval.required_for": ["reboot"]})
    st.headless = False  # the dev server serves its UI
    st.ports = _ports_for_the_printed_link()
    with st:
        yield st


@pytest.fixture(scope="module")
def k8s(stack: LocalStack) -> Cluster:
    return Cluster(stack)


@pytest.fixture(scope="module")
def awaiting(stack: LocalStack) -> list[str]:
    """An XID 79 on each node; both wait for an operator's approval."""
    gpu = GpuSimClient(stack.gpu_url)
    nodes = [BY_SIGNAL, BY_UPDATE]
    for node in nodes:
        gpu.inject_fault(node, "0", "xid", 79)
    for node in nodes:
        wait_for(stack, f"{node} awaiting approval",
                 lambda node=node: view_state(stack, node).state == "awaiting-approval",
                 timeout=60)
    return nodes


@pytest.fixture
def ui(page: Page, stack: LocalStack) -> TemporalUI:
    base = ui_base(stack.temporal_address, None)
    assert base == f"http://127.0.0.1:{stack.ports.ui}"
    return TemporalUI(page, base)


def back_in_service(k8s: Cluster, stack: LocalStack, node: str) -> None:
    res = result(stack, node, timeout=90)
    assert res.outcome == "healthy", res
    n = k8s.node(node)
    assert n.metadata.labels["gpu-remediate.io/state"] == "healthy"
    assert not n.spec.unschedulable and not k8s.has_our_taint(n)
    approved = k8s.events(node, "RemediationApproved")
    assert approved and "approved by alice" in approved[-1].message
    history = k8s.history(node)
    assert history[-1]["outcome"].startswith("healthy"), history


def test_find_by_gpu_node_and_read_the_approval_instructions(
        ui: TemporalUI, awaiting: list[str]) -> None:
    node = BY_SIGNAL
    assert ui.node_list(node) == [f"remediation-{node}"], "the GpuNode filter lists one node"
    ui.open_from_list(f"remediation-{node}")
    assert ui.status() == "Running"
    assert ui.summary().startswith(f"{node}: reboot: xid-79")
    details = ui.wait_current_details(r"waiting for an operator to approve reboot")
    assert details.startswith("awaiting-approval")
    assert f"gpu-remediate approve {node} -r REASON" in details
    assert "Send a Signal or Send an Update named approve or reject" in details
    assert '{"operator": "you", "reason": "why"}' in details

    # Each dialog lists the command under the documented name, with its payload.
    signals = ui.handler_options("Send a Signal", "Select a signal")
    approve = next(o for o in signals if o.startswith("approve "))
    assert 'Payload: {"operator": "you", "reason": "why (required)"}' in approve
    updates = ui.handler_options("Send an Update", "Select an Update")
    approve = next(o for o in updates if o.startswith("approve "))
    assert 'Payload: {"operator": "you", "reason": "why"}' in approve
    assert {o.split()[0] for o in updates} >= {"approve", "reject", "quarantine", "release",
                                              "repaired"}


def test_a_signal_without_a_reason_is_shown_as_refused(
        ui: TemporalUI, stack: LocalStack, k8s: Cluster, awaiting: list[str]) -> None:
    node = BY_SIGNAL
    ui.node_list(node)
    ui.open_from_list(f"remediation-{node}")
    ui.send_signal("approve", {"operator": "alice"})
    details = ui.wait_current_details(r"signal approve rejected: reason: required")
    assert details.startswith("awaiting-approval"), details
    view = view_state(stack, node)
    assert view.state == "awaiting-approval", "a refused approval changes nothing"
    # A payload the rules refuse names no operator the record could trust.
    assert [(c.name, c.operator) for c in view.rejected_commands] == [("approve", "")]
    assert view.rejected_commands[0].why.startswith("reason: required")
    event = wait_for(stack, "OperatorSignalRejected Event",
                     lambda: k8s.events(node, "OperatorSignalRejected") or None)
    assert "signal approve rejected: reason: required" in event[-1].message
    assert not k8s.events(node, "RemediationApproved")


def test_approve_by_signal_returns_the_node_healthy(
        ui: TemporalUI, stack: LocalStack, k8s: Cluster, awaiting: list[str]) -> None:
    node = BY_SIGNAL
    ui.node_list(node)
    ui.open_from_list(f"remediation-{node}")
    ui.send_signal("approve", PAYLOAD)
    back_in_service(k8s, stack, node)
    ui.page.reload()
    assert ui.status() == "Completed"


def test_approve_by_update_returns_the_node_healthy(
        ui: TemporalUI, stack: LocalStack, k8s: Cluster, awaiting: list[str]) -> None:
    node = BY_UPDATE
    assert ui.node_list(node) == [f"remediation-{node}"]
    ui.open_from_list(f"remediation-{node}")
    ui.wait_current_details(r"waiting for an operator to approve reboot")
    ui.send_update("approve", PAYLOAD)
    back_in_service(k8s, stack, node)
    ui.page.reload()
    assert ui.status() == "Completed"
    assert view_state(stack, node).rejected_commands == []

    # One step, one named row: the run's one patch marker first, then each activity with
    # what it did on the node (workflows/versions.py; steps/*.py summaries).
    rows = ui.timeline_rows()
    assert [r for r in rows if "core_patch" in r] == ["core_patch"], rows
    assert rows[0] == "core_patch", rows
    for row in ("claim_node • cordon and taint", "drain_node • evict pods on",
                "poll_node_job • reboot job on", "poll_node_job • validate job on",
                "release_node • healthy: release"):
        assert any(row in r and node in r for r in rows), (row, rows)
    unnamed = [r for r in rows[1:] if " • " not in r and r not in ("approval window", "approve")]
    assert not unnamed, unnamed
