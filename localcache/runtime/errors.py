"""The error tree of the framework. Every failure a caller can act on has a type here.

LocalcacheError
├── ApiError                  the apiserver answered with an error status
│   ├── BadRequest            400
│   ├── Unauthorized          401
│   ├── Forbidden             403 (RBAC denial, or an admission webhook's denial)
│   ├── NotFound              404
│   ├── Conflict              409 (stale resourceVersion, or AlreadyExists: see `reason`)
│   ├── Gone                  410 (resourceVersion too old: relist)
│   ├── Invalid               422 (validation, including CEL rules)
│   ├── TooManyRequests       429 (back off; honour `retry_after`)
│   └── ServerError           5xx
├── TransportError            no answer: connection refused/reset, TLS, DNS
│   └── ApiTimeout            the call's client-side deadline passed
├── ConfigError               no usable client configuration (kubeconfig, in-cluster)
└── TerminalError             a reconcile failure that retrying cannot fix (not requeued)
"""

from __future__ import annotations

from typing import Any


class LocalcacheError(Exception):
    """Root of every error raised on purpose by localcache."""


class ApiError(LocalcacheError):
    """The apiserver answered with a non-2xx status. `status` is the HTTP code, `reason` the
    Status object's reason (e.g. "AlreadyExists"), `body` the decoded Status when there was one."""

    def __init__(
        self, status: int, message: str, *, reason: str = "", body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(ApiError):
    pass


class Invalid(ApiError):
    pass


class TooManyRequests(ApiError):
    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class ServerError(ApiError):
    pass


class TransportError(LocalcacheError):
    """The apiserver could not be reached or the connection broke."""


class ApiTimeout(TransportError):
    """A call's client-side timeout passed before an answer arrived."""


class ConfigError(LocalcacheError):
    """The client configuration is missing or unusable: a kubeconfig that does not exist or
    does not parse, no current context, no in-cluster service account."""


class TerminalError(LocalcacheError):
    """A reconcile error that retrying cannot fix: logged and counted, never requeued."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def api_error(
    status: int, message: str, *, reason: str = "", body: dict[str, Any] | None = None
) -> ApiError:
    """The ApiError subclass for an HTTP status."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, message, reason=reason, body=body)
