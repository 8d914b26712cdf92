"""What an API call can fail with: KubeError and its kinds, made from the client library's and transport's errors.

Every message starts with what was asked (the verb and the object) and says what happened: the HTTP status
and the server's reason, or "cannot reach the API server at ..." only when no connection could be made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

GONE = 410
INVALID = 422


class KubeError(Exception):
    """An API call failed; the message names the verb, the object and the HTTP status (or why none came)."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason

    @property
    def transient(self) -> bool:
        """True when trying again later may succeed: no answer, throttled, or a server error."""
        return self.status is None or self.status == 429 or self.status >= 500


class KubeNotFound(KubeError):
    """404: the object does not exist."""


class KubeConflict(KubeError):
    """409 Conflict: the object changed since it was read (stale resourceVersion); read it again."""


class KubeAlreadyExists(KubeError):
    """409 AlreadyExists: create found an object of that name."""


class KubeExpired(KubeError):
    """410 Gone or Expired: a watch's resourceVersion is older than the history the server keeps; list again."""


@dataclass(frozen=True)
class FieldCause:
    """One cause of a 422 as the server gives it: the field (`spec.devices[0].name`), its reason and message."""

    field: str
    reason: str = ""
    message: str = ""


class KubeInvalid(KubeError):
    """422 Invalid: the server refused the object; causes name the fields it refused (empty when it named none)."""

    def __init__(self, message: str, causes: Iterable[FieldCause] = (), reason: str = "Invalid") -> None:
        super().__init__(message, INVALID, reason)
        self.causes = tuple(causes)

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the server named, in its order, each once."""
        return tuple(dict.fromkeys(cause.field for cause in self.causes if cause.field))

    def names(self, *parts: str) -> bool:
        """True when a field the server named holds one of parts (`consumesCounters` in `spec.devices[3]...`)."""
        return any(part in field for field in self.fields for part in parts)


def field_causes(details: Any) -> list[FieldCause]:
    """The causes of a Status's details (the client library's model or a plain dict), those without a field too."""
    causes = getattr(details, "causes", None) if not isinstance(details, dict) else details.get("causes")
    found = []
    for cause in causes if isinstance(causes, list) else []:
        get = cause.get if isinstance(cause, dict) else lambda key, c=cause: getattr(c, key, None)
        found.append(FieldCause(str(get("field") or ""), str(get("reason") or ""), str(get("message") or "")))
    return found


def _where(error: Exception) -> str:
    try:
        url = error.request.url  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # a transport error raised before its request was set
        return ""
    return f" at {url.scheme}://{url.netloc.decode()}"


def kube_error(what: str, error: Exception) -> KubeError:
    """error (from the client library or the transport) as a KubeError whose message starts with what."""
    import httpx2
    from lightkube import ApiError

    from ix_device_plugin.apiserver.limits import ResponseTooLarge

    if isinstance(error, ResponseTooLarge):
        return KubeError(f"{what}: {error}")
    if isinstance(error, ApiError):
        code, reason = error.status.code, error.status.reason or ""
        text = f"{what}: HTTP {code} {reason}: {error.status.message or ''}".rstrip(": ")
        if code == 404:
            return KubeNotFound(text, code, reason)
        if code == 409:
            return (KubeAlreadyExists if reason == "AlreadyExists" else KubeConflict)(text, code, reason)
        if code == GONE:
            return KubeExpired(text, code, reason)
        if code == INVALID:
            return KubeInvalid(text, field_causes(error.status.details), reason)
        return KubeError(text, code, reason)
    if isinstance(error, httpx2.HTTPStatusError):
        code = error.response.status_code
        text = f"{what}: HTTP {code} {error.response.reason_phrase}"
        return KubeExpired(text, code) if code == GONE else KubeError(text, code)
    detail = str(error) or type(error).__name__
    if isinstance(error, httpx2.ConnectError | httpx2.ConnectTimeout):
        return KubeError(f"{what}: cannot reach the API server{_where(error)}: {detail}")
    if isinstance(error, httpx2.TransportError):
        return KubeError(f"{what}: lost the connection to the API server{_where(error)}: {detail}")
    return KubeError(f"{what}: {type(error).__name__}: {error}")
