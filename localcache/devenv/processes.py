"""One subprocess of a test harness: the control plane's processes and the test servers.

`ManagedProcess` starts a command in its own session (so `stop()` signals its whole process
group) with stdin closed and stdout and stderr appended to `log_path`; `wait_ready()` polls a
readiness check with a deadline and fails with the log's tail, naming what never happened;
`stop()` sends SIGTERM, then SIGKILL after a grace period, and reaps the child; it is
idempotent. `preexec` runs in the child before exec (the test bed joins its cgroup there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.1


class ProcessError(RuntimeError):
    """A harness process exited early or never became ready."""


@dataclass
class ManagedProcess:
    name: str
    args: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    preexec: Callable[[], None] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.popen = subprocess.Popen(
                list(self.args),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if self.env is None else dict(self.env),
                start_new_session=True,
                preexec_fn=self.preexec,
            )
        finally:
            log.close()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(
        self,
        ready: Callable[[], bool],
        *,
        what: str,
        timeout: float = START_TIMEOUT_S,
        error: type[Exception] = ProcessError,
    ) -> None:
        """Poll `ready()` until true; raise `error` if the process exits or the deadline
        passes first. `ready` must return False for "not yet", not raise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise error(f"{self.name} exited before {what}:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(POLL_INTERVAL_S)
        raise error(f"{what} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        self.popen = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def log_events(log_path: Path, name: str) -> list[dict[str, Any]]:
    """The JSON log lines (`--log-format=json`) of event `name` in `log_path`, in order."""
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == name:
                found.append(entry)
    return found
