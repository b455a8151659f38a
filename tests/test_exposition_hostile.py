"""Hostile exporter bodies: parse time grows linearly with the input whatever it
holds, malformed numbers never count, and the scrape and ``evaluate`` refuse the same bodies.

The timing test compares ratios, not absolute times, of the CPU time this process spends
(not the wall clock, which other processes on a loaded machine stretch): a parser that
backtracks quadratically takes ~64x as long for 8x the input, a linear one ~8x. The sizes
are measured in turns, so a slow moment weighs on both alike."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from activities.exposition import ExpositionError, parse_exposition
from activities.parse_pool import BodyError, read_body
from policy.config import PolicySettings
from policy.models import Action
from tests.fuzz.hostile import CATEGORIES, GARBAGE, GOOD, NAME
from worker.probe.evaluate import evaluate_sources

SIZES = (64 * 1024, 128 * 1024, 256 * 1024, 512 * 1024)
MAX_RATIO = 32.0
"""time(8n) / time(n): 8 for linear, 64 for quadratic; 32 is halfway (in powers of two), so
noise must be fourfold to fail a linear parser and a quadratic one can never pass."""


def _cpu(call: Callable[[], object]) -> float:
    started = time.process_time()
    with contextlib.suppress(BodyError, ExpositionError):
        call()
    return time.process_time() - started


def _best_in_turns(rounds: int, calls: list[Callable[[], object]]) -> list[float]:
    """The least CPU time of each call over ``rounds`` rounds, the calls taken in turn."""
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            best[i] = min(best[i], _cpu(call))
    return best


def _scrape(raw: bytes) -> object:
    return read_body(raw, "n1")


def _evaluate(raw: bytes) -> object:
    return parse_exposition(raw.decode("utf-8", errors="replace"), default_node="n1")


@pytest.mark.parametrize("path", [_scrape, _evaluate], ids=["scrape", "evaluate"])
@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_parse_time_grows_linearly_with_hostile_input(
        category: str, path: Callable[[bytes], object]) -> None:
    build = CATEGORIES[category]
    bodies = [build(size) for size in SIZES]
    # A quadratic parser takes minutes at the larger sizes: one look at the largest first.
    spent = _cpu(lambda: path(bodies[-1]))
    assert spent < 30.0, f"{category}: {spent:.1f} s of CPU for {SIZES[-1]} bytes"
    times = _best_in_turns(5, [lambda raw=raw: path(raw) for raw in bodies])  # type: ignore[misc]
    ratio = times[-1] / max(times[0], 1e-6)
    print(f"\n{category} ({path.__name__[1:]}): " + ", ".join(
        f"{s // 1024} KiB {t * 1000:.2f} ms" for s, t in zip(SIZES, times, strict=True))
        + f"; time(8n)/time(n) = {ratio:.1f}")
    assert ratio < MAX_RATIO, (category, times)


# --- malformed numbers, cut bodies, content after # EOF ---------------------------------------


def _outcomes(raw: bytes, tmp_path: Path) -> tuple[str | None, str | None, Action | None]:
    """(scrape error, evaluate error, evaluate's action for n1)."""
    try:
        read_body(raw, "n1")
        scrape = None
    except BodyError as err:
        scrape = str(err)
    source = tmp_path / "body.prom"
    source.write_bytes(raw)
    report = evaluate_sources([str(source)], node="n1", config=PolicySettings())
    evaluate = report.errors[0].message if report.errors else None
    action = report.nodes[0].action if report.nodes else None
    return scrape, evaluate, action


REFUSED = {
    "fullwidth_gpu": "gpu label '\uff10' is not a GPU index",
    "arabic_indic_value": "invalid number",
    "devanagari_value": "invalid number",
    "fullwidth_value": "invalid number",
    "fractional_xid": "value 79.5 is not an integer",
    "xid_out_of_range": "value 1000000000.0 is not an integer in 0..65535",
    "xid_after_eof": "content after # EOF",
    "cut_mid_number": "truncated or corrupted",
    "cut_mid_labels": "truncated or corrupted",
    "fullwidth_count_xid": "is not an XID",
    "count_xid_5000_digits": "label xid longer than 256 characters",
    "not_utf8": "not UTF-8",
    "control_chars": "truncated or corrupted",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_garbage_is_refused_by_the_scrape_and_by_evaluate_alike(name: str,
                                                                tmp_path: Path) -> None:
    scrape, evaluate, action = _outcomes(GARBAGE[name], tmp_path)
    assert scrape is not None and evaluate is not None and action is None
    # The scrape words a bad line as a count; evaluate quotes the first one.
    assert REFUSED[name] in (scrape + " " + evaluate), (scrape, evaluate)


def test_a_well_formed_xid_still_counts(tmp_path: Path) -> None:
    assert _outcomes(GARBAGE["xid_79_valid"], tmp_path) == (None, None, Action.REBOOT)
    eof_last = GARBAGE["xid_79_valid"] + b"# EOF\n"
    assert _outcomes(eof_last, tmp_path) == (None, None, Action.REBOOT)


@pytest.mark.parametrize(("body", "message"), [
    (CATEGORIES["many_gpus"](64 * 1024), "GPUs for n1, more than 64"),
    (GOOD.encode() + b"# comment\n" * 100_001, "lines, more than 100000"),
    ((GOOD * 20_001).encode(), "health samples, more than 20000"),
])
def test_per_node_caps_give_a_clear_error(body: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message):
        read_body(body, "n1")


def test_an_identity_label_over_the_cap_is_a_bad_line() -> None:
    line = f'{NAME}{{gpu="1",UUID="{"G" * 300}",Hostname="n1"}} 1'
    with pytest.raises(BodyError, match="1 unparsable lines"):
        read_body((GOOD + line + "\n").encode(), "n1")
    result = parse_exposition(GOOD + line + "\n")
    assert result.bad_lines == 1 and "label UUID longer than 256" in result.examples[0]
