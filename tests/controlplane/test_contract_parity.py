"""The contract suite (tests/sim/test_cluster_*.py) against the simulator and against a
real kube-apiserver with its controllers, compared test by test.

Each side runs in its own pytest process (the suite decides at import time which
side it is on, from GPU_REMEDIATE_CONTRACT_KUBECONFIG). The comparison is written to
``contract-parity.md`` in the test's temporary directory and printed; any difference
not listed in KNOWN_DIFFERENCES (and in docs/controlplane.md) fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.controlplane.controlplane import ControlPlane

pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]
SUITE = ["tests/sim/test_cluster_api.py", "tests/sim/test_cluster_eviction.py",
         "tests/sim/test_cluster_tables.py", "tests/sim/test_cluster_authn.py",
         "tests/sim/test_cluster_runtimeclasses.py"]

# test id -> (simulator outcome, real outcome, why). Keep docs/controlplane.md in step.
KNOWN_DIFFERENCES: dict[str, tuple[str, str, str]] = {
    # Skipped against a real cluster by the suite itself.
    "test_cluster_api.py::test_apply_patch_is_rejected_with_415": (
        "passed", "skipped", "server-side apply exists on a real API server (by design)"),
    "test_cluster_api.py::test_unknown_path_returns_404_status": (
        "passed", "skipped", "simulator-only test (by design)"),
    "test_cluster_runtimeclasses.py::"
    "test_the_simulated_gpu_operator_installs_runtime_class_nvidia": (
        "passed", "skipped", "simulator-only test (by design): the GPU Operator's install"),
    "test_cluster_authn.py::test_an_expired_token_is_not_authenticated": (
        "passed", "skipped", "simulator-only test (by design): it moves the simulator's clock"),
    "test_cluster_eviction.py::test_pdb_percent_min_available_rounds_up": (
        "passed", "skipped", "suite marks it simulator-only: its ReplicaSet pods need kubelets"),
    "test_cluster_eviction.py::test_pdb_max_unavailable_uses_controller_scale": (
        "passed", "skipped", "suite marks it simulator-only: its ReplicaSet pods need kubelets"),
    # Found by this tier: the simulator is more lenient or worded differently.
    "test_cluster_api.py::test_invalid_taint_effect_returns_422": (
        "passed", "failed", "kube-apiserver reports the field as metadata.taints[0].effect "
        "(twice), not spec.taints[0].effect"),
    "test_cluster_eviction.py::test_eviction_with_two_pdbs_returns_500": (
        "passed", "failed", "kube-apiserver's 500 has no reason and no 'Internal error "
        "occurred:' prefix"),
    "test_cluster_api.py::test_core_events_create_list_and_patch": (
        "passed", "failed", "an Event about a cluster-scoped object (Node) must live in "
        "'default': 422 involvedObject.namespace does not match event.namespace"),
    "test_cluster_api.py::test_events_k8s_io_create_and_list": (
        "passed", "failed", "the Python client re-serialises eventTime "
        "'...00.000000Z' as '...00+00:00', which kube-apiserver rejects (400)"),
}


def run_suite(out: Path, kubeconfig: Path | None,
              suite: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """Run the contract suite; test id -> (outcome, message)."""
    env = {k: v for k, v in os.environ.items() if k != "GPU_REMEDIATE_CONTRACT_KUBECONFIG"}
    if kubeconfig is not None:
        env["GPU_REMEDIATE_CONTRACT_KUBECONFIG"] = str(kubeconfig)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-o", "junit_family=xunit1", f"--junitxml={out}", *(suite or SUITE)],
                   cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    results: dict[str, tuple[str, str]] = {}
    for case in ET.parse(out).getroot().iter("testcase"):
        test_id = f"{Path(case.get('file') or case.get('classname', '')).name}::{case.get('name')}"
        if "/" not in (case.get("file") or "") and case.get("classname"):
            test_id = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (node.get("message") or "").strip().splitlines()[0][:300] \
                    if node.get("message") else ""
                break
        results[test_id] = (outcome, message)
    return results


def test_contract_suite_on_simulator_and_real_api_server(
        controlplane: ControlPlane, tmp_path: Path) -> None:
    sim = run_suite(tmp_path / "sim.xml", None)
    real = run_suite(tmp_path / "real.xml", controlplane.kubeconfig)
    assert sim and real, "the contract suite produced no results"
    rows, unexpected = [], []
    for test_id in sorted(set(sim) | set(real)):
        s, r = sim.get(test_id, ("missing", "")), real.get(test_id, ("missing", ""))
        if s[0] == r[0]:
            continue
        known = KNOWN_DIFFERENCES.get(test_id)
        why = known[2] if known and known[:2] == (s[0], r[0]) else "NOT DOCUMENTED"
        if why == "NOT DOCUMENTED":
            unexpected.append(test_id)
        rows.append(f"| {test_id} | {s[0]} | {r[0]}: {r[1]} | {why} |")
    table = "\n".join(["| test | simulator | real API server | why |", "|---|---|---|---|",
                       *rows])
    report = (f"# Contract suite: simulator vs kube-apiserver {controlplane.info['version']}\n\n"
              f"{len(sim)} tests; {len(rows)} differ.\n\n{table}\n")
    (tmp_path / "contract-parity.md").write_text(report)
    print(report)
    assert not unexpected, f"undocumented differences (see {tmp_path}):\n{table}"
    stale = [t for t, (s_out, r_out, _) in KNOWN_DIFFERENCES.items()
             if (sim.get(t, ("missing",))[0], real.get(t, ("missing",))[0]) != (s_out, r_out)]
    assert not stale, f"known differences that no longer show (update this list and "\
        f"docs/controlplane.md): {stale}"
