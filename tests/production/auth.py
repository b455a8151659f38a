"""Authentication for the production tier's server: a CA and a frontend certificate, an RSA
signing key served as JWKS over loopback, and tokens in the default JWT claim mapper's
format (``permissions: ["<namespace>:<role>"]``; ``temporal-system`` is every namespace).

The server verifies every token against the JWKS (``TEMPORAL_JWT_KEY_SOURCE1``) and its
default authorizer decides by role (docs/security.md, "Temporal authorization").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

KID = "gpu-remediate-tier"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Auth:
    """Everything the server and the clients need, written under ``folder``."""

    folder: Path
    namespace: str = "default"
    signing: rsa.RSAPrivateKey = field(default_factory=_key)
    stranger: rsa.RSAPrivateKey = field(default_factory=_key)
    """A key the server does not know (its tokens must be refused)."""
    _server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ TLS

    def write_tls(self) -> None:
        """A CA and a frontend certificate for 127.0.0.1/localhost (a bearer token never
        travels in clear text: the SDK turns TLS on with an API key)."""
        now = dt.datetime.now(dt.UTC)
        ca_key = _key()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-remediate tier CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5))
              .not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = _key()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(_pem(key))

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.folder / "frontend.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "frontend-key.pem"

    # ------------------------------------------------------------ JWKS

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.signing.public_key()))
        return {"keys": [{**public, "kid": KID, "alg": "RS256", "use": "sig"}]}

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        """Serve the JWKS on a loopback port; yields its URL."""
        body = json.dumps(self.jwks()).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        finally:
            server.shutdown()
            server.server_close()

    # ------------------------------------------------------------ tokens

    def token(self, sub: str, *permissions: str, expires_in: dt.timedelta = dt.timedelta(hours=2),
              key: rsa.RSAPrivateKey | None = None) -> str:
        now = dt.datetime.now(dt.UTC)
        return jwt.encode({"sub": sub, "permissions": list(permissions),
                           "iat": int(now.timestamp()),
                           "exp": int((now + expires_in).timestamp())},
                          _pem(key or self.signing), algorithm="RS256", headers={"kid": KID})

    def write_token(self, name: str, token: str) -> Path:
        path = self.folder / f"{name}.jwt"
        path.write_text(token)
        return path

    # The roles of docs/security.md's table for a self-hosted server.
    def admin(self) -> str:
        return self.token("setup@tier", "temporal-system:admin")

    def worker(self) -> str:
        # write for its own calls (start, signal, its clients' queries), worker to take tasks
        # (tests/production/server: only that role polls).
        return self.token("system:serviceaccount:gpu-remediate:gpu-remediate",
                          f"{self.namespace}:write", f"{self.namespace}:worker")

    def operator(self, sub: str = "alice@example.com") -> str:
        return self.token(sub, f"{self.namespace}:write")

    def viewer(self) -> str:
        return self.token("viewer@example.com", f"{self.namespace}:read")
