"""The operator's plain-HTTP endpoints: `/metrics`, `/healthz` (liveness), `/readyz` (readiness).

Checks are registered by name as `HealthCheck`s: synchronous callables that return `None`
when healthy or a short reason string ("watch pods silent for 130s", "worker stuck") when not.
A check that raises counts as failing with the exception as its reason. Each endpoint returns
200 with body `ok` when all its checks pass, else 500 listing every failing check as
`name: reason`, one per line. With no checks registered an endpoint passes.

`HttpServer` is an async context manager (bind on enter, graceful stop on exit) and also a
runnable (`run()` serves until cancelled). `app` is exposed for aiohttp's test client. Not
promised: TLS or authentication (serve it on a cluster-internal port).

Connection limits (`ServerLimits`, shared with the admission server in `runtime.serving.tls`): a TLS
handshake must finish within `handshake_timeout_s`; a connection is closed when no complete
request header has arrived `idle_timeout_s` after it opened or after its last response (this
bounds both idle keep-alive connections and slow header reads); a request body must be read
within `body_timeout_s` (handlers that read one apply it). `LimitedTCPSite` is aiohttp's
`TCPSite` with the handshake timeout; `runner()` makes an `AppRunner` with the idle timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import structlog
from aiohttp import web

HealthCheck = Callable[[], str | None]

#: How long aiohttp waits for in-flight requests when the server stops.
SHUTDOWN_TIMEOUT = 5.0

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How long a client may take; see the module docstring."""

    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0
    body_timeout_s: float = 10.0


DEFAULT_LIMITS = ServerLimits()
LINGER_S = 1.0


def runner(
    app: web.Application,
    *,
    limits: ServerLimits = DEFAULT_LIMITS,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
) -> web.AppRunner:
    """An `AppRunner` whose connections close after `limits.idle_timeout_s` without a request
    (aiohttp arms this timer when a connection opens, and re-arms it after each response)."""
    return web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=limits.idle_timeout_s,
        # After a response to a request whose body was not read (e.g. a 408 for a slow body),
        # aiohttp drains the rest for this long before closing (its default is 10 s).
        lingering_time=LINGER_S,
    )


class LimitedTCPSite(web.TCPSite):
    """aiohttp's TCPSite with a TLS handshake timeout (asyncio's default is 60 s)."""

    def __init__(
        self,
        app_runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        limits: ServerLimits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(app_runner, host, port, ssl_context=ssl_context)
        self._handshake_timeout_s = limits.handshake_timeout_s

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        if server is None:
            raise RuntimeError("the runner is not set up")
        loop = asyncio.get_running_loop()
        if self._ssl_context is None:
            self._server = await loop.create_server(
                server, self._host, self._port, backlog=self._backlog
            )
        else:
            self._server = await loop.create_server(
                server,
                self._host,
                self._port,
                ssl=self._ssl_context,
                backlog=self._backlog,
                ssl_handshake_timeout=self._handshake_timeout_s,
            )
        sockets = self._server.sockets
        self._bound_port = int(sockets[0].getsockname()[1]) if sockets else self._port


class MetricsSource(Protocol):
    """What `/metrics` serves; `metrics.Metrics` is one."""

    def render(self) -> tuple[bytes, str]: ...


class HttpServer:
    """Serves `/metrics`, `/healthz` and `/readyz` on `host:port` (port 0 picks a free one)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        metrics: MetricsSource,
        limits: ServerLimits = DEFAULT_LIMITS,
    ) -> None:
        self._host = host
        self._limits = limits
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
        app_runner = runner(self.app, limits=self._limits)
        await app_runner.setup()
        try:
            site = LimitedTCPSite(app_runner, self._host, self._port, limits=self._limits)
            await site.start()
        except BaseException:
            await app_runner.cleanup()
            raise
        self._runner = app_runner
        addresses = app_runner.addresses  # (host, port, ...) of each bound socket
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
