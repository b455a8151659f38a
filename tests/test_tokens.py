"""The CLI's reading of its own Temporal token: identity and a refusal's explanation.

The server verifies; these tests pin what the CLI says from the claims alone."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import jwt
import pytest
from typer.testing import CliRunner

from worker import tokens
from worker.cli import app

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)


def token(sub: str | None = "alice@example.com", perms: object = ("default:write",),
          exp: dt.datetime | None = NOW + dt.timedelta(hours=1)) -> str:
    claims: dict[str, object] = {"permissions": list(perms) if isinstance(perms, tuple)
                                 else perms}
    if sub is not None:
        claims["sub"] = sub
    if exp is not None:
        claims["exp"] = int(exp.timestamp())
    return jwt.encode(claims, "not-the-servers-key-at-least-32-bytes", algorithm="HS256",
                      headers={"kid": "k1"})


def test_claims_are_read_without_the_key() -> None:
    facts = tokens.read(token(perms=("default:read", "default:WRITE", "other:admin",
                                     "junk", 7)))
    assert facts is not None and facts.subject == "alice@example.com"
    assert facts.roles == {"default": "write", "other": "admin"}
    assert facts.role_in("default") == "write" and facts.role_in("third") is None
    system = tokens.read(token(perms=("temporal-system:admin",)))
    assert system is not None and system.role_in("anything") == "admin"


@pytest.mark.parametrize("key", [None, "", "tcld_opaque_key", "a.b.c", "x" * 40])
def test_an_opaque_key_or_garbage_has_no_claims(key: str | None) -> None:
    assert tokens.read(key) is None


@pytest.mark.parametrize(("tok", "needs", "says"), [
    (token(exp=NOW - dt.timedelta(minutes=1)), "write", "expired at 2026-12-06 11:59:00 UTC"),
    (token(perms=("prod:write",)), "write", "grants no role in namespace default (it grants: "
                                            "prod:write)"),
    (token(perms=("default:read",)), "write", "grants read in namespace default; this call "
                                              "needs write"),
    (token(perms=("default:worker",)), "read", "grants worker in namespace default"),
    (token(), "write", "does not know the key that signed it"),
    (None, "read", "needs a token with read in namespace default"),
])
def test_a_refusal_names_which_rule_the_token_broke(tok: str | None, needs: str,
                                                    says: str) -> None:
    assert says in tokens.refusal(tokens.read(tok), "default", needs, now=NOW)


def _config(tmp_path: Path, key: str) -> Path:
    (tmp_path / "token").write_text(key)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"temporal:\n  address: 127.0.0.1:1\n  api_key_file: {tmp_path / 'token'}\n")
    return cfg


def test_the_operator_is_the_tokens_subject_and_cannot_be_renamed(tmp_path: Path) -> None:
    cfg = _config(tmp_path, token(sub="alice@example.com"))
    result = CliRunner().invoke(app, ["approve", "gpu-node-01", "-r", "checked the BMC",
                                      "--operator", "bob", "--config", str(cfg)])
    assert result.exit_code == 2, result.output
    assert "someone other than the subject of the Temporal token" in result.output
    assert "bob" not in result.output


def test_a_refused_call_says_why_from_the_token(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The server says only "Request unauthorized"; the CLI says the token expired."""
    from temporalio.service import RPCError, RPCStatusCode

    from worker.cli import commands

    async def refused(*_: object, **__: object) -> object:
        raise RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")

    monkeypatch.setattr(commands, "connect", refused)
    cfg = _config(tmp_path, token(exp=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)))
    result = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert result.exit_code == 1, result.output
    assert "the Temporal token expired at 2020-01-01 00:00:00 UTC" in result.output
    assert "Traceback" not in result.output


def test_a_token_refused_at_connect_says_why(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The server checks the token on the connection's first call too: the SDK reports that
    as a RuntimeError, which is a refusal, not an unreachable server."""
    from worker.cli import commands

    async def refused(*_: object, **__: object) -> object:
        raise RuntimeError("Failed client connect: Server connection error: Status { code: "
                           "PermissionDenied, message: \"Request unauthorized.\" }")

    monkeypatch.setattr(commands, "connect", refused)
    live = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)  # the CLI reads the wall clock
    cfg = _config(tmp_path, token(perms=("prod:write",), exp=live))
    result = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert result.exit_code == 1, result.output
    assert "grants no role in namespace default" in result.output
    assert "cannot reach" not in result.output
