"""The operator's plain-HTTP endpoints: `/metrics`, `/healthz` (liveness), `/readyz` (readiness).

Checks are registered by name as `HealthCheck`s: synchronous callables that return `None`
when healthy or a short reason string ("watch pods silent for 130s", "worker stuck") when not.
A check that raises counts as failing with the exception as its reason. Each endpoint returns
200 with body `ok` when all its checks pass, else 500 listing every failing check as
`name: reason`, one per line. With no checks registered an endpoint passes.

`HttpServer` is an async context manager (bind on enter, graceful stop on exit) and also a
runnable (`run()` serves until cancelled). `app` is exposed for aiohttp's test client. Not
promised: TLS or authentication (serve it on a cluster-internal port).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

import structlog
from aiohttp import web

HealthCheck = Callable[[], str | None]

#: How long aiohttp waits for in-flight requests when the server stops.
SHUTDOWN_TIMEOUT = 5.0

_log = structlog.get_logger(__name__)


class MetricsSource(Protocol):
    """What `/metrics` serves; `metrics.Metrics` is one."""

    def render(self) -> tuple[bytes, str]: ...


class HttpServer:
    """Serves `/metrics`, `/healthz` and `/readyz` on `host:port` (port 0 picks a free one)."""

    def __init__(self, *, host: str, port: int, metrics: MetricsSource) -> None:
        self._host = host
        self._port = port
        self._metrics = metrics
        self._liveness: dict[str, HealthCheck] = {}
        self._readiness: dict[str, HealthCheck] = {}
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None
        self.app = web.Application()
        self.app.router.add_get("/metrics", self._serve_metrics)
        self.app.router.add_get("/healthz", self._serve_healthz)
        self.app.router.add_get("/readyz", self._serve_readyz)

    def add_liveness_check(self, name: str, check: HealthCheck) -> None:
        """Make `/healthz` fail while `check` returns a reason. Names are unique."""
        _add(self._liveness, name, check)

    def add_readiness_check(self, name: str, check: HealthCheck) -> None:
        """Make `/readyz` fail while `check` returns a reason. Names are unique."""
        _add(self._readiness, name, check)

    @property
    def started(self) -> bool:
        """True between a successful `__aenter__` and `__aexit__`."""
        return self._bound_port is not None

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0); only valid while started."""
        if self._bound_port is None:
            raise RuntimeError("the HTTP server is not started")
        return self._bound_port

    async def __aenter__(self) -> HttpServer:
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses  # (host, port, ...) of each bound socket
        self._bound_port = int(addresses[0][1]) if addresses else self._port
        _log.info("http_server_started", host=self._host, port=self._bound_port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        runner, self._runner = self._runner, None
        bound, self._bound_port = self._bound_port, None
        if runner is not None:
            await runner.cleanup()
            _log.info("http_server_stopped", host=self._host, port=bound)

    async def run(self) -> None:
        """Serve until cancelled, then stop cleanly."""
        async with self:
            await asyncio.Event().wait()

    # -- handlers ------------------------------------------------------------------------

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self._metrics.render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def _serve_healthz(self, request: web.Request) -> web.Response:
        return _respond("healthz", self._liveness)

    async def _serve_readyz(self, request: web.Request) -> web.Response:
        return _respond("readyz", self._readiness)


def _add(checks: dict[str, HealthCheck], name: str, check: HealthCheck) -> None:
    if name in checks:
        raise ValueError(f"a check named {name!r} is already registered")
    checks[name] = check


def run_checks(checks: dict[str, HealthCheck]) -> list[str]:
    """`name: reason` for every failing check, in registration order."""
    failures = []
    for name, check in checks.items():
        try:
            reason = check()
        except Exception as exc:
            reason = f"check raised {type(exc).__name__}: {exc}"
        if reason is not None:
            failures.append(f"{name}: {reason}")
    return failures


def _respond(endpoint: str, checks: dict[str, HealthCheck]) -> web.Response:
    failures = run_checks(checks)
    if not failures:
        return web.Response(text="ok")
    _log.warning("health_check_failed", endpoint=endpoint, failures=failures)
    return web.Response(status=500, text="\n".join(failures) + "\n")
