"""Which `sourceModelUri`s have a download path: the one list of supported schemes.

A download Job runs KServe's storage initializer (`storageInitializer.image`, the pinned
`kserve-storage` of hack/storage-initializer), unless a ClusterStorageContainer with
`workloadType: localModelDownloadJob` claims the URI. The storage initializer recognises a URI
by its prefix, case-sensitively (`Storage.download` in kserve-storage 0.21.0): `gs://`,
`s3://`, `hdfs://`, `webhdfs://`, `hf://`, `modelscope://`, `oci://`, `file://` and
`http(s)://`. `file://` is refused unless allowed (`--allow-file-uris`, on for demo nodes
only), as the `localcache-cache-uri` admission policy refuses it: in a download pod it
copies the pod's own files, such as its ServiceAccount token, into a shared folder.
(Azure blob and file shares, git repositories and plain HTTP downloads are all
`https://` or `http://`). Anything else (no scheme, such as `my-model`, or `ftp://`) fails in
the Job with "Cannot recognize storage type", so admission refuses it up front.
`localcache download` (the demo Job runner) handles a subset: `file://` and `http(s)://`.

A URI is supported when it starts with one of `SUPPORTED_PREFIXES` followed by something, or
when an enabled download-job ClusterStorageContainer's `supportedUriFormats` match it (a
prefix, else a regular expression found anywhere, as the agent selects containers; a
container whose regex does not compile supports nothing).

A URI is refused before that when it is malformed (`malformed`): longer than `MAX_LENGTH`
characters (the CRDs' `maxLength` too: a URI is copied into every LocalModelNode of its
group, and etcd refuses an object over 1.5 MiB, so one tenant's long URIs would stop every
cache reaching those nodes), holding whitespace or control characters, or not parsing as a
URL (`http://[::1`, a port that is not a number, an http(s) URI with no host).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Final

from localcache.api import modelcache, storage

SUPPORTED_SCHEMES: Final = (
    "gs",
    "s3",
    "hdfs",
    "webhdfs",
    "hf",
    "modelscope",
    "oci",
    "http",
    "https",
)
SUPPORTED_PREFIXES: Final = tuple(f"{scheme}://" for scheme in SUPPORTED_SCHEMES)
MAX_LENGTH: Final = modelcache.MAX_SOURCE_URI_LENGTH
FILE_PREFIX: Final = "file://"
"""Refused unless allowed (demo nodes): in a real download pod it reads the pod's own files,
such as its ServiceAccount token, into a model folder other tenants may read."""


def _prefixes(allow_file: bool) -> tuple[str, ...]:
    return (*SUPPORTED_PREFIXES, FILE_PREFIX) if allow_file else SUPPORTED_PREFIXES


def built_in(uri: str, *, allow_file: bool = False) -> bool:
    """Whether the storage initializer recognises `uri` (a supported prefix and more)."""
    return any(
        uri.startswith(prefix) and len(uri) > len(prefix) for prefix in _prefixes(allow_file)
    )


def claimed_by(uri: str, containers: Iterable[storage.ClusterStorageContainer]) -> str | None:
    """The name of the first enabled download-job ClusterStorageContainer (by name) whose
    formats match `uri`, if any."""
    for csc in sorted(containers, key=lambda c: c.name):
        if csc.is_disabled or csc.workload_type != storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB:
            continue
        try:
            if csc.supports_uri(uri):
                return csc.name
        except ValueError:
            continue
    return None


def supported(
    uri: str,
    containers: Iterable[storage.ClusterStorageContainer] = (),
    *,
    allow_file: bool = False,
) -> bool:
    """Whether some download path handles `uri` (module docstring)."""
    return built_in(uri, allow_file=allow_file) or claimed_by(uri, containers) is not None


def describe_supported(*, allow_file: bool = False) -> str:
    """The supported schemes for messages: `gs://, s3://, …`."""
    return ", ".join(_prefixes(allow_file))


def malformed(uri: str) -> str | None:
    """Why `uri` cannot be a model's source (module docstring), or None."""
    if len(uri) > MAX_LENGTH:
        return f"is {len(uri)} characters long, more than {MAX_LENGTH}"
    bad = next((c for c in uri if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        return f"holds {bad!r} at {uri.index(bad)}: percent-encode it"
    try:
        parts = urllib.parse.urlsplit(uri)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return f"does not parse as a URL: {exc}"
    if parts.scheme.lower() in ("http", "https") and not parts.hostname:
        return "names no host"
    return None
