"""The Job controller, the TTL-after-finished controller, and what Job pods run.

Job pods' behaviour is chosen by the pod label `gpu-remediate.io/job`:
`validate` asks the GPU simulator for node health (a container running `dcgmi` acts
out dcgmi: it needs a host engine, and prints `dcgmi diag -j` JSON; sim/cluster/dcgmi.py),
`gpu-reset` resets a GPU unless another pod on the node holds the GPUs (as
`nvidia-smi -r` refuses), `reboot` reboots the node's GPUs in the GPU simulator and the
machine (sim/cluster/machines.py: the command returns before the shutdown or is killed
by it), anything else succeeds after `job_seconds`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from sim.cluster import admission, clock, dcgmi, deletion, mig, objects
from sim.cluster import resources as r
from sim.cluster.defaults import GPU
from sim.cluster.gpulink import GpuLink
from sim.cluster.podutil import condition, is_ready, is_terminal, is_terminating, owned_by, phase
from sim.cluster.store import Obj, Store


@dataclass
class JobTiming:
    job_seconds: float = 2.0


class JobPrograms:
    """The containers of remediation Jobs, as coroutines returning (exit code, message)."""

    def __init__(self, gpu: GpuLink, timing: JobTiming, kubelet: Any) -> None:
        self.gpu = gpu
        self.timing = timing
        # The kubelet is only known after construction (it needs run() as its program).
        self.kubelet = kubelet

    async def run(self, pod: Obj) -> tuple[int, str]:
        labels = pod["metadata"].get("labels") or {}
        node = pod["spec"]["nodeName"]
        kind = labels.get(objects.JOB_LABEL, "")
        await asyncio.sleep(self.timing.job_seconds)
        if kind == "validate":
            missing = mig.missing_instances(self.kubelet.store, self.kubelet.machines, node)
            if missing is not None:
                self.kubelet.write_log(pod, missing + "\n")
                return 1, missing
            command = dcgmi.command_line(pod)
            if dcgmi.runs_dcgmi(command):
                return await self._dcgmi(pod, node, command)
            if dcgmi.runs_dcgmi(dcgmi.command_line(pod, resolve=False)):
                # A dcgmi script whose branch for this environment runs no dcgmi (no host
                # engine chosen): it proves nothing, and ends as its shell would.
                out = "no DCGM host engine chosen: the diagnostic did not run\n"
                self.kubelet.write_log(pod, out)
                return 3, out.strip()
            health = await self.gpu.health(node)
            return (0, "") if health.ok else (1, "; ".join(health.problems) or "GPU unhealthy")
        if kind == "gpu-reset":
            return await self._reset(pod, node)
        if kind == "reboot":
            outcome = await self.gpu.reboot(node)
            if not outcome.ok:
                return 1, "; ".join(outcome.problems)
            if self.kubelet.request_reboot(node):
                return 0, ""  # `systemctl reboot` returned before the shutdown began
            # The shutdown kills this container: the kubelet cancels it. Should that not
            # happen (the machine vanished), end as a killed process would.
            await asyncio.sleep(self.kubelet.timing.shutdown_seconds + 30.0)
            return 137, "killed by the node shutdown"
        return 0, ""


    async def _reset(self, pod: Obj, node: str) -> tuple[int, str]:
        """The reset container: `nvidia-smi --gpu-reset` is refused while another process
        holds a GPU, and while a target GPU has persistence mode on (nvidia-persistenced,
        which the GPU Operator's driver runs, holds it). A command that turns persistence
        off (`-pm 0`) before it resets does so for its targets only, and one that turns it
        back on (`-pm 1`) does so only where it was on."""
        index = _gpu_index(pod)
        uuids = _env(pod, "GPU_UUIDS")
        command = dcgmi.command_line(pod)
        holders = self.kubelet.gpu_holders(node, pod["metadata"]["uid"]) if self.kubelet else []
        gpus = await self.gpu.gpus(node)
        if holders:
            message = dcgmi.reset_in_use(index, self._gpu_count(node), holders, gpus or [])
            self.kubelet.write_log(pod, message + "\n")
            return dcgmi.SMI_IN_USE_EXIT, message
        # Without the GPU list (no GPU simulator to ask): the targets as named.
        named = [u.strip() for u in (uuids or "").replace(" ", ",").split(",") if u.strip()]
        targets: list[str | None] = list(named) or [index]
        was_on: list[str] = []
        if gpus is not None:
            by_uuid = {str(g.get("uuid")): g for g in gpus}
            by_index = {str(g.get("index")): g for g in gpus}
            if uuids:
                wanted = [u.strip() for u in uuids.replace(" ", ",").split(",") if u.strip()]
            elif index is not None:
                wanted = [str(by_index[index]["uuid"])] if index in by_index else [index]
            else:
                wanted = list(by_uuid)
            unknown = [u for u in wanted if u not in by_uuid]
            if unknown:
                message = f"No devices were found matching {', '.join(unknown)}"
                self.kubelet.write_log(pod, message + "\n")
                return dcgmi.SMI_NOT_FOUND_EXIT, message
            if dcgmi.turns_persistence_off(command):
                for u in wanted:
                    if by_uuid[u].get("persistence_mode"):
                        await self.gpu.persistence(node, u, False)
                        was_on.append(u)
            targets = list(wanted) if (uuids or index is not None) else [None]
        problems: list[str] = []
        cleared: list[dict[str, object]] = []
        for target in targets:
            outcome = await self.gpu.reset(node, target)
            problems += outcome.problems
            cleared += outcome.cleared
        if dcgmi.restores_persistence(command):
            for u in was_on:
                await self.gpu.persistence(node, u, True)
        if problems:
            message = "; ".join(problems)
            self.kubelet.write_log(pod, message + "\n")
            return 1, message
        # A reset destroys a MIG node's GPU and compute instances (MIG mode persists).
        mig.destroy_instances(self.kubelet.store, self.kubelet.machines, node)
        # The device plugin on the node (if one runs) saw the XIDs this reset cleared.
        xids: dict[int, list[int]] = {}
        for c in cleared:
            if c.get("kind") == "xid" and isinstance(c.get("gpu"), int) and c.get("value"):
                xids.setdefault(int(c["gpu"]), []).append(int(c["value"]))  # type: ignore[call-overload]
        if xids and self.kubelet is not None:
            self.kubelet.plugin_health({node: xids})
        done = "all GPUs" if targets == [None] else ", ".join(str(t) for t in targets)
        self.kubelet.write_log(pod, f"GPU {done} on {node} reset.\nAll done.\n")
        return 0, ""

    def _gpu_count(self, node: str) -> int:
        obj = self.kubelet.store.find(r.NODES, "", node) if self.kubelet else None
        if obj is None:
            return 0
        labels = obj["metadata"].get("labels") or {}
        declared = labels.get("nvidia.com/gpu.count")
        if declared and str(declared).isdigit():
            return int(declared)
        return int(((obj.get("status") or {}).get("capacity") or {}).get(GPU) or 0)

    async def _dcgmi(self, pod: Obj, node: str, command: str) -> tuple[int, str]:
        """A validation container running dcgmi: a client of nv-hostengine."""
        obj = self.kubelet.store.find(r.NODES, "", node) if self.kubelet else None
        driver = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(
            "nvidia.com/gpu.driver", dcgmi.DEFAULT_DRIVER)
        engine = dcgmi.host_engine(command)
        running = self._engines(node)
        if engine.embedded and running:
            code, out = dcgmi.second_engine(running)
        elif (not engine.embedded and engine.host is not None and self.kubelet is not None
                and not self._node_host_engine(node)):
            # --host reaches the node's standalone nv-hostengine: the nvidia-dcgm operand.
            code, out = dcgmi.unreachable_host(engine.host)
        else:
            health = None
            if (engine.embedded or engine.host is not None) and dcgmi.runs_diag(command):
                health = await self.gpu.health(node)
            code, out = dcgmi.run(command, engine, self._gpu_count(node), driver, health,
                                  dcgmi.gpu_list(command, _env_of(pod)))
        self.kubelet.write_log(pod, out)
        return code, dcgmi.termination_message(pod, code, out)

    def _engines(self, node: str) -> list[str]:
        """The host engine already running for the node's GPUs: the standalone nvidia-dcgm
        operand (starting, running or stopping), else the one dcgm-exporter embeds (until
        its pod is gone, Terminating or not); none when neither runs."""
        if self.kubelet is None:
            return []
        if self._node_host_engine(node) or any(
                (p.get("spec") or {}).get("nodeName") == node and not is_terminal(p)
                and (p["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm"
                for p in self.kubelet.store.list(r.PODS, "gpu-operator")):
            return ["the standalone nvidia-dcgm operand"]
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']} (embedded)"
                for p in self.kubelet.store.list(r.PODS)
                if (p.get("spec") or {}).get("nodeName") == node and not is_terminal(p)
                and (p["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm-exporter"]

    def _node_host_engine(self, node: str) -> bool:
        """The GPU Operator's nvidia-dcgm pod (the standalone nv-hostengine) runs on the node."""
        for p in self.kubelet.store.list(r.PODS, "gpu-operator"):
            if ((p.get("spec") or {}).get("nodeName") == node
                    and (p["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm"
                    and is_ready(p) and not is_terminating(p)):
                return True
        return False


def _cond(kind: str, reason: str, message: str, ts: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": ts, "lastTransitionTime": ts}


def _env(pod: Obj, name: str) -> str | None:
    for c in pod["spec"].get("containers") or []:
        for env in c.get("env") or []:
            if env.get("name") == name and env.get("value") not in (None, ""):
                return str(env["value"])
    return None


def _gpu_index(pod: Obj) -> str | None:
    value = _env(pod, "GPU_INDEX")
    if value is not None:
        return value
    label = (pod["metadata"].get("labels") or {}).get(objects.GPU_LABEL)
    return str(label) if label else None


@dataclass
class _Tracking:
    """Pods counted for a Job, like the job-tracking finalizer makes durable."""

    seen: set[str] = field(default_factory=set)
    succeeded: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)


INTERIM = {"Complete": "SuccessCriteriaMet", "Failed": "FailureTarget"}
"""Since Kubernetes 1.31 the Job controller first adds the interim condition, and the
terminal one only once every pod of the Job has terminated (KEP-4368)."""


def _finished(job: Obj) -> str | None:
    for kind in ("Complete", "Failed"):
        c = condition(job, kind)
        if c and c.get("status") == "True":
            return kind
    return None


def _interim(job: Obj) -> str | None:
    """The terminal condition the Job is bound for (its interim one is set), or None."""
    for kind, interim in INTERIM.items():
        c = condition(job, interim)
        if c and c.get("status") == "True":
            return kind
    return None


class JobController:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._tracking: dict[str, _Tracking] = {}

    def reconcile(self, now: float) -> None:
        for job in self.store.list(r.JOBS):
            if is_terminating(job):
                continue
            done = _finished(job)
            if done:
                self._ttl(job, done, now)
                continue
            self._sync(job, now)

    def _ttl(self, job: Obj, done: str, now: float) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        cond = condition(job, done) or {}
        finished_at = job["status"].get("completionTime") or cond.get("lastTransitionTime")
        if finished_at and now >= clock.parse(finished_at) + int(ttl):
            m = job["metadata"]
            deletion.delete(
                self.store, r.JOBS, m["namespace"], m["name"], {"propagationPolicy": "Foreground"}
            )

    def _sync(self, job: Obj, now: float) -> None:
        m, spec = job["metadata"], job["spec"]
        track = self._tracking.setdefault(m["uid"], _Tracking())
        pods = [p for p in self.store.list(r.PODS, m["namespace"]) if owned_by(p, job)]
        present = {p["metadata"]["uid"] for p in pods}
        for p in pods:
            uid = p["metadata"]["uid"]
            track.seen.add(uid)
            if phase(p) == "Succeeded":
                track.succeeded.add(uid)
            elif phase(p) == "Failed":
                track.failed.add(uid)
        # A pod that vanished before finishing counts as failed, as with tracking finalizers.
        for uid in track.seen - present - track.succeeded:
            track.failed.add(uid)
        active = [p for p in pods if not is_terminal(p) and not is_terminating(p)]
        terminating = [p for p in pods if is_terminating(p) and not is_terminal(p)]
        status = dict(job.get("status") or {})
        # A copy: appending to the stored list would make the change invisible below.
        status["conditions"] = list(status.get("conditions") or [])
        ts = clock.rfc3339(now)
        bound = _interim(job)
        if bound is not None:
            self._finishing(job, status, pods, bound, track, ts)
            return
        if spec.get("suspend"):
            for p in active:
                deletion.delete_pod(self.store, p, None)
            active = []
        elif not status.get("startTime"):
            status["startTime"] = ts
        completions = int(spec.get("completions") or 1)
        parallelism = int(spec.get("parallelism") or 1)
        deadline = spec.get("activeDeadlineSeconds")
        verdict: tuple[str, str, str] | None = None
        if len(track.succeeded) >= completions:
            verdict = (
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
        elif len(track.failed) > int(spec.get("backoffLimit", 6)):
            verdict = (
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
        elif (
            deadline is not None
            and status.get("startTime")
            and (now >= clock.parse(status["startTime"]) + int(deadline))
        ):
            verdict = (
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )
        if verdict is not None:
            for p in active:
                deletion.delete_pod(self.store, p, None)
            terminating += active
            active = []
            self._finish(status, verdict, ts)
            if not terminating:
                # Every pod has terminated already: both conditions in the same update.
                self._terminal(status, verdict[0], ts)
        elif not spec.get("suspend"):
            missing = min(parallelism, completions - len(track.succeeded)) - len(active)
            for _ in range(max(0, missing)):
                pod = self._create_pod(job)
                if pod is None:
                    break
                active.append(pod)
        status.update(
            {
                "active": len(active),
                "ready": sum(1 for p in active if is_ready(p)),
                "succeeded": len(track.succeeded),
                "failed": len(track.failed),
                "terminating": len(terminating),
                "uncountedTerminatedPods": {},
            }
        )
        for key in ("active", "succeeded", "failed", "terminating", "conditions"):
            if not status.get(key):
                status.pop(key, None)
        if status != job.get("status"):
            job["status"] = status
            self.store.put_internal(r.JOBS, job)

    def _finish(self, status: dict[str, Any], verdict: tuple[str, str, str], ts: str) -> None:
        """The verdict: only the interim condition now. The terminal one follows in
        `_finishing`, once no pod of the Job is left running or terminating."""
        kind, reason, message = verdict
        status.setdefault("conditions", []).append(_cond(INTERIM[kind], reason, message, ts))

    @staticmethod
    def _terminal(status: dict[str, Any], kind: str, ts: str) -> None:
        conds = status.setdefault("conditions", [])
        interim: dict[str, Any] = next(
            (c for c in conds if c.get("type") == INTERIM[kind]), {})
        conds.append(_cond(kind, interim.get("reason", ""), interim.get("message", ""), ts))
        if kind == "Complete":
            status["completionTime"] = ts

    def _finishing(self, job: Obj, status: dict[str, Any], pods: list[Obj], kind: str,
                   track: _Tracking, ts: str) -> None:
        """A Job past its verdict: its remaining pods are told to stop; the terminal
        condition is added only once none is left but terminal ones. A pod on a node
        that lost power never terminates (its kubelet cannot confirm), so neither does
        the Job, until the pod is force-deleted (node deleted, or out-of-service)."""
        live = [p for p in pods if not is_terminal(p)]
        for p in live:
            if not is_terminating(p):
                deletion.delete_pod(self.store, p, None)
        if not live:
            self._terminal(status, kind, ts)
        status.update({"active": 0, "ready": 0, "succeeded": len(track.succeeded),
                       "failed": len(track.failed), "terminating": len(live)})
        for key in ("active", "succeeded", "failed", "terminating", "conditions"):
            if not status.get(key):
                status.pop(key, None)
        if status != job.get("status"):
            job["status"] = status
            self.store.put_internal(r.JOBS, job)

    def _create_pod(self, job: Obj) -> Obj | None:
        """The Job's next pod, or None where admission refuses it (a RuntimeClass the
        cluster lacks): the Job then has no pod until its deadline fails it."""
        m = job["metadata"]
        pod = objects.pod_from_template(
            job["spec"]["template"], m["namespace"], f"{m['name']}-{objects.suffix()}", job, r.JOBS
        )
        if admission.pod_refusal(self.store, pod) is not None:
            return None
        return self.store.create(r.PODS, pod)


def _env_of(pod: Obj) -> dict[str, str]:
    """The environment of the pod's first container (the Job's one)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return {str(e.get("name")): str(e.get("value", "")) for e in containers[0].get("env") or []
            if "value" in e}
