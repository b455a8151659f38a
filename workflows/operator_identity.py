"""How an operator's name is shown: marked unverified unless the Temporal server is known
to authenticate callers.

A signal or update handler is not told who sent it, and a client puts any name it likes in
the payload. Whether that name was checked is a fact about the deployment, not about the
message: ``remediation.server_authorizes`` in the worker's own config (never a client's
payload) says whether the server runs an authorizer that rejects callers without a valid
token. Where it does not, every name shown (history annotation, Events, details, the view,
``status``) carries the same mark, added once when the order is received.
"""

from __future__ import annotations

UNVERIFIED_MARK = " (unverified)"
# Workflows that record operators mark them from here on; older histories replay unmarked.
OPERATOR_MARK_PATCH = "operator-marked-unverified"


def shown_operator(name: str, server_authorizes: bool) -> str:
    """The operator's name as every record shows it: ``alice (unverified)`` where the server
    is not known to authenticate callers, ``alice`` where it is. Marking twice is marking
    once (an order recorded with the mark and shown again)."""
    if server_authorizes or not name or name.endswith(UNVERIFIED_MARK):
        return name
    return name + UNVERIFIED_MARK
