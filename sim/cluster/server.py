"""The HTTP face of the simulator: Kubernetes REST paths over aiohttp.

Requests are parsed into (resource, namespace, name, subresource) exactly as
the real API server lays out its paths, fault injection and the write log
wrap every API request, and everything else is delegated to `handlers`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from sim.cluster import clock, discovery, errors, handlers, tables
from sim.cluster import resources as r
from sim.cluster.authn import TokenAuthority
from sim.cluster.faults import FaultConfig, FaultInjector
from sim.cluster.handlers import Target
from sim.cluster.machines import COMMANDS, NodeCommand
from sim.cluster.store import Store, WriteLog, WriteRecord
from sim.cluster.watch import as_version, serve_watch

if TYPE_CHECKING:
    from sim.cluster.kubelet import Kubelet

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(body),
        status=status,
        content_type="application/json",
        headers={
            "Audit-Id": str(uuid.uuid4()),
            "Cache-Control": "no-cache, private",
            **(headers or {}),
        },
    )


def _error(err: errors.ApiError) -> web.Response:
    return _json(err.body(), err.code, err.headers)


def parse_target(path: str, minor: int = r.DEFAULT_MINOR) -> Target | str | None:
    """A resource Target, a group/version string for discovery, or None for 404."""
    segs = [s for s in path.split("/") if s]
    if segs[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", segs[2:]
    elif len(segs) >= 3 and segs[0] == "apis":
        group, version, rest = segs[1], segs[2], segs[3:]
    else:
        return None
    if not rest:
        return version if not group else f"{group}/{version}"
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        inner = r.find(group, version, rest[2], minor)
        if inner is not None and inner.namespaced:
            namespace, rest = rest[1], rest[2:]
    rt = r.find(group, version, rest[0], minor)
    if rt is None or len(rest) > 3:
        return None
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if sub and sub != "status" and sub not in r.EXTRA_SUBRESOURCES.get(rt.key, ()):
        return None
    if sub == "status" and not rt.has_status:
        return None
    if name and rt.namespaced and not namespace:
        return None
    return Target(rt, namespace, name, sub)


def _verb(method: str, t: Target, query: dict[str, str]) -> str:
    if method == "GET":
        if t.name:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if t.name else "deletecollection",
    }.get(method, method.lower())


class ClusterApi:
    def __init__(
        self, store: Store, writes: WriteLog, faults: FaultInjector,
        kubelet: Kubelet | None = None, *, minor: int = r.DEFAULT_MINOR,
    ) -> None:
        self.store = store
        # The Kubernetes release the server poses as: it decides which APIs exist.
        self.minor = minor
        self.writes = writes
        self.faults = faults
        self.kubelet = kubelet
        self.tokens = TokenAuthority(store)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/sim/v1/writes", self._writes)
        app.router.add_route("*", "/sim/v1/faults", self._faults)
        app.router.add_route("*", "/sim/v1/nodes", self._machines)
        app.router.add_route("*", "/sim/v1/nodes/{node}/{command}", self._node_command)
        self.tokens.register(app)  # TokenRequest and TokenReview (sim/cluster/authn.py)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    # -- simulator control ------------------------------------------------------

    async def _writes(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.writes.clear()
            return _json({"cleared": True})
        if request.method != "GET":
            return _error(errors.method_not_allowed())
        return _json({"writes": [w.to_json() for w in self.writes.entries()]})

    async def _faults(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.faults.clear()
        elif request.method == "PUT":
            try:
                self.faults.configure(FaultConfig.model_validate(await request.json()))
            except ValueError as err:
                return _error(errors.bad_request(f"invalid fault rules: {err}"))
        elif request.method != "GET":
            return _error(errors.method_not_allowed())
        return _json(self.faults.describe())

    async def _machines(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return _error(errors.method_not_allowed())
        return _json({"nodes": self.kubelet.describe() if self.kubelet else {}})

    async def _node_command(self, request: web.Request) -> web.Response:
        """Script a node's machine: POST /sim/v1/nodes/{node}/{hang|replace|wedge|recover}
        (hang?hard=true: power lost now, no graceful shutdown)."""
        if request.method != "POST":
            return _error(errors.method_not_allowed())
        node, command = request.match_info["node"], request.match_info["command"]
        if command not in COMMANDS:
            return _error(errors.bad_request(
                f"unknown node command {command!r}: one of {', '.join(COMMANDS)}"))
        if self.kubelet is None or node not in self.kubelet.nodes:
            return _error(errors.not_found(r.NODES, node))
        hard = request.query.get("hard", "false")
        if hard not in ("true", "false") or (hard == "true" and command != "hang"):
            return _error(errors.bad_request(
                f"hard: {hard[:20]!r} is not allowed here (true or false, and only for hang)"))
        return _json(self.kubelet.command(node, cast(NodeCommand, command),
                                          hard=hard == "true"))

    # -- Kubernetes API ---------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == "/version":
            return _json(discovery.version(self.minor))
        if path == "/api":
            return _json(discovery.api_versions(f"{request.host}"))
        if path == "/apis":
            return _json(discovery.api_groups(self.minor))
        target = parse_target(path, self.minor)
        if isinstance(target, str):
            listing = discovery.resource_list(target, self.minor)
            return _json(listing) if listing else _error(errors.path_not_found())
        if target is None:
            return _error(errors.path_not_found())
        return await self._api(request, target)

    async def _api(self, request: web.Request, t: Target) -> web.StreamResponse:
        query = dict(request.query)
        verb = _verb(request.method, t, query)
        raw = await request.read() if request.method in MUTATING else b""
        resource = t.rt.plural + (f"/{t.sub}" if t.sub else "")
        fault = self.faults.decide(verb, resource, t.rt.plural, t.rt.group, t.namespace, t.name)
        response: web.StreamResponse | None = None
        if fault is not None:
            if fault.delay_seconds:
                await asyncio.sleep(fault.delay_seconds)
            if fault.drop:
                if request.transport is not None:
                    request.transport.close()
                self._log(request, t, verb, raw, 0, query)
                raise asyncio.CancelledError
            if fault.error is not None:
                response = _json(fault.error, fault.code, fault.headers)
        if response is None:
            response = await self._handle(request, t, verb, raw, query)
            if (isinstance(response, web.Response) and response.status < 300
                    and t.rt.storage_version):
                response = _as_requested_version(response, t.rt)
        if request.method in MUTATING:
            self._log(request, t, verb, raw, response.status, query, response)
        return response

    async def _handle(
        self, request: web.Request, t: Target, verb: str, raw: bytes, query: dict[str, str]
    ) -> web.StreamResponse:
        dry_run = query.get("dryRun") == "All"
        try:
            body: Any = None
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError as err:
                    raise errors.bad_request(f"error decoding request body: {err}") from err
            if verb == "get" and t.sub == "log":
                return self._pod_log(t, query)
            if verb in ("get", "list"):
                out = (handlers.get(self.store, t) if verb == "get"
                       else handlers.list_(self.store, t, query))
                # kubectl get asks for server-side printing, as from a real API server.
                if not t.sub and tables.wants_table(request.headers.get("Accept", "")):
                    return _json(tables.table(t.rt.plural, out))
                return _json(out)
            if verb == "watch":
                return await serve_watch(request, self.store, t, query)
            if verb == "create":
                code, out = handlers.create(self.store, t, body, dry_run)
                return _json(out, code)
            if verb == "update":
                return _json(handlers.update(self.store, t, body, dry_run))
            if verb == "patch":
                return _json(handlers.patch_(self.store, t, request.content_type, body, dry_run))
            if verb in ("delete", "deletecollection"):
                options = dict(body or {})
                for key in ("gracePeriodSeconds",):
                    if key in query:
                        options[key] = int(query[key])
                if "propagationPolicy" in query:
                    options["propagationPolicy"] = query["propagationPolicy"]
                if "orphanDependents" in query:
                    options["orphanDependents"] = query["orphanDependents"] == "true"
                dry_run = dry_run or "All" in (options.get("dryRun") or [])
                if verb == "delete":
                    return _json(handlers.delete(self.store, t, options, dry_run))
                return _json(handlers.delete_collection(self.store, t, query, options, dry_run))
            raise errors.method_not_allowed(t.rt)
        except errors.ApiError as err:
            return _error(err)

    def _pod_log(self, t: Target, query: dict[str, str]) -> web.Response:
        """GET pods/{name}/log: the container's stdout as the kubelet kept it."""
        pod = self.store.get(r.PODS, t.namespace, t.name)
        containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        name = query.get("container") or ""
        if not name:
            if len(containers) != 1:
                raise errors.bad_request(
                    f"a container name must be specified for pod {t.name}, choose one of: "
                    f"[{' '.join(containers)}]")
            name = containers[0]
        elif name not in containers:
            raise errors.bad_request(f"container {name} is not valid for pod {t.name}")
        if not (pod.get("spec") or {}).get("nodeName"):
            raise errors.bad_request(f"pod {t.name} does not have a host assigned")
        statuses = {cs.get("name"): cs for cs in
                    (pod.get("status") or {}).get("containerStatuses") or []}
        state = (statuses.get(name) or {}).get("state") or {}
        if not state or "waiting" in state:
            reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
            raise errors.bad_request(
                f'container "{name}" in pod "{t.name}" is waiting to start: {reason}')
        if query.get("previous") in ("true", "1"):
            raise errors.bad_request(
                f'previous terminated container "{name}" in pod "{t.name}" not found')
        text = ""
        if self.kubelet is not None:
            text = self.kubelet.logs.get(pod["metadata"]["uid"], {}).get(name, "")
        n = _int_query(query, "tailLines")
        if n is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-n:]) if n > 0 else ""
        cap = _int_query(query, "limitBytes")
        if cap is not None:
            if cap < 1:
                raise errors.bad_request("limitBytes: Invalid value: must be greater than 0")
            text = text.encode()[:cap].decode(errors="ignore")
        return web.Response(text=text, content_type="text/plain",
                            headers={"Audit-Id": str(uuid.uuid4()),
                                     "Cache-Control": "no-cache, private"})

    def _log(
        self,
        request: web.Request,
        t: Target,
        verb: str,
        raw: bytes,
        code: int,
        query: dict[str, str],
        response: web.StreamResponse | None = None,
    ) -> None:
        name = t.name
        if not name and verb == "create" and isinstance(response, web.Response) and response.text:
            try:
                name = json.loads(response.text).get("metadata", {}).get("name", "") or ""
            except ValueError:
                name = ""
        summary = raw.decode(errors="replace")[:300]
        if verb == "patch":
            summary = f"{request.content_type} {summary}"
        self.writes.record(
            WriteRecord(
                verb=verb,
                resource=t.rt.plural + (f"/{t.sub}" if t.sub else ""),
                namespace=t.namespace,
                name=name,
                time=clock.micro(),
                code=code,
                dry_run=query.get("dryRun") == "All"
                or '"dryRun": ["All"]' in summary
                or '"dryRun":["All"]' in summary,
                summary=summary,
            )
        )


def _as_requested_version(response: web.Response, rt: r.ResourceType) -> web.Response:
    """Objects stored under another version come back as the version that was asked for."""
    if not response.text:
        return response
    try:
        body = json.loads(response.text)
    except ValueError:
        return response
    if isinstance(body, dict):
        as_version(body, rt)
    response.text = json.dumps(body)
    return response


def _int_query(query: Any, name: str) -> int | None:
    """An integer query parameter (pods/log's tailLines, limitBytes), None when absent."""
    value = query.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as err:
        raise errors.bad_request(f"invalid {name}: {value}") from err
