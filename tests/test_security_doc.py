"""docs/security.md stays true: every test its threat table names exists, and its
limits example loads as the worker would load it."""

from __future__ import annotations

import re
from pathlib import Path

from worker.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "security.md").read_text()


def test_every_test_the_threat_table_names_exists() -> None:
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", DOC)
    assert len(named) >= 12
    missing = []
    for path, test in named:
        file = ROOT / path
        if not file.exists():
            missing.append(path)
        elif test and not re.search(rf"^(async )?def {test}\(", file.read_text(), re.M):
            missing.append(f"{path}::{test}")
    # A row may go on with `::other_test` in the same file.
    for line in DOC.splitlines():
        for path, rest in re.findall(r"`(tests/[\w/]+\.py)::\w+`((?:, `::\w+`)+)", line):
            text = (ROOT / path).read_text()
            for test in re.findall(r"::(\w+)", rest):
                if not re.search(rf"^(async )?def {test}\(", text, re.M):
                    missing.append(f"{path}::{test}")
    assert missing == []


def test_the_limits_example_loads(tmp_path: Path) -> None:
    block = re.search(r"```yaml\n(.*?)```", DOC, re.S)
    assert block, "security.md has the limits example"
    path = tmp_path / "config.yaml"
    path.write_text(block.group(1))
    limits = load_settings(path).limits_settings()
    assert limits.max_unavailable == "10%" and limits.dry_run_may_end is False
