"""dcgm-exporter text exposition -> ``NodeReadings``.

A dcgm-exporter scrape of a large fleet (or a Prometheus federation of one) is tens of MB, of which
the policy needs a handful of families. So the text is first narrowed to the health families by
one regex scan that runs in C, and only those lines are parsed.

Two parsers give one result: ``parse_exposition`` (hand-written, the one production uses) and
``parse_exposition_reference`` (prometheus_client's parser on the same lines), kept so that tests
can prove the fast one reads exactly what the official one reads. The scrape uses the hand-written
one through ``parse_gpu_fields``: the same scan on the undecoded body, decoding only the selected
lines, and the GPUs as plain fields (no models), so that it can also run in a helper process
(activities/parse_pool.py).

Garbage never makes a node sick: a line that does not parse is counted, never guessed at; text that
is not exposition at all raises ``ExpositionError``; sentinel, NaN and infinite values become "no
data"; duplicate series of one GPU (MIG instances, per-pod copies) merge by UUID, keeping the
worse reading; and a payload with no health samples is reported as empty, for the caller to treat
as an error of that source.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, AnyStr

from pydantic import BaseModel, Field

from policy import dcgm
from policy.models import GpuReading, NodeReadings
from policy.rules import usable

XID_COUNT_METRIC = dcgm.XID_COUNT

HEALTH_METRICS = dcgm.FIELD_OF
INTEGRAL_FIELDS = dcgm.INTEGRAL_FIELDS
"""The metric families the policy reads, and the ``GpuReading`` field each one fills
(policy/dcgm.py)."""

_INT_FIELDS = frozenset({"xid", "clock_event_reasons", "recovery_action"})
_MAX_EXAMPLES = 5

MAX_XID = 65535
"""XIDs are small non-negative integers (NVIDIA's catalog stops in the hundreds); a value above
this, or one that is not an integer (79.5), is not an XID but a garbled line."""
MAX_INT_FIELD = 2**63 - 1
"""Clock-event reasons and recovery actions are 64-bit DCGM fields."""
MAX_NUMBER_CHARS = 64
"""No well-formed sample value or timestamp is longer (float() of a 100,000-digit token is
wasted CPU, and int() of one raises)."""
MAX_GPU_INDEX_CHARS = 4
MAX_LABEL_VALUE_CHARS = 256
"""Identity labels (Hostname, UUID, model, PCI bus id, gpu, xid) longer than this are not what
an exporter writes: the line is bad rather than a huge string carried into verdicts."""


class ExpositionError(ValueError):
    """The text is not Prometheus exposition of dcgm-exporter at all, or breaks a limit."""


@dataclass(frozen=True)
class BodyLimits:
    """What one payload may hold before it is refused whole (policy as data).

    ``NODE_LIMITS`` is for one node's exporter (the scrape path): a real 8-GPU dcgm-exporter body
    is 20-100 KB with ~100 health samples, so the caps are far above real bodies and far below
    what would let one exporter cost the worker seconds of CPU or hundreds of MB.
    ``FLEET_LIMITS`` is for ``evaluate`` of a whole fleet's federation payload.
    """

    max_bytes: int
    max_lines: int
    max_health_samples: int
    max_gpus_per_node: int


NODE_LIMITS = BodyLimits(
    # The configured exporter.max_bytes (default 4 MiB) is enforced while reading; this is
    # the ceiling that configuration may not exceed.
    max_bytes=64 * 1024 * 1024, max_lines=100_000, max_health_samples=20_000, max_gpus_per_node=64
)
FLEET_LIMITS = BodyLimits(
    max_bytes=64 * 1024 * 1024, max_lines=4_000_000, max_health_samples=2_000_000,
    max_gpus_per_node=64,
)


class ParseResult(BaseModel):
    """What one payload held."""

    nodes: list[NodeReadings] = Field(default_factory=list)
    bad_lines: int = Field(default=0, description="Health-family lines that did not parse.")
    samples: int = Field(default=0, description="Health-family samples that parsed.")
    unlabelled: int = Field(
        default=0, description="Samples without a Hostname/hostname label and no default node."
    )
    examples: list[str] = Field(
        default_factory=list, description=f"Up to {_MAX_EXAMPLES} problems, for error messages."
    )

    @property
    def empty(self) -> bool:
        """No health sample at all: an error for the source, never "healthy"."""
        return self.samples == 0


# --- line selection ---------------------------------------------------------------------------


def _selector(names: list[str]) -> str:
    # Factor out the shared prefix so the regex engine can hunt for one literal ("\nDCGM_FI_DEV_")
    # with its fast search and try the alternatives only at those spots.
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    rest = "|".join(re.escape(name[len(prefix) :]) for name in names)
    return rf"\n({re.escape(prefix)}(?:{rest})[{{ \t][^\r\n]*+)"


# The DCGM_FI_DEV_ families share a long prefix that the scan hunts for; the opt-in exporter
# family has another, so it gets its own scan, run only when the payload holds it at all.
_SELECT = _selector(
    sorted((n for n in HEALTH_METRICS if n.startswith("DCGM_FI_")), key=len, reverse=True)
)
_SELECT_EXTRA = _selector([n for n in HEALTH_METRICS if not n.startswith("DCGM_FI_")])
_SELECT_RE = re.compile(_SELECT)
_SELECT_EXTRA_RE = re.compile(_SELECT_EXTRA)
# The same scans over the undecoded body (all ASCII patterns), for the scrape path.
_SELECT_BYTES_RE = re.compile(_SELECT.encode())
_SELECT_EXTRA_BYTES_RE = re.compile(_SELECT_EXTRA.encode())
_XID_COUNT_BYTES = XID_COUNT_METRIC.encode()


def select_health_lines(text: str) -> list[str]:
    """The sample lines of the health families, without parsing anything else.

    One regex pass in C over the payload; the name must be followed by ``{`` or a blank so that a
    longer metric name sharing the prefix is not picked up.
    """
    lines = _select(_SELECT_RE, text, "\n")
    if XID_COUNT_METRIC in text:
        lines.extend(_select(_SELECT_EXTRA_RE, text, "\n"))
    return lines


def select_health_lines_bytes(raw: bytes) -> list[str]:
    """``select_health_lines`` on the undecoded body: the same lines, each decoded as
    ``raw.decode("utf-8", errors="replace")`` would have decoded it.

    Every pattern is ASCII and a line ends at an ASCII byte, where UTF-8 decoding (with
    replacement) starts afresh, so scanning bytes and decoding the few selected lines gives what
    decoding the whole body first and scanning the text gives, at a fraction of the cost.
    """
    found = _select(_SELECT_BYTES_RE, raw, b"\n")
    if _XID_COUNT_BYTES in raw:
        found.extend(_select(_SELECT_EXTRA_BYTES_RE, raw, b"\n"))
    return [line.decode("utf-8", errors="replace") for line in found]


def _select(pattern: re.Pattern[AnyStr], text: AnyStr, newline: AnyStr) -> list[AnyStr]:
    lines = pattern.findall(text)
    # The regex anchors on the preceding newline, which the very first line does not have.
    end = text.find(newline)
    first = pattern.match(newline + (text if end == -1 else text[:end]))
    if first is not None:
        lines.insert(0, first.group(1))
    return lines


# --- the whole body --------------------------------------------------------------------------

# After a newline: something that is neither a comment, a sample nor an empty line. The
# pattern starts at a literal, so the engine skips ahead instead of trying every offset.
_BAD_LINE_START = re.compile(rb"\n(?!#|[a-zA-Z_:][a-zA-Z0-9_:]*+[{ ]|\n|$)")
_CONTROL = bytes(range(0x00, 0x09)) + bytes(range(0x0E, 0x20))


def looks_intact(text: str | bytes) -> bool:
    """Whole exposition text: ends with a newline, every line starts like a comment or a
    sample, and no control characters (a cut, HTML or binary body fails).

    Checked on bytes: every character the check looks at is ASCII, and a str answers the same
    as its UTF-8 encoding (which keeps ASCII as is and writes everything else with bytes >= 0x80).
    Deleting the control bytes with ``bytes.translate`` finds them ~6x faster than a regex
    character class, which the engine tries at every offset.
    """
    raw = text.encode("utf-8", errors="surrogatepass") if isinstance(text, str) else text
    return (
        raw.endswith(b"\n")
        and _BAD_LINE_START.search(b"\n" + raw) is None
        and len(raw.translate(None, _CONTROL)) == len(raw)
    )


def check_body(raw: bytes, limits: BodyLimits = NODE_LIMITS) -> None:
    """Refuse a body that must not be judged at all, before parsing: ``ExpositionError``.

    Over the size or line caps; cut or corrupted (``looks_intact``: a cut body may still hold
    valid-looking lines, and judging a node on part of its data could drain it for nothing);
    not UTF-8; anything after an OpenMetrics ``# EOF``. The scrape (``parse_pool.read_body``)
    and ``evaluate`` both call this, so a body is refused by both or by neither.
    """
    if len(raw) > limits.max_bytes:
        raise ExpositionError(f"the exposition is larger than {limits.max_bytes} bytes")
    if not raw:
        return
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ExpositionError("the exposition is not UTF-8 text (binary?)") from None
    head = raw[:512].lstrip()
    if head[:1] == b"<" or b"<html" in head.lower():
        raise ExpositionError("payload is HTML/XML, not Prometheus text exposition")
    if not looks_intact(raw):
        raise ExpositionError("the exposition is truncated or corrupted")
    lines = raw.count(b"\n")
    if lines > limits.max_lines:
        raise ExpositionError(f"the exposition has {lines} lines, more than {limits.max_lines}")
    if _after_eof(raw).strip():
        raise ExpositionError("the exposition has content after # EOF")


def _after_eof(raw: bytes) -> bytes:
    """What follows an OpenMetrics ``# EOF`` line (b"" when there is none). ``bytes.find``
    rather than a regex: a pattern that starts with an alternative is tried at every offset."""
    at = 0 if raw.startswith(b"# EOF") else raw.find(b"\n# EOF")
    while at != -1:
        start = at if at == 0 and raw.startswith(b"# EOF") else at + 1
        end = raw.find(b"\n", start)
        line = raw[start:] if end == -1 else raw[start:end]
        if line.rstrip(b"\r") == b"# EOF":
            return b"" if end == -1 else raw[end + 1 :]
        at = raw.find(b"\n# EOF", start)
    return b""


def _check_counts(hosts: list[tuple[str, list[dict[str, Any]]]],
                  limits: BodyLimits) -> None:
    for node, gpus in hosts:
        if len(gpus) > limits.max_gpus_per_node:
            raise ExpositionError(
                f"the exposition holds {len(gpus)} GPUs for {node[:80]}, more than "
                f"{limits.max_gpus_per_node}")


def _check_selected(lines: list[str], limits: BodyLimits) -> None:
    if len(lines) > limits.max_health_samples:
        raise ExpositionError(
            f"the exposition has {len(lines)} health samples, more than "
            f"{limits.max_health_samples}")


# --- the hand-written line parser -------------------------------------------------------------

# Quoted values use the unrolled form [^"\\]*(?:\\.[^"\\]*)*: same language as (?:[^"\\]|\\.)*, but
# the regex engine runs through plain characters in one step instead of one branch per character.
#
# Every quantifier in these patterns is possessive (*+, ++, ?+): what it took is never given
# back. The grammar never needs it back (a blank run is followed by a non-blank, a name by a
# non-name character, a complete "label," by anything but a label), so the language is the
# same, and no input can make the engine backtrack: time is linear in the line's length. (With
# greedy quantifiers, blanks between two optional blank runs made a bad line cost quadratic time,
# and a 120 KB body held the event loop for seconds.)
_VALUE = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_LABEL = rf"[ \t]*+[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+{_VALUE}[ \t]*+"
_LABELS = rf"(?:{_LABEL},)*+(?:{_LABEL})?+[ \t]*+"
# One pass validates the whole line, label syntax included; the label set cannot end early at a
# "}" inside a quoted value because values are matched as quoted strings.
_LINE_RE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*+)"  # metric name
    # Label set (blanks before "{" and one leading comma are tolerated, as Prometheus' own
    # parsers do), or the blank before the value.
    rf"(?:[ \t]*+\{{,?+({_LABELS})\}}[ \t]*+|[ \t]++)"
    r"(\S++)"  # value
    r"(?:[ \t]++(\S++))?+[ \t]*+",  # optional timestamp
)
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"([^"\\]*+(?:\\.[^"\\]*+)*+)"')
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


def _unescape(value: str) -> str:
    # Only the three escapes the text format defines; any other backslash stays as written.
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def _number(token: str) -> float:
    # float() also takes "1_000" and non-ASCII digits (full-width, Arabic-Indic, Devanagari...),
    # which the text format does not allow; and a huge token costs time for nothing.
    if "_" in token or not token.isascii() or len(token) > MAX_NUMBER_CHARS:
        raise ValueError(f"invalid number {token[:40]!r}")
    return float(token)


def ascii_int(raw: str, *, max_chars: int) -> int | None:
    """``raw`` as a non-negative integer when it is 1 to ``max_chars`` ASCII digits, else None.

    ``str.isdecimal`` alone also accepts full-width, Arabic-Indic, Devanagari... digits, and
    ``int()`` of a 5000-digit string raises (Python's digit limit): neither is a GPU index or
    an XID an exporter writes."""
    if not raw or len(raw) > max_chars or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def parse_line(line: str) -> tuple[str, dict[str, str], float]:
    """One sample line -> ``(name, labels, value)``; ``ValueError`` when it is not one."""
    match = _LINE_RE.fullmatch(line)
    if match is None:
        raise ValueError("not a sample line: bad name, label set or value layout")
    name, body, value, timestamp = match.groups()
    labels = _labels(body) if body else {}
    number = _number(value)
    if timestamp is not None:
        _number(timestamp)
    return name, labels, number


def _labels(body: str) -> dict[str, str]:
    """A label set already validated by ``_LABELS`` -> its labels."""
    if "\\" in body:
        pairs = [(key, _unescape(raw)) for key, raw in _PAIR_RE.findall(body)]
    else:
        # Validated and escape-free, so every '"' delimits a value: splitting on quotes
        # gives name and value alternately, commas and braces inside values included.
        parts = body.split('"')
        pairs = [(parts[i].strip(" \t,="), parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
    labels = dict(pairs)
    if len(labels) != len(pairs):
        raise ValueError("duplicate label name")
    if "__" in body and any(key.startswith("__") for key in labels):
        raise ValueError("label names starting with '__' are reserved")
    return labels


# The fast path of ``_parse_lines``: the text between the first "{" and the last "}" of a line,
# validated on its own (same ``_LABELS`` as in ``_LINE_RE``) and kept per distinct label set, and
# what follows the "}" (the same tail as in ``_LINE_RE``).
_BODY_RE = re.compile(rf",?+({_LABELS})")
_TAIL_RE = re.compile(r"[ \t]*+(\S++)(?:[ \t]++(\S++))?+[ \t]*+")


def _parse_lines(lines: list[str], fleet: _Fleet) -> None:
    """``parse_line`` + ``fleet.add`` for each line, cheaper for the common shape.

    dcgm-exporter repeats one label set per GPU in every family, so a label set is validated and
    split once per payload, not once per line. That gives what ``parse_line`` gives: a label set
    in ``_LABELS`` cannot hold a "}" outside its quoted values, so when the text up to the last
    "}" of the line is a valid label set, it is the only split of the line ``_LINE_RE`` can
    match. Anything else (no braces, blanks around the name, an invalid label set or tail)
    goes through ``parse_line`` itself, which also words the error of a bad line.
    """
    bodies: dict[str, dict[str, str] | None] = {}
    problems: dict[str, str | None] = {}
    names: dict[str, str] = {}
    add = fleet.add_line
    for line in lines:
        brace = line.find("{")
        close = line.rfind("}")
        name = line[:brace]
        if 0 < brace < close and name in HEALTH_METRICS:
            body = line[brace + 1 : close]
            if body in bodies:
                labels = bodies[body]
            else:
                labels = bodies[body] = _body_labels(body, names)
                problems[body] = identity_problem(labels) if labels is not None else None
            tail = _TAIL_RE.fullmatch(line, close + 1) if labels is not None else None
            if labels is not None and tail is not None:
                value, timestamp = tail.groups()
                try:
                    number = _number(value)
                    if timestamp is not None:
                        _number(timestamp)
                except ValueError:
                    pass  # parse_line words it
                else:
                    problem = problems[body]
                    if problem is None:
                        add(line, name, labels, number, identity_checked=True)
                    else:
                        fleet.bad(line, problem)
                    continue
        try:
            name, parsed, number = parse_line(line)
        except ValueError as exc:
            fleet.bad(line, str(exc))
            continue
        add(line, name, parsed, number)


def _body_labels(body: str, names: dict[str, str] | None = None) -> dict[str, str] | None:
    """The labels of the text between the braces; None when it is not a valid label set.

    ``names`` caches valid between-values pieces (',UUID=' -> 'UUID') for one payload: a
    handful for a real exporter. Per payload, so that one exporter's thousands of label names
    cannot fill it for the others."""
    if names is None:
        names = {}
    if "\\" in body:
        match = _BODY_RE.fullmatch(body)
        if match is None:
            return None
        try:
            return _labels(match.group(1))
        except ValueError:
            return None
    # No escapes: every '"' opens or closes a value, so the text splits into the blanks, commas
    # and names between values (checked piece by piece, same grammar as _LABELS) and the values.
    parts = body.split('"')
    count = len(parts)
    if count == 1:
        return {} if _EMPTY_BODY_RE.fullmatch(body) else None
    if not count % 2 or _END_RE.fullmatch(parts[-1]) is None:
        return None
    first = _FIRST_NAME_RE.fullmatch(parts[0])
    if first is None:
        return None
    keys = [first.group(1)]
    for i in range(2, count - 1, 2):
        key = names.get(parts[i])
        if key is None:
            match = _NEXT_NAME_RE.fullmatch(parts[i])
            if match is None:
                return None
            key = match.group(1)
            if len(names) < 4096:
                names[parts[i]] = key
        keys.append(key)
    labels = dict(zip(keys, parts[1::2], strict=True))
    if len(labels) != len(keys) or ("__" in body and any(k.startswith("__") for k in keys)):
        return None
    return labels


# The pieces of an escape-free label set, between its values: before the first, between two
# (the comma), after the last; and one with no value at all.
_NAME = r"[ \t]*+([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"
_FIRST_NAME_RE = re.compile(rf",?+{_NAME}")
_NEXT_NAME_RE = re.compile(rf"[ \t]*+,{_NAME}")
_END_RE = re.compile(r"[ \t]*+,?+[ \t]*+")
_EMPTY_BODY_RE = re.compile(r",?+[ \t]*+")


# --- accumulation shared by both parsers ------------------------------------------------------


class _Fleet:
    """Folds samples into one reading per GPU, however many series a GPU has."""

    def __init__(self, default_node: str | None) -> None:
        self.default_node = default_node
        self.gpus: dict[tuple[str, str], dict[str, Any]] = {}
        self.samples = 0
        self.bad_lines = 0
        self.unlabelled = 0
        self.examples: list[str] = []

    def problem(self, message: str) -> None:
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(message)

    def bad(self, line: str, why: str) -> None:
        self.bad_lines += 1
        self.problem(f"unparsable line ({why}): {line[:120]!r}")

    def add_line(self, line: str, name: str, labels: dict[str, str], value: float, *,
                 identity_checked: bool = False) -> None:
        """``add``, counting a sample ``add`` refuses as a bad line."""
        try:
            self.add(name, labels, value, identity_checked=identity_checked)
        except ValueError as exc:
            self.bad(line, str(exc))

    def add(self, name: str, labels: dict[str, str], value: float, *,
            identity_checked: bool = False) -> None:
        """Fold one sample in; ``ValueError`` for a sample whose identity labels or integer
        value are malformed (it must not count, and the payload is not to be judged).
        ``identity_checked``: the caller already found ``identity_problem(labels)`` None
        (once per distinct label set rather than once per sample)."""
        field = HEALTH_METRICS.get(name)
        if field is None:
            return
        if not identity_checked:
            problem = identity_problem(labels)
            if problem is not None:
                raise ValueError(problem)
        index = labels.get("gpu", "")
        number = usable(value)
        if field in _INT_FIELDS and number is not None and number >= 0:
            limit = MAX_XID if field == "xid" else MAX_INT_FIELD
            if not number.is_integer() or number > limit:
                raise ValueError(f"{name} value {value!r} is not an integer in 0..{limit}")
        elif field in INTEGRAL_FIELDS and number is not None and not number.is_integer():
            # A count or a flag with a fraction (1e-300 double-bit errors) is a broken
            # exporter or a forged line: "> 0" would call it a fault.
            raise ValueError(f"{name} value {value!r} is not a whole number (a count or flag)")
        xid: int | None = None
        if field == "xid_counts":
            raw_xid = labels.get("xid")
            xid = xid_label(raw_xid)
            if raw_xid and xid is None:
                raise ValueError(f"xid label {raw_xid[:20]!r} is not an XID (1..{MAX_XID})")
            if number is not None and not number.is_integer():
                raise ValueError(f"{name} value {value!r} is not a count")
        self.samples += 1
        node = labels.get("Hostname") or labels.get("hostname") or self.default_node
        if not node:
            self.unlabelled += 1
            if self.unlabelled == 1:
                self.problem(f"{name} series without a Hostname/hostname label")
            return
        uuid = labels.get("UUID") or labels.get("uuid") or labels.get("gpu_uuid") or ""
        if not index and not uuid:
            # NVSwitch/CPU entities share some field names; they are not GPUs.
            return
        # MIG instances and per-pod series repeat one physical GPU: key by UUID to merge them.
        key = (node, uuid or f"index:{index}")
        gpu = self.gpus.get(key)
        if gpu is None:
            gpu = self.gpus[key] = {
                "gpu": index,
                "uuid": uuid,
                "model_name": labels.get("modelName") or labels.get("model_name") or "",
                "pci_bus_id": labels.get("pci_bus_id", ""),
                # A label field of the counters file (DCGM_FI_DEV_SERIAL, label, ...):
                # dcgm-exporter adds it to every series under the field's name.
                "serial": labels.get(SERIAL_LABEL, ""),
            }
        elif not gpu["serial"] and labels.get(SERIAL_LABEL):
            gpu["serial"] = labels[SERIAL_LABEL]
        if field == "xid_counts":
            counts = gpu.setdefault("xid_counts", {})
            # The exporter's "no XID in the window" series has no xid label and value 0.
            if xid is not None and number is not None and number >= 1:
                counts[xid] = max(counts.get(xid, 0), int(number))
            return
        if number is None or number < 0:
            return
        if field in _INT_FIELDS:
            new: float | int = int(number)
            old = gpu.get(field)
            if field == "clock_event_reasons" and old is not None:
                new = old | int(new)
            elif old is not None:
                new = max(old, new)
        else:
            old = gpu.get(field)
            # Duplicate series should agree; if they do not, the worse reading is kept.
            new = number if old is None else max(old, number)
        gpu[field] = new

    def hosts(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Per node (sorted by name) the ``GpuReading`` keyword arguments of each GPU (sorted)."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        for (node, _), fields in self.gpus.items():
            by_node.setdefault(node, []).append(fields)
        return [(node, sorted(gpus, key=_gpu_sort_key)) for node, gpus in sorted(by_node.items())]

    def result(self) -> ParseResult:
        # Validated construction: pydantic-core checks these few fields faster than
        # model_construct copies them in Python (measured 2 µs against 7 µs per GPU).
        nodes = [
            NodeReadings(node=node, gpus=[GpuReading(**f) for f in gpus])
            for node, gpus in self.hosts()
        ]
        return ParseResult(
            nodes=nodes,
            bad_lines=self.bad_lines,
            samples=self.samples,
            unlabelled=self.unlabelled,
            examples=self.examples,
        )


SERIAL_LABEL = "DCGM_FI_DEV_SERIAL"
"""The GPU's board serial, when the counters file lists it as a label field."""
_IDENTITY_LABELS = ("Hostname", "hostname", "gpu", "UUID", "uuid", "gpu_uuid", "modelName",
                    "model_name", "pci_bus_id", "xid", SERIAL_LABEL)


def identity_problem(labels: dict[str, str]) -> str | None:
    """Why a sample's identity labels are not what an exporter writes, or None."""
    for label in _IDENTITY_LABELS:
        if len(labels.get(label, "")) > MAX_LABEL_VALUE_CHARS:
            return f"label {label} longer than {MAX_LABEL_VALUE_CHARS} characters"
    index = labels.get("gpu", "")
    if index and ascii_int(index, max_chars=MAX_GPU_INDEX_CHARS) is None:
        return f"gpu label {index[:20]!r} is not a GPU index (ASCII digits)"
    return None


def xid_label(raw: str | None) -> int | None:
    """The ``xid`` label as an XID number; None when absent or not an integer in 1..MAX_XID
    written in ASCII digits."""
    xid = ascii_int(raw or "", max_chars=len(str(MAX_XID)))
    return xid if xid is not None and 0 < xid <= MAX_XID else None


def _gpu_sort_key(gpu: dict[str, Any]) -> tuple[int, str, str]:
    index: str = gpu["gpu"]
    number = ascii_int(index, max_chars=MAX_GPU_INDEX_CHARS)
    return (number if number is not None else 1 << 30, index, gpu["uuid"])


# --- "is this exposition at all?" -------------------------------------------------------------


def _lines(text: str) -> Iterator[str]:
    start = 0
    size = len(text)
    while start < size:
        end = text.find("\n", start)
        if end == -1:
            end = size
        yield text[start:end].strip()
        start = end + 1


def _check_is_exposition(text: str, parses: Callable[[str], bool]) -> None:
    """Raise ``ExpositionError`` unless ``text`` is blank, comments only, or holds at least one
    valid sample line of a DCGM family. Called only when no health sample parsed."""
    head = text[:4096]
    if "\x00" in head or "\ufffd" in head:
        raise ExpositionError("payload is binary, not Prometheus text exposition")
    stripped = head.lstrip()
    if stripped[:1] == "<" or "<html" in stripped[:512].lower():
        raise ExpositionError("payload is HTML/XML, not Prometheus text exposition")
    content = False
    checked = 0
    for line in _lines(text):
        if not line or line.startswith("#"):
            continue
        content = True
        if line.startswith("DCGM_"):
            if parses(line):
                return
            checked += 1
            # Enough to tell a garbled payload from a valid one without walking all of it.
            if checked >= 200:
                break
    if content:
        old_names = _old_namespace_names(text)
        if old_names:
            raise ExpositionError(
                f"the payload uses dcgm-exporter 1.x metric names ({', '.join(old_names)}): the "
                "exporter runs with --use-old-namespace (-o); remove that option so it serves "
                "the DCGM_FI_* names gpu-remediate reads"
            )
        raise ExpositionError(
            "no valid dcgm-exporter sample line found (not a dcgm-exporter /metrics payload?)"
        )


_OLD_NAME_RE = re.compile(r"^(dcgm_[a-z0-9_]{1,64})[{ ]", re.M)
_OLD_NAMES_SHOWN = 4


def _old_namespace_names(text: str) -> list[str]:
    """The 1.x metric names (``dcgm_gpu_temp``, ``dcgm_xid_errors``) the payload holds, a few
    of them sorted, health ones first; [] when it holds none."""
    found = set(_OLD_NAME_RE.findall(text[: 1024 * 1024]))
    health = ("dcgm_xid_errors", "dcgm_gpu_temp", "dcgm_ecc_dbe_volatile_total",
              "dcgm_retired_pages_dbe")
    ordered = [n for n in health if n in found] + sorted(found.difference(health))
    return ordered[:_OLD_NAMES_SHOWN]


def _finish(text: str, fleet: _Fleet, parses: Callable[[str], bool]) -> ParseResult:
    if fleet.samples == 0:
        _check_is_exposition(text, parses)
    return fleet.result()


# --- the two parsers --------------------------------------------------------------------------


def _hand_parses(line: str) -> bool:
    try:
        parse_line(line)
    except ValueError:
        return False
    return True


def parse_exposition(text: str, *, default_node: str | None = None,
                     limits: BodyLimits = FLEET_LIMITS) -> ParseResult:
    """Parse dcgm-exporter text into one ``NodeReadings`` per node (fast path).

    Nodes are named by the ``Hostname`` (released exporters) or ``hostname`` (newer) label;
    series without either use ``default_node``, or are counted in ``unlabelled``. More health
    samples, or more GPUs on one node, than ``limits`` allow raise ``ExpositionError``.
    """
    fleet = _Fleet(default_node)
    lines = select_health_lines(text)
    _check_selected(lines, limits)
    _parse_lines(lines, fleet)
    result = _finish(text, fleet, _hand_parses)
    _check_counts(fleet.hosts(), limits)
    return result


def parse_gpu_fields(
    raw: bytes, *, default_node: str | None = None, limits: BodyLimits = NODE_LIMITS
) -> tuple[list[tuple[str, list[dict[str, Any]]]], int]:
    """``parse_exposition`` of ``raw.decode("utf-8", errors="replace")``, without decoding the
    whole body and without building models, for the scrape path.

    Returns per node (sorted by name) the ``GpuReading`` keyword arguments of each GPU (in
    ``ParseResult.nodes`` order), and the number of bad lines; raises ``ExpositionError`` as
    ``parse_exposition`` does.
    """
    fleet = _Fleet(default_node)
    lines = select_health_lines_bytes(raw)
    _check_selected(lines, limits)
    _parse_lines(lines, fleet)
    if fleet.samples == 0:
        _check_is_exposition(raw.decode("utf-8", errors="replace"), _hand_parses)
    hosts = fleet.hosts()
    _check_counts(hosts, limits)
    return hosts, fleet.bad_lines


def _reference_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    # Imported here: only tests and benchmarks use the reference, and the parse helper
    # process (activities/parse_pool.py) starts faster without it.
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, dict(sample.labels), float(sample.value)


def _reference_parses(line: str) -> bool:
    try:
        list(_reference_samples(line))
    except ValueError:
        return False
    return True


def parse_exposition_reference(text: str, *, default_node: str | None = None) -> ParseResult:
    """``parse_exposition`` built on prometheus_client's parser, for cross-checking.

    Only sample lines are handed over (no ``# TYPE``), so counters keep their names instead of
    gaining the ``_total`` suffix prometheus_client adds to typed counters.
    """
    fleet = _Fleet(default_node)
    lines = select_health_lines(text)
    try:
        # One call for the whole batch is the fast case.
        samples = list(_reference_samples("\n".join(lines)))
    except ValueError:
        # prometheus_client rejects the whole text for one bad line: redo it line by line so
        # bad lines are counted like the fast parser counts them.
        samples = []
        for line in lines:
            try:
                samples.extend(_reference_samples(line))
            except ValueError as exc:
                fleet.bad(line, str(exc) or "invalid line")
    for name, labels, value in samples:
        fleet.add_line(name, name, labels, value)
    return _finish(text, fleet, _reference_parses)
