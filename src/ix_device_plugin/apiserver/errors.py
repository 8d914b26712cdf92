"""What an API call can fail with: KubeError and its kinds, made from the client library's and transport's errors.

Every message starts with what was asked (the verb and the object) and says what happened: the HTTP status
and the server's reason, or "cannot reach the API server at ..." only when no connection could be made.
"""

from __future__ import annotations

GONE = 410


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
