"""`localcache import prepare|progress|place`: the program of a shared-volume cache's import
pod (`caching.importjob` builds the Job; `download.importplace` holds the steps).

- `prepare --models DIR --key KEY`: finishes an interrupted placement, empties the staging
  folder; prints one line saying what it did.
- `progress --dir DIR [--interval S]`: prints `{"bytes": N, "files": M}` (one JSON line,
  flushed) at once and then every `interval` seconds (at least `MIN_INTERVAL_S`), measuring
  `DIR` with a bounded walk (`PROGRESS_MAX_FILES` files, `PROGRESS_MAX_DEPTH` levels, symlinks
  never followed; a missing folder measures 0). SIGTERM or SIGINT ends it with exit 0 at once,
  even in the middle of a walk (the pod's native sidecar is stopped this way when `place`
  ends); run as `localcache import progress`, SIGTERM is held from the command's first lines
  (`localcache.__main__`), so one sent while it loads is taken too.
- `place --models DIR --key KEY`: places the download; prints and writes to
  `--termination-log` (default /dev/termination-log, the kubelet's) the JSON line
  `{"bytes": N, "files": M}` of what it placed.
- An expected failure (an unsafe key, no claim folder, an empty download, a filesystem error)
  prints one line `localcache import COMMAND: error: ...` on stderr, writes the same text (less
  the prefix) as the termination message, and exits 1; usage errors exit 2 (argparse). A
  permission error also names the uid and groups the pod runs with (`PERMISSION_HINT`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final, TextIO

from localcache.download import importplace, importwalk

TERMINATION_LOG: Final = "/dev/termination-log"
PROGRESS_INTERVAL_S: Final = 5.0
MIN_INTERVAL_S: Final = 1.0
PROGRESS_MAX_FILES: Final = 100_000
PROGRESS_MAX_DEPTH: Final = 64
_STOP_SIGNALS: Final = {signal.SIGTERM, signal.SIGINT}
PERMISSION_HINT: Final = (
    "the claim's models/ folder must be writable by the import pod's uid or by the group "
    "localModel.sharedPVCImportFSGroup gives it"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="import_command", metavar="STEP", required=True)
    for step, text in (
        ("prepare", "finish an interrupted placement and empty the staging folder"),
        ("place", "move the staged download to models/<key> (refuses an empty one)"),
    ):
        cmd = sub.add_parser(step, help=text, description=text)
        cmd.add_argument("--models", required=True, type=Path, help="the claim's models/")
        cmd.add_argument("--key", required=True, help="the model's storage key")
        cmd.add_argument(
            "--termination-log",
            default=TERMINATION_LOG,
            help="where the outcome is written for the pod status (default: %(default)s)",
        )
    progress = sub.add_parser(
        "progress",
        help="print the staging folder's size as JSON lines until SIGTERM",
        description="Print {bytes, files} of DIR every INTERVAL seconds until SIGTERM.",
    )
    progress.add_argument("--dir", required=True, type=Path, help="the folder to measure")
    progress.add_argument(
        "--interval", type=float, default=PROGRESS_INTERVAL_S, help="seconds between lines"
    )


def run(args: argparse.Namespace) -> int:
    step: str = args.import_command
    if step == "progress":
        return _run_progress(args.dir, interval=max(args.interval, MIN_INTERVAL_S))
    try:
        if step == "prepare":
            recovered = importplace.prepare(args.models, args.key)
            print(
                "finished an interrupted placement; staging folder emptied"
                if recovered
                else "staging folder emptied"
            )
            return 0
        size = importplace.place(args.models, args.key)
    except (ValueError, OSError, importplace.StepError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, PermissionError):
            message += f" (uid {os.getuid()}, groups {sorted(os.getgroups())}: {PERMISSION_HINT})"
        print(f"localcache import {step}: error: {message}", file=sys.stderr)
        _terminate(args.termination_log, message)
        return 1
    line = progress_line(size)
    print(line)
    _terminate(args.termination_log, line)
    return 0


def progress_line(size: importwalk.Size) -> str:
    return json.dumps({"bytes": size.bytes, "files": size.files})


def _terminate(path: str, text: str) -> None:
    """Best effort: outside a pod there may be no termination log."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    except OSError:
        pass


def report_progress(
    folder: Path,
    *,
    interval: float,
    out: TextIO,
    wait: Callable[[float], bool],
    stopping: Callable[[], bool],
) -> None:
    """Print the size of `folder` every `interval` seconds until `wait(interval)` or
    `stopping()` says to stop (the real ones watch SIGTERM and SIGINT)."""
    while not stopping():
        size = importwalk.measure(
            folder, max_files=PROGRESS_MAX_FILES, max_depth=PROGRESS_MAX_DEPTH, stop=stopping
        )
        if stopping():
            return
        out.write(progress_line(size) + "\n")
        out.flush()
        if wait(interval):
            return


def _run_progress(folder: Path, *, interval: float) -> int:
    # Signals are blocked and then waited for (no handler, no lock): a walk polls for a
    # pending one, the pause between lines waits for one.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)

    def stopping() -> bool:
        return bool(signal.sigpending() & _STOP_SIGNALS)

    def wait(seconds: float) -> bool:
        return signal.sigtimedwait(_STOP_SIGNALS, max(seconds, 0.0)) is not None

    with contextlib.suppress(BrokenPipeError):
        report_progress(folder, interval=interval, out=sys.stdout, wait=wait, stopping=stopping)
    return 0
