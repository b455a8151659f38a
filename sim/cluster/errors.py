"""API errors rendered as `kind: Status` bodies worded like the real API server.

The wording matters: clients (and the product) match on `reason`, `code` and
sometimes on the message, so each constructor mirrors one of apimachinery's
`errors.NewXxx` helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.cluster.resources import ResourceType

CONFLICT_MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


@dataclass
class FieldError:
    """One entry of a field.ErrorList: `field: Type: detail`."""

    field: str
    kind: str  # Required | Invalid | Unsupported | Duplicate | Forbidden | TooLong
    detail: str
    value: Any = None

    _REASONS = {
        "Required": ("FieldValueRequired", "Required value"),
        "Invalid": ("FieldValueInvalid", "Invalid value"),
        "Unsupported": ("FieldValueNotSupported", "Unsupported value"),
        "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
        "Forbidden": ("FieldValueForbidden", "Forbidden"),
        "TooLong": ("FieldValueTooLong", "Too long"),
    }

    def text(self) -> str:
        _reason, label = self._REASONS[self.kind]
        if self.kind in ("Invalid", "Unsupported", "Duplicate"):
            shown = f'"{self.value}"' if isinstance(self.value, str) else repr(self.value)
            return f"{label}: {shown}" + (f": {self.detail}" if self.detail else "")
        return f"{label}: {self.detail}"

    def cause(self) -> dict[str, Any]:
        return {"reason": self._REASONS[self.kind][0], "message": self.text(), "field": self.field}


@dataclass
class ApiError(Exception):
    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    retry_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        details = dict(self.details or {})
        if self.retry_after:
            details["retryAfterSeconds"] = self.retry_after
        if details:
            out["details"] = details
        out["code"] = self.code
        return out


def _resource_details(rt: ResourceType, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{rt.qualified} "{name}" not found', _resource_details(rt, name)
    )


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _resource_details(rt, name)
    )


def conflict(rt: ResourceType, name: str, why: str = CONFLICT_MODIFIED) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}',
        _resource_details(rt, name),
    )


def invalid(rt: ResourceType, name: str, errs: list[FieldError]) -> ApiError:
    texts = [f"{e.field}: {e.text()}" for e in errs]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = [e.cause() for e in errs]
    return ApiError(422, "Invalid", f'{rt.group_kind} "{name}" is invalid: {joined}', details)


def unprocessable(message: str) -> ApiError:
    """NewGenericServerResponse(422): what a failed JSON patch op turns into."""
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{rt.qualified} "{name}" is forbidden: {why}',
        _resource_details(rt, name),
    )


def method_not_allowed(rt: ResourceType | None = None) -> ApiError:
    details = {} if rt is None else {k: v for k, v in _resource_details(rt, "").items() if v}
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        details,
    )


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"application/json-patch+json, application/merge-patch+json, "
        f"application/strategic-merge-patch+json (got {content_type!r}; this simulator does "
        f"not implement server-side apply)",
    )


def too_many_requests(
    message: str, retry_after: int = 0, causes: list[dict[str, Any]] | None = None
) -> ApiError:
    err = ApiError(429, "TooManyRequests", message, {"causes": causes} if causes else {})
    if retry_after:
        err.retry_after = retry_after
        err.headers["Retry-After"] = str(retry_after)
    return err


def internal(message: str) -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def service_unavailable(
    message: str = "the server is currently unable to handle the request",
) -> ApiError:
    return ApiError(503, "ServiceUnavailable", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
