"""A scraped dcgm-exporter body -> one node's GPU readings, here or in a helper process.

``read_body`` is the CPU part of ``FleetActivities.scrape`` (corruption check, parse, the choice
of this node's series), on the undecoded body. It returns plain ``GpuReading`` keyword arguments
rather than models, so that it can run in another process and send back a compact result.

``ParsePool`` runs ``read_body`` in one helper process (``python -c`` importing only this module
and the parser, never the caller's ``__main__``), fed over its stdin and read over its stdout
from the event loop: no executor threads, no fork of a multi-threaded worker. Bodies travel in
batches; while the helper starts, and whenever it is busier than this process, bodies are read
here instead, so the two cores share the work. The helper exits when its stdin closes (at
``close``, or when this process dies); a helper that fails is dropped and the work continues
here. Every body gets the result or the error it would get without the pool.

Deliberately not here: anything of Kubernetes, Temporal or aiohttp, so the helper starts fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pickle
import signal
import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO

from activities.exposition import (
    NODE_LIMITS,
    ExpositionError,
    check_body,
    parse_gpu_fields,
)
from activities.exposition import looks_intact as looks_intact  # re-exported: one check

log = logging.getLogger(__name__)

GpuFields = dict[str, Any]
"""``GpuReading`` keyword arguments, exactly the types it declares."""

Outcome = tuple[int, Any]
"""(_OK, fields) | (_BAD, BodyError message) | (_RAISED, another exception) | _RETRY."""

PARSE_ON_LOOP_BYTES = 256 * 1024
"""Bodies up to this size (a few ms of parsing) are parsed on the event loop; larger ones in a
thread, or in the helper process."""


class BodyError(ValueError):
    """The body is not one usable exposition of the node; the message is the scrape error."""


def read_body(raw: bytes, node: str) -> list[GpuFields]:
    """The GPUs of ``node`` in one scraped body, as ``FleetActivities.scrape`` reads them.

    ``BodyError`` when the body must not be judged: cut or corrupted, not dcgm-exporter text,
    unparsable lines, other hosts only, no GPU series, over one of the caps of ``NODE_LIMITS``
    (bytes, lines, health samples, GPUs). ``evaluate`` refuses the same bodies
    (``exposition.check_body``).
    """
    try:
        check_body(raw, NODE_LIMITS)
        hosts, bad_lines = parse_gpu_fields(raw, default_node=node, limits=NODE_LIMITS)
    except ExpositionError as err:
        raise BodyError(str(err)) from None
    if bad_lines:
        raise BodyError(f"{bad_lines} unparsable lines in the exposition")
    # One host in the exposition: it is this node's exporter, whatever its Hostname label
    # says (without hostNetwork that is the exporter pod's name). Several hosts (a federating
    # endpoint): keep only this node's series.
    mine = hosts
    if len(hosts) > 1:
        mine = [h for h in hosts if h[0] == node]
        if not mine:
            raise BodyError(f"the exposition holds {len(hosts)} hosts, none named {node}")
    gpus: dict[str, GpuFields] = {}
    for _, fields in mine:
        for gpu in fields:
            gpus[gpu["uuid"] or gpu["gpu"]] = gpu
    if not gpus:
        raise BodyError("no GPU series in the exposition")
    return list(gpus.values())


# --- the helper process -----------------------------------------------------------------------

# A frame is an 8-byte little-endian length and that many bytes of pickle.
_HEADER = struct.Struct("<Q")
_OK, _BAD, _RAISED, _AGAIN = 0, 1, 2, 3
_RETRY: Outcome = (_AGAIN, None)
"""Set on a body the helper will not answer: read it here."""


def _outcome(raw: bytes, node: str) -> Outcome:
    try:
        return _OK, read_body(raw, node)
    except BodyError as err:
        return _BAD, str(err)
    except Exception as err:  # re-raised for that body in the caller, as without the pool
        return _RAISED, err


def _read_frame(stream: BinaryIO) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    return data if len(data) == size else None


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The helper's loop: batches of (node, body) in, a list of outcomes out, until EOF."""
    # Ctrl-C in a terminal reaches the whole process group: the worker decides when the
    # helper stops (by closing its stdin), and a dead worker closes it too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (frame := _read_frame(stdin)) is not None:
        batch: list[tuple[str, bytes]] = pickle.loads(frame)
        outcomes = [_outcome(raw, node) for node, raw in batch]
        try:
            out = pickle.dumps(outcomes, protocol=5)
        except Exception:  # an exception that does not pickle: the caller raises it itself
            out = pickle.dumps([_RETRY if o[0] == _RAISED else o for o in outcomes], protocol=5)
        stdout.write(_HEADER.pack(len(out)))
        stdout.write(out)
        stdout.flush()


def _helper_command() -> list[str]:
    # Import this module by path root, not through the caller's __main__ or working directory.
    root = str(Path(__file__).resolve().parents[1])
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from activities.parse_pool import serve; "
        "serve(sys.stdin.buffer, sys.stdout.buffer)"
    )
    return [sys.executable, "-c", code, root]


def default_workers() -> int:
    """Helper processes worth starting here: one when there is a core to spare."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return 1 if cores > 1 else 0


class ParsePool:
    """``read_body`` spread over this process and one helper process.

    Use from one event loop: ``start()``, then ``await pool.read(raw, node)`` per body, and
    ``await pool.close()`` once (on error paths too). ``batch`` bodies go to the helper
    together; a batch waits at most ``linger`` seconds for more. Bodies are read here while the
    helper starts, after it failed, and whenever ``max_batches`` batches are already queued
    there (so both processes stay busy and neither queue grows).
    """

    def __init__(self, *, batch: int = 16, linger: float = 0.002, max_batches: int = 8) -> None:
        self.batch = batch
        self.linger = linger
        self.max_batches = max_batches
        self.helped = 0
        """Bodies the helper read."""
        self.here = 0
        """Bodies read in this process."""
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = False
        self._closing = False
        self._failed = False
        self._pending: list[tuple[str, bytes, asyncio.Future[Outcome]]] = []
        self._waiting: list[list[asyncio.Future[Outcome]]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._starting: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def capacity(self) -> int:
        """Bodies that can wait on the helper at once (beyond that they are read here)."""
        return (self.max_batches + 1) * self.batch

    @property
    def pid(self) -> int | None:
        """The helper's process id, once started."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the helper in the background; until it is ready, bodies are read here."""
        self._starting = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> None:
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *_helper_command(), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=1 << 20)
            _grow_pipe(self._proc)
            # An empty batch there and back: the helper has imported the parser.
            self._send([])
            await self._receive()
        except Exception as err:  # the helper is an optimisation: never fail a scrape for it
            self._fail(err)
            return
        if not self._closing:
            self._ready = True
            self._reader = asyncio.get_running_loop().create_task(self._read_results())

    def _send(self, batch: list[tuple[str, bytes]]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        frame = pickle.dumps(batch, protocol=5)
        self._proc.stdin.write(_HEADER.pack(len(frame)) + frame)

    async def _receive(self) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        (size,) = _HEADER.unpack(await self._proc.stdout.readexactly(_HEADER.size))
        return pickle.loads(await self._proc.stdout.readexactly(size))

    async def _read_results(self) -> None:
        try:
            while True:
                outcomes = await self._receive()
                for future, outcome in zip(self._waiting.pop(0), outcomes, strict=True):
                    if not future.done():
                        future.set_result(outcome)
        except Exception as err:  # EOF, a dead helper, a garbled frame
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        """The helper is gone or broke: what it still owed, and all the rest, is read here."""
        if not self._closing and not self._failed:
            log.warning("parse helper process failed (%r); parsing in this process", err)
        self._failed = True
        self._ready = False
        for futures in self._waiting:
            for future in futures:
                if not future.done():
                    future.set_result(_RETRY)
        self._waiting.clear()
        self._flush()

    async def read(self, raw: bytes, node: str) -> list[GpuFields]:
        """``read_body(raw, node)``: the same fields or the same exception, wherever it ran."""
        if not self._ready or len(self._waiting) >= self.max_batches:
            return await self._here(raw, node)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._pending.append((node, raw, future))
        if len(self._pending) >= self.batch:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = loop.call_later(self.linger, self._flush)
        kind, value = await future
        if kind == _AGAIN:
            return await self._here(raw, node)
        self.helped += 1
        if kind == _BAD:
            raise BodyError(value)
        if kind == _RAISED:
            raise value
        fields: list[GpuFields] = value
        return fields

    async def _here(self, raw: bytes, node: str) -> list[GpuFields]:
        self.here += 1
        if len(raw) > PARSE_ON_LOOP_BYTES:
            # Not on the event loop: health checks and the other scrapes keep running (the
            # GIL is handed over every 5 ms).
            return await asyncio.to_thread(read_body, raw, node)
        return read_body(raw, node)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        futures = [future for *_, future in pending]
        if self._ready:
            try:
                self._send([(node, raw) for node, raw, _ in pending])
            except Exception as err:  # the pipe closed under us
                self._waiting.append(futures)
                self._fail(err)
                return
            self._waiting.append(futures)
            return
        for future in futures:
            future.set_result(_RETRY)

    async def close(self) -> None:
        """Stop the helper and wait until it has exited. Bodies it still owed are read here."""
        self._closing = True
        self._ready = False
        self._flush()
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()  # the helper answers what it has, then exits on EOF
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail(RuntimeError("closed"))


def _grow_pipe(proc: asyncio.subprocess.Process) -> None:
    """Let a whole batch of bodies sit in the pipe to the helper: fewer wake-ups on both sides."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    pipe = proc.stdin.get_extra_info("pipe") if proc.stdin is not None else None
    if setsize is None or pipe is None:
        return
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), setsize, 1 << 20)
