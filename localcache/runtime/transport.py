"""HTTP transport to the apiserver: requests with deadlines, errors mapped, watch streams.

`Transport` sends requests through kubernetes_asyncio's TLS-configured aiohttp session (it is
handed the REST client and configuration by `runtime.kube`, the only module that imports
kubernetes_asyncio) and maps every failure onto the `errors` tree:
a non-2xx answer → the `ApiError` subclass for its status with the Status reason and message
(429 with `retry_after` from Retry-After or the Status details); a refused, reset or broken
connection → `TransportError`; a passed deadline → `ApiTimeout`.

Every request is sent by `Transport.open`, which counts it for `metrics` (when set) in
client-go's `rest_client_requests_total{code,method,host}` (`code` is the HTTP status, or
`<error>` when no answer came); `call` and `WatchStream` time it in
`rest_client_request_duration_seconds{verb,host}` (until the body is read; for a WATCH,
until its response headers arrived), however it ends.

`WatchStream` is one open WATCH: an async iterator of raw `{"type", "object"}` events that
raises the mapped `ApiError` for an ERROR event and `ApiTimeout` once the connection has been
silent for its read deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json as _json
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

import aiohttp

from localcache.runtime import errors
from localcache.runtime.apitypes import Obj

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""A watch event larger than this is a broken stream (etcd caps objects at 1.5 MiB)."""
NO_ANSWER = "<error>"
"""The `code` of a request that got no HTTP answer (client-go's label value)."""


class RequestMetrics(Protocol):
    """Where API requests are reported (`metrics.Metrics.rest_client()` returns one)."""

    def inc_requests(self, code: str, method: str, host: str) -> None: ...
    def observe_request_duration(self, verb: str, host: str, seconds: float) -> None: ...


def error_from_status(
    status: int, body: Any, *, retry_after: float | None = None
) -> errors.ApiError:
    """The `errors.ApiError` for an HTTP status and a (possibly Status-shaped) body."""
    status_obj: dict[str, Any] = body if isinstance(body, dict) else {}
    message = str(status_obj.get("message") or (body if isinstance(body, str) else "") or "")
    reason = str(status_obj.get("reason") or "")
    code = int(status_obj.get("code") or status)
    if retry_after is None:
        details = status_obj.get("details") or {}
        if isinstance(details, dict) and details.get("retryAfterSeconds"):
            retry_after = float(details["retryAfterSeconds"])
    err = errors.api_error(code, message.strip() or f"HTTP {code}", reason=reason, body=status_obj)
    if isinstance(err, errors.TooManyRequests):
        err.retry_after = retry_after
    return err


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def query(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out.append((key, "true" if value else "false"))
        else:
            out.append((key, str(value)))
    return out


class Transport:
    """Requests to one apiserver, counted per verb in `requests`."""

    def __init__(
        self,
        rest_client: Any,
        configuration: Any,
        *,
        default_headers: Mapping[str, str],
        request_timeout: float,
    ) -> None:
        self._rest = rest_client
        self._config = configuration
        self._default_headers = dict(default_headers)
        self.request_timeout = request_timeout
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests sent, per verb (get, list, watch, create, update, patch, delete, raw)."""
        self.metrics: RequestMetrics | None = None
        """Reported to for every request, when set."""
        self.host = urllib.parse.urlsplit(str(configuration.host)).netloc or "none"
        """The apiserver's host:port, the `host` label of the request metrics."""

    async def headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        headers.update(self._default_headers)
        for setting in (await self._config.auth_settings()).values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    async def open(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """Send a request and return the response once its headers arrived (body unread).
        Non-2xx answers are read, released and raised as `ApiError`. Counts the request
        in `rest_client_requests_total`; callers observe its duration (`timed`)."""
        self.requests[verb] += 1
        metrics = self.metrics
        headers = await self.headers(content_type)
        code = NO_ANSWER
        try:
            resp: aiohttp.ClientResponse = await self._rest.request(
                method,
                self._config.host + path,
                query_params=dict(query),
                headers=headers,
                body=body,
                _preload_content=False,
                _request_timeout=client_timeout,
            )
            code = str(resp.status)
        except TimeoutError as exc:
            raise errors.ApiTimeout(f"{method} {path}: no answer in time") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.TransportError(f"{method} {path}: {exc!r}") from exc
        finally:
            if metrics is not None:
                metrics.inc_requests(code, method, self.host)
        if 200 <= resp.status < 300:
            return resp
        try:
            raw = await resp.read()
        except TimeoutError as exc:
            raise errors.ApiTimeout(f"{method} {path}: error body not read in time") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.TransportError(f"{method} {path}: {exc!r}") from exc
        finally:
            resp.release()
        try:
            decoded: Any = _json.loads(raw)
        except ValueError:
            decoded = raw.decode(errors="replace")
        raise error_from_status(resp.status, decoded, retry_after=_retry_after(resp.headers))

    @contextlib.contextmanager
    def timed(self, method: str) -> Iterator[None]:
        """Observe the enclosed request's duration in `rest_client_request_duration_seconds`,
        however it ends."""
        started = time.monotonic()
        try:
            yield
        finally:
            if self.metrics is not None:
                seconds = max(0.0, time.monotonic() - started)
                self.metrics.observe_request_duration(method, self.host, seconds)

    async def call(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = None,
    ) -> bytes:
        limit = self.request_timeout if request_timeout is None else request_timeout
        try:
            with self.timed(method):
                async with asyncio.timeout(limit):
                    resp = await self.open(
                        verb,
                        method,
                        path,
                        query=query,
                        body=body,
                        content_type=content_type,
                        client_timeout=aiohttp.ClientTimeout(total=limit),
                    )
                    try:
                        return await resp.read()
                    finally:
                        resp.release()
        except TimeoutError as exc:
            raise errors.ApiTimeout(f"{method} {path}: no answer within {limit:.1f}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.TransportError(f"{method} {path}: {exc!r}") from exc

    async def json(self, verb: str, method: str, path: str, **kwargs: Any) -> Obj:
        raw = await self.call(verb, method, path, **kwargs)
        try:
            decoded = _json.loads(raw)
        except ValueError as exc:
            raise errors.TransportError(f"{method} {path}: answer is not JSON") from exc
        if not isinstance(decoded, dict):
            raise errors.TransportError(f"{method} {path}: answer is not a JSON object")
        return decoded


class WatchStream:
    """One open WATCH connection: an async context manager and async iterator of raw events.

    A read deadline is enforced twice: aiohttp's `sock_read` timeout, and a watchdog timer
    that fails the pending read with `ApiTimeout` once no line arrived for `read_deadline`
    seconds of waiting (time the consumer spends between reads does not count). The
    watchdog is re-armed lazily, so a busy stream costs no timer per event. The connection
    is closed on exit."""

    def __init__(
        self,
        transport: Transport,
        path: str,
        *,
        query: list[tuple[str, str]],
        read_deadline: float,
        connect_timeout: float,
    ) -> None:
        self._transport = transport
        self._path = path
        self._query = query
        self._read_deadline = read_deadline
        self._connect_timeout = connect_timeout
        self._resp: aiohttp.ClientResponse | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._waiting_since: float | None = None  # loop time the pending read began
        self._lines: collections.deque[bytes] = collections.deque()  # complete, not yet parsed
        self._fragments: list[bytes] = []  # the start of a line still arriving
        self._fragment_size = 0

    async def __aenter__(self) -> Self:
        client_timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
            sock_read=self._read_deadline,
        )
        try:
            with self._transport.timed("GET"):
                async with asyncio.timeout(self._connect_timeout + self._read_deadline):
                    self._resp = await self._transport.open(
                        "watch",
                        "GET",
                        self._path,
                        query=self._query,
                        client_timeout=client_timeout,
                    )
        except TimeoutError as exc:
            raise errors.ApiTimeout(f"WATCH {self._path}: not opened in time") from exc
        self._loop = asyncio.get_running_loop()
        self._watchdog = self._loop.call_later(self._read_deadline, self._check_silence)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._resp is not None:
            self._resp.close()
            self._resp = None

    def _check_silence(self) -> None:
        self._watchdog = None
        if self._resp is None or self._loop is None:
            return
        now = self._loop.time()
        since = self._waiting_since
        silent_for = 0.0 if since is None else now - since
        if silent_for < self._read_deadline:
            self._watchdog = self._loop.call_later(
                self._read_deadline - silent_for, self._check_silence
            )
            return
        self._resp.content.set_exception(
            errors.ApiTimeout(f"WATCH {self._path}: silent for {silent_for:.0f}s")
        )

    def __aiter__(self) -> AsyncIterator[Obj]:
        return self

    async def _next_line(
        self, content: aiohttp.StreamReader, loop: asyncio.AbstractEventLoop
    ) -> bytes | None:
        """The next line of the stream, None at its end. Reads whatever has arrived in one
        go and splits it, which is much cheaper per event than a readline each."""
        while not self._lines:
            self._waiting_since = loop.time()
            try:
                data = await content.readany()
            except errors.ApiTimeout:
                raise
            except TimeoutError as exc:
                raise errors.ApiTimeout(
                    f"WATCH {self._path}: silent for {self._read_deadline:.0f}s"
                ) from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise errors.TransportError(f"WATCH {self._path}: {exc!r}") from exc
            finally:
                self._waiting_since = None
            if not data:  # end of stream
                if not self._fragments:
                    return None
                tail, self._fragments = b"".join(self._fragments), []
                return tail
            if b"\n" not in data:
                self._fragments.append(data)
                self._fragment_size += len(data)
                if self._fragment_size > MAX_EVENT_BYTES:
                    raise errors.TransportError(
                        f"WATCH {self._path}: event over {MAX_EVENT_BYTES} B"
                    )
                continue
            if self._fragments:
                data = b"".join([*self._fragments, data])
            parts = data.split(b"\n")
            tail = parts.pop()
            self._fragments = [tail] if tail else []
            self._fragment_size = len(tail)
            self._lines.extend(parts)
        return self._lines.popleft()

    async def __anext__(self) -> Obj:
        if self._resp is None or self._loop is None:
            raise RuntimeError("WatchStream used outside `async with`")
        while True:
            if self._lines:
                line: bytes | None = self._lines.popleft()
            else:
                line = await self._next_line(self._resp.content, self._loop)
            if line is None:
                raise StopAsyncIteration
            if not line or line.isspace():
                continue
            try:
                event: Obj = _json.loads(line)
            except ValueError as exc:
                raise errors.TransportError(f"WATCH {self._path}: undecodable event") from exc
            if event.get("type") == "ERROR":
                obj = event.get("object")
                code = int(obj.get("code") or 500) if isinstance(obj, dict) else 500
                raise error_from_status(code, obj)
            return event
