"""The operator's commands in a shell: every action needs a reason (exit 2, one line, before
anything is sent), refused values are never echoed raw, output fits a pipe, errors lead
somewhere, and `plan` and the others find the stack `up` runs in this directory."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from policy.models import Action
from worker.cli import commands as cli
from worker.cli import operator as ops
from worker.cli.locate import STACK_STATE, locate
from worker.cli.output import EXIT_CODES, plain_table, shown
from workflows.ids import MAX_REASON_CHARS
from workflows.messages import OperatorAck, RemediationView
from workflows.transitions import NodeState, Step

runner = CliRunner()

ACTIONS: list[list[str]] = [
    ["approve", "gpu-node-02"], ["reject", "gpu-node-02"], ["quarantine", "gpu-node-02"],
    ["release", "gpu-node-02"], ["repaired", "gpu-node-02"], ["abort", "gpu-node-02"],
    ["remediate", "gpu-node-02", "--action", "reboot"], ["release-orphan", "gpu-node-02"],
    ["detector", "pause"], ["detector", "resume"],
    ["incident", "resolve", "nvl72-rack-07"], ["incident", "release", "nvl72-rack-07"],
]
ESC = "\x1b"


@pytest.fixture
def nothing_sent(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Temporal is never reached: a refused command must fail before anything is sent."""
    sent: list[object] = []

    def refuse(config: Any, work: Any, hint: Any = None) -> Any:
        sent.append(work)
        raise AssertionError("the command reached Temporal")

    monkeypatch.setattr(cli, "with_client", refuse)
    monkeypatch.setattr(cli, "_require_node", lambda config, node: None)
    return sent


def invoke(*args: str) -> Any:
    return runner.invoke(cli.app, list(args))


@pytest.mark.parametrize("command", ACTIONS, ids=lambda c: " ".join(c[:2]))
def test_every_action_refuses_to_run_without_a_reason(
        command: list[str], nothing_sent: list[object]) -> None:
    result = invoke(*command)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--reason/-r is required" in lines[0], lines
    assert nothing_sent == []


@pytest.mark.parametrize(("reason", "says"), [
    ("", "reason: required"),
    ("   \t ", "reason: required"),
    ("x" * 10_000, f"at most {MAX_REASON_CHARS}"),
    (f"ok{ESC}[2J{ESC}]0;pwned\a", "control character or terminal escape (U+001B"),
    ("two\nlines", "U+000A"),
    ("bidi \u202e override", "U+202E"),
], ids=["empty", "spaces", "10KB", "escape", "newline", "bidi"])
def test_a_bad_reason_is_refused_with_a_clear_line_and_never_echoed(
        reason: str, says: str, nothing_sent: list[object]) -> None:
    result = invoke("approve", "gpu-node-02", "-r", reason)
    assert result.exit_code == 2
    assert says in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert ESC not in result.output and "pwned" not in result.output
    assert "x" * 100 not in result.output and "\u202e" not in result.output


@pytest.mark.parametrize("operator", ["detector", " Detector ", "policy", f"eve{ESC}[31m", ""])
def test_internal_names_and_unprintable_operators_are_refused(
        operator: str, nothing_sent: list[object]) -> None:
    result = invoke("quarantine", "gpu-node-02", "-r", "RMA 4411", "--operator", operator)
    assert result.exit_code == 2, result.output
    assert "operator:" in result.output and ESC not in result.output


@pytest.mark.parametrize("node", [f"gpu-node-02{ESC}[2K", "GPU_NODE", "a" * 300, "x-"])
def test_a_node_name_that_cannot_exist_is_refused_unechoed(
        node: str, nothing_sent: list[object]) -> None:
    result = invoke("approve", node, "-r", "checked")
    assert result.exit_code == 2
    assert "node:" in result.output and ESC not in result.output
    assert "a" * 100 not in result.output


def test_the_operator_defaults_to_user_at_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_REMEDIATE_OPERATOR", raising=False)
    who = ops.operator_identity(None)
    assert "@" in who and who.split("@")[1]
    monkeypatch.setenv("GPU_REMEDIATE_OPERATOR", "sre-oncall")
    assert ops.operator_identity(None) == "sre-oncall"
    assert ops.operator_identity("alice") == "alice"


def test_a_good_command_is_sent_with_who_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def update(client: Any, node: str, verb: str, cmd: Any) -> OperatorAck:
        seen.append((node, verb, cmd))
        return OperatorAck(state=NodeState.DRAINING, message="approved by alice")

    monkeypatch.setattr(ops, "remediation_update", update)
    monkeypatch.setattr(cli, "with_client",
                        lambda config, work, hint=None, needs="write": asyncio.run(work(None)))
    result = invoke("approve", "gpu-node-02", "-r", "no jobs on it", "--operator", "alice",
                    "-o", "json")
    assert result.exit_code == 0, result.output
    assert seen[0][0:2] == ("gpu-node-02", "approve")
    assert (seen[0][2].operator, seen[0][2].reason) == ("alice", "no jobs on it")
    assert json.loads(result.output) == {"node": "gpu-node-02", "accepted": True,
                                         "state": "draining", "message": "approved by alice"}


# ---------------------------------------------------------------- output that fits a shell


def view(node: str, state: NodeState = NodeState.QUARANTINED, **kw: Any) -> RemediationView:
    return RemediationView.model_validate({
        "node": node, "state": state, "step": Step.QUARANTINED, "action": Action.REBOOT,
        "reason": "XID 79 on GPU 3: uncorrectable ECC, row remapping failed " * 3,
        "dry_run": False, **kw})


LONG = "gpu-node-" + "very-long-pool-name-" * 5 + "07"


def test_a_piped_status_never_cuts_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    views = [view(LONG), view("gpu-node-08", NodeState.DRAINING)]
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write":
                        [] if work is cli._open_incidents else views)
    result = invoke("status")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "ACTION", "STEP", "SINCE", "ATTEMPT",
                                "PODS_LEFT", "BLOCKED_BY", "REASON"]
    assert LONG in lines[1] and views[0].reason.strip() in lines[1]
    assert lines[1].split()[:2] == [LONG, "quarantined"]
    assert "…" not in result.output


def test_status_of_a_quarantined_node_exits_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "with_client",
                        lambda config, work, hint=None, needs="write": view("gpu-node-07"))
    monkeypatch.setattr(cli, "_print_ui_link", lambda config, node: None)
    assert invoke("status", "gpu-node-07").exit_code == 0
    result = invoke("status", "gpu-node-07", "-o", "json")
    assert result.exit_code == 0 and json.loads(result.output)["state"] == "quarantined"


def test_status_of_a_node_with_an_isolated_gpu_names_rule_owner_and_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    iso = {"rule": "gpu-remediate.gpu-3.gpu-node-07", "api_version": "v1", "device": "gpu-3",
           "gpu": "3", "uuid": "GPU-5d1a3c2e-8d0b-4c1e-9a57-6b1f3c2d9e41",
           "effect": "NoExecute", "owner": "remediation-gpu-node-07",
           "reason": "XID 48 on GPU 3"}
    isolated = view("gpu-node-07", NodeState.HEALTHY, step="gpu-quarantined",
                    gpu_isolation=iso)
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="read": isolated)
    monkeypatch.setattr(cli, "_print_ui_link", lambda config, node: None)
    result = invoke("status", "gpu-node-07")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for part in ("DeviceTaintRule gpu-remediate.gpu-3.gpu-node-07", "device gpu-3",
                 "NoExecute", "owner remediation-gpu-node-07", "XID 48 on GPU 3",
                 "release gpu-node-07 -r REASON"):
        assert part in text, part
    assert json.loads(invoke("status", "gpu-node-07", "-o", "json").output)[
        "gpu_isolation"]["rule"] == iso["rule"]


def test_plain_tables_keep_columns_countable_and_escape_control_characters() -> None:
    text = plain_table(("node", "why"), [("n1", ""), ("n2", f"bad{ESC}[2Jthing")])
    rows = [line.split() for line in text.splitlines()]
    assert rows == [["NODE", "WHY"], ["n1", "-"], ["n2", "bad\\x1b[2Jthing"]]
    assert shown("a\u202eb\nc") == "a\\u202eb\\x0ac"


def test_watch_to_a_pipe_writes_a_timestamped_snapshot_whenever_something_changed() -> None:
    answers = [[view("gpu-node-07", NodeState.DRAINING)]] * 2 + [[view("gpu-node-07")]] * 2 + [[]]
    polls = iter(answers)
    written: list[str] = []
    clock = iter(datetime(2026, 12, 6, 3, 0, s, tzinfo=UTC) for s in range(10))

    async def fetch() -> list[Any]:
        return next(polls)

    asyncio.run(cli.watch_changes(fetch, written.append, "table", every=0,
                                  now=lambda: next(clock), rounds=len(answers)))
    assert len(written) == 3, written
    assert written[0].startswith("# 2026-12-06T03:00:00Z (1 in flight)\nNODE")
    assert "draining" in written[0] and "quarantined" in written[1]
    assert written[2].startswith("# 2026-12-06T03:00:02Z (0 in flight)")
    json_lines: list[str] = []
    polls = iter(answers)
    asyncio.run(cli.watch_changes(fetch, json_lines.append, "json", every=0,
                                  rounds=len(answers)))
    assert [json.loads(line)["remediations"][0]["state"] if json.loads(line)["remediations"]
            else None for line in json_lines] == ["draining", "quarantined", None]


def test_the_exit_codes_are_one_table_in_the_help_and_the_docs() -> None:
    result = invoke("--help")
    assert [code for code, _ in EXIT_CODES] == [0, 1, 2]
    for _, meaning in EXIT_CODES:
        assert meaning.split(":")[0] in " ".join(result.output.split())
    ops_doc = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
    for code, meaning in EXIT_CODES:
        assert f"| {code} | {meaning} |" in ops_doc


# ---------------------------------------------------------------- errors that lead somewhere


def test_an_unreachable_temporal_is_one_line_naming_the_address_and_what_sets_it(
        tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("temporal: {address: '127.0.0.1:1'}\n")
    result = invoke("status", "-c", str(config))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert "cannot reach Temporal at 127.0.0.1:1 (connection refused)" in lines[0]
    assert "temporal.address" in lines[0] and "GPU_REMEDIATE_TEMPORAL__ADDRESS" in lines[0]
    assert "tonic" not in result.output and "Traceback" not in result.output
    verbose = invoke("-v", "status", "-c", str(config))
    assert verbose.exit_code == 1 and "tonic" in verbose.output


def test_an_unknown_node_lists_close_matches() -> None:
    names = [f"gpu-node-{i:02d}" for i in range(1, 13)] + ["cpu-node-01"]
    said = cli.no_such_node("gpu-node-1", names)
    assert said.startswith("no node named gpu-node-1 in the cluster; close matches: ")
    assert "gpu-node-10" in said and "cpu-node-01" not in said
    assert "kubectl get nodes" in cli.no_such_node("zzz", names)


def test_a_node_the_cluster_lacks_gets_no_next_steps_for_it() -> None:
    """`status gpu-node-2`: suggesting `remediate gpu-node-2` would lead nowhere."""
    names = ["gpu-node-01", "gpu-node-02"]
    message = f"{ops.NO_REMEDIATION} gpu-node-2; {ops.NONE_KNOWN}\nnext: `gpu-remediate status ...`"
    said = cli.node_hint("gpu-node-2", message, names)
    assert said == cli.no_such_node("gpu-node-2", names) and "\n" not in said
    assert cli.node_hint("gpu-node-02", message, names) == message
    assert cli.node_hint("gpu-node-2", message, None) == message  # the cluster not asked


# ---------------------------------------------------------------- the stack `up` runs here


def write_state(where: Path, pid: int) -> Path:
    config = where / ".gpu-remediate" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("temporal: {address: '127.0.0.1:1'}\n")
    (where / STACK_STATE).write_text(json.dumps({"pid": pid, "config": str(config)}))
    return config


def test_commands_run_beside_up_find_its_stack(tmp_path: Path) -> None:
    config = write_state(tmp_path, os.getpid())
    found = locate(None, cwd=tmp_path)
    assert found.config == config and "gpu-remediate up" in found.source
    mine = tmp_path / "mine.yaml"
    assert locate(mine, cwd=tmp_path).config == mine  # --config wins


def test_a_state_file_left_by_a_stack_that_ended_is_ignored(tmp_path: Path) -> None:
    gone = _dead_pid()
    write_state(tmp_path, gone)
    found = locate(None, cwd=tmp_path)
    assert found.config is None and "defaults" in found.source


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_beside_up_uses_its_temporal_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_state(tmp_path, os.getpid())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPU_REMEDIATE_CONFIG", raising=False)
    result = invoke("status")
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output and "the stack `gpu-remediate up` runs here" in \
        result.output




def test_an_unreachable_kubernetes_api_names_its_server_and_what_sets_it(
        tmp_path: Path) -> None:
    from worker.cli.locate import Located, kubernetes_unreachable
    from worker.config import load_settings

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {}}]\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"kubernetes: {{kubeconfig: {kubeconfig}, in_cluster: false}}\n")
    said = kubernetes_unreachable(load_settings(config), Located(config, "config.yaml"),
                                  "MaxRetryError(... [Errno 111] Connection refused)")
    assert said.startswith("cannot reach the Kubernetes API at https://10.0.0.1:6443 "
                           f"(connection refused; kubeconfig {kubeconfig})")
    assert "kubernetes.kubeconfig" in said and "KUBECONFIG" in said
    assert "\n" not in said and "MaxRetryError" not in said


def test_a_config_beside_up_that_names_no_temporal_talks_to_the_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan -c other.yaml` to compare detector settings, beside `up`: the file says
    nothing of Temporal or the cluster, so the stack's are used, and the error says so."""
    write_state(tmp_path, os.getpid())
    other = tmp_path / "other.yaml"
    other.write_text("detector: {max_unavailable: 1}\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("status", "-c", str(other))
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output
    assert "temporal, kubernetes, exporter from the stack" in result.output


# ---------------------------------------------------------------- domain incidents


def _incident(**kw: Any) -> Any:
    from workflows.incidents import DomainIncident

    return DomainIncident.model_validate({
        "label": "nvidia.com/gpu.clique", "domain": "nvl72-rack-07",
        "opened_at": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
        "nodes": ["gpu-node-01", "gpu-node-02"],
        "reason": "4 nodes of nvidia.com/gpu.clique=nvl72-rack-07 flagged within 0:05:00",
        **kw})


def test_status_shows_open_incidents_under_the_remediations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write":
                        [_incident()] if work is cli._open_incidents else [])
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert ("domain incident nvidia.com/gpu.clique=nvl72-rack-07 since 2026-12-01 08:00:00 "
            "(open: cordoned, not drained): nodes gpu-node-01, gpu-node-02") in result.output


def test_status_as_json_carries_the_remediations_and_the_open_incidents(
        monkeypatch: pytest.MonkeyPatch) -> None:
    views = [view("gpu-node-08", NodeState.DRAINING)]
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write":
                        [_incident()] if work is cli._open_incidents else views)
    result = invoke("status", "-o", "json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert [v["node"] for v in found["remediations"]] == ["gpu-node-08"]
    assert found["incidents"] == [{
        "domain": "nvidia.com/gpu.clique=nvl72-rack-07", "label": "nvidia.com/gpu.clique",
        "value": "nvl72-rack-07", "nodes": ["gpu-node-01", "gpu-node-02"],
        "opened": "2026-12-01T08:00:00+00:00", "state": "open: cordoned, not drained",
        "reason": "4 nodes of nvidia.com/gpu.clique=nvl72-rack-07 flagged within 0:05:00"}]
    # No detector answering: no incidents, the same shape.
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write":
                        [] if work is cli._open_incidents else views)
    assert json.loads(invoke("status", "-o", "json").output)["incidents"] == []


def test_a_gpu_scoped_lease_shows_in_detector_status_and_status_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from workflows.leases import Lease
    from workflows.messages import DetectorView

    at = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    dv = DetectorView(paused=False, breaker_open=False, breaker_reason="", budget=1,
                      in_flight=["gpu-node-02"], waiting=[], last_tick=None, last_errors=[],
                      ticks_total=1, started_total=2, leases=[
                          Lease(node="gpu-node-07", token="t", granted_at=at,
                                workflow_id="remediation-gpu-node-07", scope="gpu", gpus=1,
                                slot=False),
                          Lease(node="gpu-node-02", token="u", granted_at=at,
                                workflow_id="remediation-gpu-node-02", gpus=8)])
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write": dv)
    text = " ".join(invoke("detector", "status").output.split())
    assert "1/1 in use" in text
    assert "gpu-node-07: 1 GPU, no node slot" in text and "gpu-node-02: 8 GPU" not in text
    held = view("gpu-node-07", NodeState.HEALTHY, step="waiting-for-a-drain-slot",
                lease_scope="gpu")
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="read": held)
    monkeypatch.setattr(cli, "_print_ui_link", lambda config, node: None)
    text = " ".join(invoke("status", "gpu-node-07").output.split())
    assert "lease: one GPU, no node slot" in text


def test_detector_status_shows_gpus_out_of_service_against_the_gpu_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from workflows.messages import DetectorView, DomainUse, GpuUse

    dv = DetectorView(paused=False, breaker_open=False, breaker_reason="", budget=1,
                      in_flight=["gpu-node-02"], waiting=[], last_tick=None, last_errors=[],
                      ticks_total=1, started_total=2,
                      gpus=GpuUse(gpus=64, out_of_service=9, isolated=1, budget=12,
                                  pools={"p1": 9}, pool_budgets={"p1": 16}),
                      domains=[DomainUse(label="rack", domain="r1", nodes=4, in_use=1,
                                         gpus=32, gpus_in_use=9, gpu_budget=16)])
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write": dv)
    text = " ".join(invoke("detector", "status").output.split())
    assert "GPUs 9/12 out of service (1 isolated GPUs, node in service) of 64; pool p1 " \
           "9/16" in text
    assert "rack=r1: 1/- nodes of 4, 9/16 GPUs" in text
    shown_json = json.loads(invoke("detector", "status", "-o", "json").output)
    assert shown_json["gpus"] == {"gpus": 64, "out_of_service": 9, "isolated": 1,
                                  "budget": 12, "pools": {"p1": 9},
                                  "pool_budgets": {"p1": 16}}
    # A detector from before the count (no `gpus` in its view): no GPU line.
    dv.gpus = None
    assert "out of service" not in invoke("detector", "status").output


def test_incident_list_as_json_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from workflows.messages import DetectorView

    closed = _incident(domain="nvl72-rack-02", closed_at=datetime(2026, 12, 1, 9, tzinfo=UTC),
                       closed_by="resolved by alice: tray replaced")
    dv = DetectorView(paused=False, breaker_open=False, breaker_reason="", budget=2,
                      in_flight=[], waiting=[], last_tick=None, last_errors=[],
                      ticks_total=1, started_total=0, incidents=[_incident(), closed])
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write": dv)
    result = invoke("incident", "list", "-o", "json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert [i["domain"] for i in found] == ["nvl72-rack-07", "nvl72-rack-02"]
    assert found[1]["closed_by"] == "resolved by alice: tray replaced"
    result = invoke("incident", "list")
    lines = result.output.splitlines()
    assert lines[0].split() == ["DOMAIN", "OPENED", "NODES", "STATE", "REASON"]
    assert "closed: resolved by alice" in lines[2]


def test_incident_resolve_sends_the_domain_who_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, Any]] = []

    async def update(client: Any, verb: str, arg: Any) -> OperatorAck:
        seen.append((verb, arg))
        return OperatorAck(state=NodeState.HEALTHY, message="incident resolved by alice")

    monkeypatch.setattr(ops, "detector_update", update)
    monkeypatch.setattr(cli, "with_client",
                        lambda config, work, hint=None, needs="write": asyncio.run(work(None)))
    result = invoke("incident", "resolve", "nvidia.com/gpu.clique=nvl72-rack-07", "-r",
                    "switch tray replaced", "--operator", "alice")
    assert result.exit_code == 0, result.output
    verb, cmd = seen[0]
    assert verb == "resolve_incident"
    assert (cmd.domain, cmd.operator, cmd.reason) == (
        "nvidia.com/gpu.clique=nvl72-rack-07", "alice", "switch tray replaced")


def test_a_domain_that_is_no_label_value_is_refused_before_sending(
        nothing_sent: list[object]) -> None:
    result = invoke("incident", "release", "rack 7\x1b[2J", "-r", "why")
    assert result.exit_code == 2 and "not a domain" in result.output
    assert ESC not in result.output and nothing_sent == []
