"""ServiceAccount tokens bound to pods, and the TokenReview that reads them back.

Two API calls, as the real API server lays them out:

- ``POST /api/v1/namespaces/NS/serviceaccounts/NAME/token`` (a TokenRequest with
  ``spec.boundObjectRef`` a Pod): a token for that account, bound to the pod, which names
  the pod's node (the kubelet asks for these for projected volumes; tests and the benchmark
  ask for them directly);
- ``POST /apis/authentication.k8s.io/v1/tokenreviews``: who a token is. For a pod-bound
  token ``status.user.extra`` carries ``authentication.kubernetes.io/pod-name``, ``pod-uid``,
  ``node-name`` and ``node-uid`` (Kubernetes 1.30+, ServiceAccountTokenPodNodeInfo) and
  ``credential-id``. A token is refused once expired, when its audiences and the review's
  do not meet, or once its pod is gone (or is another pod of the same name).

Tokens are JWTs signed with an HMAC key of this simulator (a real one signs with RSA/EC;
nobody but the simulator checks them here). The simulator does not store ServiceAccounts:
any account name in an existing namespace is accepted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sim.cluster import clock, errors
from sim.cluster import resources as r
from sim.cluster.store import Store

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
"""The API server's own audience: a TokenRequest without audiences gets it."""
MIN_EXPIRATION_SECONDS = 600
DEFAULT_EXPIRATION_SECONDS = 3600
MAX_EXPIRATION_SECONDS = 2**32

EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
EXTRA_NODE_NAME = "authentication.kubernetes.io/node-name"
EXTRA_NODE_UID = "authentication.kubernetes.io/node-uid"
EXTRA_CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"

TOKEN_PATH = "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenAuthority:
    """Issues and reviews tokens over ``store``; ``now`` is the clock (tests move it)."""

    def __init__(self, store: Store, now: Callable[[], float] = clock.now) -> None:
        self.store = store
        self.now = now
        self._key = secrets.token_bytes(32)

    # -- TokenRequest ------------------------------------------------------------

    def request_token(self, namespace: str, account: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        if self.store.find(r.NAMESPACES, "", namespace) is None:
            raise errors.not_found(r.NAMESPACES, namespace)
        spec = body.get("spec") or {}
        if not isinstance(spec, dict):
            raise errors.bad_request("spec: must be an object")
        audiences = spec.get("audiences") or [API_AUDIENCE]
        seconds = spec.get("expirationSeconds", DEFAULT_EXPIRATION_SECONDS)
        problems = []
        if not isinstance(audiences, list) or not all(isinstance(a, str) and a
                                                      for a in audiences):
            problems.append(errors.FieldError("spec.audiences", "Invalid", "must be a list "
                                              "of non-empty strings", audiences))
        if isinstance(seconds, bool) or not isinstance(seconds, int) or \
                not MIN_EXPIRATION_SECONDS <= seconds <= MAX_EXPIRATION_SECONDS:
            problems.append(errors.FieldError(
                "spec.expirationSeconds", "Invalid",
                f"may not specify a duration less than {MIN_EXPIRATION_SECONDS} seconds",
                seconds))
        ref = spec.get("boundObjectRef")
        pod: dict[str, Any] | None = None
        if ref is not None:
            if not isinstance(ref, dict) or ref.get("kind") != "Pod":
                problems.append(errors.FieldError("spec.boundObjectRef.kind", "Unsupported",
                                                  'supported values: "Pod"',
                                                  (ref or {}).get("kind")
                                                  if isinstance(ref, dict) else ref))
            else:
                pod = self.store.find(r.PODS, namespace, str(ref.get("name", "")))
                if pod is None:
                    raise errors.not_found(r.PODS, str(ref.get("name", "")))
                if ref.get("uid") and ref["uid"] != pod["metadata"].get("uid"):
                    raise errors.conflict(r.PODS, pod["metadata"]["name"],
                                          f"the UID in the bound object reference "
                                          f"({ref['uid']}) does not match the UID in record")
        if problems:
            raise errors.invalid(r.PODS, account, problems)
        issued = int(self.now())
        claims: dict[str, Any] = {
            "iss": API_AUDIENCE, "sub": f"system:serviceaccount:{namespace}:{account}",
            "aud": audiences, "iat": issued, "nbf": issued, "exp": issued + seconds,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": {"namespace": namespace,
                              "serviceaccount": {"name": account}},
        }
        if pod is not None:
            claims["kubernetes.io"]["pod"] = {"name": pod["metadata"]["name"],
                                              "uid": pod["metadata"].get("uid", "")}
            node_name = (pod.get("spec") or {}).get("nodeName")
            node = self.store.find(r.NODES, "", node_name) if node_name else None
            if node is not None:
                claims["kubernetes.io"]["node"] = {"name": node_name,
                                                   "uid": node["metadata"].get("uid", "")}
        token = self._sign(claims)
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": account, "namespace": namespace,
                             "creationTimestamp": clock.rfc3339(issued)},
                "spec": {"audiences": audiences, "expirationSeconds": seconds,
                         "boundObjectRef": ref},
                "status": {"token": token,
                           "expirationTimestamp": clock.rfc3339(issued + seconds)}}

    def _sign(self, claims: dict[str, Any]) -> str:
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = _b64(json.dumps(claims, separators=(",", ":")).encode())
        mac = hmac.new(self._key, f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{_b64(mac)}"

    # -- TokenReview -------------------------------------------------------------

    def review(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise errors.bad_request("TokenReview: spec is required")
        spec = body["spec"]
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise errors.invalid(r.PODS, "", [errors.FieldError(
                "spec.token", "Required", "", None)])
        wanted = spec.get("audiences") or [API_AUDIENCE]
        status = self._status(token, wanted)
        return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def _status(self, token: str, wanted: list[str]) -> dict[str, Any]:
        def refused(why: str) -> dict[str, Any]:
            return {"authenticated": False, "user": {},
                    "error": f"[invalid bearer token, {why}]"}

        claims = self._verified(token)
        if claims is None:
            return refused("token could not be verified")
        if claims["exp"] <= self.now():
            return refused("service account token has expired")
        audiences = [a for a in wanted if a in claims["aud"]]
        if not audiences:
            return refused(f"token audiences {claims['aud']} is invalid for the target "
                           f"audiences {wanted}")
        k8s = claims["kubernetes.io"]
        namespace = k8s["namespace"]
        extra: dict[str, list[str]] = {EXTRA_CREDENTIAL_ID: [f"JTI={claims['jti']}"]}
        if "pod" in k8s:
            pod = self.store.find(r.PODS, namespace, k8s["pod"]["name"])
            if pod is None or pod["metadata"].get("uid", "") != k8s["pod"]["uid"]:
                return refused(f"pod \"{k8s['pod']['name']}\" not found (or another pod of "
                               "that name): the token was bound to it")
            extra[EXTRA_POD_NAME] = [k8s["pod"]["name"]]
            extra[EXTRA_POD_UID] = [k8s["pod"]["uid"]]
            if "node" in k8s:
                extra[EXTRA_NODE_NAME] = [k8s["node"]["name"]]
                extra[EXTRA_NODE_UID] = [k8s["node"]["uid"]]
        return {"authenticated": True,
                "user": {"username": claims["sub"], "uid": str(uuid.uuid5(
                    uuid.NAMESPACE_URL, claims["sub"])),
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                               "system:authenticated"],
                    "extra": extra},
                "audiences": audiences}

    def _verified(self, token: str) -> dict[str, Any] | None:
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            mac = _unb64(parts[2])
            claims = json.loads(_unb64(parts[1]))
        except ValueError:
            return None
        good = hmac.new(self._key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(mac, good) or not isinstance(claims, dict):
            return None
        return claims

    # -- HTTP ----------------------------------------------------------------------

    def register(self, app: web.Application) -> None:
        """Routes ahead of the generic resource dispatch (call before adding it)."""
        app.router.add_post(TOKEN_PATH, self._token_request)
        app.router.add_post(REVIEW_PATH, self._token_review)

    async def _token_request(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda body: self.request_token(
            request.match_info["namespace"], request.match_info["name"], body))

    async def _token_review(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.review)

    @staticmethod
    async def _answer(request: web.Request,
                      work: Callable[[Any], dict[str, Any]]) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        try:
            return web.json_response(work(body), status=201)
        except errors.ApiError as err:
            return web.json_response(err.body(), status=err.code)
