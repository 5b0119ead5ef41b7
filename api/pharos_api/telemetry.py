"""The API's request latency (``pharos_api_request_duration_seconds``, pharos_core.telemetry),
measured by a plain ASGI middleware: from the request's arrival to the end of its response, by
method, route template (``/v1/jobs/{job_id}``, never the concrete path: bounded labels; a path no
route matches is ``(unmatched)``) and status."""

from __future__ import annotations

import time

from pharos_core.telemetry import API_REQUEST_SECONDS

UNMATCHED = "(unmatched)"


class RequestMetrics:
    """ASGI middleware observing every HTTP request in :data:`API_REQUEST_SECONDS`."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500  # an exception before the response started: the server answers 500

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # the router puts the matched route into the (shared) scope
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            API_REQUEST_SECONDS.labels(scope["method"], route, str(status)).observe(time.perf_counter() - t0)
