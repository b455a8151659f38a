"""What a node or an exporter wrote shows in the Temporal UI as the characters it is: the
remediation's details never grow a heading, a link, an image or HTML from a GPU's label."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from policy.models import Action, Finding, Verdict
from workflows.detector import _evidence
from workflows.ui_text import plain, printable

HOSTILE = "### Approved by SRE [runbook](http://x)"
# The Temporal UI renders GitHub-flavoured Markdown: CommonMark with tables and strikethrough.
MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def tokens(text: str) -> list[Any]:
    out = []
    for token in MD.parse(text):
        out.append(token)
        out += token.children or []
    return out


def literal(text: str) -> str:
    """What a line of Markdown renders as, when it is nothing but text."""
    [para, inline, close] = MD.parse(text)
    assert (para.type, close.type) == ("paragraph_open", "paragraph_close"), text
    assert {t.type for t in inline.children} <= {"text", "softbreak"}, [
        t.type for t in inline.children]
    return "".join("\n" if t.type == "softbreak" else t.content for t in inline.children)


def hostile_verdict(uuid: str = HOSTILE, **finding: str) -> Verdict:
    return Verdict(node="gpu-node-7", action=Action.REBOOT, findings=[Finding(
        gpu=finding.get("gpu", "3"), uuid=uuid, signal=finding.get("signal", "xid"),
        value=79, rule=finding.get("rule", "xid-79"), action=Action.REBOOT)])


def test_a_hostile_uuid_renders_as_text_not_a_heading_or_a_link() -> None:
    details = _evidence(hostile_verdict(), "detector", "policy verdict", dry_run=False)
    found = tokens(details)
    headings = [t for t in found if t.type == "heading_open"]
    assert len(headings) == 1, "only the remediation's own title is a heading"
    assert not [t for t in found if t.type in (
        "link_open", "image", "html_inline", "html_block", "code_inline", "s_open")]
    cells = [t.content for t in found if t.type == "inline"]
    assert HOSTILE in [c.replace("\\", "") for c in cells]
    # The UUID is one cell of one row: the table keeps its six columns.
    assert sum(t.type == "td_open" for t in found) == 6


@pytest.mark.parametrize("field", ["gpu", "signal", "rule"])
def test_every_exporter_field_of_the_details_is_escaped(field: str) -> None:
    bad = "x | y <img src=x onerror=alert(1)> [a](http://b) **c**"
    details = _evidence(hostile_verdict(uuid="GPU-1", **{field: bad}), "detector", "why",
                        dry_run=False)
    found = tokens(details)
    assert not [t for t in found if t.type in ("link_open", "image", "html_inline")]
    assert sum(t.type == "strong_open" for t in found) == 1, "only the requester is bold"
    assert sum(t.type == "td_open" for t in found) == 6


def test_the_requester_and_reason_cannot_forge_lines_or_links() -> None:
    details = _evidence(hostile_verdict(uuid="GPU-1"), "mallory\n### Approved",
                        "ok [runbook](http://x)\r\n\n# done", dry_run=False)
    assert len(details.splitlines()) == 6
    found = tokens(details)
    assert sum(t.type == "heading_open" for t in found) == 1
    assert not [t for t in found if t.type == "link_open"]


def test_the_shipped_details_still_read_as_before() -> None:
    details = _evidence(hostile_verdict(uuid="GPU-1"), "bob", "user report: NaNs",
                        dry_run=True)
    assert details.startswith("### gpu-node-7: reboot (dry-run)\n")
    assert "| 3 | GPU-1 | xid | 79 | xid-79 | reboot |" in details
    assert "Requested by **bob**: user report: NaNs" in details


@pytest.mark.parametrize(("text", "shown"), [
    ("a\r\nb\tc", "a  b c"),
    ("GPU-\x1b[31mred\x1b[0m", "GPU-[31mred[0m"),
    ("admin\u202egnp.exe", "admingnp.exe"),
    ("zero\u200bwidth", "zerowidth"),
    ("ok", "ok"),
])
def test_printable_drops_control_and_format_characters(text: str, shown: str) -> None:
    assert printable(text, 100) == shown


def test_leading_spaces_never_open_a_code_block() -> None:
    assert literal(plain("    indented", 80)) == "indented"
    assert literal(plain("\t1. item", 80)) == "1. item"


@pytest.mark.parametrize("line", ["- item", "+ item", "---", "===", "-", "1) x", "> quote"])
def test_a_line_of_node_text_never_starts_a_block(line: str) -> None:
    assert literal(plain(line, 80)) == line
    assert literal("intro\n" + plain(line, 80)) == "intro\n" + line


def test_long_text_is_cut_to_the_limit_with_an_ellipsis() -> None:
    assert printable("x" * 50, 10) == "x" * 9 + "…"
    assert literal(plain("[" * 50, 10)) == "[" * 9 + "…"


@given(st.text(max_size=80))
def test_plain_renders_as_exactly_the_printable_text(text: str) -> None:
    expected = printable(text, 80).strip()
    if not expected:
        return
    # CommonMark drops leading and trailing white space of a paragraph, nothing else.
    assert literal(plain(text, 80)).strip() == expected
