"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the status code that fits."""

from __future__ import annotations

from dataclasses import dataclass

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "unavailable_error",
}


@dataclass(frozen=True)
class ApiError(Exception):
    """A request the server refuses or could not complete; `message` is one short line for the client."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class ContextExceeded(ApiError):
    """A prompt longer than the context, in llama-server's shape (`exceed_context_size_error` with the two sizes): a
    400, which the OpenAI SDK does not retry."""

    n_prompt_tokens: int = 0
    n_ctx: int = 0

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": self.n_prompt_tokens,
                "n_ctx": self.n_ctx,
            }
        }


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)
