"""One error tree, classified by blame.

`ClientError` subclasses become HTTP 4xx before streaming starts; `EngineError` becomes a 500
before streaming, or an `error` event plus `response.failed` after it. `SetupError` is for the CLI.
"""

from __future__ import annotations

from typing import Any


class OarsError(Exception):
    """Base of every error oars raises on purpose."""


class SetupError(OarsError):
    """Installing or locating a model failed; reported by the CLI, never over HTTP."""


class ClientError(OarsError):
    """The request is at fault: an OpenAI-style error body with a 4xx status."""

    status = 400
    type = "invalid_request_error"

    headers: dict[str, str] = {}

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(ClientError):
    """A parameter is missing, of the wrong type or out of range."""

    def __init__(self, message: str, *, param: str | None, code: str = "invalid_value"):
        super().__init__(message, param=param, code=code)


class ContextLengthExceeded(ClientError):
    def __init__(self, message: str):
        super().__init__(message, param="input", code="context_length_exceeded")


class UpstreamRejected(ClientError):
    """An upstream engine refused the request as the client's fault (its 4xx, passed on)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message, param=param, code=code)
        self.status, self.type = status, type


class TooLarge(ClientError):
    """The request body is over the server's limit (read no further than the limit)."""

    status = 413

    def __init__(self, limit: int, what: str = "The request body"):
        super().__init__(
            f"{what} is over this server's limit of {limit} bytes.", code="request_too_large"
        )


class RateLimited(ClientError):
    """Too many at once for this key: try again after `retry_after` seconds."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message, code="rate_limit_exceeded")
        self.headers = {"Retry-After": str(retry_after)}


class RequestTimeout(ClientError):
    status = 408

    def __init__(self, message: str):
        super().__init__(message, code="request_timeout")


class NotFound(ClientError):
    status = 404

    def __init__(self, message: str, *, param: str | None = None, code: str = "not_found"):
        super().__init__(message, param=param, code=code)


class DependencyFailed(ClientError):
    """A server the request named (an MCP server) could not be used: 424, as OpenAI answers a
    tool listing that failed."""

    status = 424
    type = "external_connector_error"

    def __init__(self, message: str, *, param: str | None = "tools"):
        super().__init__(message, param=param, code="http_error")


class StoreUnavailable(OarsError):
    """The response store cannot be reached, or refused a write: 503, nothing reported stored."""

    status = 503

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": "server_error",
                "param": None,
                "code": "store_unavailable",
            }
        }


class EngineError(OarsError):
    """The engine failed; the client is not at fault."""

    status = 500
    type = "server_error"
    code = "server_error"

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": str(self), "type": self.type, "param": None, "code": self.code}
        }


class UpstreamError(EngineError):
    """An upstream engine failed: unreachable or broken (502), or too slow (504)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        code: str = "upstream_error",
        retryable: bool = False,
    ):
        super().__init__(message)
        self.status, self.code = status, code
        # before the first byte, another replica may serve it: refused, or a 5xx status
        self.retryable = retryable
