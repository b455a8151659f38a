"""What the CLI prints, made to fit a shell: exit codes in one table, tables that never cut a
value when stdout is a pipe or a file, text from nodes and operators shown without the
control characters or terminal escapes it might carry."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done, or read: whatever the nodes' state (a quarantined node is a state, "
              "not an error)"),
    (EXIT_FAILED, "could not: Temporal or the Kubernetes API not reached, no such "
                  "remediation or node, the workflow refused the command (not in the state "
                  "it applies to)"),
    (EXIT_USAGE, "bad usage: an unknown option, no --reason, a value the rules refuse (an "
                 "empty or too long reason, a control character, not a node name), a config "
                 "file that does not load"),
)
"""The operator commands' exit codes (`check` and `evaluate` have their own, in their help)."""


def exit_codes_help() -> str:
    """The table for `--help` (Markdown: typer's rich help renders it)."""
    return "Exit codes of the operator commands:\n\n" + "\n".join(
        f"* **{code}** {meaning}" for code, meaning in EXIT_CODES)


def shown(text: object) -> str:
    """``text`` as it may reach a terminal: every control character (ESC starts each
    terminal escape) and bidirectional override written as its code, never raw."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or (
                unicodedata.category(ch) == "Cf" and unicodedata.bidirectional(ch) in (
                    "LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI")):
            out.append(f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def plain_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned with spaces, every value whole: what `| grep`, `| cut`, `| column`
    and a file get. An empty cell shows as "-" so that columns stay countable by awk."""
    cells = [[shown(c) or "-" for c in row] for row in rows]
    header = [c.upper().replace(" ", "_") for c in columns]
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *cells]]
    return "\n".join(lines)


def print_table(console: Console, columns: Sequence[str], rows: Sequence[Sequence[object]],
                title: str | None = None) -> None:
    """A Rich table in a terminal (long values fold, never cut); plain aligned text
    anywhere else."""
    if not console.is_terminal:
        console.print(plain_table(columns, rows), soft_wrap=True, highlight=False)
        return
    table = rich_table(columns, rows, title)
    console.print(table)


def rich_table(columns: Sequence[str], rows: Sequence[Sequence[object]],
               title: str | None = None) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(Text(shown(c)) for c in row))
    return table
