"""The repair ledger's store (activities/ledger.py) against the cluster simulator over real
HTTP: shards by month, relapses found at write, retried writes, rollover, entries that
cannot be read, retention, the metrics on a real prometheus_client registry, the
observation's notes for admission, and `report` over a month of entries."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from temporalio.testing import ActivityEnvironment
from typer.testing import CliRunner

from activities import ledger as ledger_module
from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.ledger import (
    LEDGER_SELECTOR,
    LedgerActivities,
    LedgerStore,
    month_of,
    months_between,
    shard_name,
)
from policy.models import Action, Finding, Verdict
from tests.activities.conftest import Cluster, metric
from workflows.ledger import LedgerEntry, LedgerGpu, LedgerInput, entry_id
from workflows.settings import LedgerSettings

NS = "default"
# A day ago: `report` on the command line reads up to the wall clock's now.
NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
SETTINGS = LedgerSettings()


def entry(node: str = "gpu-node-01", *, at: datetime, minutes: int = 30,
          action: str = "reboot", outcome: str = "healthy", fault: str = "xid-79",
          uid: str = "", serial: str = "S-1", uuid: str = "GPU-1") -> LedgerEntry:
    finished = at + timedelta(minutes=minutes)
    wid = f"remediation-{node}"
    return LedgerEntry(id=entry_id(wid, at, finished), node=node, node_uid=uid or f"uid-{node}",
                       gpus=[LedgerGpu(index="0", uuid=uuid, serial=serial)], gpu_count=8,
                       fault=fault, verdict_action=action, action=action, outcome=outcome,
                       started=at, finished=finished, workflow_id=wid)


def shards(cluster: Cluster) -> list[Any]:
    return list(cluster.core.list_namespaced_config_map(
        NS, label_selector=LEDGER_SELECTOR).items)


def test_months_between() -> None:
    assert months_between(datetime(2026, 11, 30, tzinfo=UTC),
                          datetime(2026, 12, 20, tzinfo=UTC)) == ["2026-11", "2026-12"]
    assert months_between(datetime(2025, 12, 1, tzinfo=UTC),
                          datetime(2026, 1, 1, tzinfo=UTC)) == ["2025-12", "2026-01"]


def test_an_entry_lands_in_its_months_shard_and_a_relapse_is_found(cluster: Cluster) -> None:
    store = LedgerStore(cluster.core, NS)
    first = entry(at=NOW.replace(day=1, hour=1), action="reset", fault="xid-48")
    stored, earlier, wrote = store.append(first, SETTINGS, NOW)
    assert wrote and earlier is None and stored.relapse_of == ""
    [cm] = shards(cluster)
    assert cm.metadata.name == shard_name(month_of(first.finished), 0)
    assert cm.metadata.labels["gpu-remediate.io/ledger-month"] == month_of(first.finished)
    assert json.loads(cm.data[f"{first.id}.json"])["action"] == "reset"
    again = entry(at=first.finished + timedelta(days=1))
    stored, earlier, wrote = store.append(again, SETTINGS, NOW)
    assert wrote and earlier is not None and earlier.id == first.id
    assert (stored.relapse_of, stored.relapse_by) == (first.id, "node")
    # A retried write finds its entry and writes nothing.
    _, _, wrote = store.append(again, SETTINGS, NOW)
    assert not wrote
    assert len(store.read().entries) == 2


def test_a_full_shard_rolls_over_and_an_unreadable_entry_is_skipped_and_kept(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "ENTRIES_PER_SHARD", 3)
    store = LedgerStore(cluster.core, NS)
    day = NOW.replace(day=1, hour=12)
    for i in range(3):
        store.append(entry(f"n{i}", at=day - timedelta(hours=i + 1)), SETTINGS, NOW)
    # Someone with write access to the namespace garbles one entry.
    month = month_of(day)
    name = shard_name(month, 0)
    cm = cluster.core.read_namespaced_config_map(name, NS)
    key = sorted(cm.data)[0]
    cm.data[key] = '{"id": 5, "node": ['
    cluster.core.replace_namespaced_config_map(name, NS, cm)
    before = metric("gpu_remediate_ledger_unreadable_total") or 0
    store.append(entry("n9", at=day - timedelta(minutes=40)), SETTINGS, NOW)
    read = store.read()
    assert [s.name for s in read.shards] == [name, shard_name(month, 1)]
    assert read.unreadable == 1 and len(read.entries) == 3
    assert metric("gpu_remediate_ledger_unreadable_total") == before + 1
    # Never overwritten: the garbled text is still there for an operator to look at.
    assert cluster.core.read_namespaced_config_map(name, NS).data[key] == '{"id": 5, "node": ['


def test_retention_deletes_whole_months_past_it(cluster: Cluster) -> None:
    store = LedgerStore(cluster.core, NS)
    now = datetime(2026, 12, 20, tzinfo=UTC)
    old = datetime(2025, 12, 10, tzinfo=UTC)
    store.append(entry("old", at=old), SETTINGS, old + timedelta(days=1))
    store.append(entry("new", at=now - timedelta(days=1)), SETTINGS, now)
    gone = store.prune(timedelta(days=400), now)
    assert gone == []
    gone = store.prune(timedelta(days=90), now)
    assert gone == [shard_name("2025-12", 0)]
    assert [e.node for e in store.read().entries] == ["new"]


def test_record_repair_exposes_the_repair_quality_metrics(cluster: Cluster) -> None:
    acts = LedgerActivities(cluster.api, SETTINGS, NS)
    env = ActivityEnvironment()
    labels = {"action": "reset", "outcome": "healthy"}
    count = metric("gpu_remediate_repair_duration_seconds_count", **labels) or 0
    relapses = metric("gpu_remediate_repair_relapses_total", action="reset",
                      fault="xid-48") or 0
    lost = metric("gpu_remediate_gpu_hours_lost_total") or 0
    first = entry("m1", at=datetime.now(UTC) - timedelta(hours=5), action="reset",
                  fault="xid-48", minutes=90)
    result = env.run(acts.record_repair, LedgerInput(entry=first))
    assert result.written and result.relapse_of == ""
    second = entry("m1", at=datetime.now(UTC) - timedelta(hours=2), action="reboot",
                   minutes=60)
    result = env.run(acts.record_repair, LedgerInput(entry=second))
    assert (result.relapse_of, result.relapse_by) == (first.id, "node")
    # A retried write counts nothing twice.
    assert not env.run(acts.record_repair, LedgerInput(entry=second)).written
    assert metric("gpu_remediate_repair_duration_seconds_count", **labels) == count + 1
    assert metric("gpu_remediate_repair_relapses_total", action="reset",
                  fault="xid-48") == relapses + 1
    assert metric("gpu_remediate_gpu_hours_lost_total") == pytest.approx(lost + 8 * 1.5 + 8)
    text = generate_latest().decode()
    assert 'gpu_remediate_repair_duration_seconds_bucket{action="reset",le="7200.0",' \
           'outcome="healthy"}' in text
    assert "# TYPE gpu_remediate_repair_relapses_total counter" in text


def test_a_write_the_api_refuses_is_counted_and_raised(cluster: Cluster) -> None:
    cluster.faults({"verb": "create", "resource": "configmaps", "status": 500})
    acts = LedgerActivities(cluster.api, SETTINGS, NS)
    before = metric("gpu_remediate_ledger_write_failures_total") or 0
    with pytest.raises(Exception, match="500"):
        ActivityEnvironment().run(acts.record_repair,
                                  LedgerInput(entry=entry(at=datetime.now(UTC))))
    assert metric("gpu_remediate_ledger_write_failures_total") == before + 1


def test_the_observation_reads_the_ledger_for_flagged_nodes(cluster: Cluster) -> None:
    store = LedgerStore(cluster.core, NS)
    now = datetime.now(UTC)
    store.append(entry("gpu-node-01", at=now - timedelta(hours=3), action="reset",
                       uid="u1"), SETTINGS, now)
    for i in range(2):
        store.append(entry(f"other-{i}", at=now - timedelta(days=i + 2), serial="S-L",
                           uuid=f"GPU-o{i}"), SETTINGS, now)
    fleet = FleetActivities(cluster.api, ExporterSettings(), record_namespace=NS)
    v = Verdict(node="gpu-node-01", action=Action.RESET, findings=[Finding(
        gpu="0", uuid="GPU-x", serial="S-L", signal="xid", value=48, rule="xid-48",
        action=Action.RESET)])
    notes, trouble = fleet.ledger_notes([v], {"gpu-node-01": "u1"}, timedelta(days=30), now)
    assert trouble == ""
    note = notes["gpu-node-01"]
    assert note.last_repair is not None and note.last_repair.action == "reset"
    assert [f.node for f in note.serial_faults["S-L"]] == ["other-1", "other-0"]
    # A ledger the API will not list: no escalation this tick, and said why.
    cluster.faults({"verb": "list", "resource": "configmaps", "status": 500})
    notes, trouble = fleet.ledger_notes([v], {}, timedelta(days=30), now)
    assert notes == {} and "probation and lemons not applied" in trouble


# ------------------------------------------------------------------ report over a month


def _month(store: LedgerStore) -> list[LedgerEntry]:
    """A month of a 200-node fleet: resets that relapse one time in four, reboots, a few
    quarantines, and one GPU that keeps failing wherever it goes."""
    rng = random.Random(7)
    start = NOW - timedelta(days=30)
    out: list[LedgerEntry] = []
    for i in range(120):
        at = start + timedelta(hours=6 * i + rng.randint(0, 3))
        node = f"gpu-node-{rng.randint(1, 200):03d}"
        kind = rng.random()
        action, fault, minutes, outcome = (
            ("reset", "xid-48", rng.randint(15, 40), "healthy") if kind < 0.5 else
            ("reboot", "xid-79", rng.randint(30, 90), "healthy") if kind < 0.9 else
            ("quarantine", "xid-95", rng.randint(5, 20), "quarantined"))
        out.append(entry(node, at=at, action=action, fault=fault, minutes=minutes,
                         outcome=outcome, serial=f"S-{node}", uuid=f"GPU-{node}"))
        if action == "reset" and i % 4 == 0:   # flagged again the next day
            out.append(entry(node, at=at + timedelta(days=1), action="reboot",
                             fault="xid-48", minutes=45, serial=f"S-{node}",
                             uuid=f"GPU-{node}"))
    for k in range(4):   # the lemon: one serial in four different nodes
        out.append(entry(f"lemon-host-{k}", at=start + timedelta(days=2 + 6 * k, hours=1),
                         action="reset", fault="xid-48", serial="S-LEMON",
                         uuid=f"GPU-lemon-{k}"))
    for e in sorted(out, key=lambda e: e.finished):
        store.append(e, SETTINGS, e.finished + timedelta(minutes=1))
    return out


def test_report_over_a_simulated_month(cluster: Cluster, tmp_path: Path) -> None:
    from worker.cli.report import make_report
    from worker.config import load_settings

    store = LedgerStore(cluster.core, NS)
    written = _month(store)
    assert len(store.read().shards) >= 2      # more than one shard a month: one List reads all
    config = tmp_path / "config.yaml"
    config.write_text(f"kubernetes:\n  kubeconfig: {cluster.kubeconfig}\n"
                      f"  record_namespace: {NS}\n")
    settings = load_settings(config)
    r = make_report(settings, timedelta(days=31), now=NOW + timedelta(days=1), gpus=1600,
                    core=cluster.core)
    assert r.entries == len(written)
    per = {a.action: a for a in r.actions}
    assert per["reset"].relapses > 0 and 0 < (per["reset"].relapse_rate or 0) < 1
    assert per["quarantine"].mttr_seconds is None
    assert per["reboot"].mttr_seconds is not None
    lemon = [x for x in r.lemons if x.kind == "gpu" and x.key == "S-LEMON"]
    assert lemon and lemon[0].faults == 4 and len(lemon[0].nodes) == 4
    assert r.gpu_hours_lost > 0 and 0 < (r.availability_lost or 0) < 0.01

    from worker.cli.commands import app

    runner = CliRunner()
    as_json = runner.invoke(app, ["report", "-c", str(config), "--since", "31d",
                                  "--fleet-gpus", "1600", "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert {a["action"] for a in data["actions"]} == {"reset", "reboot", "quarantine"}
    assert any(x["key"] == "S-LEMON" for x in data["lemons"])
    table = runner.invoke(app, ["report", "-c", str(config), "--fleet-gpus", "1600"])
    assert table.exit_code == 0, table.output
    assert "per action and fault" in table.output and "S-LEMON" in table.output
    assert "GPU-hours lost" in table.output
    bad = runner.invoke(app, ["report", "-c", str(config), "--since", "a month"])
    assert bad.exit_code == 2 and "--since" in bad.output


def test_a_shard_rolls_over_before_the_api_servers_size_limit(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """By bytes as well as by count: the cluster simulator refuses more than 1 MiB, as the
    API server does, and a write never comes near it."""
    monkeypatch.setattr(ledger_module, "MAX_SHARD_BYTES", 4096 + 2000)
    store = LedgerStore(cluster.core, NS)
    day = NOW.replace(day=1, hour=12)
    for i in range(6):
        e = entry(f"n{i}", at=day - timedelta(minutes=i + 1))
        store.append(e.model_copy(update={"why": "x" * 300}), SETTINGS, NOW)
    read = store.read()
    assert len(read.entries) == 6 and len(read.shards) >= 3
    assert all(sum(len(k) + len(v) for k, v in s.raw.items()) <= 2000 for s in read.shards)
