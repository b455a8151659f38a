"""Contract: ServiceAccount tokens bound to a pod, and the TokenReview that says which node
the pod runs on (the node-bound event path's trust: docs/architecture.md, "The node-bound
event path").

Runs against the simulator by default, or against a real cluster (Kubernetes 1.30+, where
ServiceAccountTokenPodNodeInfo puts the node in the review's ``extra``) when
GPU_REMEDIATE_CONTRACT_KUBECONFIG is set (tests/sim/testkit.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client

from sim.cluster.authn import TokenAuthority
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster
from worker.config import NodeReportSettings
from worker.service.reports import REPORT_PATH, NodeReports, token_review
from workflows.messages import NodeReport

sim_only = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")

AUDIENCE = "gpu-remediate"
NODE_NAME = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    c = Contract.open(tmp_path_factory.mktemp("authn"), scenario="small", job_seconds=0.2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def placed(k: Contract) -> tuple[str, str, Any]:
    """A namespace with its default ServiceAccount, a node, and a pod on it."""
    ns = k.namespace()
    if real_cluster():  # the ServiceAccount controller makes "default" shortly after
        wait_for(lambda: k.core.read_namespaced_service_account("default", ns), timeout=30,
                 transient=(client.ApiException,))
    node = k.node()
    return ns, node, k.pod(ns, node)


def request_token(k: Contract, ns: str, pod: Any | None, **spec: Any) -> str:
    body: dict[str, Any] = {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 600,
                                     **spec}}
    if pod is not None:
        body["spec"]["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1",
                                          "name": pod.metadata.name, "uid": pod.metadata.uid}
    answer = k.core.create_namespaced_service_account_token("default", ns, body)
    return str(answer.status.token)


def review(k: Contract, token: str, audiences: list[str] | None = None) -> Any:
    return client.AuthenticationV1Api(k.api).create_token_review(
        {"spec": {"token": token, "audiences": audiences or [AUDIENCE]}}).status


def test_a_pod_bound_token_names_the_pods_node(k: Contract,
                                                placed: tuple[str, str, Any]) -> None:
    ns, node, pod = placed
    status = review(k, request_token(k, ns, pod))
    assert status.authenticated is True
    assert status.user.username == f"system:serviceaccount:{ns}:default"
    assert status.user.extra[NODE_NAME] == [node]
    assert status.user.extra["authentication.kubernetes.io/pod-name"] == [pod.metadata.name]
    assert status.user.extra["authentication.kubernetes.io/pod-uid"] == [pod.metadata.uid]
    assert AUDIENCE in status.audiences


def test_a_token_bound_to_nothing_names_no_node(k: Contract,
                                                placed: tuple[str, str, Any]) -> None:
    ns, _, _ = placed
    status = review(k, request_token(k, ns, None))
    assert status.authenticated is True
    assert NODE_NAME not in (status.user.extra or {})


def test_a_token_for_another_audience_is_not_authenticated(
        k: Contract, placed: tuple[str, str, Any]) -> None:
    ns, _, pod = placed
    status = review(k, request_token(k, ns, pod), audiences=["someone-else"])
    assert status.authenticated is not True
    assert status.error


def test_a_made_up_token_is_not_authenticated(k: Contract) -> None:
    status = review(k, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")
    assert status.authenticated is not True and status.error


def test_a_token_dies_with_its_pod(k: Contract, placed: tuple[str, str, Any]) -> None:
    ns, node, _ = placed
    pod = k.pod(ns, node)
    token = request_token(k, ns, pod)
    assert review(k, token).authenticated is True
    k.core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    wait_for(lambda: review(k, token).authenticated is not True, timeout=30)


def test_a_token_shorter_than_ten_minutes_is_refused(k: Contract,
                                                     placed: tuple[str, str, Any]) -> None:
    ns, _, pod = placed
    with pytest.raises(client.ApiException) as err:
        request_token(k, ns, pod, expirationSeconds=60)
    assert err.value.status == 422
    assert "spec.expirationSeconds" in json.loads(err.value.body)["message"]


def test_a_token_for_a_missing_pod_is_refused(k: Contract,
                                              placed: tuple[str, str, Any]) -> None:
    ns, _, _ = placed
    with pytest.raises(client.ApiException) as err:
        k.core.create_namespaced_service_account_token("default", ns, {"spec": {
            "audiences": [AUDIENCE], "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                        "name": "no-such-pod"}}})
    assert err.value.status == 404


@sim_only
def test_an_expired_token_is_not_authenticated(k: Contract,
                                               placed: tuple[str, str, Any]) -> None:
    ns, _, pod = placed
    assert k.sim is not None and k.sim.sim is not None
    now = [1_000_000.0]
    authority = TokenAuthority(k.sim.sim.store, now=lambda: now[0])
    token = authority.request_token(ns, "default", {"spec": {
        "audiences": [AUDIENCE], "expirationSeconds": 600,
        "boundObjectRef": {"kind": "Pod", "name": pod.metadata.name}}})["status"]["token"]
    assert authority.review({"spec": {"token": token, "audiences": [AUDIENCE]}})[
        "status"]["authenticated"] is True
    now[0] += 601
    status = authority.review({"spec": {"token": token, "audiences": [AUDIENCE]}})["status"]
    assert status["authenticated"] is False and "expired" in status["error"]
    # Another simulator's key never verifies this one's token.
    other = TokenAuthority(k.sim.sim.store, now=lambda: now[0] - 601)
    assert other.review({"spec": {"token": token}})["status"]["authenticated"] is False


async def test_the_report_endpoint_accepts_a_watcher_only_for_its_pods_node(
        k: Contract, placed: tuple[str, str, Any]) -> None:
    """The worker's endpoint (worker/service/reports.py) over this cluster's own TokenReview:
    the pod-bound token of the watcher's ServiceAccount reports for its pod's node and no
    other; a token bound to nothing, or of another ServiceAccount, reports for none."""
    ns, node, pod = placed
    other = k.node()
    watcher = f"system:serviceaccount:{ns}:default"
    signals: list[NodeReport] = []

    async def signal(report: NodeReport) -> None:
        signals.append(report)

    reports = NodeReports(
        NodeReportSettings(audience=AUDIENCE, service_accounts=[watcher]),
        token_review(k.api, AUDIENCE), signal)
    bound, unbound = request_token(k, ns, pod), request_token(k, ns, None)
    line = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus."

    async with TestClient(TestServer(reports.app())) as http:
        async def post(token: str, for_node: str) -> tuple[int, str]:
            answer = await http.post(REPORT_PATH, headers={"Authorization": f"Bearer {token}"},
                                     json={"node": for_node, "gpu": "0", "xid": 79,
                                           "line": line})
            return answer.status, (await answer.json()).get("reason", "")

        assert await post(bound, other) == (403, "other_node")
        assert await post(unbound, node) == (403, "not_node_bound")
        assert await post(bound, node) == (202, "")
    assert [(s.node, s.xid) for s in signals] == [(node, 79)]

    strangers = NodeReports(
        NodeReportSettings(audience=AUDIENCE,
                           service_accounts=["system:serviceaccount:elsewhere:watch"]),
        token_review(k.api, AUDIENCE), signal)
    async with TestClient(TestServer(strangers.app())) as http:
        answer = await http.post(REPORT_PATH, headers={"Authorization": f"Bearer {bound}"},
                                 json={"node": node, "gpu": "0", "xid": 79, "line": line})
        assert (answer.status, (await answer.json())["reason"]) == (403, "not_watcher")
    assert len(signals) == 1
