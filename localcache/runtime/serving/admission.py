"""Admission webhook handling: AdmissionReview `admission.k8s.io/v1` in and out.

- `AdmissionServer`: a registry of handlers keyed by URL path and the aiohttp application that
  serves them (`app()`). A handler is `async (Request) -> Response`; build responses with
  `review.allowed()`, `review.denied()` and `review.patched()` (`runtime.serving.review`: the
  review as data). TLS serving (hot-reloaded certificate, the TCP site) is `runtime.serving.tls`.

Contract:
- Every 200 response is an AdmissionReview carrying the request's `uid`.
- A body over `max_body_bytes` gets 413; a body not received within `body_timeout_s` gets 408
  and the connection is closed (handshake and idle limits are `runtime.serving.tls.serve`'s); a body
  that is not JSON or not an `admission.k8s.io/v1` AdmissionReview with a request uid gets
  400; none of these reaches a handler.
- A handler that raises or outlives its timeout is answered per its `on_failure`: `"deny"`
  (a denial saying so: code 500 or 504) or `"error"` (HTTP 500/504, so the apiserver applies the
  webhook's failurePolicy). Keep timeouts below the configuration's `timeoutSeconds`.
- Metrics: `controller_runtime_webhook_requests_total{webhook,code}`,
  `controller_runtime_webhook_latency_seconds{webhook}`,
  `controller_runtime_webhook_requests_in_flight{webhook}` (the `webhook` label is the path),
  plus `localcache_admission_reviews_total{webhook,result}` with result in `RESULTS`.
  `stats()` returns the same counts as data. Logs carry uid, kind, namespace, name, operation.
- Not promised: handlers for one path may run concurrently; responses carry no audit
  annotations.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import structlog
from aiohttp import web

from localcache.runtime import clock as clock_mod
from localcache.runtime import metrics as metrics_mod
from localcache.runtime.serving import review

log = structlog.get_logger(__name__)

DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
DEFAULT_TIMEOUT_S = 8.0
DEFAULT_BODY_TIMEOUT_S = 10.0
RESULTS = (
    "allowed", "patched", "denied", "timeout", "error", "malformed", "too_large", "slow_client",
)  # fmt: skip

FailureMode = Literal["deny", "error"]


Handler = Callable[[review.Request], Awaitable[review.Response]]


@dataclass(frozen=True)
class AdmissionStats:
    """Answered reviews by (path, result), and the registered paths."""

    paths: tuple[str, ...]
    counts: Mapping[tuple[str, str], int]

    def count(self, path: str, result: str | None = None) -> int:
        return sum(n for (p, r), n in self.counts.items() if p == path and result in (None, r))


@dataclass(frozen=True)
class _Route:
    handler: Handler
    timeout_s: float
    on_failure: FailureMode


class AdmissionServer:
    """Handlers by path, and the aiohttp application serving them (see module doc)."""

    def __init__(
        self,
        *,
        metrics: metrics_mod.Metrics | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        clock: clock_mod.Clock | None = None,
    ) -> None:
        self._routes: dict[str, _Route] = {}
        self._body_timeout_s = body_timeout_s
        self._max_body = max_body_bytes
        self._timeout_s = timeout_s
        self._clock = clock or clock_mod.SystemClock()
        self._counts: Counter[tuple[str, str]] = Counter()
        m = metrics or metrics_mod.Metrics()
        self._requests = m.counter(
            "controller_runtime_webhook_requests_total",
            "Total number of admission requests by HTTP status code.",
            labels=("webhook", "code"),
        )
        self._latency = m.histogram(
            "controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests",
            labels=("webhook",),
            buckets=metrics_mod.WORKQUEUE_BUCKETS,
        )
        self._in_flight = m.gauge(
            "controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.",
            labels=("webhook",),
        )
        self._results = m.counter(
            "localcache_admission_reviews_total",
            "Admission requests by outcome (allowed, patched, denied, timeout, error, ...).",
            labels=("webhook", "result"),
        )

    def register(
        self,
        path: str,
        handler: Handler,
        *,
        timeout_s: float | None = None,
        on_failure: FailureMode = "deny",
    ) -> None:
        """Serve `handler` at `path` (POST). Register before `app()`; a path is taken once."""
        if not path.startswith("/"):
            raise ValueError(f"webhook path must start with '/': {path!r}")
        if path in self._routes:
            raise ValueError(f"webhook path already registered: {path}")
        self._routes[path] = _Route(handler, timeout_s or self._timeout_s, on_failure)

    def stats(self) -> AdmissionStats:
        return AdmissionStats(tuple(self._routes), dict(self._counts))

    def app(self) -> web.Application:
        """A new aiohttp application with one POST route per registered path."""
        application = web.Application(client_max_size=self._max_body)
        for path in self._routes:
            application.router.add_post(path, self._handle)
        return application

    async def _handle(self, http: web.Request) -> web.StreamResponse:
        path = http.path
        started = self._clock.now()
        self._in_flight.inc(webhook=path)
        status, result = 500, "error"
        try:
            response, result = await self._review(path, http)
            status = response.status
            return response
        finally:
            self._in_flight.dec(webhook=path)
            self._requests.inc(webhook=path, code=str(status))
            self._results.inc(webhook=path, result=result)
            self._latency.observe(self._clock.now() - started, webhook=path)
            self._counts[(path, result)] += 1

    async def _review(self, path: str, http: web.Request) -> tuple[web.Response, str]:
        if (http.content_length or 0) > self._max_body:
            return _too_large(path, http.content_length or 0, self._max_body)
        if http.content_type not in ("application/json", "application/octet-stream"):
            return _bad_request(path, f"content type {http.content_type!r}, want application/json")
        try:
            async with asyncio.timeout(self._body_timeout_s):
                body = await http.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(path, -1, self._max_body)
        except TimeoutError:
            log.warning("admission.slow_body", webhook=path, timeout_s=self._body_timeout_s)
            text = f"request body not received within {self._body_timeout_s:g}s"
            response = web.Response(status=408, text=text, headers={"Connection": "close"})
            response.force_close()
            return response, "slow_client"
        try:
            request = review.Request.from_review(json.loads(body))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and MalformedReview
            return _bad_request(
                path, str(exc) if isinstance(exc, review.MalformedReview) else "invalid JSON"
            )
        route = self._routes[path]
        with structlog.contextvars.bound_contextvars(webhook=path, **request.log_context()):
            try:
                async with asyncio.timeout(route.timeout_s):
                    answer = await route.handler(request)
            except TimeoutError:
                log.warning("admission.handler_timeout", timeout_s=route.timeout_s)
                msg = f"admission handler {path} did not answer within {route.timeout_s:g}s"
                return _failure(request.uid, route, msg, status=504, reason="Timeout"), "timeout"
            except Exception as exc:
                log.exception("admission.handler_failed", error_type=type(exc).__name__)
                msg = f"admission handler {path} failed: {type(exc).__name__}"
                failure = _failure(request.uid, route, msg, status=500, reason="InternalError")
                return failure, "error"
            emit = log.debug if answer.allowed else log.info  # denials are worth a line
            emit("admission.reviewed", result=answer.result, message=answer.message or None)
            return web.json_response(answer.review(request.uid)), answer.result


def _failure(uid: str, route: _Route, message: str, *, status: int, reason: str) -> web.Response:
    if route.on_failure == "error":
        return web.Response(status=status, text=message)
    return web.json_response(review.denied(message, code=status, reason=reason).review(uid))


def _bad_request(path: str, message: str) -> tuple[web.Response, str]:
    log.warning("admission.malformed", webhook=path, error=message)
    return web.Response(status=400, text=f"malformed AdmissionReview: {message}"), "malformed"


def _too_large(path: str, size: int, limit: int) -> tuple[web.Response, str]:
    log.warning("admission.too_large", webhook=path, size=size, limit=limit)
    text = f"request body exceeds the {limit}-byte limit of this admission webhook"
    return web.Response(status=413, text=text), "too_large"
