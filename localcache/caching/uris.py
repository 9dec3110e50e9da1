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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from localcache.api import storage

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
