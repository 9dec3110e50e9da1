"""Holding the test object store's checksum-mode HEADs: a TEST HARNESS knob, so that the origin
answers `localcache origin-sums` (`download.seedsums`) only after the download it runs beside
has ended, as a slow origin would.

Server side (`objectstore.guard`): `Holds.control(environ, start_response)` answers
- `POST HOLD_PATH?bucket=B&prefix=P`: from then on, a HEAD in checksum mode (header
  `x-amz-checksum-mode`, path-style `/B/<key>` with `<key>` beginning with `P`) waits before
  it reaches moto, until released or for `MAX_HOLD_S` at most;
- `POST RELEASE_PATH`: every held request goes on, and every hold ends;
and None for any other path. `Holds.wait(environ)` is called for each request the guard passes
to moto; `Holds.held` counts the requests that were held (it only grows: the guard's stats
report it as `heldChecksumHeads`).
Harness side: `hold(endpoint, bucket, prefix)` and `release(endpoint)`, one POST each with a
timeout, raising `OSError` for anything but 200.
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Final

from localcache.devenv import modelserver

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

HOLD_PATH: Final = "/_objectstore/hold-checksum-heads"
RELEASE_PATH: Final = "/_objectstore/release-checksum-heads"
MAX_HOLD_S: Final = 120.0
TIMEOUT_S: Final = 10.0


class Holds:
    """The holds of one server (thread-safe: the server answers from a thread per request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prefixes: set[tuple[str, str]] = set()
        self._released = threading.Event()
        self.held = 0

    def control(self, environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        path = environ.get("PATH_INFO", "")
        if path not in (HOLD_PATH, RELEASE_PATH):
            return None
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [("Content-Length", "0")])
            return []
        with self._lock:
            if path == HOLD_PATH:
                query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
                bucket, prefix = query.get("bucket", [""])[0], query.get("prefix", [""])[0]
                self._prefixes.add((bucket, prefix))
                if self._released.is_set():  # what a hold before holds stays held
                    self._released = threading.Event()
            else:
                self._prefixes.clear()
                self._released.set()
        start_response("200 OK", [("Content-Length", "0")])
        return []

    def wait(self, environ: WSGIEnvironment) -> None:
        if environ.get("REQUEST_METHOD") != "HEAD" or not environ.get("HTTP_X_AMZ_CHECKSUM_MODE"):
            return
        bucket, _, key = environ.get("PATH_INFO", "").lstrip("/").partition("/")
        with self._lock:
            if not any(bucket == b and key.startswith(p) for b, p in self._prefixes):
                return
            self.held += 1
            released = self._released
        released.wait(MAX_HOLD_S)


def hold(endpoint: str, bucket: str, prefix: str) -> None:
    """Hold the checksum-mode HEADs of `bucket`'s objects under `prefix` at `endpoint`."""
    _post(endpoint, HOLD_PATH + "?" + urllib.parse.urlencode({"bucket": bucket, "prefix": prefix}))


def release(endpoint: str) -> None:
    """Let every held HEAD at `endpoint` go on, and end every hold."""
    _post(endpoint, RELEASE_PATH)


def _post(endpoint: str, path: str) -> None:
    status, _ = modelserver.http_request("POST", endpoint + path, timeout=TIMEOUT_S)
    if status != 200:
        raise OSError(f"POST {path.partition('?')[0]}: HTTP {status}")
