"""Calls from simulated Jobs to the GPU simulator's HTTP API.

Made over HTTP (not through sim.gpu's Python client) so the two simulators
stay independent processes, as dcgm-exporter and the kubelet are. With no
URL configured, validation passes and repairs are no-ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    ok: bool
    problems: list[str] = field(default_factory=list)


class GpuLink:
    def __init__(self, base_url: str | None, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        self._client = httpx.AsyncClient(timeout=timeout) if self.base_url else None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def health(self, node: str) -> Outcome:
        if self._client is None:
            return Outcome(True)
        try:
            resp = await self._client.get(f"{self.base_url}/api/v1/nodes/{node}/health")
            resp.raise_for_status()
            data = resp.json()
        except (httpx.HTTPError, ValueError) as err:
            return Outcome(False, [f"cannot read GPU health from the GPU simulator: {err}"])
        return Outcome(bool(data.get("healthy")), [str(p) for p in data.get("problems") or []])

    async def _post(self, url: str, body: dict[str, str]) -> Outcome:
        if self._client is None:
            return Outcome(True)
        try:
            resp = await self._client.post(url, json=body)
        except httpx.HTTPError as err:
            return Outcome(False, [f"GPU simulator unreachable: {err}"])
        if resp.status_code < 300:
            return Outcome(True)
        try:
            message = str(resp.json().get("error") or resp.text)
        except ValueError:
            message = resp.text
        return Outcome(False, [f"HTTP {resp.status_code}: {message}"])

    async def reset(self, node: str, gpu: str | None) -> Outcome:
        body = {"gpu": gpu} if gpu is not None else {}
        return await self._post(f"{self.base_url}/api/v1/nodes/{node}/reset", body)

    async def reboot(self, node: str) -> Outcome:
        return await self._post(f"{self.base_url}/api/v1/nodes/{node}/reboot", {})
