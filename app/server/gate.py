"""The gate every request passes before any route (routes added later included): a Host that names this server
(no DNS rebinding), an Origin the user allowed when a browser sends one, and a JSON body for a POST (no browser
"simple request" with a text/plain or form body runs). A refusal is one line in OpenAI's error shape: 403 for Host
and Origin, 415 for the body's type. The rules are `access.py`'s; CORS headers and preflights for the allowed
origins are Starlette's CORSMiddleware, inside the gate."""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.server_access import Access
from app.server.api_errors import ApiError
from engine_ext.untrusted_text import one_line

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPE = "application/json"


class RequestGate:
    """ASGI middleware: answers a request it refuses itself, passes the others to `app`."""

    def __init__(self, app: ASGIApp, access: Access, refused: Callable[[], None] = lambda: None) -> None:
        self.app = app
        self.access = access
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.refusal(Headers(scope=scope), scope["method"])
            if error is not None:
                self.refused()
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers, method: str) -> ApiError | None:
        access = self.access
        host = headers.get("host")
        if not access.host_allowed(host):
            return ApiError(403, f"Host {one_line(host or '', 80)!r} is not this server's name: {access.host_hint}")
        origin = headers.get("origin")
        if not access.origin_allowed(origin):
            return ApiError(
                403, f"Origin {one_line(origin or '', 80)!r} may not call this server: {access.origin_hint}"
            )
        if method in _BODY_METHODS:
            given = headers.get("content-type", "")
            if given.split(";", 1)[0].strip().lower() != JSON_TYPE:
                what = f"not {one_line(given, 60)!r}" if given else "none was given"
                return ApiError(415, f"the request body must be JSON (Content-Type: {JSON_TYPE}); {what}")
        return None
