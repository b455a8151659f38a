"""``dcgmi diag -j`` output as evidence: which test passed or failed on which GPU.

The validation Job runs ``nv-hostengine ...; dcgmi diag -r 2 -j`` and the worker reads the pod's
log. ``parse_dcgmi_json`` turns that log into a ``DiagReport``; the remediation decides with
``DiagReport.passed`` and records ``DiagReport.summary()``. A node is returned to service on this
evidence, so anything this module does not understand must come out as *not passed* (or as
``DiagUnparseable``), never as a pass.

Both shapes dcgmi writes are read:

* DCGM 3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_id": "0", "status": "Pass", "warnings": [...], "info": ...}]}]}]}}``.
* DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": [... "results": [{"entity_group": "GPU",
  "entity_group_id": 1, "entity_id": 0, "status": "Pass", "warnings": [{"warning", "error_id",
  "error_category", "error_severity"}], "info": [...]}], "test_summary": {"status": ...}}]},
  "metadata": {"version": "4.2.3", ...}, "entity_groups": [...]}``.

Quirks of the real output (dcgmi's own JSON writer and DCGM's tests and schema), and what we do:

* dcgmi writes the result *Warn* as ``"Fail"`` in JSON (3.x and 4.x; only the text table says
  "Warn"). We read ``"Warn"`` when it appears, but a DCGM warning normally arrives as a fail.
* Results that did not run are left out (4.x also drops the ``test_summary`` of a test that did
  not run), so a test can carry no ``results`` at all: it becomes one ``not-run`` result, or its
  ``test_summary`` when there is one. ``"Not Run"`` is read where an older writer prints it.
* 4.x puts errors that belong to no entity only in the test's ``test_summary``; a summary worse
  than every entity result of its test is kept as an extra result with ``gpu=None``.
* The version sits in different places: at the root (3.x dcgmi), inside the diagnostic object
  (3.x nvvs, and the ``runtime_error`` document), in a root ``metadata`` (4.x) or a ``metadata``
  inside the diagnostic object. All are read. The output never says the level (``-r``): the caller
  passes the level it asked for.
* 3.x nvvs writes ``"gpu_ids"`` as ``"0,1,2,3"`` or as a bare integer, statuses in capitals
  (``"PASS"``), and sparse arrays with ``null`` entries (jsoncpp); 3.x dcgmi writes a deployment
  test's warning text under ``"warnings"`` instead of ``"warning"`` and its ``gpu_id`` as an
  integer. All read. The 3.x CPU EUD test names ``cpu_id`` and may say ``"Skip - All"``.
* A diagnostic that could not run prints only ``{"DCGM ...": {"version", "runtime_error"}}``:
  ``DiagUnparseable`` with DCGM's message. ``dcgmi diag -i N`` wraps each run in
  ``{"iterations": [...], "Overall Result": ...}``: the runs' results are merged.

Decisions:

* Entities that are not GPUs (4.x ``CPU``, ``Switch``, ...; 3.x ``cpu_id``) are kept with
  ``gpu=None`` and the entity named at the start of ``message`` (``"CPU 0: ..."``): a failing CPU
  test is still a reason not to return the node, and dropping it would turn a fail into a pass.
* A status this module does not know (a newer DCGM, a typo, an empty string) is a ``fail`` whose
  message says so: it must never count as a pass, and a human should look.
* A document of the right shape but the wrong types (``test_categories`` not a list, a status
  that is a number, a GPU id that is not a number, a result that is not an object) is rejected
  whole with ``DiagUnparseable``: output dcgmi did not write is no evidence about the node.
* Duplicate keys, ``NaN``/``Infinity``, nesting deeper than the interpreter allows and input over
  ``max_bytes`` are rejected before any result is read.
* When the log holds more than one diagnostic document (a retried container), the last one wins.

Pure: stdlib and pydantic only, imported by the Temporal workflow sandbox.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Status = Literal["pass", "fail", "warn", "skip", "not-run"]

DIAG_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
"""The root key of dcgmi's diagnostic document: 4.x, then 3.x."""

MESSAGE_MAX = 300
EXCERPT_MAX = 200
_NAME_MAX = 120
_CODE_MAX = 64
_CODES_MAX = 8
_MAX_GPU_ID = 4096
_SCAN_BUDGET_FACTOR = 32
_SCAN_BUDGET_FLOOR = 32_000_000
"""The JSON search reads at most this many times the input (plus the floor) before it gives up:
a log full of almost-JSON must not cost quadratic time."""
_MAX_CANDIDATES = 10_000
"""At most this many ``{`` are decoded: a real log has a handful before dcgmi's JSON."""
_OBJECT_START = re.compile(r'\{\s*["}]')
"""Where a JSON object may start: only these ``{`` are handed to the decoder."""

_STATUS_WORDS: dict[str, Status] = {
    "pass": "pass",
    "passed": "pass",
    "fail": "fail",
    "failed": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "not-run",
    "not_run": "not-run",
    "not-run": "not-run",
    "notrun": "not-run",
}

_RANK: dict[Status, int] = {"pass": 0, "skip": 1, "not-run": 1, "warn": 2, "fail": 3}
"""How bad a status is, to tell when a test's summary says more than its entity results."""

_GPU_GROUP_ID = 1
"""``DCGM_FE_GPU``: the entity group id of a GPU in dcgm_fields.h."""


class DiagUnparseable(ValueError):
    """The log holds no diagnostic document this module can read; the message says why."""


class DiagResult(BaseModel):
    """One test on one entity, as dcgmi reported it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    category: str
    """dcgmi's category: "Deployment", "Integration", "Hardware", "Stress", ..."""
    test: str
    """dcgmi's test name: "memory", "pcie", "software" (4.x), "GPU Memory", "PCIe" (3.x)."""
    gpu: str | None
    """The GPU index as dcgmi numbers it ("0", "3"); None for a test that names no GPU (3.x
    deployment checks, a 4.x test summary) or an entity that is not a GPU."""
    status: Status
    codes: tuple[str, ...] = ()
    """DCGM's error codes as given: a name when the output has one, else ``"error_id 83"``."""
    message: str = ""
    """The first warning (or, with none, the first info) text, on one line, at most 300 chars."""

    @property
    def where(self) -> str:
        """``memory on GPU 3``, or just the test when it names no GPU."""
        return f"{self.test} on GPU {self.gpu}" if self.gpu is not None else self.test


class DiagReport(BaseModel):
    """Every result of one ``dcgmi diag`` run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = ""
    """The DCGM version when the output says; empty otherwise."""
    level: int | None = None
    """The ``-r`` level the caller ran; dcgmi's JSON does not carry it."""
    results: tuple[DiagResult, ...]

    @property
    def passed(self) -> bool:
        """No fail anywhere and at least one pass: skips and not-runs prove nothing."""
        return bool(self.results) and not self.failed and any(
            r.status == "pass" for r in self.results)

    @property
    def failed(self) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    def gpus_seen(self) -> set[str]:
        """The GPUs any result names, whatever its status."""
        return {r.gpu for r in self.results if r.gpu is not None}

    def summary(self, limit: int = 600) -> str:
        """One line for an Event or the workflow history, never longer than ``limit``.

        The counts always fit; what failed (then what warned) gets the room that is left, so a
        long DCGM message cannot push the counts out of the line.
        """
        counts = {s: sum(1 for r in self.results if r.status == s) for s in _RANK}
        total = len(self.results)
        gpus = _gpu_ranges(self.gpus_seen())
        if total and counts["pass"] == total:
            where = f" on GPUs {gpus}" if gpus else ""
            return _clip(f"dcgmi diag: all {total} results passed{where}", limit)
        parts = [f"{counts['pass']} passed"]
        details: dict[int, str] = {}
        for status, word in (("fail", "failed"), ("warn", "warned")):
            hits = [r for r in self.results if r.status == status]
            if hits:
                more = f"; +{len(hits) - 3} more" if len(hits) > 3 else ""
                details[len(parts)] = "; ".join(_detail(r) for r in hits[:3]) + more
                parts.append(f"{len(hits)} {word}")
        if counts["skip"]:
            parts.append(f"{counts['skip']} skipped")
        if counts["not-run"]:
            parts.append(f"{counts['not-run']} not run")
        tail = " - nothing passed" if not self.failed and not counts["pass"] else ""
        room = limit - len(f"dcgmi diag: {', '.join(parts)}{tail}")
        for index, detail in details.items():
            if room < 12:
                break
            shown = _clip(detail, room - 3)
            parts[index] += f" ({shown})"
            room -= len(shown) + 3
        return _clip(f"dcgmi diag: {', '.join(parts)}{tail}", limit)


def parse_dcgmi_json(
    output: str | bytes, *, max_bytes: int = 4_000_000, level: int | None = None
) -> DiagReport:
    """The ``DiagReport`` in a pod log that contains ``dcgmi diag -j`` output.

    Text before and after the JSON (nv-hostengine's banner, shell noise) is skipped. Raises
    ``DiagUnparseable`` when there is no readable diagnostic document; a document that reads but
    proves nothing comes back as a report that has not ``passed``.
    """
    text = _as_text(output, max_bytes)
    root = _find_document(text)
    results: list[DiagResult] = []
    version = ""
    if isinstance(root.get("iterations"), list) and not any(k in root for k in DIAG_KEYS):
        runs = [run for run in root["iterations"] if run is not None]
        if not runs:
            raise DiagUnparseable(f"an iterated dcgmi output without runs: {_excerpt(text)}")
        for run in runs:
            run_version, run_results = _read_document(_object(run, "an iteration"))
            version = version or run_version
            results.extend(run_results)
        overall = root.get("Overall Result")
        if isinstance(overall, str) and _status(overall)[0] != "pass" and not any(
                r.status == "fail" for r in results):
            results.append(DiagResult(
                category="", test="iterations", gpu=None, status="fail",
                message=_one_line(f"Overall Result {overall}: {_text_of(root.get('Warning'))}")))
    else:
        version, results = _read_document(root)
    if not results:
        raise DiagUnparseable(f"the dcgmi diagnostic holds no test results: {_excerpt(text)}")
    return DiagReport(version=version, level=level, results=tuple(results))


# --- finding the document -------------------------------------------------------------------


class _Rejected(ValueError):
    """A JSON value dcgmi never writes (duplicate key, NaN): the whole log is rejected."""


def _as_text(output: str | bytes, max_bytes: int) -> str:
    if isinstance(output, bytes | bytearray):
        if len(output) > max_bytes:
            raise DiagUnparseable(f"the log is {len(output)} bytes, over the {max_bytes} limit")
        return bytes(output).decode("utf-8", errors="replace")
    if not isinstance(output, str):
        raise DiagUnparseable(f"the log is a {type(output).__name__}, not text")
    # A character is at least one byte: only a string that might be over needs encoding.
    if len(output) > max_bytes or (
            len(output) * 4 > max_bytes
            and len(output.encode("utf-8", errors="surrogatepass")) > max_bytes):
        raise DiagUnparseable(f"the log is over the {max_bytes}-byte limit "
                              f"({len(output)} characters); not parsed")
    return output


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Rejected(f"duplicate key {key[:_NAME_MAX]!r}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise _Rejected(f"non-standard JSON constant {name}")


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant)


def _is_document(value: dict[str, Any]) -> bool:
    return any(k in value for k in DIAG_KEYS) or isinstance(value.get("iterations"), list)


def _find_document(text: str) -> dict[str, Any]:
    """The last JSON object in ``text`` that holds a diagnostic, decoded from each ``{``.

    Only a ``{`` that opens an object (``{"`` or ``{}``) is tried, decoded objects are skipped
    whole, and the work is bounded: a failed decode costs about its offset into the text (the
    decoder's error counts the lines before it), and the search stops once it has spent a fixed
    multiple of the input or tried ``_MAX_CANDIDATES`` objects. A log of noise, or one huge
    broken document, costs linear time.
    """
    budget = _SCAN_BUDGET_FACTOR * len(text) + _SCAN_BUDGET_FLOOR
    found: dict[str, Any] | None = None
    match = _OBJECT_START.search(text)
    tries = 0
    while match is not None and budget > 0 and tries < _MAX_CANDIDATES:
        tries += 1
        start = match.start()
        try:
            value, end = _DECODER.raw_decode(text, start)
        except RecursionError:
            raise DiagUnparseable(
                f"the JSON is nested too deeply to read: {_excerpt(text[start:])}") from None
        except _Rejected as exc:
            raise DiagUnparseable(f"{exc}, which dcgmi never writes: {_excerpt(text[start:])}"
                                  ) from None
        except ValueError as exc:  # JSONDecodeError, or an integer over the digit limit
            budget -= (exc.pos if isinstance(exc, json.JSONDecodeError) else len(text)) + 1
            match = _OBJECT_START.search(text, start + 1)
            continue
        budget -= end - start
        if isinstance(value, dict) and _is_document(value):
            found = value
        match = _OBJECT_START.search(text, end)
    if found is not None:
        return found
    if match is not None:
        raise DiagUnparseable(f"gave up looking for the diagnostic JSON (too much JSON-like "
                              f"noise in the log): {_excerpt(text)}")
    keys = " or ".join(repr(k) for k in DIAG_KEYS)
    raise DiagUnparseable(f"no JSON object with {keys} in the log: {_excerpt(text)}")


# --- reading the document -------------------------------------------------------------------


def _read_document(root: dict[str, Any]) -> tuple[str, list[DiagResult]]:
    key = next((k for k in DIAG_KEYS if k in root), None)
    if key is None:
        raise DiagUnparseable(f"no {' or '.join(repr(k) for k in DIAG_KEYS)} key: "
                              f"{_excerpt(json.dumps(root))}")
    diag = _object(root[key], repr(key))
    version = _version(root, diag)
    results: list[DiagResult] = []
    runtime_error = diag.get("runtime_error")
    categories = diag.get("test_categories")
    if categories is None:
        if runtime_error is not None:
            raise DiagUnparseable(
                f"dcgmi reported a runtime error instead of results: "
                f"{_excerpt(_text_of(runtime_error))}")
        raise DiagUnparseable(f"{key!r} has no 'test_categories': "
                              f"{_excerpt(json.dumps(diag))}")
    for category in _items(categories, "'test_categories'"):
        category = _object(category, "a test category")
        cat_name = _name(category.get("category"), "a category's 'category'")
        for test in _items(category.get("tests"), f"the tests of category {cat_name!r}"):
            test = _object(test, f"a test of category {cat_name!r}")
            results.extend(_read_test(cat_name, test))
    if runtime_error is not None:
        results.append(DiagResult(category="", test="runtime_error", gpu=None, status="fail",
                                  message=_one_line(_text_of(runtime_error))))
    return version, results


def _read_test(category: str, test: dict[str, Any]) -> list[DiagResult]:
    name = _name(test.get("name"), f"a test's 'name' in category {category!r}")
    where = f"test {name!r}"
    raw_results = test.get("results")
    out: list[DiagResult] = []
    if raw_results is not None:
        for result in _items(raw_results, f"the results of {where}"):
            out.extend(_read_result(category, name, _object(result, f"a result of {where}"),
                                    where))
    summary = test.get("test_summary")
    if summary is not None:
        summary = _object(summary, f"the test_summary of {where}")
        status, note = _status(summary.get("status"), where)
        worst = max((_RANK[r.status] for r in out), default=-1)
        if not out or (_RANK[status] > worst and status in ("fail", "warn")):
            codes, message = _evidence(summary, note)
            out.append(DiagResult(category=category, test=name, gpu=None, status=status,
                                  codes=codes, message=message))
    if not out:
        # 4.x drops the results (and the summary) of a test that did not run.
        out.append(DiagResult(category=category, test=name, gpu=None, status="not-run"))
    return out


def _read_result(category: str, test: str, result: dict[str, Any],
                 where: str) -> list[DiagResult]:
    """One result object: one ``DiagResult`` per GPU it names (3.x nvvs lists several)."""
    status, note = _status(result.get("status"), where)
    gpus, entity = _entities(result, where)
    codes, message = _evidence(result, note, entity)
    return [DiagResult(category=category, test=test, gpu=gpu, status=status, codes=codes,
                       message=message) for gpu in gpus]


def _entities(result: dict[str, Any], where: str) -> tuple[list[str | None], str]:
    """The GPUs a result is about (``[None]`` for none) and the non-GPU entity it names."""
    if "entity_group" in result or "entity_group_id" in result or "entity_id" in result:
        group = result.get("entity_group")
        group_id = result.get("entity_group_id")
        if group is not None and not isinstance(group, str):
            raise DiagUnparseable(f"'entity_group' of {where} is not text: {_excerpt(repr(group))}")
        if group_id is not None and not _is_int(group_id):
            raise DiagUnparseable(
                f"'entity_group_id' of {where} is not an integer: {_excerpt(repr(group_id))}")
        entity = _index(result.get("entity_id"), f"'entity_id' of {where}")
        is_gpu = (group.upper() == "GPU") if isinstance(group, str) else group_id == _GPU_GROUP_ID
        if is_gpu:
            return [entity], ""
        label = group if isinstance(group, str) else f"entity group {group_id}"
        return [None], f"{label[:_NAME_MAX]} {entity}" if entity is not None else label[:_NAME_MAX]
    if "cpu_id" in result:
        cpu = result["cpu_id"]
        if not isinstance(cpu, str | int) or isinstance(cpu, bool):
            raise DiagUnparseable(f"'cpu_id' of {where} is not an id: {_excerpt(repr(cpu))}")
        return [None], f"CPU {str(cpu)[:_NAME_MAX]}"
    for key in ("gpu_id", "gpu_ids"):
        if key in result:
            return _gpu_list(result[key], f"'{key}' of {where}"), ""
    return [None], ""


def _gpu_list(value: Any, what: str) -> list[str | None]:
    if value is None:
        return [None]
    if isinstance(value, list):
        items: list[Any] = [v for v in value if v is not None]
    elif isinstance(value, str):
        items = [v for v in value.split(",") if v.strip()]
    else:
        items = [value]
    gpus: list[str | None] = []
    for item in items:
        gpu = _index(item, what)
        if gpu not in gpus:
            gpus.append(gpu)
    return gpus or [None]


def _index(value: Any, what: str) -> str | None:
    """A GPU or entity index as text ("3"); None when absent."""
    if value is None:
        return None
    if _is_int(value):
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 6:
        number = int(value.strip())
    else:
        raise DiagUnparseable(f"{what} is not an index: {_excerpt(repr(value))}")
    if not 0 <= number <= _MAX_GPU_ID:
        raise DiagUnparseable(f"{what} is out of range: {number}")
    return str(number)


def _status(value: Any, where: str = "the output") -> tuple[Status, str]:
    """The status, and a note when it was not one we know (read as a fail)."""
    if not isinstance(value, str):
        raise DiagUnparseable(f"the status of {where} is not text: {_excerpt(repr(value))}")
    word = " ".join(value.split()).lower()
    # The 3.x CPU EUD writes "Pass - All" / "Skip - All".
    word = word.split(" - ", 1)[0]
    status = _STATUS_WORDS.get(word)
    if status is None:
        return "fail", f"unrecognised dcgmi status {value[:40]!r}"
    return status, ""


def _evidence(result: dict[str, Any], note: str, entity: str = "") -> tuple[tuple[str, ...], str]:
    """DCGM's codes and the first warning (or info) text of a result or test summary."""
    codes: list[str] = []
    texts: list[str] = []
    warnings = result.get("warnings")
    if isinstance(warnings, str | dict):
        warnings = [warnings]
    if isinstance(warnings, list):
        for warning in warnings:
            if isinstance(warning, str):
                texts.append(warning)
            elif isinstance(warning, dict):
                # 3.x dcgmi writes a deployment test's text under "warnings".
                text = warning.get("warning", warning.get("warnings"))
                if isinstance(text, str):
                    texts.append(text)
                code = warning.get("error_id")
                if isinstance(code, str) and code.strip():
                    codes.append(code.strip()[:_CODE_MAX])
                elif _is_int(code):
                    codes.append(f"error_id {code}")
    if not texts:
        info = result.get("info")
        infos = [info] if isinstance(info, str) else info if isinstance(info, list) else []
        texts.extend(i for i in infos if isinstance(i, str))
    first = next((t for t in (_one_line(t) for t in texts) if t), "")
    message = "; ".join(p for p in (note, first) if p)
    if entity:
        message = f"{entity}: {message}" if message else entity
    unique = tuple(dict.fromkeys(codes))[:_CODES_MAX]
    return unique, _clip(message, MESSAGE_MAX)


def _version(root: dict[str, Any], diag: dict[str, Any]) -> str:
    places: list[Any] = [diag.get("version"), root.get("version")]
    for holder in (root, diag):
        meta = holder.get("metadata")
        if isinstance(meta, dict):
            places.append(meta.get("version"))
    found = next((v for v in places if isinstance(v, str) and v.strip()), "")
    return _one_line(found)[:_CODE_MAX]


# --- small helpers --------------------------------------------------------------------------


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DiagUnparseable(f"{what} is a {_kind(value)}, not an object: "
                              f"{_excerpt(_dump(value))}")
    return value


def _items(value: Any, what: str) -> list[Any]:
    """The entries of a JSON array, without jsoncpp's ``null`` holes."""
    if not isinstance(value, list):
        raise DiagUnparseable(f"{what} is a {_kind(value)}, not a list: {_excerpt(_dump(value))}")
    return [v for v in value if v is not None]


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise DiagUnparseable(f"{what} is a {_kind(value)}, not text: {_excerpt(_dump(value))}")
    return _one_line(value)[:_NAME_MAX]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "missing value" if value is None else type(value).__name__


def _dump(value: Any) -> str:
    try:
        return json.dumps(value)[: EXCERPT_MAX * 2]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[: EXCERPT_MAX * 2]


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else _dump(value)


def _one_line(text: str) -> str:
    """Control characters and runs of whitespace become one space; the ends are trimmed."""
    cleaned = "".join(c if c.isprintable() else " " for c in text[: MESSAGE_MAX * 8])
    return " ".join(cleaned.split())


def _clip(text: str, limit: int) -> str:
    if limit <= 0:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _excerpt(text: str) -> str:
    """At most ~200 characters of what was seen, quoted, for an error message."""
    head = text.strip()[:EXCERPT_MAX]
    more = "…" if len(text.strip()) > EXCERPT_MAX else ""
    return f"{head!r}{more}" if head else "(empty)"


def _detail(result: DiagResult) -> str:
    evidence = " - ".join(p for p in (",".join(result.codes), result.message) if p)
    return f"{result.where}: {evidence}" if evidence else result.where


def _gpu_ranges(gpus: set[str]) -> str:
    """``{"0", ..., "7"}`` -> ``0-7``; ``{"0", "1", "3"}`` -> ``0-1,3``."""
    numbers = sorted(int(g) for g in gpus if g.isdigit())
    others = sorted(g for g in gpus if not g.isdigit())
    spans: list[tuple[int, int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    text = [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans]
    return ",".join(text + others)
