"""Where a shared-volume cache's import lands on the claim: names only, no I/O. Shared by
the import program (`download.importplace`, inside the import pod) and the Job builder
(`caching.importjob`, in the controller).

Relative to the claim's `models/` folder (the import pod mounts the claim with
`subPath: models`, never the rest of it):

    <key>                               the placed model (`pvc://<claim>/models/<key>`)
    .localcache-import/<key>/data       staging: the download lands here
    .localcache-import/<key>/old        the previous copy while it is being replaced
    .localcache-import/<key>/placing    marker: a placement is in progress

`check_key(key)` accepts a storage key only when it is one path component that cannot
escape `models/` (no `/`, NUL or backslash, not `.` or `..`, not the staging folder's name,
at most `MAX_KEY_LENGTH` characters) and raises `ValueError` otherwise. Storage keys are 16
hex characters (`caching.keys.storage_key`); the check is looser on purpose, so that the
program does not decide what a key is, only that it is a safe name.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Final

MODELS: Final = "models"
"""The claim's folder the import pod sees (KServe's layout: `pvc://<claim>/models/<key>`)."""
STAGING: Final = ".localcache-import"
DATA: Final = "data"
OLD: Final = "old"
PLACING: Final = "placing"
MAX_KEY_LENGTH: Final = 128


def check_key(key: str) -> str:
    """`key` when it is a safe single path component (module docstring), else `ValueError`."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"a storage key has 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
    if any(c in key for c in "/\\\x00") or key in (".", "..", STAGING):
        raise ValueError(f"not a storage key (one path component): {key!r}")
    if not key.isprintable():
        raise ValueError(f"not a storage key (control characters): {key!r}")
    return key


def staging(key: str) -> PurePosixPath:
    """`.localcache-import/<key>`, relative to `models/`."""
    return PurePosixPath(STAGING) / check_key(key)


def data_subpath(key: str) -> str:
    """The download container's `subPath` on the claim: `models/.localcache-import/<key>/data`."""
    return str(PurePosixPath(MODELS) / staging(key) / DATA)
