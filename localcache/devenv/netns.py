"""Network and mount namespaces of the real-node test bed, owned by anchor processes.

A namespace lives as long as its anchor (`unshare ... sleep infinity`) or any other process in
it. The test bed never bind-mounts a namespace file, so killing every process it started is
enough to remove every namespace, link, address, route, iptables rule and mount it made.

- `Anchor.start(mount=...)` creates a network (and optionally a private mount) namespace and
  returns once it exists.
- `Anchor.run(...)` runs a command inside it (`nsenter`), `Anchor.prefix()` is the argv prefix
  for long-running processes.
- `setns_net(fd)` moves the calling thread into a network namespace (the port forwarder's
  connecting threads).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
START_TIMEOUT_S = 10.0


class NamespaceError(RuntimeError):
    """A namespace could not be created or entered."""


def setns_net(fd: int) -> None:
    """Move the calling thread into the network namespace open at `fd`; sockets made on the
    thread afterwards belong to that namespace for life (used by the port forwarder)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@dataclass
class Anchor:
    """A `sleep infinity` process that holds a new network (+ mount) namespace open."""

    name: str
    log_dir: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, *, mount: bool, preexec: Callable[[], None] | None = None) -> Anchor:
        args = ["unshare", "--net"]
        if mount:
            args += ["--mount", "--propagation", "private"]
        args += ["sleep", "infinity"]
        log = open(self.log_dir / f"{self.name}-anchor.log", "ab")  # noqa: SIM115 - for the child
        try:
            self.popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        finally:
            log.close()
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise NamespaceError(f"{self.name}: unshare exited {self.popen.returncode}")
            try:
                if os.readlink(f"/proc/{self.pid}/ns/net") != own and self._comm() == "sleep":
                    return self
            except OSError:
                pass
            time.sleep(0.01)
        raise NamespaceError(f"{self.name}: namespace not created within {START_TIMEOUT_S}s")

    def _comm(self) -> str:
        return Path(f"/proc/{self.pid}/comm").read_text().strip()

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise NamespaceError(f"{self.name}: anchor not started")
        return self.popen.pid

    @property
    def netns_path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def prefix(self, *, mount: bool = False) -> list[str]:
        """The argv prefix that runs a command inside this namespace."""
        args = ["nsenter", f"--net=/proc/{self.pid}/ns/net"]
        if mount:
            args.append(f"--mount=/proc/{self.pid}/ns/mnt")
        return [*args, "--"]

    def run(
        self, args: Sequence[str], *, mount: bool = False, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command inside this namespace; raise with its output when it fails."""
        done = subprocess.run(
            [*self.prefix(mount=mount), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise NamespaceError(
                f"{self.name}: {' '.join(args)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done

    def script(self, text: str, *, mount: bool = False, env: dict[str, str] | None = None) -> None:
        """Run a bash script (set -euo pipefail) inside this namespace."""
        prefix = self.prefix(mount=mount)
        done = subprocess.run(
            [
                *prefix,
                "env",
                *[f"{k}={v}" for k, v in (env or {}).items()],
                "bash",
                "-euo",
                "pipefail",
                "-c",
                text,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise NamespaceError(f"{self.name}: script failed: {(done.stderr or done.stdout)}")

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
