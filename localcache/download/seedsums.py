"""`localcache origin-sums <s3 uri> <dest>`: the SHA-256 the origin stores for each object of an
`s3://` model, recorded while KServe's storage initializer downloads it (a sidecar of a seed's
origin Job, `agent.jobs.peerjob.seed_job`). The agent checks the downloaded bytes
against them and records them as the files' `originSha256` (`agent.disk.originsums`): boto3
checks such a checksum only for an object it reads in one request, and the storage initializer
reads an object over 8 MB by ranges.

Contract:
- Lists the model as the storage initializer does and HEADs each object in checksum mode
  (`download.s3origin`: the credentials and endpoint of KServe's variables or
  `STORAGE_CONFIG`, every call with a timeout), all within `--deadline` seconds.
- Writes `<dest>/` + `originpaths.STAGED_SUMS` (`originpaths.StagedSums`; a temporary name
  beginning with that one, then a rename) when at least one object has a full-object SHA-256
  and there are at most `originpaths.MAX_STAGED_SUMS` objects; nothing otherwise.
- Always exits 0: a failure (the origin refuses, no credentials, anonymous access, the
  deadline) is one line on stderr and no file, and the download goes on; the storage
  initializer then reports the origin's own answer. Never printed: credentials, URLs.
- `--sidecar`: then waits for SIGTERM (the kubelet stops a sidecar once the download ends),
  which ends it with exit 0 at any point, also in the middle of its work: a temporary file
  it leaves is the agent's to remove (`agent.disk.originsums.drop_staged`).
Who trusts the file: the agent, as it trusts every byte the download pod writes (a check of
the download, never a proof of access across scopes).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from localcache.api import originpaths
from localcache.download import peersources, s3origin

DEADLINE_S: Final = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="the model's s3:// URI")
    parser.add_argument("dest", help="the download's folder (the Job's staging mount)")
    parser.add_argument(
        "--sidecar",
        action="store_true",
        help="then wait for SIGTERM (a sidecar beside the download); exit 0 on it",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEADLINE_S,
        help=f"seconds allowed for the listing and the HEADs (default {DEADLINE_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    if args.sidecar:
        signal.signal(signal.SIGTERM, _stopped)
    said = record(args.uri, Path(args.dest), env=os.environ, deadline=args.deadline)
    print(f"localcache origin-sums: {said}", file=sys.stderr, flush=True)
    while args.sidecar:
        signal.pause()
    return 0


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(0)


def record(uri: str, dest: Path, *, env: Mapping[str, str], deadline: float) -> str:
    """Stage the origin's SHA-256s of `uri` in `dest` (module contract); what happened."""
    outcome: list[str] = []
    late = threading.Event()
    decided = threading.Lock()  # the file and the answer, before the deadline or never

    def work() -> None:
        try:
            said, sums = _record(uri, env)
        except Exception as exc:  # never fail the download: it reports the origin's answer
            said, sums = f"no checksums recorded: {type(exc).__name__}", {}
        with decided:
            if late.is_set():
                return
            try:
                if sums:
                    _write(dest, sums)
            except OSError as exc:
                said = f"no checksums recorded: {exc.strerror or type(exc).__name__}"
            outcome.append(said)

    worker = threading.Thread(
        target=work,
        name="localcache-origin-sums",
        daemon=True,  # botocore calls cannot be interrupted: the process exits without it
    )
    worker.start()
    worker.join(deadline)
    with decided:
        if not outcome:
            late.set()
            return f"no checksums recorded: not done within {deadline:g} s"
    return outcome[0]


def _record(uri: str, env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """What to say, and the sums to write."""
    try:
        origin = s3origin.S3Origin.from_env(env)
        objects = origin.objects(uri)
        if len(objects) > originpaths.MAX_STAGED_SUMS:
            return f"no checksums recorded: over {originpaths.MAX_STAGED_SUMS} objects", {}
        sums = origin.checksums(uri, objects)
    except peersources.FetchError as exc:
        return f"no checksums recorded: {exc}", {}
    if not sums:
        return f"{len(objects)} object(s), none stored with a full-object SHA-256", {}
    return f"{len(objects)} object(s), {len(sums)} with the origin's SHA-256 recorded", sums


def _write(dest: Path, sums: dict[str, str]) -> None:
    text = originpaths.StagedSums(sha256=sums).model_dump_json()
    tmp = dest / f"{originpaths.STAGED_SUMS}.{os.getpid()}.tmp"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, dest / originpaths.STAGED_SUMS)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
