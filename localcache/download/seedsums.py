"""`localcache origin-sums <s3 uri> <dest>`: the SHA-256 the origin stores for each object of an
`s3://` model, recorded while KServe's storage initializer downloads it (a sidecar of a seed's
origin Job, `agent.jobs.peerjob.seed_job`). The agent checks the downloaded bytes
against them and records them as the files' `originSha256` (`agent.disk.originsums`): boto3
checks such a checksum only for an object it reads in one request, and the storage initializer
reads an object over 8 MB by ranges.

Contract:
- Lists the model as the storage initializer does and HEADs each object in checksum mode
  (`download.s3origin`: the credentials and endpoint of KServe's variables or
  `STORAGE_CONFIG`, unsigned for `awsAnonymousCredential`, every call with a timeout), all
  within `--deadline` seconds.
- Writes `<dest>/` + `originpaths.STAGED_SUMS` (`originpaths.StagedSums`; a temporary name
  beginning with that one, then a rename) once the origin answered for every object, at most
  `originpaths.MAX_STAGED_SUMS` of them: the full-object SHA-256s it stores, none when it
  stores none. Nothing otherwise, and the agent then serves the copy to no peer
  (`agent.disk.originsums.read_staged`: unchecked).
- Always exits 0: a failure (the origin refuses, no credentials, the deadline) is one line on
  stderr and no file, and the download goes on; the storage initializer then reports the
  origin's own answer. Never printed: credentials, URLs.
- `--sidecar`: then waits for SIGTERM (the kubelet stops a sidecar once the download ends)
  and exits 0 on it. SIGTERM is held from the process's first lines (`localcache.__main__`,
  before the command's imports) until the record is written or given up (the deadline): a
  download that ends first, even at once, neither cuts the answer off nor has its signal
  dropped (the seed's pod allows for the wait, `agent.jobs.peerjob.SEED_GRACE_S`). A SIGKILL
  may still leave a temporary file: the agent's to remove
  (`agent.disk.originsums.drop_staged`).
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

DEADLINE_S: Final = float(originpaths.SUMS_DEADLINE_S)


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
    stopped = threading.Event()
    if args.sidecar:
        # held until the answer is out (already, when started by `localcache.__main__`): PID 1
        # of a container drops a signal it neither holds nor handles; set before the worker
        # starts, which inherits it. The handler serves a caller that runs this unheld.
        signal.signal(signal.SIGTERM, lambda _signum, _frame: stopped.set())
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    said = record(args.uri, Path(args.dest), env=os.environ, deadline=args.deadline)
    print(f"localcache origin-sums: {said}", file=sys.stderr, flush=True)
    if args.sidecar and not stopped.is_set():
        signal.sigwait({signal.SIGTERM})  # taken whether it came meanwhile or comes later
    return 0


def record(uri: str, dest: Path, *, env: Mapping[str, str], deadline: float) -> str:
    """Stage the origin's SHA-256s of `uri` in `dest` (module contract); what happened."""
    outcome: list[str] = []
    late = threading.Event()
    decided = threading.Lock()  # the file and the answer, before the deadline or never

    def work() -> None:
        try:
            said, sums = _record(uri, env)
        except Exception as exc:  # never fail the download: it reports the origin's answer
            said, sums = f"no checksums recorded: {type(exc).__name__}", None
        with decided:
            if late.is_set():
                return
            try:
                if sums is not None:
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


def _record(uri: str, env: Mapping[str, str]) -> tuple[str, dict[str, str] | None]:
    """What to say, and the sums to write (None: no answer, nothing to write)."""
    try:
        origin = s3origin.S3Origin.from_env(env, anonymous_ok=True)
        objects = origin.objects(uri)
        if len(objects) > originpaths.MAX_STAGED_SUMS:
            return f"no checksums recorded: over {originpaths.MAX_STAGED_SUMS} objects", None
        sums = origin.checksums(uri, objects)
    except peersources.FetchError as exc:
        return f"no checksums recorded: {exc}", None
    if not sums:
        return f"{len(objects)} object(s), none stored with a full-object SHA-256", sums
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
