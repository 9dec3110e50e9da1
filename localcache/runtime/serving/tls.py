"""TLS serving for the admission webhook server: a hot-reloadable certificate and a TCP site.

- `ReloadableTLS`: a server `ssl.SSLContext` whose certificate is swapped in place when the
  files change (rotation without restart), with the versions and ciphers of `tlsoptions`.
- `serve()`: runs an aiohttp application on host:port until its block exits.

Framework module: it knows files and sockets, nothing of AdmissionReview or LocalModel kinds.
Log events keep the `admission.` prefix (`admission.tls_reloaded`, `admission.serving`).
Not promised: client-certificate authentication; a changed file is picked up only by
`reload()` or the next poll of `watch()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from aiohttp import web

from localcache.runtime import clock as clock_mod
from localcache.runtime.serving import httpserver, tlsoptions

log = structlog.get_logger(__name__)


class ReloadableTLS:
    """A server SSLContext serving the certificate in `cert_path`/`key_path`.

    `context` is handed to the server once; every new connection is switched (through the SNI
    callback) to the context loaded last, so `reload()` rotates the certificate without a
    restart. A failed reload (missing or mismatched files) keeps the previous certificate.
    """

    def __init__(
        self, cert_path: Path, key_path: Path, options: tlsoptions.TLSOptions | None = None
    ) -> None:
        self.cert_path, self.key_path = Path(cert_path), Path(key_path)
        self.options = options or tlsoptions.TLSOptions()
        self._stamp = self._file_stamp()
        self._current = self._load()
        self.context = self._load()
        self.context.sni_callback = self._select

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.options.apply(ctx)
        ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx

    def _select(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        conn.context = self._current

    def _file_stamp(self) -> bytes:
        """A digest of both files: cheap for two small files, and blind to timestamp granularity."""
        return hashlib.sha256(self.cert_path.read_bytes() + self.key_path.read_bytes()).digest()

    def reload(self) -> bool:
        """Load the files now; True when the new certificate is in use."""
        try:
            stamp = self._file_stamp()
            self._current = self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("admission.tls_reload_failed", cert=str(self.cert_path), error=str(exc))
            return False
        self._stamp = stamp
        log.info("admission.tls_reloaded", cert=str(self.cert_path))
        return True

    def reload_if_changed(self) -> bool:
        """Reload when either file changed since the last load; True when it reloaded."""
        try:
            changed = self._file_stamp() != self._stamp
        except OSError:
            return False
        return changed and self.reload()

    async def watch(self, *, clock: clock_mod.Clock, interval_s: float = 10.0) -> None:
        """Poll the files every `interval_s` until cancelled."""
        while True:
            await clock.sleep(interval_s)
            self.reload_if_changed()


@contextlib.asynccontextmanager
async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    shutdown_timeout_s: float = 5.0,
    limits: httpserver.ServerLimits = httpserver.DEFAULT_LIMITS,
) -> AsyncIterator[int]:
    """Serve `app` on host:port (0: any free port) until the block exits; yields the port.
    Slow clients are cut off by `limits` (handshake and idle/header timeouts, see
    `httpserver.ServerLimits`)."""
    runner = httpserver.runner(app, limits=limits, shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    try:
        site = httpserver.LimitedTCPSite(runner, host, port, ssl_context=ssl_context, limits=limits)
        await site.start()
        bound = int(runner.addresses[0][1])
        log.info("admission.serving", host=host, port=bound, tls=ssl_context is not None)
        yield bound
    finally:
        await runner.cleanup()
