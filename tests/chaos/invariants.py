"""A background checker that samples the cluster and Temporal while chaos runs and
records every breach of the invariants (docs/architecture.md, "Invariants"):

- budget: never more nodes out of service by us than ``max_unavailable``;
- ownership: no node carries our label or taint without a running remediation
  workflow for longer than ``grace`` (the window of a claim or a release in flight);
- hands off: a node an admin cordoned stays cordoned;
- no data, no action: a node whose exporter was unreadable before its fault is never
  claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.node_keys import STATE_LABEL, TAINT_KEY
from tests.e2e.kit import OUT_OF_SERVICE, Cluster
from worker.config import TemporalSettings
from worker.stack import LocalStack
from worker.temporal_client import connect
from workflows.ids import remediation_workflow_id


@dataclass
class InvariantChecker:
    stack: LocalStack
    max_unavailable: int
    grace: float = 20.0
    every: float = 0.3
    admin_cordoned: set[str] = field(default_factory=set)
    unreadable: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    max_out: int = 0
    _ownerless_since: dict[str, float] = field(default_factory=dict)
    _reported: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> InvariantChecker:
        self._thread = threading.Thread(target=self._run, name="invariants", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> InvariantChecker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _violate(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self.violations.append(f"{time.strftime('%H:%M:%S')} {message}")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        k8s = Cluster(self.stack)
        temporal: Client | None = None
        try:
            while not self._stop.is_set():
                if temporal is None:
                    with contextlib.suppress(Exception):
                        temporal = loop.run_until_complete(
                            connect(TemporalSettings(address=self.stack.temporal_address)))
                with contextlib.suppress(Exception):  # an API fault or a restart: next sample
                    self._sample(k8s, loop, temporal)
                self._stop.wait(self.every)
        finally:
            loop.close()

    def _running(self, loop: asyncio.AbstractEventLoop, temporal: Client | None,
                 node: str) -> bool | None:
        if temporal is None:
            return None
        try:
            desc = loop.run_until_complete(asyncio.wait_for(
                temporal.get_workflow_handle(remediation_workflow_id(node)).describe(), 5))
        except RPCError as err:
            return False if err.status == RPCStatusCode.NOT_FOUND else None
        except Exception:
            return None  # the server is restarting: no data, no verdict
        return desc.status == WorkflowExecutionStatus.RUNNING

    def _sample(self, k8s: Cluster, loop: asyncio.AbstractEventLoop,
                temporal: Client | None) -> None:
        nodes = k8s.core.list_node(_request_timeout=5).items
        now = time.monotonic()
        out = []
        for n in nodes:
            name = n.metadata.name
            state = (n.metadata.labels or {}).get(STATE_LABEL, "healthy")
            tainted = any(t.key == TAINT_KEY for t in n.spec.taints or [])
            if state in OUT_OF_SERVICE:
                out.append(name)
            if name in self.admin_cordoned and not n.spec.unschedulable:
                self._violate(f"admin:{name}", f"{name}: the admin's cordon was undone")
            if name in self.unreadable and (state != "healthy" or tainted):
                self._violate(f"unreadable:{name}",
                              f"{name}: claimed ({state}) while its exporter was unreadable")
            if state != "healthy" or tainted:
                running = self._running(loop, temporal, name)
                if running is False:
                    since = self._ownerless_since.setdefault(name, now)
                    if now - since > self.grace:
                        self._violate(f"owner:{name}:{since}",
                                      f"{name}: {state} (taint {tainted}) without a running "
                                      f"workflow for {now - since:.0f}s")
                elif running:
                    self._ownerless_since.pop(name, None)
            else:
                self._ownerless_since.pop(name, None)
        self.max_out = max(self.max_out, len(out))
        if len(out) > self.max_unavailable:
            self._violate(f"budget:{int(now)}",
                          f"budget exceeded: {len(out)} > {self.max_unavailable}: {sorted(out)}")
        self.samples += 1
