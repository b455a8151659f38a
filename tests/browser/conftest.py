"""The browser tier: the Temporal UI paths an operator uses, in a real browser.

Off unless GPU_REMEDIATE_BROWSER names the browser: ``system`` (Debian's ``chromium`` on
PATH) or the path of a Chromium executable. Playwright drives it; it never downloads a
browser of its own. tests/browser/verify.sh runs the tier; CI (.ci/run) turns it on when
its inputs changed since tests/browser/VERIFIED. See docs/operations.md, "Approve, reject,
quarantine and release from the Temporal UI".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

ENV = "GPU_REMEDIATE_BROWSER"
VERIFY = Path(__file__).with_name("verify.sh")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"browser: drives the Temporal UI in Chromium through Playwright "
                   f"(skipped unless {ENV} is set)")


def resolve(choice: str | None) -> tuple[Path | None, str]:
    """The Chromium executable for ``choice``, or None with the reason the tier is skipped.
    A choice that names no usable browser is an error, not a skip: the tier was asked for."""
    choice = (choice or "").strip()
    if choice in ("", "0", "no", "off"):
        return None, (f"the browser tier is off: set {ENV}=system (Debian's chromium) or the "
                      "path of a Chromium executable; tests/browser/verify.sh runs it")
    if choice in ("1", "yes", "system"):
        found = shutil.which("chromium") or shutil.which("chromium-browser")
        if found is None:
            pytest.fail(f"{ENV}={choice}, but no chromium on PATH: apt-get install chromium")
        return Path(found), ""
    path = Path(choice).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{ENV}: {path} is not an executable file")
    return path, ""


@pytest.fixture(scope="session")
def chromium() -> Path:
    path, why = resolve(os.environ.get(ENV))
    if path is None:
        if os.environ.get("CI") == "true" and not _verified():
            pytest.fail(f"CI=true and the browser tier's inputs changed since "
                        f"tests/browser/VERIFIED, but {ENV} is not set: .ci/run sets it "
                        "(or run tests/browser/verify.sh and commit VERIFIED)")
        pytest.skip(why)
    return path


def _verified() -> bool:
    check = subprocess.run([str(VERIFY), "--check"], capture_output=True, text=True,
                           timeout=60, check=False)
    return check.returncode == 0


@pytest.fixture(scope="session")
def browser(chromium: Path) -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        pytest.fail(f"{ENV} is set but Playwright is not installed ({err}): "
                    "pip install -e '.[test]'")
    with sync_playwright() as pw:
        # The system browser, never one Playwright would download (`playwright install`).
        launched = pw.chromium.launch(executable_path=str(chromium), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    # Actions wait for the UI, which polls a busy 2-core machine: generous, but bounded.
    context.set_default_timeout(30_000)
    yield context.new_page()
    context.close()
