"""The endpoint nodes report faults to (``gpu-remediate watch`` on each node): HTTPS, one
``POST /v1/reports`` per fault.

A node may speak only for itself. Each report carries the watcher's projected
ServiceAccount token; a TokenReview (with our audience) says whose it is, and the token of
a pod carries the name of the node the pod runs on (``extra`` key
``authentication.kubernetes.io/node-name``, Kubernetes 1.30+). A report is accepted only
from the watcher's ServiceAccount and only for that node; anything else is refused with
its reason counted in ``gpu_remediate_node_reports_refused_total{reason}``. Accepted reports
are rate-limited per node, then signalled to the detector, which only wakes: the decision
still comes from a fresh evaluation of that node and the budget (workflows/reports.py).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from kubernetes.client import ApiClient, AuthenticationV1Api, V1TokenReview, V1TokenReviewSpec
from prometheus_client import Counter
from pydantic import ValidationError
from temporalio.client import Client

from worker.config import ConfigError, NodeReportSettings
from workflows.ids import DETECTOR_WORKFLOW_ID
from workflows.messages import NodeReport
from workflows.reports import NODE_REPORT_SIGNAL

log = logging.getLogger("gpu_remediate.reports")

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
REPORT_PATH = "/v1/reports"

REFUSED = Counter(
    "gpu_remediate_node_reports_refused_total",
    "Node reports refused, by reason (no_token, expired, unauthenticated, not_watcher, "
    "not_node_bound, other_node, too_large, bad_report, rate_limited, review_failed, "
    "signal_failed).", ["reason"])
ACCEPTED = Counter(
    "gpu_remediate_node_reports_accepted_total",
    "Node reports accepted; signalled=false: a repeat of one signalled within "
    "RESIGNAL_SECONDS, which the detector still holds.", ["signalled"])

RESIGNAL_SECONDS = 60.0
"""A repeat of the same (node, GPU, XID) within this is accepted without a new signal:
the detector keeps a report for two minutes (workflows/reports.REPORT_TTL), and every
signal is an event in its history."""
MAX_SIGNALLED = 100_000

MAX_CACHED_REVIEWS = 4096
MAX_REVIEWS_IN_FLIGHT = 16
MAX_NODE_BUCKETS = 100_000


class Refused(Exception):
    """A report not accepted: ``reason`` is the counter's label, ``status`` the answer."""

    def __init__(self, reason: str, status: int, message: str) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


@dataclass(frozen=True)
class Reviewed:
    """Who a token belongs to, as the API server says."""

    user: str
    node: str | None


Review = Callable[[str], Awaitable[tuple[bool, str, Reviewed | None]]]
"""token -> (authenticated, error, who): a TokenReview."""


def token_review(api: ApiClient, audience: str) -> Review:
    """A TokenReview through the Kubernetes API (authentication.k8s.io/v1, create)."""
    authn = AuthenticationV1Api(api)

    def review(token: str) -> tuple[bool, str, Reviewed | None]:
        answer = authn.create_token_review(
            V1TokenReview(spec=V1TokenReviewSpec(token=token, audiences=[audience])))
        status = answer.status
        if status is None or not status.authenticated or status.user is None:
            return False, (status.error if status is not None else None) or "", None
        if status.audiences is not None and audience not in status.audiences:
            return False, f"token not meant for audience {audience}", None
        nodes = (status.user.extra or {}).get(NODE_NAME_EXTRA) or []
        return True, "", Reviewed(user=status.user.username or "",
                                  node=nodes[0] if len(nodes) == 1 else None)

    async def run(token: str) -> tuple[bool, str, Reviewed | None]:
        return await asyncio.to_thread(review, token)

    return run


def unverified_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without checking its signature: used only to refuse
    early and to bound how long a review is reused, never to accept anything."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        padded = parts[1] + "=" * (-len(parts[1]) % 4)
        exp = json.loads(base64.urlsafe_b64decode(padded)).get("exp")
    except (ValueError, AttributeError):
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class TokenBucket:
    """``rate`` per second up to ``burst``, per key; the oldest keys go past ``max_keys``."""

    def __init__(self, rate: float, burst: int, max_keys: int = MAX_NODE_BUCKETS) -> None:
        self.rate, self.burst, self.max_keys = rate, float(burst), max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str, now: float) -> bool:
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
        ok = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if ok else tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return ok


class NodeReports:
    """Authenticates, checks and forwards node reports (see the module's docstring)."""

    def __init__(self, settings: NodeReportSettings, review: Review,
                 signal: Callable[[NodeReport], Awaitable[None]],
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.review = review
        self.signal = signal
        self.clock = clock
        self.buckets = TokenBucket(settings.per_node_per_second, settings.per_node_burst)
        self._cache: OrderedDict[str, tuple[float, Reviewed]] = OrderedDict()
        self._reviews = asyncio.Semaphore(MAX_REVIEWS_IN_FLIGHT)
        self._signalled: OrderedDict[tuple[str, str, int], float] = OrderedDict()

    def app(self) -> web.Application:
        # aiohttp refuses a larger body itself (413) before any of it is read into memory.
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_post(REPORT_PATH, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        try:
            report, signalled = await self.accept(request)
        except Refused as err:
            REFUSED.labels(err.reason).inc()
            if err.reason != "rate_limited":
                log.warning("node report refused (%s): %s", err.reason, err)
            headers = {"Retry-After": "1"} if err.status in (429, 503) else None
            return web.json_response({"accepted": False, "reason": err.reason,
                                      "message": str(err)}, status=err.status, headers=headers)
        ACCEPTED.labels("true" if signalled else "false").inc()
        if signalled:
            log.info("node report accepted: %s GPU %s XID %d", report.node, report.gpu,
                     report.xid)
        return web.json_response({"accepted": True, "node": report.node,
                                  "signalled": signalled}, status=202)

    async def accept(self, request: web.Request) -> tuple[NodeReport, bool]:
        """The report, and whether the detector was signalled (not for a recent repeat)."""
        token = _bearer(request.headers.get("Authorization", ""))
        if not token:
            raise Refused("no_token", 401, "no bearer token")
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            raise Refused("too_large", 413,
                          f"body of {length} bytes over {self.settings.max_body_bytes}")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as err:
            raise Refused("too_large", 413,
                          f"body over {self.settings.max_body_bytes} bytes") from err
        if len(raw) > self.settings.max_body_bytes:
            raise Refused("too_large", 413, f"body over {self.settings.max_body_bytes} bytes")
        who = await self.authenticate(token)
        body = self._parse(raw)
        claimed = body.get("node")
        if not isinstance(claimed, str) or not claimed:
            raise Refused("bad_report", 400, "node: a node name is required")
        if claimed != who.node:
            raise Refused("other_node", 403,
                          f"token bound to node {who.node!r} cannot report for {claimed!r}")
        now = self.clock()
        if not self.buckets.take(who.node, now):
            raise Refused("rate_limited", 429, f"{who.node}: over "
                          f"{self.settings.per_node_per_second:g} reports/s")
        try:
            # The time is ours: the node's clock never says how fresh its report is.
            report = NodeReport.model_validate(
                {**body, "node": who.node, "at": datetime.fromtimestamp(now, UTC)})
        except ValidationError as err:
            raise Refused("bad_report", 400, _first_error(err)) from err
        key = (report.node, report.gpu, report.xid)
        last = self._signalled.get(key)
        if last is not None and now - last < RESIGNAL_SECONDS:
            return report, False
        try:
            await self.signal(report)
        except Exception as err:  # the watcher retries; nothing was acted on
            raise Refused("signal_failed", 503, f"detector not reachable: {err}") from err
        self._signalled.pop(key, None)
        self._signalled[key] = now
        while len(self._signalled) > MAX_SIGNALLED:
            self._signalled.popitem(last=False)
        return report, True

    @staticmethod
    def _parse(raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise Refused("bad_report", 400, f"body is not JSON: {err}") from err
        if not isinstance(body, dict):
            raise Refused("bad_report", 400, "body must be a JSON object")
        return body

    async def authenticate(self, token: str) -> Reviewed:
        """The token's watcher and node, or Refused."""
        now = self.clock()
        exp = unverified_expiry(token)
        if exp is not None and exp <= now:
            raise Refused("expired", 401, "token expired")
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            who = cached[1]
        else:
            self._cache.pop(key, None)
            if self._reviews.locked():
                raise Refused("review_failed", 503, "too many token reviews in flight")
            async with self._reviews:
                try:
                    ok, error, found = await self.review(token)
                except Exception as err:
                    raise Refused("review_failed", 503, f"TokenReview failed: {err}") from err
            if not ok or found is None:
                reason = "expired" if "expired" in error.lower() else "unauthenticated"
                raise Refused(reason, 401, error or "token not authenticated")
            who = found
            until = now + self.settings.review_cache_seconds
            if exp is not None:
                until = min(until, exp)
            if until > now:
                self._cache[key] = (until, who)
                while len(self._cache) > MAX_CACHED_REVIEWS:
                    self._cache.popitem(last=False)
        if who.user not in self.settings.service_accounts:
            raise Refused("not_watcher", 403, f"{who.user} may not report node faults")
        if not who.node:
            raise Refused("not_node_bound", 403,
                          "token names no node (not a pod-bound token, or a Kubernetes "
                          "before 1.30 without ServiceAccountTokenPodNodeInfo)")
        return who


def _bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    field = ".".join(str(p) for p in e.get("loc", ())) or "body"
    return f"{field}: {e.get('msg', 'invalid')}"


def detector_signal(client: Client) -> Callable[[NodeReport], Awaitable[None]]:
    """Signal the detector (``node_report``) with an accepted report."""
    handle = client.get_workflow_handle(DETECTOR_WORKFLOW_ID)

    async def signal(report: NodeReport) -> None:
        await asyncio.wait_for(handle.signal(NODE_REPORT_SIGNAL, report), timeout=5)

    return signal


def server_ssl(settings: NodeReportSettings) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    assert settings.tls_cert is not None and settings.tls_key is not None  # the validator's
    try:
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"reports.tls_cert / reports.tls_key: cannot load "
                          f"{settings.tls_cert} and {settings.tls_key}: {err}") from err
    return ctx


async def serve_reports(settings: NodeReportSettings, api: ApiClient,
                        client: Client) -> web.AppRunner:
    """Start the HTTPS endpoint; the caller cleans the runner up."""
    reports = NodeReports(settings, token_review(api, settings.audience),
                          detector_signal(client))
    runner = web.AppRunner(reports.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.bind, settings.port,
                      ssl_context=server_ssl(settings)).start()
    log.info("node reports served on https://%s:%d%s", settings.bind, settings.port,
             REPORT_PATH)
    return runner
