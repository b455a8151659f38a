"""Text a node or an exporter wrote, made safe to show a person.

The Temporal UI renders a workflow's summary and details as Markdown. Whatever a node can
write (its labels, its exporter's text: GPU UUIDs, model names, the ``gpu`` label) must
show as the characters it is, never as a heading, a link, an image, emphasis, a table
cell break or HTML: a node must not be able to put "Approved by SRE" and a runbook link on
its own remediation page. Control characters (CR/LF, terminal escapes, bidi overrides,
zero-width characters) are dropped: they would forge lines in a log, an Event or a
terminal, or make text read other than it is.

Pure: no I/O; workflow code imports this module through the sandbox.
"""

from __future__ import annotations

import string
import unicodedata

# CommonMark renders a backslash before any ASCII punctuation as that character, literally.
# Escaped: every character that starts or closes a construct (block markers, emphasis,
# code, links and images, tables, HTML and entities) and those an autolink needs ('/' of
# "://" and "//", '.' of a domain). Left as they are, for prose to stay readable: the few
# that mean nothing on their own, and those that mean something only at the start of a
# line (a list item, a setext underline), escaped there.
_AT_START = "-+="
_LITERAL = set(":,;\"'%?@$^" + _AT_START)
_ESCAPED = {ord(c): "\\" + c for c in string.punctuation if c not in _LITERAL}
_SPACES = {"\t", "\n", "\r", "\v", "\f", "\u2028", "\u2029", "\x85"}


def printable(text: str, limit: int) -> str:
    """``text`` without control or format characters (line and tab breaks become a space),
    cut to ``limit`` characters ending in "…". For plain-text places (Events, logs)."""
    kept = "".join(
        " " if c in _SPACES else c for c in text
        if c in _SPACES or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co", "Cn"))
    if len(kept) > limit:
        kept = kept[: max(0, limit - 1)] + "…"
    return kept


def plain(text: str, limit: int) -> str:
    """``text`` as literal text inside Markdown: control characters dropped, cut to
    ``limit`` visible characters (ending in "…"), every Markdown and HTML metacharacter
    escaped. The result renders as the characters of the (cut) input; it may be up to
    twice ``limit`` long before rendering. Leading and trailing white space goes too: at
    the start of a line, four spaces would open a code block."""
    escaped = printable(text, limit).strip().translate(_ESCAPED)
    return "\\" + escaped if escaped[:1] in tuple(_AT_START) else escaped
