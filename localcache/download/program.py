"""`localcache download <uri> <dest>`: fetch a model from a `file://` or `http(s)://` URI.

It serves local runs and tests (the default download-Job image stays KServe's storage
initializer), and it can stand in for the storage initializer: it takes the same two arguments
and lays the model out the same way.

Contract:
- `dest` is a directory (created, with its parents, when missing; it may already exist, e.g.
  a Job's volume mount). A single-file source (a `file://` file, or an HTTP URL) lands as
  `dest/<file name>`; a `file://` directory lands as its contents directly under `dest`
  (symlinks are copied as symlinks, other special files are refused).
- Atomic: everything is first written into a hidden staging directory inside `dest` (same
  filesystem, so renames are atomic even when `dest` is a mount point), every file and folder
  fsynced, and only then renamed into place; an entry of the same name is replaced. On any
  failure, nothing of this run remains in `dest`: the staging directory is removed, entries
  already renamed are rolled back (replaced ones restored), and a `dest` this run created is
  removed again. Not promised: atomicity of the whole set of top-level entries against a
  crash (SIGKILL) in the middle of the final renames; leftovers then carry the hidden
  `.localcache-partial-` prefix.
- Limits: at most `max_bytes` are written in all (an HTTP Content-Length over it fails before
  any byte is read), and the whole download, retries included, must end within `deadline`
  seconds; both failures are final (not retried). The CLI takes `--max-size` (a quantity such
  as `20Gi`; default `LOCALCACHE_DOWNLOAD_MAX_SIZE`, e.g. the cache's `modelSize`, else
  `DEFAULT_MAX_BYTES`) and `--deadline`.
- HTTP (`download.http`): streamed to disk in chunks; every connect and every read has a timeout
  (`timeout` seconds of silence); transient failures are retried up to `attempts` times in
  all, with backoff. Redirects are followed, but never to a loopback, link-local, unspecified
  or cloud-metadata address (127.0.0.0/8, ::1, 169.254.0.0/16, fe80::/10, 0.0.0.0, ::,
  fd00:ec2::254, 100.100.100.200; names are resolved and every address checked) unless the
  original URL's host is itself such an address.
- Errors: `DownloadError` with a one-line message; `main` prints it and returns 1 (argparse
  usage errors return 2); no traceback for expected failures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import stat
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import structlog

from localcache.api import quantity as quantity_mod
from localcache.download import http
from localcache.download import staging as staging_mod
from localcache.runtime import clock as clock_mod
from localcache.runtime import durable

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_ATTEMPTS = 4
DEFAULT_BACKOFF_S = 1.0
CHUNK_BYTES = http.CHUNK_BYTES
DEFAULT_MAX_BYTES = http.DEFAULT_MAX_BYTES
DEFAULT_DEADLINE_S = http.DEFAULT_DEADLINE_S
MAX_SIZE_ENV = "LOCALCACHE_DOWNLOAD_MAX_SIZE"

DownloadError = http.DownloadError
is_internal_address = http.is_internal_address

# ---------------------------------------------------------------------------- entry point


async def download(
    uri: str,
    dest: Path,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 - per connect/read, not a deadline
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float = DEFAULT_BACKOFF_S,
    clock: clock_mod.Clock | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    deadline: float = DEFAULT_DEADLINE_S,
    internal_redirects: bool | None = None,
) -> int:
    """Download `uri` into directory `dest` atomically (module doc); return bytes written.
    `internal_redirects` None: allowed only when `uri`'s own host is internal."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    if max_bytes < 0 or deadline <= 0:
        raise ValueError("max_bytes must be >= 0 and deadline > 0")
    limits = http.Limits(uri, max_bytes=max_bytes, deadline=deadline)
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        source: Path | str = _local_path(uri, parts)
    elif scheme in ("http", "https"):
        source = uri
        name = _http_file_name(uri, parts)
    else:
        shown = f"'{scheme}'" if scheme else "none"
        raise DownloadError(
            f"unsupported URI scheme {shown} in {uri!r}: localcache download handles "
            "file://, http:// and https://"
        )
    dest = Path(dest)
    created = await asyncio.to_thread(_prepare_dest, dest)
    staging: Path | None = None
    try:
        staging = await asyncio.to_thread(staging_mod.new_staging, dest)
        if isinstance(source, Path):
            written = await asyncio.to_thread(_copy_local, source, staging, dest, limits)
        else:
            if internal_redirects is None:
                internal_redirects = await http.is_internal_url(source)
            try:
                async with asyncio.timeout(deadline):
                    written = await http.fetch(
                        source, staging / name, io_timeout=timeout, attempts=attempts,
                        backoff=backoff, clock=clock or clock_mod.SystemClock(), limits=limits,
                        internal_redirects=internal_redirects,
                    )  # fmt: skip
            except TimeoutError:
                raise limits.expired() from None
        await asyncio.to_thread(durable.fsync_dir, staging)
        await asyncio.to_thread(_commit, staging, dest)
    except OSError as exc:
        await asyncio.to_thread(_clean_up, staging, dest if created else None)
        raise DownloadError(f"{uri} -> {dest}: {_os_message(exc)}") from None
    except BaseException:
        # Also on cancellation: never leave a half-written model behind.
        _clean_up(staging, dest if created else None)
        raise
    await asyncio.to_thread(_clean_up, staging, None)
    log.info("download.done", uri=uri, dest=str(dest), bytes=written)
    return written


# ------------------------------------------------------------------------------- file://


def _local_path(uri: str, parts: urllib.parse.SplitResult) -> Path:
    if parts.netloc not in ("", "localhost"):
        raise DownloadError(f"{uri!r}: a file:// URI needs an absolute path (file:///path)")
    path = urllib.request.url2pathname(parts.path)
    if not path.startswith("/"):
        raise DownloadError(f"{uri!r}: a file:// URI needs an absolute path (file:///path)")
    return Path(path)


def _copy_local(source: Path, staging: Path, dest: Path, limits: http.Limits) -> int:
    """Copy a file or a tree into `staging`; every file fsynced. Returns bytes copied."""
    try:
        st = source.stat()
    except FileNotFoundError:
        raise DownloadError(f"no such file or directory: {source}") from None
    except PermissionError:
        raise DownloadError(f"permission denied reading {source}") from None
    if stat.S_ISREG(st.st_mode):
        return _copy_file(source, staging / source.name, limits)
    if not stat.S_ISDIR(st.st_mode):
        raise DownloadError(f"{source} is neither a regular file nor a directory")
    real_source, real_dest = source.resolve(), dest.resolve()
    if real_dest == real_source or real_dest.is_relative_to(real_source):
        raise DownloadError(f"destination {dest} is inside the source directory {source}")
    return _copy_tree(source, staging, limits)


def _copy_tree(source: Path, target: Path, limits: http.Limits) -> int:
    total = 0
    try:
        entries = sorted(os.scandir(source), key=lambda e: e.name)
    except PermissionError:
        raise DownloadError(f"permission denied reading {source}") from None
    for entry in entries:
        src, dst = Path(entry.path), target / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif entry.is_dir(follow_symlinks=False):
            dst.mkdir()
            total += _copy_tree(src, dst, limits)
            durable.fsync_dir(dst)
        elif entry.is_file(follow_symlinks=False):
            total += _copy_file(src, dst, limits)
        else:
            raise DownloadError(f"{src} is a special file (socket, FIFO or device): not copied")
    return total


def _copy_file(source: Path, target: Path, limits: http.Limits) -> int:
    try:
        src = source.open("rb")
    except PermissionError:
        raise DownloadError(f"permission denied reading {source}") from None
    with src, target.open("xb") as dst:
        while chunk := src.read(CHUNK_BYTES):
            limits.take(len(chunk))
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
        size = dst.tell()
    shutil.copymode(source, target)
    return size


# ------------------------------------------------------------------------------- http(s)


def _http_file_name(uri: str, parts: urllib.parse.SplitResult) -> str:
    if not parts.hostname:
        raise DownloadError(f"{uri!r}: no host in the URL")
    path = urllib.parse.unquote(parts.path)
    name = "" if path.endswith("/") else PurePosixPath(path).name
    if name in ("", ".", "..") or "\0" in name:
        raise DownloadError(
            f"{uri!r}: cannot derive a file name from the URL path; use a URL ending in one"
        )
    return name


# ---------------------------------------------------------------------- staging, commit

PARTIAL_PREFIX = staging_mod.PARTIAL_PREFIX
_prepare_dest = staging_mod.prepare_dest
_commit = staging_mod.commit
_clean_up = staging_mod.clean_up
_os_message = staging_mod.os_message


# ------------------------------------------------------------------------------ command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `localcache download`, for the CLI's subcommand parser."""
    parser.add_argument("uri", help="file:///path (a file or a directory) or http(s)://host/file")
    parser.add_argument("dest", help="directory to place the model in (created when missing)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds allowed for a connect or a silent read (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-size",
        default=None,
        help=f"largest download allowed, a quantity such as 20Gi (default ${MAX_SIZE_ENV}, "
        f"else {DEFAULT_MAX_BYTES >> 40}Ti)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help=f"seconds allowed for the whole download (default {DEFAULT_DEADLINE_S:g})",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=DEFAULT_ATTEMPTS,
        help=f"HTTP tries in all, for transient errors (default {DEFAULT_ATTEMPTS})",
    )


def run(args: argparse.Namespace) -> int:
    """Run a parsed `localcache download` command; 0 on success, 1 on failure (one line)."""
    if not str(args.dest).strip():
        print("localcache download: error: DEST must name a directory", file=sys.stderr)
        return 1
    size = args.max_size or os.environ.get(MAX_SIZE_ENV) or str(DEFAULT_MAX_BYTES)
    try:
        max_bytes = int(quantity_mod.Quantity(size))
    except ValueError:
        print(f"localcache download: error: invalid --max-size {size!r}", file=sys.stderr)
        return 1
    if max_bytes <= 0 or args.deadline <= 0:
        message = "--max-size and --deadline must be positive"
        print(f"localcache download: error: {message}", file=sys.stderr)
        return 1
    try:
        written = asyncio.run(
            download(
                args.uri,
                Path(args.dest),
                timeout=args.timeout,
                attempts=max(1, args.attempts),
                max_bytes=max_bytes,
                deadline=args.deadline,
            )
        )
    except ValueError as exc:  # urllib's parse errors, e.g. an unclosed IPv6 bracket
        print(f"localcache download: error: invalid URI {args.uri!r}: {exc}", file=sys.stderr)
        return 1
    except DownloadError as exc:
        print(f"localcache download: error: {exc}", file=sys.stderr)
        return 1
    print(f"downloaded {args.uri} to {args.dest} ({written} bytes)")
    return 0


def main(argv: Sequence[str]) -> int:
    """`localcache download <uri> <dest>` with `argv` the arguments after `download`."""
    return run_command(
        "localcache download",
        "Download a file:// or http(s):// model URI into a directory, atomically.",
        add_arguments,
        run,
        argv,
    )


def run_command(
    prog: str,
    description: str,
    arguments: Callable[[argparse.ArgumentParser], None],
    command: Callable[[argparse.Namespace], int],
    argv: Sequence[str],
) -> int:
    """Parse `argv` for one `localcache` subcommand and run it; a usage error returns 2."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    arguments(parser)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return command(args)
