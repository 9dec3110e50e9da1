"""A Hugging Face Hub stand-in as static files for the test file server: what
huggingface_hub's `snapshot_download` reads of a public model repository.

`hub_files(repo, files, lfs=..., published=...)` returns the files (path below the server's
root -> bytes) that make `<base>/hub` (`HF_ENDPOINT`) answer, for model `repo` ("org/name"):
- `GET /api/models/{repo}/revision/main`: the repository with its commit (`COMMIT`);
- `GET /api/models/{repo}/tree/{COMMIT}` (the query is ignored, one page): each file with its
  size and git blob id, and for an LFS file its `lfs.oid`, the SHA-256 the Hub publishes;
- `HEAD`/`GET /{repo}/resolve/{COMMIT}/{path}`: the bytes, with `X-Repo-Commit` and the ETag
  (an LFS file's `X-Linked-Etag`/`X-Linked-Size`), through the server's `.headers` sidecars.
`published` replaces the SHA-256 the Hub publishes for a file (what a download whose bytes are
not the Hub's looks like to a checker).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Final

COMMIT: Final = "0123456789abcdef0123456789abcdef01234567"
PREFIX: Final = "hub"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def hub_files(
    repo: str,
    files: Mapping[str, bytes],
    *,
    lfs: Collection[str] = (),
    published: Mapping[str, str] | None = None,
) -> dict[str, bytes]:
    """The server files of a Hub stand-in serving `repo` (module doc)."""
    api = f"{PREFIX}/api/models/{repo}"
    tree, out = [], {}
    for path, data in sorted(files.items()):
        entry: dict[str, object] = {
            "type": "file",
            "oid": git_blob_id(data),
            "size": len(data),
            "path": path,
        }
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{git_blob_id(data)}"'}
        if path in lfs:
            sha = (published or {}).get(path) or hashlib.sha256(data).hexdigest()
            entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            headers |= {"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))}
        tree.append(entry)
        resolved = f"{PREFIX}/{repo}/resolve/{COMMIT}/{path}"
        out[resolved] = data
        out[f"{resolved}.headers"] = json.dumps(headers).encode()
    siblings = [{"rfilename": path} for path in sorted(files)]
    info = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings}
    out[f"{api}/revision/main"] = json.dumps(info).encode()
    out[f"{api}/tree/{COMMIT}"] = json.dumps(tree).encode()
    return out
