"""A plain HTTP file server for model files, with an optional throttle: a TEST HARNESS.

The server program only (standard library only, so it also runs as a plain script where
localcache is not installed, e.g. `python3 fileserver.py` in the operator image on a cluster);
`modelserver.ModelServer` starts and reads it.

The end-to-end test bed serves model files from it as an `http://` model source, possibly from
inside a network namespace of its own, so it is a subprocess that Python starts (no Docker):

    python -m localcache.devenv.fileserver --dir D --host H --port P [--rate B]

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
- A stall on demand: when `<file>.stall` exists beside a served file and holds a number N, the
  first N GETs of that file send the first half of the body (Content-Length says all of it)
  and then nothing, until the client goes away or `STALL_HOLD_S` pass (then the connection is
  closed, the body truncated); later GETs are served whole. What a stalled origin looks like.
- A GET of a file with `Range: bytes=N-` or `bytes=N-M` (one range) answers 206 with
  `Content-Range` and those bytes (416 when N is past the end; throttled and counted as any
  body, never stalled); another or an invalid Range header is ignored (200, the whole file).
- Headers on demand: when `<file>.headers` exists beside a served file and holds a JSON
  object, its entries are added to every answer for that file (GET, HEAD, ranges): what a
  Hub stand-in answers (`X-Repo-Commit`, `X-Linked-Etag`), with static files for its API.
- SIGTERM closes the listening socket and exits 0.
Not promised: multiple ranges, keep-alive (HTTP/1.0: one request per connection), TLS,
uploads, any order between the counts of concurrent requests and their bodies' completion.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import io
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

STATS_PATH = "/_stats"
MAX_CHUNK = 64 * 1024
STALL_SUFFIX = ".stall"
HEADERS_SUFFIX = ".headers"
STALL_HOLD_S = 600.0
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _Counters:
    """Per-path request and byte counts, shared by the handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.bytes_sent: dict[str, int] = {}
        self.stalled: dict[str, int] = {}

    def count_request(self, path: str) -> None:
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1

    def count_bytes(self, path: str, n: int) -> None:
        with self._lock:
            self.bytes_sent[path] = self.bytes_sent.get(path, 0) + n

    def take_stall(self, path: str, allowed: int) -> bool:
        """Whether this GET of `path` stalls: one of the first `allowed` ones."""
        with self._lock:
            done = self.stalled.get(path, 0)
            if done >= allowed:
                return False
            self.stalled[path] = done + 1
            return True

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
        if not self._ranged():
            super().do_GET()

    def do_HEAD(self) -> None:
        self.counters.count_request(self._url_path())
        super().do_HEAD()

    def end_headers(self) -> None:
        for name, value in self._extra_headers().items():
            self.send_header(name, value)
        super().end_headers()

    def _extra_headers(self) -> dict[str, str]:
        """What `<file>.headers` adds to the answers for `file` (module doc)."""
        sidecar = Path(self.translate_path(self.path) + HEADERS_SUFFIX)
        try:
            data = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _ranged(self) -> bool:
        """Answer a GET with one byte range of a file (module doc); False: not such a GET."""
        match = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        path = self.translate_path(self.path)
        if match is None or not os.path.isfile(path):
            return False
        if match[2] and int(match[2]) < int(match[1]):
            return False  # an invalid range is ignored (RFC 9110): the whole file
        with open(path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            start = int(match[1])
            end = min(int(match[2]), size - 1) if match[2] else size - 1
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True
            self.send_response(206)
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            src.seek(start)
            self._send(src, self.wfile, stall_at=None, limit=end - start + 1)
        return True

    def copyfile(self, source: Any, outputfile: Any) -> None:
        src: BinaryIO = source
        self._send(src, outputfile, stall_at=self._stall_at(src), limit=None)

    def _send(
        self,
        src: BinaryIO,
        out: io.BufferedIOBase | BinaryIO,
        *,
        stall_at: int | None,
        limit: int | None,
    ) -> None:
        path = self._url_path()
        chunk = MAX_CHUNK if self.rate is None else max(1, min(MAX_CHUNK, self.rate // 10))
        started = time.monotonic()
        sent = 0
        stop = stall_at if stall_at is not None else limit  # never both
        while data := src.read(chunk if stop is None else min(chunk, stop - sent)):
            if self.rate is not None:
                # Pace: this chunk may leave once the ones before it have had their time.
                due = started + sent / self.rate
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
            out.write(data)
            sent += len(data)
            self.counters.count_bytes(path, len(data))
            if stall_at is not None and sent >= stall_at:
                out.flush()
                self._hold()
                return

    def _stall_at(self, src: BinaryIO) -> int | None:
        """Where this GET's body stops (half of it) when it is to stall, else None."""
        marker = Path(self.translate_path(self.path) + STALL_SUFFIX)
        try:
            allowed = int(marker.read_text().strip() or "0")
        except (OSError, ValueError):
            return None
        size = os.fstat(src.fileno()).st_size
        if size < 2 or not self.counters.take_stall(self._url_path(), allowed):
            return None
        return size // 2

    def _hold(self) -> None:
        """Send nothing until the client closes the connection or `STALL_HOLD_S` pass."""
        self.close_connection = True
        deadline = time.monotonic() + STALL_HOLD_S
        while time.monotonic() < deadline:
            try:
                readable, _, _ = select.select([self.connection], [], [], 0.2)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    return
            except OSError:
                return


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
    parser = argparse.ArgumentParser(prog="python -m localcache.devenv.fileserver")
    parser.add_argument("--dir", required=True, type=Path, help="folder to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--rate", type=int, default=None, help="bytes per second per response")
    args = parser.parse_args(argv)
    serve(args.dir.resolve(), args.host, args.port, args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
