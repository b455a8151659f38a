"""The node watcher (worker/watch): following a kernel log, reading its Xid lines with the
probe's parser, and reporting without ever blocking (dedupe, rate limit, bounded queue,
retries)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.polling import wait_for
from worker.watch.follow import MAX_LINE_BYTES, follow, kmsg_line
from worker.watch.reporter import Reporter, ReporterSettings
from worker.watch.watcher import Watcher, WatchSettings

XID_79 = ("[ 8123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
          "GPU has fallen off the bus.")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def settings(tmp_path: Path, **kw: Any) -> ReporterSettings:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("token-1\n")
    return ReporterSettings(url="https://worker.test/v1/reports", token_file=token, **kw)


class Worker:
    """A fake endpoint: answers from a script, records what it got."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = statuses or []
        self.got: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.got.append((request.headers["Authorization"], json.loads(request.content)))
        status = self.statuses.pop(0) if self.statuses else 202
        return httpx.Response(status, json={})


def reporter(tmp_path: Path, worker: Worker, clock: Clock | None = None,
             **kw: Any) -> tuple[Reporter, list[float]]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    r = Reporter(settings(tmp_path, **kw), transport=httpx.MockTransport(worker),
                 clock=clock or Clock(), sleep=sleep)
    return r, slept


def watcher(tmp_path: Path, r: Reporter) -> Watcher:
    return Watcher(WatchSettings(node="node-a", reporter=r.settings,
                                 kernel_log=tmp_path / "kern.log"), reporter=r)


# ---------------------------------------------------------------- lines


def test_an_xid_line_becomes_a_report_for_this_node_naming_the_gpus_bus(tmp_path: Path) -> None:
    r, _ = reporter(tmp_path, Worker())
    w = watcher(tmp_path, r)
    w.on_line(XID_79)
    report = r.queue.get_nowait()
    assert (report["node"], report["gpu"], report["xid"]) == ("node-a", "00000000:18:00.0", 79)
    assert report["line"] == XID_79


def test_with_nvml_the_gpu_is_named_by_uuid_for_kernel_lines_too(tmp_path: Path) -> None:
    r, _ = reporter(tmp_path, Worker())
    w = watcher(tmp_path, r)
    w.uuid_of = {"00000000:18:00.0": "GPU-abc"}
    w.on_line(XID_79)
    w.on_nvml("GPU-abc", 79, "NVML: XID 79 on GPU-abc")
    assert r.queue.qsize() == 1 and r.queue.get_nowait()["gpu"] == "GPU-abc"


@pytest.mark.parametrize("line", [
    "[ 8123.4] NVRM: Xid (PCI:0000:18:0",  # truncated mid-address
    "[ 8123.4] NVRM: Xid (PCI:0000:18:00): ",  # truncated before the number
    "[ 8123.4] NVRM: Xi[ 8123.5] usb 1-1: new device",  # interleaved with another CPU's line
    "[ 8123.4] NVRM: GPU at PCI:0000:18:00: GPU-abc",
    "[ 8123.4] eth0: link up",
    "",
])
def test_a_line_the_parser_cannot_read_is_no_report(tmp_path: Path, line: str) -> None:
    r, _ = reporter(tmp_path, Worker())
    watcher(tmp_path, r).on_line(line)
    assert r.queue.empty()


def test_a_line_repeated_a_million_times_is_one_report(tmp_path: Path) -> None:
    clock = Clock()
    r, _ = reporter(tmp_path, Worker(), clock, dedupe_seconds=10)
    w = watcher(tmp_path, r)
    for i in range(10_000):  # through the parser
        w.on_line(XID_79.replace("8123", str(i)))
    for _ in range(1_000_000 - 10_000):  # the rest straight to the reporter
        r.offer("00000000:18:00.0", 79, lambda: pytest.fail("a repeat is not built"))
    assert r.queue.qsize() == 1 and r.counts.deduplicated == 999_999
    clock.t += 10  # the same fault printed again later is reported again
    w.on_line(XID_79)
    assert r.queue.qsize() == 2


def test_many_different_xids_are_rate_limited_and_the_queue_is_bounded(tmp_path: Path) -> None:
    clock = Clock()
    r, _ = reporter(tmp_path, Worker(), clock, burst=10, per_second=2, queue_size=64)
    w = watcher(tmp_path, r)
    for i in range(1000):
        w.on_line(f"[ 1.0] NVRM: Xid (PCI:0000:{i % 256:02x}:00): {i + 1}, pid=1")
    assert r.queue.qsize() == 10 and r.counts.rate_limited == 990
    for step in range(200):  # the worker does not read: the queue fills, offers drop
        clock.t += 1.0
        w.on_line(f"[ 1.0] NVRM: Xid (PCI:0000:18:00): {2000 + step}, pid=1")
    assert r.queue.qsize() == 64 and r.counts.dropped > 0


def test_kmsg_records_read_as_dmesg_prints_them() -> None:
    record = b"3,1234,8123456789,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1\n SUBSYSTEM=pci\n"
    assert kmsg_line(record) == "[ 8123.456789] NVRM: Xid (PCI:0000:18:00): 48, pid=1"
    assert kmsg_line(b"garbage") == "garbage"


# ---------------------------------------------------------------- following a file


def _follow(path: Path, **kw: Any) -> tuple[list[str], threading.Event, threading.Thread]:
    lines: list[str] = []
    stop, opened = threading.Event(), threading.Event()
    t = threading.Thread(target=follow, args=(path, lines.append, stop),
                         kwargs={**kw, "opened": opened}, daemon=True)
    t.start()
    assert opened.wait(10)
    return lines, stop, t


def test_follow_starts_at_the_end_and_reads_appended_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, old\n")
    lines, stop, t = _follow(log)
    try:
        with log.open("a") as f:
            f.write("[ 2.0] NVRM: Xid (PCI:0000:18:00): 48, ")  # half a line: not yet
            f.flush()
            with log.open("a") as g:
                g.write("new\n")
        wait_for(lambda: lines, timeout=10)
        assert lines == ["[ 2.0] NVRM: Xid (PCI:0000:18:00): 48, new"]
    finally:
        stop.set()
        t.join(5)


def test_follow_from_start_reads_what_is_there(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a\nb\n")
    lines, stop, t = _follow(log, from_start=True)
    try:
        wait_for(lambda: len(lines) == 2, timeout=10)
    finally:
        stop.set()
        t.join(5)


def test_follow_reopens_a_truncated_or_rotated_log_and_cuts_long_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x" * 1000 + "\n")
    lines, stop, t = _follow(log)
    try:
        log.write_text("")  # truncated
        rotated = tmp_path / "kern.log.new"
        rotated.write_text("after rotation\n" + "y" * (MAX_LINE_BYTES * 3) + "\nend\n")
        rotated.replace(log)
        wait_for(lambda: "end" in lines, timeout=10)
        assert lines[0] == "after rotation"
        assert lines[1] == "y" * MAX_LINE_BYTES
        assert lines[-1] == "end"
    finally:
        stop.set()
        t.join(5)


def test_the_watcher_reports_a_line_appended_to_its_log(tmp_path: Path) -> None:
    worker = Worker()
    r, _ = reporter(tmp_path, worker)
    log = tmp_path / "kern.log"
    log.write_text("")
    w = Watcher(WatchSettings(node="node-a", reporter=r.settings, kernel_log=log), reporter=r)

    async def append_until_reported() -> None:
        # Until the watcher has the log open a line may land before its starting point:
        # the same line again is one report (deduplicated), so write it until one arrives.
        while not worker.got:
            with log.open("a") as f:
                f.write(XID_79 + "\n")
            await asyncio.sleep(0.05)

    async def go() -> None:
        task = asyncio.create_task(w.run())
        try:
            await asyncio.wait_for(append_until_reported(), 30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    auth, body = worker.got[0]
    assert auth == "Bearer token-1" and body["xid"] == 79 and body["node"] == "node-a"


def test_an_unreadable_log_ends_the_watcher_with_the_error(tmp_path: Path) -> None:
    r, _ = reporter(tmp_path, Worker())
    w = Watcher(WatchSettings(node="node-a", reporter=r.settings,
                              kernel_log=tmp_path / "missing"), reporter=r)
    with pytest.raises(FileNotFoundError):
        asyncio.run(w.run())


# ---------------------------------------------------------------- sending


async def test_retries_with_backoff_what_the_worker_cannot_take_yet(tmp_path: Path) -> None:
    worker = Worker([503, 429, 503, 202])
    r, slept = reporter(tmp_path, worker)
    assert await r.send({"gpu": "0", "xid": 79})
    assert slept == [0.2, 0.4, 0.8] and r.counts.sent == 1 and len(worker.got) == 4


async def test_gives_up_on_a_refusal_and_after_the_last_attempt(tmp_path: Path) -> None:
    worker = Worker([403])
    r, slept = reporter(tmp_path, worker)
    assert not await r.send({"gpu": "0", "xid": 79})
    assert r.counts.refused == 1 and slept == []
    worker.statuses = [503] * 20
    r2, slept2 = reporter(tmp_path, worker, max_attempts=5, max_backoff_seconds=0.5)
    assert not await r2.send({"gpu": "0", "xid": 79})
    assert slept2 == [0.2, 0.4, 0.5, 0.5] and r2.counts.dropped == 1


async def test_the_token_is_read_again_for_each_report(tmp_path: Path) -> None:
    worker = Worker()
    r, _ = reporter(tmp_path, worker)
    await r.send({"gpu": "0", "xid": 79})
    (tmp_path / "token").write_text("token-2")  # the kubelet rotated it
    await r.send({"gpu": "0", "xid": 48})
    assert [a for a, _ in worker.got] == ["Bearer token-1", "Bearer token-2"]


async def test_an_unreachable_worker_is_retried_not_raised(tmp_path: Path) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    r = Reporter(settings(tmp_path, max_attempts=3), transport=httpx.MockTransport(down),
                 sleep=sleep)
    assert not await r.send({"gpu": "0", "xid": 79})
    assert len(slept) == 2 and r.counts.dropped == 1
