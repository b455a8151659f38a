"""The worker's node-report endpoint (worker/service/reports.py): who may report what.

The TokenReview is a fake here (the simulator's and a real API server's are tested in
tests/sim/test_cluster_authn.py); everything else is the real handler behind aiohttp.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from worker.config import NodeReportSettings
from worker.service.reports import (
    REPORT_PATH,
    NodeReports,
    Reviewed,
    TokenBucket,
    unverified_expiry,
)
from workflows.messages import NodeReport

WATCHER = "system:serviceaccount:gpu-remediate-watch:gpu-remediate-watch"
NOW = 1_800_000_000.0


def jwt(exp: float) -> str:
    def part(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'RS256'})}.{part({'exp': exp, 'sub': WATCHER})}.c2ln"


GOOD_A = jwt(NOW + 3600)
GOOD_B = jwt(NOW + 3601)


@dataclass
class Fake:
    """The TokenReview's answers by token, the detector's received signals, a clock."""

    reviews: dict[str, tuple[bool, str, Reviewed | None]] = field(default_factory=lambda: {
        GOOD_A: (True, "", Reviewed(WATCHER, "node-a")),
        GOOD_B: (True, "", Reviewed(WATCHER, "node-b")),
        "lapsed": (False, "[invalid bearer token, service account token has expired]", None),
        "forged": (False, "[invalid bearer token, token could not be verified]", None),
        "workload": (True, "", Reviewed("system:serviceaccount:team-a:default", "node-a")),
        "unbound": (True, "", Reviewed(WATCHER, None)),
    })
    asked: list[str] = field(default_factory=list)
    signals: list[NodeReport] = field(default_factory=list)
    now: float = NOW
    detector_down: bool = False

    async def review(self, token: str) -> tuple[bool, str, Reviewed | None]:
        self.asked.append(token)
        return self.reviews.get(token, (False, "unknown token", None))

    async def signal(self, report: NodeReport) -> None:
        if self.detector_down:
            raise RuntimeError("Temporal unavailable")
        self.signals.append(report)


@pytest.fixture
async def fake() -> Fake:
    return Fake()


@pytest.fixture
async def http(fake: Fake) -> AsyncIterator[TestClient]:
    reports = NodeReports(NodeReportSettings(per_node_per_second=1, per_node_burst=3),
                          fake.review, fake.signal, clock=lambda: fake.now)
    async with TestClient(TestServer(reports.app())) as c:
        yield c


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("gpu_remediate_node_reports_refused_total",
                                     {"reason": reason}) or 0.0


BODY = {"node": "node-a", "gpu": "0", "xid": 79,
        "line": "[ 8123.4] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.",
        "at": "2020-01-01T00:00:00Z"}


async def post(http: TestClient, token: str | None, body: Any = BODY,
               raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if raw is not None:
        answer = await http.post(REPORT_PATH, data=raw, headers=headers)
    else:
        answer = await http.post(REPORT_PATH, json=body, headers=headers)
    return answer.status, await answer.json()


async def test_a_report_for_the_tokens_own_node_is_signalled(http: TestClient,
                                                             fake: Fake) -> None:
    status, answer = await post(http, GOOD_A)
    assert (status, answer["accepted"]) == (202, True)
    [sent] = fake.signals
    assert (sent.node, sent.gpu, sent.xid) == ("node-a", "0", 79)
    # The worker's clock dates the report, not the node's.
    assert sent.at.timestamp() == NOW


@pytest.mark.parametrize(("token", "reason", "status"), [
    (None, "no_token", 401),
    ("", "no_token", 401),
    (jwt(NOW - 1), "expired", 401),
    ("lapsed", "expired", 401),
    ("forged", "unauthenticated", 401),
    ("workload", "not_watcher", 403),
    ("unbound", "not_node_bound", 403),
])
async def test_refused_tokens_are_counted_by_reason(http: TestClient, fake: Fake,
                                                    token: str | None, reason: str,
                                                    status: int) -> None:
    before = refused(reason)
    got, answer = await post(http, token)
    assert (got, answer["reason"]) == (status, reason)
    assert refused(reason) == before + 1
    assert fake.signals == []


async def test_an_expired_jwt_is_refused_without_asking_the_api_server(http: TestClient,
                                                                     fake: Fake) -> None:
    await post(http, jwt(NOW - 60))
    assert fake.asked == []


async def test_a_token_bound_to_another_node_cannot_report_for_this_one(http: TestClient,
                                                                       fake: Fake) -> None:
    before = refused("other_node")
    status, answer = await post(http, GOOD_B)  # node-b's watcher, a report for node-a
    assert (status, answer["reason"]) == (403, "other_node")
    assert "node-b" in answer["message"] and refused("other_node") == before + 1
    assert fake.signals == []


async def test_a_body_over_the_limit_is_refused_before_the_token_is_reviewed(
        http: TestClient, fake: Fake) -> None:
    before = refused("too_large")
    status, answer = await post(http, GOOD_A, raw=json.dumps(
        {**BODY, "line": "x" * 10_000}).encode())
    assert (status, answer["reason"]) == (413, "too_large")
    assert refused("too_large") == before + 1
    assert fake.asked == [] and fake.signals == []


@pytest.mark.parametrize(("body", "field"), [
    ({**BODY, "xid": "seventy-nine"}, "xid"),
    ({**BODY, "gpu": "0; rm -rf /"}, "gpu"),
    ({k: v for k, v in BODY.items() if k != "node"}, "node"),
    ([BODY], "body"),
])
async def test_a_bad_report_names_the_field(http: TestClient, fake: Fake, body: Any,
                                            field: str) -> None:
    status, answer = await post(http, GOOD_A, body)
    assert (status, answer["reason"]) == (400, "bad_report")
    assert answer["message"].startswith(field) or field in answer["message"]
    assert fake.signals == []


async def test_a_storm_is_rate_limited_per_node(http: TestClient, fake: Fake) -> None:
    before = refused("rate_limited")
    answers = [(await post(http, GOOD_A, {**BODY, "xid": 1 + i % 7}))[0] for i in range(200)]
    # The burst, then nothing until the bucket refills (the clock stands still).
    assert answers[:3] == [202] * 3 and set(answers[3:]) == {429}
    assert refused("rate_limited") == before + 197
    assert len(fake.signals) == 3
    # The TokenReview was asked once: the answer is reused for the same token.
    assert fake.asked == [GOOD_A]
    # Another node's watcher is not held back by node-a's storm.
    assert (await post(http, GOOD_B, {**BODY, "node": "node-b"}))[0] == 202
    fake.now += 1.0
    assert (await post(http, GOOD_A))[0] == 202


async def test_a_repeat_is_accepted_without_signalling_the_detector_again(
        http: TestClient, fake: Fake) -> None:
    first = await http.post(REPORT_PATH, json=BODY, headers={"Authorization": f"Bearer {GOOD_A}"})
    again = await http.post(REPORT_PATH, json=BODY, headers={"Authorization": f"Bearer {GOOD_A}"})
    assert (first.status, (await first.json())["signalled"]) == (202, True)
    assert (again.status, (await again.json())["signalled"]) == (202, False)
    assert len(fake.signals) == 1
    fake.now += 61  # the detector's copy is about to expire: signalled again
    await post(http, GOOD_A)
    assert len(fake.signals) == 2


async def test_a_detector_that_cannot_be_signalled_is_a_retryable_answer(
        http: TestClient, fake: Fake) -> None:
    fake.detector_down = True
    answer = await http.post(REPORT_PATH, json=BODY, headers={"Authorization":
                                                              f"Bearer {GOOD_A}"})
    assert answer.status == 503 and answer.headers["Retry-After"] == "1"


async def test_a_cached_review_is_not_reused_past_the_tokens_expiry(http: TestClient,
                                                                    fake: Fake) -> None:
    short = jwt(NOW + 5)
    fake.reviews[short] = (True, "", Reviewed(WATCHER, "node-a"))
    assert (await post(http, short))[0] == 202
    fake.now += 6
    status, answer = await post(http, short)
    assert (status, answer["reason"]) == (401, "expired")


def test_a_million_reports_in_a_second_pass_the_bucket_a_handful_of_times() -> None:
    bucket = TokenBucket(rate=1.0, burst=5)
    taken = sum(bucket.take("node-a", NOW + i / 1_000_000) for i in range(1_000_000))
    assert taken == 5  # the burst; the refill over the second is not one whole report yet
    assert bucket.take("node-a", NOW + 1.0)


def test_the_token_buckets_are_bounded() -> None:
    bucket = TokenBucket(rate=1.0, burst=1, max_keys=10)
    for i in range(100):
        bucket.take(f"n{i}", NOW)
    assert len(bucket._buckets) == 10


def test_expiry_is_read_only_from_a_jwt_shape() -> None:
    assert unverified_expiry(jwt(123)) == 123
    assert unverified_expiry("opaque") is None
    assert unverified_expiry("a.!!!.c") is None
    assert unverified_expiry("a." + base64.urlsafe_b64encode(b'{"exp": true}').decode()
                             + ".c") is None


def test_a_certificate_that_cannot_be_loaded_is_a_config_error_naming_it(
        tmp_path: Path) -> None:
    from worker.config import ConfigError
    from worker.service.reports import server_ssl

    missing = tmp_path / "nope.crt"
    with pytest.raises(ConfigError, match=r"reports\.tls_cert.*nope\.crt"):
        server_ssl(NodeReportSettings(enabled=True, tls_cert=missing, tls_key=missing))
