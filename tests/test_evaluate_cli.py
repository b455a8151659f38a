"""The offline ``evaluate`` command: JSON contract, exit codes, and every kind of source."""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import pytest

from policy.config import PolicySettings
from policy.models import Action
from worker.probe.evaluate import ConfigError, evaluate_sources, load_policy_config, run_evaluate

LABELS = (
    'gpu="{g}",UUID="GPU-{host}-{g}",pci_bus_id="00000000:18:00.0",device="nvidia{g}",'
    'modelName="NVIDIA H100 80GB HBM3",{key}="{host}",DCGM_FI_DRIVER_VERSION="570.124.06"'
)


def exposition(host: str, *, xid: int = 0, temp: int = 40, key: str = "Hostname") -> str:
    rows = []
    for g in range(2):
        labels = LABELS.format(g=g, host=host, key=key)
        rows.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid if g == 1 else 0}")
        rows.append(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {temp}")
        rows.append(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{labels}}} 0")
        rows.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 100.000000")
    return "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n" + "\n".join(rows) + "\n"


def run_json(
    capsys: pytest.CaptureFixture[str],
    sources: list[str],
    node: str | None,
    config: Path | None,
    output: Literal["json", "table"],
) -> tuple[int, dict[str, Any]]:
    code = run_evaluate(sources, node, config, output)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out  # exactly one JSON object
    return code, json.loads(lines[0])


@pytest.fixture
def sick_file(tmp_path: Path) -> Path:
    path = tmp_path / "sick.prom"
    path.write_text(exposition("gpu-07", xid=79))
    return path


@pytest.fixture
def healthy_file(tmp_path: Path) -> Path:
    path = tmp_path / "healthy.prom"
    path.write_text(exposition("gpu-08", key="hostname"))
    return path


def test_json_contract_exact_shape(capsys: pytest.CaptureFixture[str], sick_file: Path) -> None:
    code, doc = run_json(capsys, [str(sick_file)], None, None, "json")
    assert code == 0
    assert doc == {
        "nodes": [
            {
                "node": "gpu-07",
                "action": "reboot",
                "findings": [
                    {
                        "gpu": "1",
                        "uuid": "GPU-gpu-07-1",
                        "serial": "",
                        "signal": "DCGM_FI_DEV_XID_ERRORS",
                        "value": 79.0,
                        "rule": "xid-79-restart-bm",
                        "action": "reboot",
                        "detail": "",
                    }
                ],
            }
        ],
        "errors": [],
        "warnings": [],
        "blind": [
            {"node": "gpu-07", "signal": signal, "missing": missing}
            for signal, missing in [
                ("ecc-dbe", ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]),
                ("row-remap-pending", ["DCGM_FI_DEV_ROW_REMAP_PENDING"]),
                ("uncorrectable-remap-limit", ["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]),
                ("clock-reasons", ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]),
                ("recovery-action", ["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"]),
                ("repeat-xid", ["DCGM_EXP_XID_ERRORS_COUNT"]),
                # The link rules are off by default (policy.links), so not blind.
            ]
        ],
    }


def test_many_sources_and_nodes(
    capsys: pytest.CaptureFixture[str], sick_file: Path, healthy_file: Path
) -> None:
    code, doc = run_json(capsys, [str(sick_file), str(healthy_file)], None, None, "json")
    assert code == 0
    assert [(n["node"], n["action"]) for n in doc["nodes"]] == [
        ("gpu-07", "reboot"),
        ("gpu-08", "none"),
    ]
    assert doc["nodes"][1]["findings"] == []


def test_one_source_many_nodes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "federated.prom"
    path.write_text(exposition("a", temp=90) + exposition("b", xid=48) + exposition("c"))
    code, doc = run_json(capsys, [str(path)], None, None, "json")
    assert code == 0
    assert {n["node"]: n["action"] for n in doc["nodes"]} == {
        "a": "thermal",
        "b": "reset",
        "c": "none",
    }


def test_unreadable_file_is_an_error_exit_1(
    capsys: pytest.CaptureFixture[str], sick_file: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.prom"
    code, doc = run_json(capsys, [str(missing), str(sick_file)], None, None, "json")
    assert code == 1
    assert [n["node"] for n in doc["nodes"]] == ["gpu-07"]
    (error,) = doc["errors"]
    assert set(error) == {"source", "message"}
    assert error["source"] == str(missing)
    assert "cannot read file" in error["message"]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ("<html><body>502</body></html>", "HTML"),
        ("", "no DCGM health samples"),
        ('DCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="n"} 1\n', "no DCGM health samples"),
        (exposition("x", xid=79) + 'DCGM_FI_DEV_XID_ERRORS{gpu="1"\n', "did not parse"),
    ],
)
def test_bad_payload_yields_no_node(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, payload: str, fragment: str
) -> None:
    path = tmp_path / "bad.prom"
    path.write_text(payload)
    code, doc = run_json(capsys, [str(path)], None, None, "json")
    assert code == 1
    assert doc["nodes"] == []
    assert fragment in doc["errors"][0]["message"]


def test_binary_payload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bin.prom"
    path.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe garbage")
    code, doc = run_json(capsys, [str(path)], None, None, "json")
    assert code == 1 and doc["nodes"] == []
    assert "UTF-8" in doc["errors"][0]["message"]


def test_node_flag_names_unlabelled_series(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "nohost.prom"
    path.write_text('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1"} 95\n')
    code, doc = run_json(capsys, [str(path)], None, None, "json")
    assert code == 1 and doc["nodes"] == []
    assert "--node" in doc["errors"][0]["message"]
    code, doc = run_json(capsys, [str(path)], "worker-3", None, "json")
    assert code == 0
    assert doc["nodes"][0]["node"] == "worker-3"
    assert doc["nodes"][0]["action"] == "reset"


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = io.TextIOWrapper(io.BytesIO(exposition("from-stdin", xid=13).encode()))
    monkeypatch.setattr(sys, "stdin", fake)
    code, doc = run_json(capsys, ["-"], None, None, "json")
    assert code == 0
    assert doc["nodes"][0]["node"] == "from-stdin"
    assert doc["nodes"][0]["findings"][0]["rule"] == "xid-13-restart-app"


class _Exporter(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[str]:
    _Exporter.routes = {
        "/metrics": (200, exposition("http-node", xid=48).encode()),
        "/broken": (500, b"internal error"),
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_source(capsys: pytest.CaptureFixture[str], exporter: str) -> None:
    code, doc = run_json(capsys, [f"{exporter}/metrics"], None, None, "json")
    assert code == 0
    assert doc["nodes"] == [
        {
            "node": "http-node",
            "action": "reset",
            "findings": [
                {
                    "gpu": "1",
                    "uuid": "GPU-http-node-1",
                    "serial": "",
                    "signal": "DCGM_FI_DEV_XID_ERRORS",
                    "value": 48.0,
                    "rule": "xid-48-workflow-xid-48",
                    "action": "reset",
                    "detail": "",
                }
            ],
        }
    ]


def test_http_errors(capsys: pytest.CaptureFixture[str], exporter: str) -> None:
    code, doc = run_json(capsys, [f"{exporter}/broken", f"{exporter}/missing"], None, None, "json")
    assert code == 1
    assert [e["message"] for e in doc["errors"]] == [
        f"HTTP 500 from {exporter}/broken",
        f"HTTP 404 from {exporter}/missing",
    ]


def test_unreachable_url_times_out_or_fails_fast() -> None:
    # Port 9 (discard) on localhost is closed: the connection is refused.
    report = evaluate_sources(
        ["http://127.0.0.1:9/metrics"], node=None, config=PolicySettings(), timeout_s=2
    )
    assert report.nodes == []
    assert report.errors[0].message.startswith("cannot fetch")


def test_config_whole_file_and_section(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sick_file: Path
) -> None:
    whole = tmp_path / "service.yaml"
    whole.write_text("policy:\n  xid_overrides:\n    79: quarantine\n")
    section = tmp_path / "policy.yaml"
    section.write_text("xid_overrides:\n  79: quarantine\n")
    for path in (whole, section):
        code, doc = run_json(capsys, [str(sick_file)], None, path, "json")
        assert code == 0
        assert doc["nodes"][0]["action"] == "quarantine"
        assert doc["nodes"][0]["findings"][0]["rule"] == "xid-79-override"


def test_invalid_config_is_usage_error_naming_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sick_file: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("policy:\n  thermal:\n    gpu_temp_c: hot\n")
    assert run_evaluate([str(sick_file)], None, path, "json") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "policy.thermal.gpu_temp_c" in captured.err


def test_misspelled_config_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("unknown_xid_actoin: reboot\n")
    with pytest.raises(ConfigError, match="unknown_xid_actoin"):
        load_policy_config(path)


def test_unreadable_config_is_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sick_file: Path
) -> None:
    assert run_evaluate([str(sick_file)], None, tmp_path / "missing.yaml", "json") == 2
    assert "cannot read config file" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("policy: [unclosed\n")
    assert run_evaluate([str(sick_file)], None, broken, "json") == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_empty_config_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_policy_config(path) == PolicySettings()


def test_no_sources_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_evaluate([], None, None, "json") == 2
    assert "at least one" in capsys.readouterr().err


def test_table_output(capsys: pytest.CaptureFixture[str], sick_file: Path, tmp_path: Path) -> None:
    code = run_evaluate([str(sick_file), str(tmp_path / "missing")], None, None, "table")
    out = capsys.readouterr().out
    assert code == 1
    assert "gpu-07" in out and "xid-79-restart-bm" in out and "reboot" in out
    assert "cannot read file" in out


def test_same_node_in_two_sources_is_merged(tmp_path: Path) -> None:
    first = tmp_path / "1.prom"
    first.write_text(exposition("n", xid=79))
    second = tmp_path / "2.prom"
    second.write_text(exposition("n", temp=95))
    report = evaluate_sources([str(first), str(second)], node=None, config=PolicySettings())
    assert [v.node for v in report.nodes] == ["n"]
    assert report.nodes[0].action == Action.REBOOT


# ---------------------------------------------------------------- the catalog is the oracle
# One case per XID of NVIDIA's catalog, generated from the catalog data itself: whatever the
# catalog row says (bucket mapped to an action, or its documented deviation) is what the whole
# offline path (exporter text -> parser -> policy -> report) must answer.

from policy.xid import DEFAULT_XID_TABLE  # noqa: E402


@pytest.mark.parametrize("xid", sorted(DEFAULT_XID_TABLE))
def test_evaluate_gives_the_catalog_action_for_every_catalog_xid(
    xid: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = DEFAULT_XID_TABLE[xid]
    path = tmp_path / f"xid-{xid}.prom"
    path.write_text(exposition("gpu-x", xid=xid))
    code, doc = run_json(capsys, [str(path)], None, None, "json")
    assert code == 0
    (node,) = doc["nodes"]
    assert node["action"] == row.action.value
    (finding,) = node["findings"]
    assert (finding["gpu"], finding["value"], finding["action"]) == ("1", float(xid),
                                                                      row.action.value)
    # 154 names the recovery action it followed; here it cannot be read (no field exported).
    expected_rule = "xid-154-recovery-unreadable" if xid == 154 else row.rule_id
    assert finding["rule"] == expected_rule


@pytest.mark.parametrize("xid", [173, 255, 1000])
def test_evaluate_alerts_on_an_xid_outside_the_catalog(xid: int, tmp_path: Path) -> None:
    path = tmp_path / "unknown.prom"
    path.write_text(exposition("gpu-u", xid=xid))
    report = evaluate_sources([str(path)], node=None, config=PolicySettings())
    (verdict,) = report.nodes
    assert verdict.action == Action.ALERT
    assert [(f.rule, f.action) for f in verdict.findings] == [(f"xid-{xid}-unknown", Action.ALERT)]


def test_evaluate_holds_an_unknown_xid_for_review_when_configured(tmp_path: Path) -> None:
    path = tmp_path / "unknown.prom"
    path.write_text(exposition("gpu-u", xid=200))
    config = tmp_path / "policy.yaml"
    config.write_text("policy:\n  unknown_xid_action: quarantine\n")
    report = evaluate_sources([str(path)], node=None, config=load_policy_config(config))
    assert report.nodes[0].action == Action.QUARANTINE


def test_evaluate_rejects_a_reset_for_unknown_xids_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("policy:\n  unknown_xid_action: reset\n")
    with pytest.raises(ConfigError, match=r"policy\.unknown_xid_action: .*alert or quarantine"):
        load_policy_config(config)


def test_every_action_has_a_check_exit_code() -> None:
    """``gpu-remediate check`` runs the same policy: an action without an exit code would crash
    it on the first unknown XID."""
    from worker.probe.exit_codes import EXIT_BY_ACTION

    assert set(EXIT_BY_ACTION) == set(Action)
    # Both leave the node in service: below every code that takes it out (thermal and up).
    for action in (Action.ALERT, Action.DIAGNOSE):
        assert EXIT_BY_ACTION[Action.APP] <= EXIT_BY_ACTION[action] < EXIT_BY_ACTION[
            Action.THERMAL]
