"""Fuzz: dcgm-exporter bodies (structure-aware generation, corpus mutations, the hostile
categories). Properties: no crash (only the documented refusals), no hang (2 s per example),
no action on malformed data, and the same answer from the scrape path and ``evaluate``."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from activities.exposition import ExpositionError
from activities.parse_pool import BodyError, read_body
from policy.config import PolicySettings
from policy.models import Action, GpuReading, NodeReadings, Verdict
from policy.rules import evaluate_node
from tests.fuzz.hostile import GARBAGE, GOOD, NAME
from tests.fuzz.strategies import HOSTILE_DIGITS, budget, corpus, corpus_mutations, exposition
from worker.probe import evaluate as evaluate_cli

POLICY = PolicySettings()


def scrape(raw: bytes) -> Verdict | str:
    """What the detector concludes for node n1 from this body: a verdict, or the error."""
    try:
        gpus = read_body(raw, "n1")
    except BodyError as err:
        return f"refused: {err}"
    return evaluate_node(NodeReadings(node="n1", gpus=[GpuReading(**g) for g in gpus]), POLICY)


def evaluate(raw: bytes) -> Verdict | str:
    """What ``gpu-remediate evaluate --node n1`` concludes from the same body."""
    try:
        result = evaluate_cli._parse_source(raw, "n1")
    except evaluate_cli._SourceFailed as err:
        return f"refused: {err}"
    verdicts = [evaluate_node(r, POLICY) for r in evaluate_cli._merge(result.nodes)]
    assert [v.node for v in verdicts] == ["n1"], verdicts
    return verdicts[0]


def check(raw: bytes) -> tuple[Verdict | str, Verdict | str]:
    by_scrape, by_evaluate = scrape(raw), evaluate(raw)
    # Both refuse or both judge, and judge alike. (The wording of a refusal may differ: the
    # scrape counts bad lines, evaluate quotes the first.)
    assert isinstance(by_scrape, str) == isinstance(by_evaluate, str), (by_scrape, by_evaluate)
    if not isinstance(by_scrape, str):
        assert by_scrape == by_evaluate
    return by_scrape, by_evaluate


@budget(1000)
@given(exposition())
def test_generated_bodies(raw: bytes) -> None:
    check(raw)


@budget(500)
@given(corpus_mutations("exposition"))
def test_mutated_corpus_bodies(raw: bytes) -> None:
    check(raw)


def test_every_corpus_body() -> None:
    for raw in corpus("exposition"):
        check(raw)


@budget(150)
@given(bad=st.sampled_from(HOSTILE_DIGITS[:7]), where=st.sampled_from(["gpu", "xid", "value"]),
       before=st.integers(min_value=0, max_value=3), after=st.integers(min_value=0, max_value=3))
@example(bad="79.5", where="value", before=0, after=0)
def test_a_malformed_number_never_acts(bad: str, where: str, before: int, after: int) -> None:
    """An XID 79 whose GPU index, xid label or value is not a well-formed number, among good
    lines: the body is refused whole, never judged on the rest (no drain for garbage). A
    value that is float syntax but no usable number ("1e999") is "no data" instead."""
    good = [f'{NAME}{{gpu="{i}",UUID="GPU-{i}",Hostname="n1"}} 0' for i in range(1, 7)]
    if where == "gpu":
        line = f'{NAME}{{gpu="{bad}",UUID="GPU-9",Hostname="n1"}} 79'
    elif where == "xid":
        line = ('DCGM_EXP_XID_ERRORS_COUNT{gpu="0",UUID="GPU-9",Hostname="n1",'
                f'xid="{bad}"}} 3')
    else:
        line = f'{NAME}{{gpu="0",UUID="GPU-9",Hostname="n1"}} {bad}'
    raw = ("\n".join([*good[:before], line, *good[before:before + after]]) + "\n").encode()
    by_scrape, _ = check(raw)
    assert isinstance(by_scrape, str) or by_scrape.action == Action.NONE, by_scrape
    if where != "value" or bad != "1e999":
        assert isinstance(by_scrape, str), by_scrape


def test_every_garbage_body_is_refused_or_inert() -> None:
    for name, raw in GARBAGE.items():
        by_scrape, _ = check(raw)
        if name in ("xid_79_valid", "rich_markup_labels"):
            assert isinstance(by_scrape, Verdict) and by_scrape.action == Action.REBOOT
        else:
            assert isinstance(by_scrape, str), name


def test_the_refusals_are_the_documented_ones() -> None:
    """Only BodyError leaves read_body; ExpositionError is what evaluate wraps."""
    for raw in corpus("exposition"):
        try:
            read_body(raw, "n1")
        except BodyError:
            pass
        except ExpositionError as err:  # pragma: no cover - would be a defect
            raise AssertionError(f"ExpositionError escaped read_body: {err}") from err
    assert GOOD.startswith(NAME)
