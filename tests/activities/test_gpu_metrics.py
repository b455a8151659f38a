"""The admission report's GPU figures as metrics: GPUs out of service at the fleet and in
each fault domain the report names, the GPU budgets, the isolated GPUs."""

from __future__ import annotations

from activities.admission_report import report_admission
from tests.activities.conftest import metric
from workflows.messages import AdmissionReport, DomainUse, GpuUse

RACK = "node-restriction.kubernetes.io/rack"


def report(gpus: GpuUse | None, domains: list[DomainUse] | None = None) -> AdmissionReport:
    return AdmissionReport(budget=2, in_use=1, waiting=0, breaker_open=False, paused=False,
                           gpus=gpus, domains=domains or [])


def test_gpus_out_per_level_and_isolated_gpus_are_published_and_a_freed_domain_goes() -> None:
    report_admission(report(GpuUse(gpus=64, out_of_service=9, isolated=1, budget=12,
                                   pools={"p1": 9}, pool_budgets={"p1": 10}), [
        DomainUse(label=RACK, domain="r1", nodes=4, in_use=1, gpus=32, gpus_in_use=8,
                  gpu_budget=16),
        DomainUse(label=RACK, domain="r2", nodes=4, in_use=0, gpus=32, gpus_in_use=1),
        DomainUse(label=RACK, domain="", nodes=1, in_use=0, gpus=8, gpus_in_use=0)]))
    assert metric("gpu_remediate_gpus_out_of_service", level="fleet", domain="") == 9
    assert metric("gpu_remediate_gpu_budget", level="fleet", domain="") == 12
    assert metric("gpu_remediate_isolated_gpus") == 1
    assert metric("gpu_remediate_gpus_out_of_service", level="pool", domain="p1") == 9
    assert metric("gpu_remediate_gpu_budget", level="pool", domain="p1") == 10
    assert metric("gpu_remediate_gpus_out_of_service", level=RACK, domain="r1") == 8
    assert metric("gpu_remediate_gpu_budget", level=RACK, domain="r1") == 16
    assert metric("gpu_remediate_gpus_out_of_service", level=RACK, domain="r2") == 1
    assert metric("gpu_remediate_gpu_budget", level=RACK, domain="r2") is None  # none set
    assert metric("gpu_remediate_gpus_out_of_service", level=RACK, domain="unlabelled") == 0
    # r1 back in service, the isolated GPU released: their series go or read 0.
    report_admission(report(GpuUse(gpus=64, out_of_service=1, isolated=0), [
        DomainUse(label=RACK, domain="r2", nodes=4, in_use=0, gpus=32, gpus_in_use=1)]))
    assert metric("gpu_remediate_gpus_out_of_service", level=RACK, domain="r1") is None
    assert metric("gpu_remediate_gpus_out_of_service", level="pool", domain="p1") is None
    assert metric("gpu_remediate_gpu_budget", level=RACK, domain="r1") is None
    assert metric("gpu_remediate_gpu_budget", level="fleet", domain="") is None
    assert metric("gpu_remediate_gpus_out_of_service", level="fleet", domain="") == 1
    assert metric("gpu_remediate_isolated_gpus") == 0


def test_a_report_without_gpu_figures_leaves_the_gpu_metrics_alone() -> None:
    report_admission(report(GpuUse(gpus=16, out_of_service=3, isolated=3)))
    report_admission(report(None))  # a detector run from before GPU counts
    assert metric("gpu_remediate_gpus_out_of_service", level="fleet", domain="") == 3
    assert metric("gpu_remediate_isolated_gpus") == 3
