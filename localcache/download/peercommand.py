"""`localcache fetch`: the program of a peer-mode download pod (`download.peerfetch`).

    localcache fetch --storage-key K --digest (sha256:...|follow) --source NODE=https://IP:PORT ...
        --token-file PATH (--ca-env VAR | --ca-file PATH) [--server-name localcache-peer]
        [--max-size Q] [--deadline S] [--stall-timeout S] [--concurrency N]
        [--prove-s3 s3://BUCKET/PREFIX] [--resume-origin http(s)://URL]
        [--report /dev/termination-log] DEST

Contract:
- `--source` is repeated in rank order (best first), at most `api.peer.MAX_SOURCES`.
- `--prove-s3` (the model's `s3://` URI, at most `api.peer.MAX_URI` characters): before the
  transfer, the sources are asked to run presigned HEADs of every object of the model, made
  with this pod's S3 credentials from its environment (`download.peerproof`: a peer of
  another credential scope serves only then); the sources that refuse are left. The proof
  counts against `--deadline`; its failures (the origin refusing the listing, no credentials,
  no source accepting) end the run with "use origin".
- `--resume-origin` (the model's `http(s)://` URI, read without credentials): a file that no
  peer can finish is finished from there by Range, verified as any (`download.peerorigin`);
  a URI it cannot use so (an archive, a compressed file) is a usage error.
- Exit codes: 0 the model is in DEST, verified; `api.peer.EXIT_USE_ORIGIN` (3) no peer could
  serve it (the agent's next attempt goes to the origin at once); 1 anything else (bad
  arguments, an unreadable CA or token file, a disk error); 2 argparse usage errors. Every
  failure prints one line on stderr, `localcache fetch: error: ...` (no traceback).
- In every outcome (usage errors aside) an `api.peer.FetchReport` JSON (at most
  `MAX_REPORT_BYTES`; write errors ignored) is written to `--report`: the outcome, the bytes
  received per source node, from peers in all and from the origin, a short reason.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

import structlog

from localcache.api import originpaths, peer
from localcache.api import quantity as quantity_mod
from localcache.download import http, peerfetch, peerorigin, peersources, program

log = structlog.get_logger(__name__)

MAX_SIZE_ENV: Final = "LOCALCACHE_DOWNLOAD_MAX_SIZE"
DEFAULT_REPORT: Final = "/dev/termination-log"
MAX_REPORT_BYTES: Final = 4096
MAX_CONCURRENCY: Final = 32
_KEY = re.compile(r"[0-9a-f]{16}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `localcache fetch`, for the CLI's subcommand parser."""
    parser.add_argument("dest", help="directory to place the model in (created when missing)")
    parser.add_argument("--storage-key", required=True, help="the model's storage key")
    parser.add_argument(
        "--digest",
        required=True,
        help=f"the content digest, sha256:<hex>; {peer.FOLLOW!r}: the sources still download "
        "the model (their first complete manifest decides)",
    )
    parser.add_argument(
        "--source",
        action="append",
        required=True,
        metavar="NODE=https://IP:PORT",
        help=f"a peer, best first (repeat, at most {peer.MAX_SOURCES})",
    )
    parser.add_argument("--token-file", required=True, help="the projected bearer token")
    ca = parser.add_mutually_exclusive_group(required=True)
    ca.add_argument("--ca-env", help="environment variable holding the peer CA (PEM)")
    ca.add_argument("--ca-file", help="file holding the peer CA (PEM)")
    parser.add_argument(
        "--server-name",
        default=peer.SERVER_NAME,
        help=f"the name peers' certificates must carry (default {peer.SERVER_NAME})",
    )
    parser.add_argument(
        "--max-size",
        default=None,
        help=f"largest model allowed, a quantity such as 20Gi (default ${MAX_SIZE_ENV}, "
        f"else {http.DEFAULT_MAX_BYTES >> 40}Ti)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=http.DEFAULT_DEADLINE_S,
        help=f"seconds allowed for the whole fetch (default {http.DEFAULT_DEADLINE_S:g})",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=peerfetch.DEFAULT_STALL_S,
        help="seconds without a byte before a source is left "
        f"(default {peerfetch.DEFAULT_STALL_S:g})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=peerfetch.DEFAULT_CONCURRENCY,
        help=f"files in flight at once (default {peerfetch.DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--prove-s3",
        default=None,
        metavar="S3_URI",
        help="the model's s3:// URI: first prove to the sources, with this pod's S3 "
        "credentials, that it may read every object of it (presigned HEADs)",
    )
    parser.add_argument(
        "--resume-origin",
        default=None,
        metavar="URL",
        help="the model's http(s):// URI: a file the peers break off is finished from there",
    )
    parser.add_argument(
        "--report",
        default=DEFAULT_REPORT,
        help=f"where to write the JSON report (default {DEFAULT_REPORT})",
    )


def run(args: argparse.Namespace) -> int:
    """Run a parsed `localcache fetch` command (module doc); the exit code."""
    board = peersources.Board([])
    try:
        request, board = _request(args)
        size = asyncio.run(_fetch(request, Path(args.dest), board, prove_s3=args.prove_s3))
    except peersources.FetchError as exc:
        outcome: Literal["use-origin", "failed"] = "use-origin" if exc.use_origin else "failed"
        _report(args.report, outcome, board, str(exc))
        print(f"localcache fetch: error: {_one_line(exc)}", file=sys.stderr)
        return peer.EXIT_USE_ORIGIN if exc.use_origin else 1
    except http.DownloadError as exc:  # e.g. DEST exists and is not a directory
        _report(args.report, "failed", board, str(exc))
        print(f"localcache fetch: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    _report(args.report, "complete", board, None)
    print(
        f"fetched {args.storage_key} to {args.dest} ({size} bytes, "
        f"{board.origin_bytes} of them from the origin)"
    )
    return 0


def main(argv: Sequence[str]) -> int:
    """`localcache fetch ...` with `argv` the arguments after `fetch`."""
    return program.run_command(
        "localcache fetch",
        "Fetch a model folder from peer nodes into a directory, verified, atomically.",
        add_arguments,
        run,
        argv,
    )


async def _fetch(
    request: peerfetch.Request, dest: Path, board: peersources.Board, *, prove_s3: str | None
) -> int:
    """The proof (when asked for), then the transfer, within the one deadline."""
    if prove_s3 is not None:
        # imported only here: botocore would cost every process that imports the CLI
        from localcache.download import peerproof, s3origin

        started = request.clock.now()
        origin = await asyncio.to_thread(s3origin.S3Origin.from_env, os.environ)
        await peerproof.prove(request, board, uri=prove_s3, origin=origin)
        left = request.deadline - (request.clock.now() - started)
        if left <= 0:
            raise peersources.use_origin(
                f"the peers did not finish within {request.deadline:g} s (--deadline)"
            )
        request = dataclasses.replace(request, deadline=left)
    return await peerfetch.fetch(request, dest, board)


def _request(args: argparse.Namespace) -> tuple[peerfetch.Request, peersources.Board]:
    bad = peersources.local_failure
    if not str(args.dest).strip():
        raise bad("DEST must name a directory")
    if not _KEY.fullmatch(args.storage_key):
        raise bad(f"invalid --storage-key {args.storage_key[:40]!r} (16 hex digits)")
    if args.digest != peer.FOLLOW and not _DIGEST.fullmatch(args.digest):
        raise bad(f"invalid --digest {args.digest[:80]!r} (sha256:<64 hex digits>)")
    if len(args.source) > peer.MAX_SOURCES:
        raise bad(f"at most {peer.MAX_SOURCES} --source")
    try:
        sources = [peersources.parse_source(value) for value in args.source]
    except ValueError as exc:
        raise bad(str(exc)) from None
    if len({s.node for s in sources}) != len(sources):
        raise bad("a --source node is given twice")
    if args.prove_s3 is not None:
        try:
            originpaths.parse_s3(args.prove_s3)
        except ValueError as exc:
            raise bad(f"invalid --prove-s3: {exc}") from None
    origin = None
    if args.resume_origin is not None:
        try:
            origin = peerorigin.Origin.of(args.resume_origin)
        except ValueError as exc:
            raise bad(f"invalid --resume-origin: {exc}") from None
    size = args.max_size or os.environ.get(MAX_SIZE_ENV) or str(http.DEFAULT_MAX_BYTES)
    try:
        max_bytes = int(quantity_mod.Quantity(size))
    except ValueError:
        raise bad(f"invalid --max-size {size[:40]!r}") from None
    numbers = (max_bytes, args.deadline, args.stall_timeout, args.concurrency)
    if min(numbers) <= 0 or args.concurrency > MAX_CONCURRENCY:
        raise bad(
            "--max-size, --deadline, --stall-timeout must be positive, --concurrency "
            f"between 1 and {MAX_CONCURRENCY}"
        )
    credentials = peersources.Credentials(ca_pem=_ca_pem(args), token_file=Path(args.token_file))
    request = peerfetch.Request(
        storage_key=args.storage_key,
        digest=args.digest,
        credentials=credentials,
        server_name=args.server_name,
        max_bytes=max_bytes,
        deadline=args.deadline,
        stall_timeout=args.stall_timeout,
        connect_timeout=min(peerfetch.DEFAULT_CONNECT_S, args.stall_timeout),
        concurrency=args.concurrency,
        origin=origin,
    )
    return request, peersources.Board(sources)


def _ca_pem(args: argparse.Namespace) -> str:
    if args.ca_env is not None:
        pem = os.environ.get(args.ca_env)
        if not pem:
            raise peersources.local_failure(f"the environment variable {args.ca_env} is unset")
        return pem
    try:
        with open(args.ca_file, "rb") as f:
            return f.read(peersources.MAX_CA_BYTES + 1).decode("ascii", "replace")
    except OSError as exc:
        raise peersources.local_failure(f"reading {args.ca_file}: {exc.strerror}") from None


def _report(
    path: str,
    outcome: Literal["complete", "use-origin", "failed"],
    board: peersources.Board,
    reason: str | None,
) -> None:
    """Write the FetchReport to `path`; never fails."""
    received = {node: size for node, size in board.bytes.items() if size}
    report = peer.FetchReport(
        outcome=outcome,
        peer_bytes=sum(board.bytes.values()),
        origin_bytes=board.origin_bytes,
        sources=dict(list(received.items())[: peer.MAX_SOURCES + 1]),
        reason=_one_line(reason)[:256] if reason else None,
        bad_sources={
            node[: peer.MAX_NODE_NAME]: _one_line(why)[: peer.MAX_BAD_REASON]
            for node, why in list(board.corrupt.items())[: peer.MAX_SOURCES + 1]
        },
    )
    data = b""
    for drop in ({"bad_sources"} if not report.bad_sources else set(), {"bad_sources"},
                 {"bad_sources", "reason", "sources"}):  # fmt: skip
        data = report.model_dump_json(by_alias=True, exclude_none=True, exclude=drop).encode()
        if len(data) <= MAX_REPORT_BYTES:  # never cut: a cut report parses as nothing
            break
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        log.warning("fetch.report_unwritten", path=path, error=exc.strerror)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())
