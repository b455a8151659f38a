"""Calls from simulated Jobs to the GPU simulator's HTTP API.

Made over HTTP (not through sim.gpu's Python client) so the two simulators
stay independent processes, as dcgm-exporter and the kubelet are. With no
URL configured, validation passes and repairs are no-ops.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    ok: bool
    problems: list[str] = field(default_factory=list)
    # What a repair cleared, as the GPU simulator reports it: [{"gpu": 3, "kind": "xid",
    # "value": 48, ...}]; empty without a GPU simulator.
    cleared: list[dict[str, object]] = field(default_factory=list)


class GpuLink:
    """The simulated Job containers' way to the simulated GPUs.

    A real validation or reset container talks to the GPUs of its own node; it never fails
    because a network hop is slow. So a transport error, a timeout or a 5xx from the GPU
    simulator (an overloaded simulator on a small machine) is retried until ``deadline``
    seconds have passed; only then does the Job fail, saying why. A 4xx is an answer (for
    example an unknown node) and is never retried. Resets and reboots are retried only when
    the request cannot have arrived (no connection), never after a read timeout or a 5xx,
    so a repair is not done twice.
    """

    def __init__(self, base_url: str | None, timeout: float = 5.0, deadline: float = 120.0,
                 backoff: float = 0.5) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        self._client = httpx.AsyncClient(timeout=timeout) if self.base_url else None
        self.deadline = deadline
        self.backoff = backoff

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def _call(self, method: str, url: str, body: dict[str, object] | None = None
                    ) -> httpx.Response:
        """One request, retried until the deadline; the last error is raised
        (``httpx.HTTPError``) or the last 5xx response returned."""
        idempotent = method == "GET"
        unsent = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
        assert self._client is not None
        give_up = asyncio.get_running_loop().time() + self.deadline
        delay = self.backoff
        while True:
            try:
                resp = await self._client.request(method, url, json=body)
                if resp.status_code < 500 or not idempotent:
                    return resp
                failure: httpx.Response | httpx.HTTPError = resp
            except httpx.TransportError as err:
                if not idempotent and not isinstance(err, unsent):
                    raise
                failure = err
            if asyncio.get_running_loop().time() + delay > give_up:
                if isinstance(failure, httpx.Response):
                    return failure
                raise failure
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def health(self, node: str) -> Outcome:
        if self._client is None:
            return Outcome(True)
        try:
            resp = await self._call("GET", f"{self.base_url}/api/v1/nodes/{node}/health")
            resp.raise_for_status()
            data = resp.json()
        except (httpx.HTTPError, ValueError) as err:
            return Outcome(False, [f"cannot read GPU health from the GPU simulator: {err}"])
        return Outcome(bool(data.get("healthy")), [str(p) for p in data.get("problems") or []])

    async def _post(self, url: str, body: dict[str, object]) -> Outcome:
        if self._client is None:
            return Outcome(True)
        try:
            resp = await self._call("POST", url, body)
        except httpx.HTTPError as err:
            return Outcome(False, [f"GPU simulator unreachable: {err}"])
        if resp.status_code < 300:
            try:
                cleared = resp.json().get("cleared") or []
            except (ValueError, AttributeError):
                cleared = []
            return Outcome(True, cleared=[c for c in cleared if isinstance(c, dict)])
        try:
            message = str(resp.json().get("error") or resp.text)
        except ValueError:
            message = resp.text
        return Outcome(False, [f"HTTP {resp.status_code}: {message}"])

    async def fleet_xids(self) -> dict[str, dict[int, list[int]]] | None:
        """The XIDs active on every GPU of the fleet: {node: {gpu index: [xid, ...]}}.

        One request, never retried: the device plugin's health check asks again on its
        next round. None without a GPU simulator or when it does not answer."""
        if self._client is None:
            return None
        try:
            resp = await self._client.get(f"{self.base_url}/api/v1/nodes")
            if resp.status_code != 200:
                return None
            data = resp.json()
            out: dict[str, dict[int, list[int]]] = {}
            for node in data.get("nodes") or []:
                out[str(node["name"])] = {
                    int(g["index"]): [int(f["value"]) for f in g.get("faults") or []
                                      if f.get("kind") == "xid" and f.get("value") is not None]
                    for g in node.get("gpus") or []
                }
            return out
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return None

    async def gpus(self, node: str) -> list[dict[str, object]] | None:
        """The node's GPUs as the GPU simulator lists them (index, uuid, persistence_mode,
        ...); None without a GPU simulator or when it does not answer."""
        if self._client is None:
            return None
        try:
            resp = await self._call("GET", f"{self.base_url}/api/v1/nodes/{node}")
            resp.raise_for_status()
            gpus = resp.json().get("gpus") or []
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return [g for g in gpus if isinstance(g, dict)]

    async def persistence(self, node: str, gpu: str, enabled: bool) -> Outcome:
        """`nvidia-smi -i GPU -pm 0|1`."""
        if self._client is None:
            return Outcome(True)
        try:
            resp = await self._call("POST", f"{self.base_url}/api/v1/nodes/{node}/persistence",
                                    {"gpu": gpu, "enabled": enabled})
        except httpx.HTTPError as err:
            return Outcome(False, [f"GPU simulator unreachable: {err}"])
        if resp.status_code < 300:
            return Outcome(True)
        return Outcome(False, [f"HTTP {resp.status_code}: {resp.text[:300]}"])

    async def reset(self, node: str, gpu: str | None) -> Outcome:
        body: dict[str, object] = {"gpu": gpu} if gpu is not None else {}
        return await self._post(f"{self.base_url}/api/v1/nodes/{node}/reset", body)

    async def reboot(self, node: str) -> Outcome:
        return await self._post(f"{self.base_url}/api/v1/nodes/{node}/reboot", {})
