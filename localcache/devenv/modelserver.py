"""The harness side of the HTTP model server (`fileserver`, the program): a TEST HARNESS.

`ModelServer` starts `python -m localcache.devenv.fileserver` as a subprocess (with an optional
argv prefix such as `["nsenter", "--net=/proc/<pid>/ns/net", "--"]`, to serve from inside a
network namespace), waits for it with a deadline and reads its request counts (`stats()`); the
subprocess itself is a `processes.ManagedProcess`. `ServerProcess` is the start-and-wait part
the S3 store shares. See `fileserver` for what the server answers.
"""

from __future__ import annotations

import functools
import http.client
import http.server
import json
import sys
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from localcache.devenv import assets, fileserver, processes

STATS_PATH = fileserver.STATS_PATH
HTTP_TIMEOUT_S = 5.0


class ServerError(Exception):
    """A test server did not start, or answered something unexpected."""


def format_host(host: str) -> str:
    """`host` as it goes into a URL (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host else host


def http_get(url: str, *, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """One unsigned GET with a timeout: (status, body). Connection errors raise OSError."""
    return http_request("GET", url, timeout=timeout)


def http_request(method: str, url: str, *, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """One unsigned request without a body, with a timeout: (status, body). Connection errors
    raise OSError."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@dataclass(frozen=True, slots=True)
class ServerStats:
    """What `/_stats` reported: requests and body bytes per URL path."""

    requests: Mapping[str, int]
    bytes_sent: Mapping[str, int]


@dataclass
class ServerProcess:
    """The harness side shared by the test servers run as subprocesses (`ModelServer` here,
    `objectstore.ObjectStore`): host, port, the process and the URL this process reaches.

    `_launch()` binds host:port (a port free on this host's loopback when `port` is None),
    starts the process built by `command(port)`, waits until `GET ready_path` answers 200
    and runs `then()`; on any failure it calls `stop()` and re-raises. `stop()` ends the
    process group, waits and releases the port; it is idempotent.
    """

    host: str = field(default="127.0.0.1", init=False)
    port: int = field(default=0, init=False)
    process: processes.ManagedProcess | None = field(default=None, init=False)
    reach: str | None = field(default=None, init=False)

    def _launch(
        self,
        command: Callable[[int], processes.ManagedProcess],
        *,
        host: str,
        port: int | None,
        reach: str | None,
        ready_path: str,
        what: str,
        error: type[ServerError],
        then: Callable[[], None] | None = None,
    ) -> None:
        if self.process is not None:
            raise error(f"{what} already started")
        self.host = host
        self.reach = reach
        self.port = assets.free_port() if port is None else port
        self.process = command(self.port)
        self.process.start()
        try:
            self.process.wait_ready(
                functools.partial(self._answers, ready_path),
                what=f"{what} on {self._own_url}",
                error=error,
            )
            if then is not None:
                then()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        assets.release_port(self.port)  # a no-op unless free_port reserved it

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{format_host(self.host)}:{self.port}"

    @property
    def _own_url(self) -> str:
        return self.reach or self.base_url

    def _answers(self, path: str) -> bool:
        try:
            return http_get(self._own_url + path, timeout=1.0)[0] == 200
        except OSError:
            return False


@dataclass
class ModelServer(ServerProcess):
    """The model file server of this module, run as a subprocess.

    `start()` launches it (after `argv_prefix`, e.g. an `nsenter` into a network namespace)
    bound to host:port and returns once `/_stats` answers, or raises `ServerError` with the
    log's tail. `host` must be reachable from this process (`stats()` and the readiness poll
    connect to it). With `port=None` a port free on this host's loopback is picked: pass
    a port when the server runs in another namespace. `stop()` ends the process group and
    waits; it is idempotent. Files may be added to `root` while the server runs.
    """

    root: Path
    rate: int | None = None
    log_path: Path | None = None

    def start(
        self,
        argv_prefix: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        reach: str | None = None,
    ) -> ModelServer:
        """`reach`: the URL this process uses when host:port is not reachable from it."""

        def command(port: int) -> processes.ManagedProcess:
            argv = [
                *argv_prefix,
                sys.executable,
                "-m",
                fileserver.__name__,
                "--dir",
                str(self.root),
            ]
            argv += ["--host", host, "--port", str(port)]
            if self.rate is not None:
                argv += ["--rate", str(self.rate)]
            log = self.log_path or Path(tempfile.mkdtemp(prefix="localcache-modelsrv-")) / "log"
            return processes.ManagedProcess("modelserver", argv, log)

        self._launch(
            command,
            host=host,
            port=port,
            reach=reach,
            ready_path=STATS_PATH,
            what="model server",
            error=ServerError,
        )
        return self

    def url(self, path: str) -> str:
        """The URL of `path` (relative to `root`; percent-encoded here)."""
        return f"{self.base_url}/{urllib.parse.quote(path.lstrip('/'))}"

    def stats(self) -> ServerStats:
        status, body = http_get(self._own_url + STATS_PATH)
        if status != 200:
            raise ServerError(f"{STATS_PATH} answered {status}")
        data = json.loads(body)
        return ServerStats(requests=data["requests"], bytes_sent=data["bytes_sent"])
