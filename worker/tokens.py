"""What the CLI can tell from its own Temporal token, without trusting it.

The Temporal server decides: its JWT claim mapper verifies the signature and its authorizer
the role (docs/security.md). The CLI only reads its token's claims, unverified, for two
things: the operator identity it records (the token's subject, the same name the server
stamps as the principal of every history event the call writes, so a history entry ties to
the server's authorization decision), and a refusal's explanation (the server answers every
refusal with the same "Request unauthorized"; the token says whether it expired, names
another namespace or grants too small a role). Nothing here grants anything.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import jwt

# The default claim mapper's permission claim and roles ("namespace:role";
# temporal-system is every namespace).
PERMISSIONS_CLAIM = "permissions"
SYSTEM_NAMESPACE = "temporal-system"
ROLES = ("worker", "read", "write", "admin")
"""Weakest first: the default authorizer compares role bits (worker < read < write <
admin), so a ``worker`` permission alone grants no API call."""


@dataclass(frozen=True)
class TokenFacts:
    """A JWT's claims as the CLI reads them (unverified)."""

    subject: str | None
    expires: dt.datetime | None
    roles: dict[str, str] = field(default_factory=dict)
    """Namespace -> the strongest role granted there."""

    def role_in(self, namespace: str) -> str | None:
        granted = [r for ns, r in self.roles.items() if ns in (namespace, SYSTEM_NAMESPACE)]
        return max(granted, key=ROLES.index) if granted else None

    def expired(self, now: dt.datetime) -> bool:
        return self.expires is not None and self.expires <= now


def read(token: str | None, permissions_claim: str = PERMISSIONS_CLAIM) -> TokenFacts | None:
    """The claims of ``token`` when it is a JWT; None for an opaque key or no key."""
    if not token or token.count(".") != 2:
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    sub = claims.get("sub")
    exp = claims.get("exp")
    roles: dict[str, str] = {}
    perms = claims.get(permissions_claim)
    for p in perms if isinstance(perms, list) else []:
        if not isinstance(p, str) or ":" not in p:
            continue
        ns, role = p.split(":", 1)
        role = role.lower()
        if role in ROLES and (ns not in roles or ROLES.index(role) > ROLES.index(roles[ns])):
            roles[ns] = role
    return TokenFacts(
        subject=sub if isinstance(sub, str) and sub else None,
        expires=dt.datetime.fromtimestamp(exp, dt.UTC) if isinstance(exp, int | float)
        else None,
        roles=roles)


def refusal(facts: TokenFacts | None, namespace: str, needs: str,
            now: dt.datetime | None = None) -> str:
    """Why the server refused a call that ``needs`` a role in ``namespace``, as far as the
    token tells; the last resort names what only the server can know."""
    if facts is None:
        return (f"the Temporal server refused the call: it needs a token with {needs} in "
                f"namespace {namespace} (temporal.api_key_file)")
    now = now or dt.datetime.now(dt.UTC)
    if facts.expired(now):
        assert facts.expires is not None
        return (f"the Temporal token expired at {facts.expires:%Y-%m-%d %H:%M:%S} UTC: "
                "fetch a new one into temporal.api_key_file")
    role = facts.role_in(namespace)
    if role is None:
        others = ", ".join(f"{ns}:{r}" for ns, r in sorted(facts.roles.items())) or "none"
        return (f"the Temporal token grants no role in namespace {namespace} (it grants: "
                f"{others}); this call needs {needs}")
    if ROLES.index(role) < ROLES.index(needs):
        return (f"the Temporal token grants {role} in namespace {namespace}; this call "
                f"needs {needs}")
    return (f"the Temporal server refused a current token that grants {role} in namespace "
            f"{namespace}: it does not know the key that signed it (or the token is "
            "malformed); ask for a token from the server's issuer")
