"""What a local control plane needs from the machine: its binaries and free loopback ports.

The binaries come from `hack/build-control-plane.sh` (built from source through the Go module
proxy into `${XDG_CACHE_HOME:-~/.cache}/localcache/control-plane/<version>/`, or
`LOCALCACHE_BIN_CACHE`) or from `KUBEBUILDER_ASSETS` when it is set. `free_port()` reserves a
loopback port against other test processes on the machine with an advisory lock file, held
until `release_port()` or the process's exit.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PREFERRED_VERSIONS = ("v1.36.3", "v1.35.4", "v1.34.4")


class ControlPlaneError(RuntimeError):
    """The control plane could not be found, started or reached."""


def _cache_root() -> Path:
    explicit = os.environ.get("LOCALCACHE_BIN_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localcache" / "control-plane"


def find_binaries() -> Path:
    """The directory holding `etcd` and `kube-apiserver` (and usually `kube-controller-manager`).

    `KUBEBUILDER_ASSETS` wins when set; otherwise the newest preferred version in the cache.
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    candidates = [Path(assets)] if assets else [_cache_root() / v for v in PREFERRED_VERSIONS]
    for directory in candidates:
        if all(os.access(directory / b, os.X_OK) for b in ("etcd", "kube-apiserver")):
            return directory
    raise ControlPlaneError(
        "no control-plane binaries found in "
        + ", ".join(str(c) for c in candidates)
        + ": run `make control-plane` (or set KUBEBUILDER_ASSETS)"
    )


@contextlib.contextmanager
def _port_lock_dir() -> Iterator[Path]:
    lock_dir = Path(tempfile.gettempdir()) / "localcache-ports"
    lock_dir.mkdir(exist_ok=True)
    yield lock_dir


_held_port_locks: dict[int, Any] = {}


def release_port(port: int) -> None:
    """Give up the reservation `free_port` took for `port`."""
    lock_file = _held_port_locks.pop(port, None)
    if lock_file is not None:
        lock_file.close()


@atexit.register
def _release_all_ports() -> None:
    for port in list(_held_port_locks):
        release_port(port)


def free_port() -> int:
    """A free loopback port, reserved against other test processes by an advisory lock file."""
    with _port_lock_dir() as lock_dir:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            lock_file = open(lock_dir / f"port-{port}", "w")  # noqa: SIM115 - held for process life
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_file.close()
                continue
            _held_port_locks[port] = lock_file
            return port
    raise ControlPlaneError("no free loopback port after 100 tries")
