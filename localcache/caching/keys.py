"""The keys that tie caches, LocalModelNode entries and on-disk folders together.

- Status key: how a cache's entry is named in `LocalModelNode.status.modelStatus`: the cache
  name for a LocalModelCache, `namespace/name` for a LocalModelNamespaceCache. This module is
  the only place that formats or parses it.
- Storage key: the on-disk folder of a model: the first 16 lowercase hex characters of the
  SHA-256 of the raw `sourceModelUri` bytes, without any normalisation (`gs://b/m` and
  `gs://b/m/` differ). KServe's pod mutator recomputes it, so it must match bit for bit.
- URI match: whether an InferenceService's storage URI is served by a cache's source URI:
  equal, or a sub-path, after trimming one trailing `/` from each (KServe's
  `MatchStorageURI`). `gs://b/model` serves `gs://b/model/x` but not `gs://b/model-evil`.
"""

from __future__ import annotations

import hashlib
from typing import NewType

StatusKey = NewType("StatusKey", str)
StorageKey = NewType("StorageKey", str)

STORAGE_KEY_LENGTH = 16


def status_key(name: str, namespace: str | None) -> StatusKey:
    """`name` for a cluster cache (`namespace` None or ""), else `namespace/name`."""
    if not name or "/" in name:
        raise ValueError(f"not a cache name: {name!r}")
    if namespace and "/" in namespace:
        raise ValueError(f"not a namespace: {namespace!r}")
    return StatusKey(f"{namespace}/{name}" if namespace else name)


def parse_status_key(key: str) -> tuple[str | None, str]:
    """Inverse of `status_key`: `(namespace or None, name)`. `ValueError` for anything
    `status_key` cannot produce (empty parts, more than one `/`)."""
    namespace, sep, name = key.partition("/")
    if not sep:
        if not key:
            raise ValueError("empty status key")
        return None, key
    if not namespace or not name or "/" in name:
        raise ValueError(f"not a status key: {key!r}")
    return namespace, name


def _go_utf8(text: str) -> bytes:
    """The UTF-8 bytes Go holds for a string decoded from the same JSON: lone surrogates
    (which Go's JSON decoder turns into U+FFFD) cannot be encoded as they are."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text).encode(
            "utf-8"
        )


def storage_key(uri: str) -> StorageKey:
    """First 16 lowercase hex chars of SHA-256 over the raw URI (KServe's `GetStorageKey`)."""
    return StorageKey(hashlib.sha256(_go_utf8(uri)).hexdigest()[:STORAGE_KEY_LENGTH])


def match_storage_uri(cached: str, requested: str) -> bool:
    """True when `requested` is `cached` or lies under it (KServe's `MatchStorageURI`).

    One trailing `/` is trimmed from both first; then `requested` must equal `cached`, or
    start with it followed by `/`. No other normalisation: non-URI strings such as
    `foo:bar:baz` match only themselves (or their sub-paths).
    """
    cached = cached.removesuffix("/")
    requested = requested.removesuffix("/")
    return requested == cached or requested.startswith(cached + "/")
