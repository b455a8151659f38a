"""The report path end to end but for Temporal: the watcher's reporter, over HTTPS with the
endpoint's CA, to the worker's endpoint (serve_reports), which reviews the token with the
cluster simulator's TokenReview (a token it issued for a pod on the node)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from tests.sim.testkit import Contract
from worker.config import NodeReportSettings
from worker.service.reports import REPORT_PATH, serve_reports
from worker.watch.reporter import Reporter, ReporterSettings
from workflows.messages import NodeReport

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

NAMESPACE, ACCOUNT, AUDIENCE = "gpu-remediate-watch", "gpu-remediate-watch", "gpu-remediate"


class FakeTemporal:
    """What serve_reports uses of a Temporal client: the detector's handle, to signal."""

    def __init__(self) -> None:
        self.signals: list[tuple[str, NodeReport]] = []

    def get_workflow_handle(self, workflow_id: str) -> Any:
        outer = self

        class Handle:
            async def signal(self, name: str, arg: NodeReport) -> None:
                outer.signals.append((name, arg))

        return Handle()


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("tls"), scenario="small", job_seconds=0.2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cert")
    cert, key = d / "tls.crt", d / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=gpu-remediate-reports",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def token_for(k: Contract, node: str, tmp: Path) -> Path:
    if NAMESPACE not in {n.metadata.name for n in k.core.list_namespace().items}:
        k.core.create_namespace({"metadata": {"name": NAMESPACE}})
    pod = k.pod(NAMESPACE, node)
    answer = k.core.create_namespaced_service_account_token(ACCOUNT, NAMESPACE, {"spec": {
        "audiences": [AUDIENCE], "boundObjectRef": {"kind": "Pod", "name": pod.metadata.name,
                                                    "uid": pod.metadata.uid}}})
    path = tmp / f"token-{node}"
    path.write_text(answer.status.token)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_watcher_reports_over_https_for_its_own_node_only(
        k: Contract, tls: tuple[Path, Path], tmp_path: Path) -> None:
    node, other = k.node(), k.node()
    token = token_for(k, node, tmp_path)
    settings = NodeReportSettings(enabled=True, bind="127.0.0.1", port=free_port(),
                                  tls_cert=tls[0], tls_key=tls[1], audience=AUDIENCE)
    temporal = FakeTemporal()
    api = config.new_client_from_config(config_file=str(k.kubeconfig))
    runner = await serve_reports(settings, api, temporal)  # type: ignore[arg-type]
    try:
        url = f"https://127.0.0.1:{settings.port}{REPORT_PATH}"
        reporter = Reporter(ReporterSettings(url=url, token_file=token, ca_file=tls[0],
                                             max_attempts=1))
        assert await reporter.send({"node": node, "gpu": "0", "xid": 79, "line": "x",
                                    "at": "2026-01-01T00:00:00Z"})
        assert await reporter.send({"node": other, "gpu": "0", "xid": 79}) is False
        assert reporter.counts.refused == 1
        [(name, report)] = temporal.signals
        assert name == "node_report" and (report.node, report.xid) == (node, 79)
        # A client that does not trust the endpoint's CA sends nothing (and no token).
        untrusting = Reporter(ReporterSettings(url=url, token_file=token, max_attempts=1))
        assert not await untrusting.send({"node": node, "gpu": "0", "xid": 79})
        await reporter._client.aclose()
        await untrusting._client.aclose()
    finally:
        await runner.cleanup()
        api.close()
