"""A plain HTTP file server for model files, with an optional throttle: a TEST HARNESS.

The end-to-end test bed serves model files from it as an `http://` model source, possibly from
inside a network namespace of its own, so it is a subprocess that Python starts (no Docker):

    python -m localcache.devenv.modelserver --dir D --host H --port P [--rate B]

Server contract (standard library only: `http.server.ThreadingHTTPServer`, one thread per
connection):
- GET and HEAD of a file under `--dir` answer 200 with `Content-Length` and the exact bytes
  (HEAD: headers only); a missing file answers 404; paths cannot leave `--dir`. A directory
  answers the standard library's listing (or its `index.html`).
- `--rate B` throttles every response body to at most B bytes per second, each response on
  its own (two parallel downloads get B each): a body of N bytes takes at least
  `(N - chunk) / B` seconds, where `chunk` is at most B / 10. Without `--rate`, no throttle.
- Every GET and HEAD of a path other than `/_stats` is counted per URL path (query string
  dropped), whatever its status; `GET /_stats` answers JSON
  `{"requests": {path: count}, "bytes_sent": {path: body bytes written}}`. Counts only grow.
- SIGTERM closes the listening socket and exits 0.
Not promised: Range requests, keep-alive (HTTP/1.0: one request per connection), TLS,
uploads, any order between the counts of concurrent requests and their bodies' completion.

`ModelServer` starts that module as a subprocess (with an optional argv prefix such as
`["nsenter", "--net=/proc/<pid>/ns/net", "--"]`), waits for it with a deadline and reads its
stats; the subprocess itself is a `processes.ManagedProcess`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import http.server
import json
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Self

from localcache.devenv import controlplane, processes

STATS_PATH = "/_stats"
HTTP_TIMEOUT_S = 5.0
MAX_CHUNK = 64 * 1024


class ServerError(Exception):
    """A test server did not start, or answered something unexpected."""


# ---- the server (runs in the subprocess) ------------------------------------------------


class _Counters:
    """Per-path request and byte counts, shared by the handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.bytes_sent: dict[str, int] = {}

    def count_request(self, path: str) -> None:
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1

    def count_bytes(self, path: str, n: int) -> None:
        with self._lock:
            self.bytes_sent[path] = self.bytes_sent.get(path, 0) + n

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"requests": dict(self.requests), "bytes_sent": dict(self.bytes_sent)}


class _Handler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus `/_stats`, counting and a per-response throttle."""

    def __init__(self, *args: Any, counters: _Counters, rate: int | None, **kwargs: Any) -> None:
        self.counters = counters  # set before super().__init__, which handles the request
        self.rate = rate
        super().__init__(*args, **kwargs)

    def _url_path(self) -> str:
        return urllib.parse.urlsplit(self.path).path

    def do_GET(self) -> None:
        if self._url_path() == STATS_PATH:
            body = json.dumps(self.counters.snapshot(), sort_keys=True).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.counters.count_request(self._url_path())
        super().do_GET()

    def do_HEAD(self) -> None:
        self.counters.count_request(self._url_path())
        super().do_HEAD()

    def copyfile(self, source: Any, outputfile: Any) -> None:
        src: BinaryIO = source
        out: BinaryIO = outputfile
        path = self._url_path()
        chunk = MAX_CHUNK if self.rate is None else max(1, min(MAX_CHUNK, self.rate // 10))
        started = time.monotonic()
        sent = 0
        while data := src.read(chunk):
            if self.rate is not None:
                # Pace: this chunk may leave once the ones before it have had their time.
                due = started + sent / self.rate
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
            out.write(data)
            sent += len(data)
            self.counters.count_bytes(path, len(data))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(root: Path, host: str, port: int, rate: int | None) -> None:
    """Serve `root` on host:port until SIGTERM (see the module docstring)."""
    if rate is not None and rate <= 0:
        raise ValueError("rate must be a positive number of bytes per second")
    handler = functools.partial(_Handler, counters=_Counters(), rate=rate, directory=str(root))
    server_cls = _Server6 if ":" in host else _Server
    with server_cls((host, port), handler) as server:

        def on_term(signum: int, frame: object) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
        print(f"modelserver: serving {root} on {host}:{port} rate={rate}", flush=True)
        with contextlib.suppress(SystemExit, KeyboardInterrupt):
            server.serve_forever(poll_interval=0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcache.devenv.modelserver")
    parser.add_argument("--dir", required=True, type=Path, help="folder to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--rate", type=int, default=None, help="bytes per second per response")
    args = parser.parse_args(argv)
    serve(args.dir.resolve(), args.host, args.port, args.rate)
    return 0


# ---- the harness side ----------------------------------------------------------------


def format_host(host: str) -> str:
    """`host` as it goes into a URL (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host else host


def http_get(url: str, *, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """One unsigned GET with a timeout: (status, body). Connection errors raise OSError."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
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
        self.port = controlplane.free_port() if port is None else port
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
        controlplane.release_port(self.port)  # a no-op unless free_port reserved it

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
            argv = [*argv_prefix, sys.executable, "-m", __name__, "--dir", str(self.root)]
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


if __name__ == "__main__":
    sys.exit(main())
