"""When each node reported a model downloaded: a `kubectl get --watch` of LocalModelNodes.

`ReadyWatch.start()` runs `kubectl get localmodelnodes --watch -o json` (it lists, then
watches from the list's resourceVersion, so no change after it starts is missed) and a reader
thread that notes, for each wanted node, the monotonic time at which its LocalModelNode first
showed `status.modelStatus[<status key>] == ModelDownloaded`. `wait(timeout)` returns those
times once every wanted node has one, or raises `TimeoutError` naming the nodes that never
did; `stop()` ends kubectl and the thread (always call it). Times are when this process
received the event: the apiserver's and kubectl's latency (well under a second) is included.

`downloaded(obj, key)` and `JsonStream` (kubectl prints one pretty-printed JSON object after
another) are pure.
"""

from __future__ import annotations

import codecs
import json
import os
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

DOWNLOADED = "ModelDownloaded"
READ_CHUNK = 65536
STOP_TIMEOUT_S = 10.0


def downloaded(obj: Mapping[str, Any], status_key: str) -> bool:
    """Whether a LocalModelNode reports `status_key` downloaded."""
    status = obj.get("status") or {}
    return bool((status.get("modelStatus") or {}).get(status_key) == DOWNLOADED)


class JsonStream:
    """Splits a stream of concatenated JSON objects (whitespace between them)."""

    def __init__(self) -> None:
        self._buffer = ""
        self._decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[Any]:
        self._buffer += text
        found: list[Any] = []
        while True:
            rest = self._buffer.lstrip()
            if not rest:
                self._buffer = ""
                return found
            try:
                obj, end = self._decoder.raw_decode(rest)
            except json.JSONDecodeError:
                self._buffer = rest  # incomplete: wait for more
                return found
            found.append(obj)
            self._buffer = rest[end:]


def listed_items(objs: list[Any]) -> list[Mapping[str, Any]]:
    """The objects, with a List's items in its place (kubectl may print the first listing
    as one List)."""
    found: list[Mapping[str, Any]] = []
    for obj in objs:
        if not isinstance(obj, dict):
            continue
        if str(obj.get("kind", "")).endswith("List"):
            found += [item for item in obj.get("items") or [] if isinstance(item, dict)]
        else:
            found.append(obj)
    return found


class ReadyWatch:
    """See the module docstring."""

    def __init__(
        self,
        kubectl: Sequence[str],
        *,
        status_key: str,
        nodes: Collection[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = [*kubectl, "get", "localmodelnodes", "--watch", "-o", "json"]
        self._env = dict(env or os.environ)
        self.status_key = status_key
        self.nodes = frozenset(nodes)
        self.ready: dict[str, float] = {}
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._error: str | None = None

    def start(self) -> ReadyWatch:
        self._proc = subprocess.Popen(
            self._argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
        )
        self._thread = threading.Thread(target=self._read, name="ready-watch", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        stream = JsonStream()
        text = codecs.getincrementaldecoder("utf-8")()
        fd = self._proc.stdout.fileno()
        while True:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                break
            now = time.monotonic()
            for obj in listed_items(stream.feed(text.decode(chunk))):
                name = (obj.get("metadata") or {}).get("name")
                if (
                    name in self.nodes
                    and name not in self.ready
                    and downloaded(obj, self.status_key)
                ):
                    with self._cond:
                        self.ready[name] = now
                        self._cond.notify_all()
        with self._cond:
            stderr = self._proc.stderr.read().decode() if self._proc.stderr else ""
            self._error = f"kubectl watch ended: {stderr.strip()[-500:]}"
            self._cond.notify_all()

    def wait(self, timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while set(self.ready) < self.nodes:
                if self._error is not None:
                    raise RuntimeError(self._error)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(self.nodes - set(self.ready))
                    raise TimeoutError(
                        f"{', '.join(missing)} never reported {self.status_key} "
                        f"{DOWNLOADED} within {timeout:.0f}s"
                    )
                self._cond.wait(left)
            return dict(self.ready)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(STOP_TIMEOUT_S)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        if self._proc is not None:
            for pipe in (self._proc.stdout, self._proc.stderr):
                if pipe is not None:
                    pipe.close()
