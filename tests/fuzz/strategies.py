"""Shared settings and input strategies of the fuzz suite.

Fixed budget: every property runs a fixed number of examples, derandomized (the same inputs on
every run and machine, so CI is reproducible and never flaky), with the seed corpus in
tests/fuzz/corpus/ always tried first. The whole suite is meant to stay under a minute on
one core; ``FUZZ_EXAMPLES`` scales it (e.g. a long local run: ``FUZZ_EXAMPLES=20``)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from activities.exposition import HEALTH_METRICS

CORPUS = Path(__file__).parent / "corpus"
SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))


def budget(examples: int) -> settings:
    """``examples`` derandomized examples; an example slower than 2 s fails ("no hang")."""
    return settings(
        max_examples=max(1, int(examples * SCALE)), derandomize=True, database=None,
        deadline=timedelta(seconds=2), print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )


def corpus(kind: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((CORPUS / kind).iterdir()) if p.is_file()]


# --- exposition: structure-aware ---------------------------------------------------------------

HOSTILE_DIGITS = ["\uff17\uff19", "\u0667\u0669", "\u096d\u096f", "\u00b2", "7" * 5000, "79.5",
                  "1e999", "-1", "0x4f", "1_0", "NaN", "+Inf", "", " ", "4\u00a0"]
NAMES = [*HEALTH_METRICS, "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORSX", "go_gc_x"]
LABEL_NAMES = ["gpu", "UUID", "uuid", "Hostname", "xid", "pod", "modelName", "pci_bus_id",
               "__name__", "a b", "0x", ""]
PIECES = ['"', "{", "}", ",", "=", " ", "\t", "\\", "\n", "\r", "#", "# EOF\n", "[/x]", "\x00",
          "\u00e9", "\ufffd", "\\\"", "9" * 300]

label_values = st.one_of(
    st.sampled_from(["0", "1", "7", "GPU-1", "GPU-2", "n1", "79", "13", "48", "[/x]", "[bold]"]),
    st.sampled_from(HOSTILE_DIGITS),
    st.text(max_size=20),
)
values = st.one_of(
    st.sampled_from(["0", "1", "13", "31", "48", "79", "95", "1e3", "-5", "NaN", "+Inf",
                     "2147483632", "9223372036854775794"]),
    st.sampled_from(HOSTILE_DIGITS),
    st.integers(min_value=-10, max_value=10**20).map(str),
    st.floats(allow_nan=True).map(repr),
)


@st.composite
def sample_line(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    labels = draw(st.lists(st.tuples(st.sampled_from(LABEL_NAMES), label_values), max_size=6))
    # A node is this node ("n1") or none, so that the scrape and evaluate see the same host.
    labels = [(k, "n1" if k == "Hostname" else v) for k, v in labels]
    body = ",".join(f'{k}="{v}"' for k, v in labels)
    blank = draw(st.sampled_from(["", " ", "\t", "  "]))
    stamp = draw(st.sampled_from(["", " 1700000000000", " x"]))
    return f"{name}{{{blank}{body}{blank}}} {draw(values)}{stamp}"


@st.composite
def valid_line(draw: st.DrawFn) -> str:
    """A well-formed health sample of node n1 (so that bodies are often judged, not only
    refused, and the scrape and evaluate verdicts get compared)."""
    name = draw(st.sampled_from(list(HEALTH_METRICS)))
    gpu = draw(st.integers(min_value=0, max_value=7))
    extra = draw(st.sampled_from(["", ',pod="p"', ',xid="13"', ',xid="79"', ',Hostname="n1"']))
    value = draw(st.sampled_from(["0", "1", "13", "48", "79", "95", "3", "NaN", "2147483632"]))
    return f'{name}{{gpu="{gpu}",UUID="GPU-{gpu}"{extra}}} {value}'


@st.composite
def exposition(draw: st.DrawFn) -> bytes:
    """A body from grammar pieces, sometimes mutated: cut, spliced, a hostile piece inserted."""
    line = st.one_of(valid_line(), valid_line(), valid_line(), sample_line(), st.sampled_from(
        ["# HELP x y", "# TYPE DCGM_FI_DEV_XID_ERRORS gauge", "", "# EOF"]))
    lines = draw(st.lists(line, max_size=12))
    raw = ("\n".join(lines) + draw(st.sampled_from(["\n", "\n", "\n", "", "\r\n"]))).encode()
    return draw(mutated(raw))


@st.composite
def mutated(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        op = draw(st.sampled_from(["cut", "insert", "delete", "duplicate"]))
        at = draw(st.integers(min_value=0, max_value=len(data)))
        if op == "cut":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.sampled_from(PIECES)).encode()
        elif op == "delete":
            del data[at:at + draw(st.integers(min_value=1, max_value=8))]
        elif data:
            end = data.find(b"\n", at)
            start = data.rfind(b"\n", 0, at) + 1
            data[start:start] = data[start:(end if end != -1 else len(data))] + b"\n"
    return bytes(data)


def corpus_mutations(kind: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from(corpus(kind)).flatmap(mutated)


# --- JSON-ish annotation values ----------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
annotation_texts = st.one_of(
    st.sampled_from([c.decode("utf-8", errors="replace") for c in corpus("annotations")]),
    json_values.map(json.dumps),
    st.text(alphabet='[]{}":,0123456789e.-+ aNIfinty', max_size=60),
    st.text(max_size=40),
)
