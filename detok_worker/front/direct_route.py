"""The generation routes (POST /v1/completions, /v1/chat/completions) served past Starlette's stack.

Nearly every request a busy front serves is a generation request, and each paid for layers that only pass it on:
Starlette's error middleware, the access-log and X-Request-Id middleware classes (each with its own wrapper of
`send`), the exception middleware, the router's scan of every route, and the route's request_response wrapper
(a second exception wrapper). `DirectRoutes` does what those layers do for these two routes, in one function with
one wrapper of `send`, in the same order:

- the request id in the scope and X-Request-Id on the response head (middleware.tag_request_id);
- the status and duration for the metrics and the access log (request_log.RequestObserver), 500 when the handler
  fails before any head and NO_RESPONSE when nothing was sent;
- an APIError becomes its error response (a RuntimeError once the head is out, as Starlette's handler wrapper);
- any other error: logged and answered with a 500 on the server's `send` when no head is out, then re-raised (as
  Starlette's ServerErrorMiddleware);
- the route in scope["route"] (the endpoint label) and its endpoint and empty path params, as the router sets them.

Other paths and methods, and every request while CORS is on (its middleware must see them), take the stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from detok_worker.front.errors import APIError, error_response
from detok_worker.front.middleware import tag_request_id, with_header
from detok_worker.front.request_log import NO_RESPONSE, RequestObserver

ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]
# what Starlette's handler wrapper raises for a handled error after the response head was sent
STARTED_MESSAGE = "Caught handled exception, but response already started."


class DirectRoutes:
    def __init__(self, routes: Iterable[Route], observer: RequestObserver, on_unexpected: ErrorHandler) -> None:
        self._routes = {route.path: route for route in routes}
        self._observer = observer
        self._on_unexpected = on_unexpected

    def match(self, scope: Scope) -> Route | None:
        """The route when `scope` is a POST to one of the direct paths, else None (the stack serves it)."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        return self._routes.get(get_route_path(scope))

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        started = self._observer.begin(scope)
        header = tag_request_id(scope)
        status = 0

        async def send_tagged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = with_header(message, header)
            await send(message)

        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        request = Request(scope, receive, send_tagged)
        try:
            try:
                response = await route.endpoint(request)
                await response(scope, receive, send_tagged)
            except APIError as exc:
                if status:
                    raise RuntimeError(STARTED_MESSAGE) from exc
                await error_response(exc)(scope, receive, send_tagged)
        except BaseException as exc:
            self._observer.observe(scope, status or 500, started)
            if isinstance(exc, Exception) and not status:
                await (await self._on_unexpected(request, exc))(scope, receive, send)
            raise
        self._observer.observe(scope, status or NO_RESPONSE, started)
