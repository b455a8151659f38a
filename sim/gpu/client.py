"""Synchronous client for the GPU simulator's control API (used by the CLI and the cluster sim)."""

from __future__ import annotations

from typing import Any

import httpx


class GpuSimError(Exception):
    """The simulator refused a request or could not be reached.

    `message` is the server's own error text; `status` is the HTTP status (None when
    no response came back).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class GpuSimClient:
    def __init__(self, base_url: str = "http://127.0.0.1:9400", timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GpuSimClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, f"/api/v1{path}", **kwargs)
        except httpx.HTTPError as err:
            raise GpuSimError(f"cannot reach the GPU simulator at {self.base_url}: {err}") from err
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_error:
            text = data.get("error") if isinstance(data, dict) else None
            raise GpuSimError(
                text or f"HTTP {response.status_code}: {response.text.strip()}",
                response.status_code,
            )
        return data

    def list_nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self._call("GET", "/nodes")["nodes"]
        return nodes

    def get_node(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/nodes/{node}")
        return result

    def inject_fault(
        self,
        node: str,
        gpu: int,
        kind: str,
        value: int | None = None,
        clears_on: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": kind}
        if value is not None:
            body["value"] = value
        if clears_on is not None:
            body["clears_on"] = clears_on
        result: dict[str, Any] = self._call("POST", f"/nodes/{node}/gpus/{gpu}/faults", json=body)
        return result

    def clear(self, node: str, gpu: int | None = None) -> dict[str, Any]:
        params = {} if gpu is None else {"gpu": str(gpu)}
        result: dict[str, Any] = self._call("DELETE", f"/nodes/{node}/faults", params=params)
        return result

    def reset(self, node: str, gpu: int | str | None = None) -> dict[str, Any]:
        """GPU reset; raises GpuSimError(status=409) when the GPU cannot be reset."""
        body = {} if gpu is None else {"gpu": str(gpu)}
        result: dict[str, Any] = self._call("POST", f"/nodes/{node}/reset", json=body)
        return result

    def set_persistence(self, node: str, enabled: bool, gpu: int | str | None = None
                        ) -> dict[str, Any]:
        """`nvidia-smi [-i GPU] -pm 0|1`; gpu is an index or a UUID, None for every GPU."""
        body: dict[str, Any] = {"enabled": enabled}
        if gpu is not None:
            body["gpu"] = str(gpu)
        result: dict[str, Any] = self._call("POST", f"/nodes/{node}/persistence", json=body)
        return result

    def reboot(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/nodes/{node}/reboot")
        return result

    def health(self, node: str) -> dict[str, Any]:
        """{"node": ..., "healthy": bool, "problems": [str]} as `dcgmi diag -r 2` would say."""
        result: dict[str, Any] = self._call("GET", f"/nodes/{node}/health")
        return result

    def set_exporter_mode(
        self, node: str, mode: str, delay_seconds: float | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"mode": mode}
        if delay_seconds is not None:
            body["delay_seconds"] = delay_seconds
        result: dict[str, Any] = self._call("PUT", f"/nodes/{node}/exporter", json=body)
        return result

    def assign_pod(
        self,
        node: str,
        gpu: int,
        namespace: str | None,
        pod: str | None,
        container: str = "main",
    ) -> dict[str, Any]:
        """Label a GPU's series with the pod using it; pod=None removes the labels."""
        body: dict[str, Any] = (
            {"pod": None}
            if pod is None
            else {"namespace": namespace, "pod": pod, "container": container}
        )
        result: dict[str, Any] = self._call("PUT", f"/nodes/{node}/gpus/{gpu}/pod", json=body)
        return result
