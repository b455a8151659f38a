"""Send reports to the worker: ``offer`` never blocks (a bounded queue; when it is full the
report is dropped and counted), one sender posts them in order with the token read afresh
for each (the kubelet rotates projected tokens), retrying what the worker could not take
yet (429, 503, no answer) with exponential backoff, and giving up on what it refused.

Before the queue: a repeat of the same (GPU, XID) within ``dedupe_seconds`` is one report,
and a token bucket caps the rest, so a kernel line printed a million times is a handful of
reports, and the worker's own per-node limit is the second line of defence.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("gpu_remediate.watch")

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass
class Counts:
    sent: int = 0
    refused: int = 0
    deduplicated: int = 0
    rate_limited: int = 0
    dropped: int = 0
    """Queue full, or retries exhausted."""
    retries: int = 0


@dataclass
class ReporterSettings:
    url: str
    token_file: Path
    ca_file: Path | None = None
    queue_size: int = 64
    per_second: float = 2.0
    burst: int = 10
    dedupe_seconds: float = 10.0
    timeout_seconds: float = 5.0
    max_attempts: int = 8
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 10.0
    extra_headers: dict[str, str] = field(default_factory=dict)


class Reporter:
    def __init__(self, settings: ReporterSettings, *,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.settings = settings
        self.counts = Counts()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(settings.queue_size)
        self._clock = clock
        self._sleep = sleep
        self._last: dict[tuple[str, int], float] = {}
        self._tokens, self._filled = float(settings.burst), clock()
        self._said = float("-inf")
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(settings.ca_file)) if settings.ca_file
            else True)
        self._client = httpx.AsyncClient(timeout=settings.timeout_seconds, verify=verify,
                                         transport=transport)

    def _suppressed(self, now: float) -> None:
        """Say, at most once a minute, that reports are being held back (a storm)."""
        if now - self._said >= 60.0:
            self._said = now
            c = self.counts
            log.warning("reports held back so far: %d over the rate, %d dropped (queue full "
                        "or retries exhausted); %d repeats folded", c.rate_limited, c.dropped,
                        c.deduplicated)

    def offer(self, gpu: str, xid: int, build: Callable[[], dict[str, Any]]) -> bool:
        """Queue the report ``build`` makes for ``xid`` on ``gpu``, unless it repeats one just
        offered, the rate is spent, or the queue is full. Never blocks; a repeat costs a
        look-up (``build`` is not called)."""
        now = self._clock()
        key = (gpu, xid)
        last = self._last.get(key)
        if last is not None and now - last < self.settings.dedupe_seconds:
            self.counts.deduplicated += 1
            return False
        self._tokens = min(float(self.settings.burst),
                           self._tokens + (now - self._filled) * self.settings.per_second)
        self._filled = now
        if self._tokens < 1.0:
            self.counts.rate_limited += 1
            self._suppressed(now)
            return False
        try:
            self.queue.put_nowait(build())
        except asyncio.QueueFull:
            self.counts.dropped += 1
            self._suppressed(now)
            return False
        self._tokens -= 1.0
        self._last[key] = now
        if len(self._last) > 4096:  # forget the oldest: they only deduplicate
            for k in sorted(self._last, key=self._last.__getitem__)[:2048]:
                del self._last[k]
        return True

    async def run(self) -> None:
        """Send queued reports until cancelled."""
        try:
            while True:
                report = await self.queue.get()
                await self.send(report)
        finally:
            await self._client.aclose()

    async def send(self, report: dict[str, Any]) -> bool:
        """Post one report, retrying what may succeed later. True once accepted."""
        s = self.settings
        delay = s.backoff_seconds
        for attempt in range(1, s.max_attempts + 1):
            status, why = await self._post(report)
            if status is not None and status < 300:
                self.counts.sent += 1
                return True
            if status is not None and status not in RETRY_STATUS:
                self.counts.refused += 1
                log.warning("report of XID %s on GPU %s refused (%s): %s", report.get("xid"),
                            report.get("gpu"), status, why)
                return False
            if attempt == s.max_attempts:
                break
            self.counts.retries += 1
            await self._sleep(delay)
            delay = min(delay * 2, s.max_backoff_seconds)
        self.counts.dropped += 1
        log.warning("report of XID %s on GPU %s dropped after %d attempts: %s",
                    report.get("xid"), report.get("gpu"), s.max_attempts, why)
        return False

    async def _post(self, report: dict[str, Any]) -> tuple[int | None, str]:
        try:
            token = self.settings.token_file.read_text().strip()
        except OSError as err:
            return None, f"cannot read the token: {err}"
        try:
            answer = await self._client.post(
                self.settings.url, json=report,
                headers={"Authorization": f"Bearer {token}", **self.settings.extra_headers})
        except httpx.HTTPError as err:
            return None, f"{type(err).__name__}: {err}"
        return answer.status_code, answer.text[:300]
