"""The peer data plane's API: the node group knob, the status a node publishes about what it
can serve, and the wire records between an agent's peer server and a peer-mode download pod.

localcache's own fields (KServe's CRDs do not declare them, so the apiserver prunes them under
the with-kserve profile's CRDs, and peer distribution is then simply off).

- `PeerDistributionSpec` (`LocalModelNodeGroup.spec.peerDistribution`): on (`enabled`) by
  default on localcache's CRDs (the apiserver fills in `{}`, then `enabled: true`);
  `maxUploads` caps the download pods one node serves at once (the planner never gives a
  source more children; the server answers 429 beyond it); `uploadBandwidth` caps one node's
  serving rate (bytes per second, a quantity).
- `PeerStatus` (`LocalModelNode.status.peer`): the agent's peer endpoint and, per model folder
  it can serve (complete and hashed, `PeerModel`), the storage key, the content digest of its
  file manifest and the credential scopes (SHA-256 digests, as in `DownloadJob.scope`) whose
  own download Jobs proved access to that content on this node; a download still in
  progress: `complete: false`, no digest, the scope of its Job (it serves its whole files);
  `unservable`: the complete folders it could not hash and will not serve, with why (a
  follower never waits for such a seed).
- `PeerManifest` (`GET /p2p/v1/models/{storageKey}/manifest`): every entry of the folder:
  regular files with size and sha256, directories, symlinks; `digest` is the content digest
  (`manifest_digest`), the one `agent.disk.digest.tree_digest` computes from the folder itself:
  one digest decides both "same content" for the tenancy rule and what a receiver verifies.
- `FetchReport`: what a peer-mode download pod writes as its termination message (bounded).

Bounds: a manifest holds at most `MAX_FILES` entries, paths at most `MAX_PATH` characters and
`MAX_DEPTH` components, relative, without `.`/`..` components or NUL.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from localcache.api import meta
from localcache.api.quantity import Quantity

WIRE_PREFIX: Final = "/p2p/v1"
DEFAULT_PORT: Final = 8476
TOKEN_AUDIENCE: Final = "localcache-peer"
SERVER_NAME: Final = "localcache-peer"
"""The DNS name in every agent's peer serving certificate; fetchers verify it (not the IP)."""
EXIT_USE_ORIGIN: Final = 3
"""A peer-mode download pod's exit code when no peer could serve: the next attempt is the
origin's."""
DIGEST_PREFIX: Final = "sha256:"
MAX_FILES: Final = 20000
MAX_PATH: Final = 1024
MAX_DEPTH: Final = 64
MAX_PEER_MODELS: Final = 256
MAX_SCOPES: Final = 16
MAX_SOURCES: Final = 3
MAX_NODE_NAME: Final = 253
MAX_BAD_REASON: Final = 160
DEFAULT_MAX_UPLOADS: Final = 2
FOLLOW: Final = "follow"
"""`localcache fetch --digest follow`: the sources may still be downloading the model; the
first complete manifest a source serves decides the content."""
PART_SUFFIX: Final = ".localcache-part"
"""A file a peer-mode download pod is still writing: `<path>.localcache-part`, renamed to
`<path>` once verified (so a complete name in its staging folder is a verified file)."""
MAX_PROOF_ORIGINS: Final = 8
PROOF_EXPIRES_S: Final = 60
"""The longest validity of a presigned HEAD a proof may carry (`X-Amz-Expires`)."""
MAX_PROOF_URL: Final = 4096
MAX_URI: Final = 2048
NONCE_PATTERN: Final = r"^lc-[0-9a-f]{32}$"
_ORIGIN_PATTERN: Final = r"^https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?$"
_ORIGIN: Final = re.compile(_ORIGIN_PATTERN)
_SHA256_HEX: Final = r"^[0-9a-f]{64}$"
_DIGEST: Final = r"^sha256:[0-9a-f]{64}$"
_KEY: Final = r"^[0-9a-f]{16}$"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
"""Control characters (NUL, newline...): never in a manifest's paths, so that no entry can
pose as several lines of the digest's listing."""


class PeerDistributionSpec(meta.ApiModel):
    """Peer distribution for a node group's downloads (localcache's own field)."""

    enabled: bool = Field(
        default=True,
        description=(
            "Nodes of the group fill each other: one node downloads a model from the origin, "
            "the others fetch sha256-verified files from nodes holding it in the same "
            "credential scope, falling back to the origin. On by default; false: every node "
            "downloads from the origin, exactly as without peer distribution."
        ),
        json_schema_extra={"default": True},
    )
    max_uploads: int = Field(
        default=DEFAULT_MAX_UPLOADS,
        ge=1,
        le=16,
        description="Download pods one node serves at once (the fan-out of the tree).",
    )
    upload_bandwidth: Quantity | None = Field(
        default=None,
        description="Bytes per second one node may serve to peers in all; unset: no cap.",
    )
    proof_origins: list[str] = Field(
        default_factory=list,
        max_length=MAX_PROOF_ORIGINS,
        json_schema_extra={
            "items": {"type": "string", "maxLength": 272, "pattern": _ORIGIN_PATTERN}
        },
        description=(
            "S3 endpoints (scheme://host[:port]) at which a download pod of another "
            "credential scope may prove that it can read every file of an s3:// model "
            "(presigned HEAD requests the serving node runs); it is then served by peers. "
            "Empty: models are shared only within one credential scope."
        ),
    )

    @field_validator("proof_origins")
    @classmethod
    def _origins(cls, values: list[str]) -> list[str]:
        for value in values:
            if _ORIGIN.fullmatch(value) is None:
                raise ValueError(f"not an origin scheme://host[:port]: {value[:80]!r}")
        return values


class PeerModel(meta.ApiModel):
    """One model folder a node can serve to peers: complete and hashed, or still downloading
    (`complete: false`: its verified files so far)."""

    storage_key: str = Field(description="The model's storage key.", pattern=_KEY)
    digest: str | None = Field(
        default=None,
        description="Content digest of its file manifest (unset while downloading).",
        pattern=_DIGEST,
    )
    complete: bool | None = Field(
        default=None,
        description="False while the node still downloads it (it serves its whole, hashed "
        "files); unset: complete.",
    )

    @property
    def whole(self) -> bool:
        return self.complete is not False

    scopes: list[str] = Field(
        description="Credential scopes (SHA-256) whose own downloads proved this content here.",
        max_length=MAX_SCOPES,
    )
    bytes: int = Field(
        ge=0,
        json_schema_extra={"format": "int64"},
        description="Size in bytes (0 while downloading).",
    )


class UnservableReason(StrEnum):
    UNSERVABLE = "unservable"
    UNREADABLE = "unreadable"
    ERROR = "error"
    ORIGIN_MISMATCH = "origin-mismatch"
    ORIGIN_UNCHECKED = "origin-unchecked"


class PeerUnservable(meta.ApiModel):
    """A model folder this node holds complete but will not serve to peers."""

    storage_key: str = Field(description="The model's storage key.", pattern=_KEY)
    reason: str = Field(  # an `UnservableReason`; a string, so a new one never fails a write
        max_length=32,
        description="unservable: an entry the wire cannot describe (a FIFO, a device, a "
        "symlink leaving the folder, too many or too deep entries); unreadable: the folder "
        "could not be read; error: the agent failed (its log names the folder); "
        "origin-mismatch: a file's bytes are not the SHA-256 its origin published; "
        "origin-unchecked: the download did not record the checksums its origin stores.",
    )


class PeerStatus(meta.ApiModel):
    """What this node's agent serves to peer-mode download pods."""

    endpoint: str | None = Field(
        default=None,
        description="https://<pod IP>:<port> of the agent's peer server; unset when not serving.",
        json_schema_extra={"maxLength": 128},
    )
    models: list[PeerModel] | None = Field(
        default=None,
        description="Model folders this node can serve.",
        json_schema_extra={"maxItems": MAX_PEER_MODELS},
    )
    unservable: list[PeerUnservable] | None = Field(
        default=None,
        description="Complete model folders this node will never serve (peers fetch them "
        "elsewhere, or from the origin, rather than wait for this node).",
        json_schema_extra={"maxItems": MAX_PEER_MODELS},
    )


class ManifestFile(meta.ApiModel):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256_HEX)
    origin_sha256: str | None = Field(
        default=None,
        pattern=_SHA256_HEX,
        description="The SHA-256 the origin published for this file (a Hugging Face LFS "
        "file's), as the download recorded it; always `sha256` (checked when the list is made). "
        "This node's record: never served (`PeerManifest.wire_json`).",
    )

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_path(value)

    @model_validator(mode="after")
    def _attested_is_own(self) -> ManifestFile:
        if self.origin_sha256 is not None and self.origin_sha256 != self.sha256:
            raise ValueError(f"{self.path}: the origin's sha256 is not the file's")
        return self


class ManifestLink(meta.ApiModel):
    path: str
    target: str = Field(max_length=MAX_PATH)

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_path(value)

    @field_validator("target")
    @classmethod
    def _printable(cls, value: str) -> str:
        if _CONTROL.search(value):
            raise ValueError("a link target with a control character")
        return value


class PeerManifest(meta.ApiModel):
    """A model folder's file manifest, as a peer serves it; `complete: false` while the peer
    still downloads it (only its verified files are listed; `digest` is that listing's)."""

    storage_key: str = Field(pattern=_KEY)
    digest: str = Field(pattern=_DIGEST)
    complete: bool = True
    files: list[ManifestFile] = Field(max_length=MAX_FILES)
    dirs: list[str] = Field(default_factory=list, max_length=MAX_FILES)
    links: list[ManifestLink] = Field(default_factory=list, max_length=MAX_FILES)
    others: list[str] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="Entries that are neither (sockets, FIFOs...): never served.",
    )

    @field_validator("dirs", "others")
    @classmethod
    def _relative_entries(cls, values: list[str]) -> list[str]:
        return [check_path(v) for v in values]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def wire_json(self) -> str:
        """The manifest as a peer serves it: without `originSha256`, which receivers never
        compare (a follower compares a source's partial and complete manifests entry by
        entry, and fetchers of earlier versions too)."""
        drop = {"files": {"__all__": {"origin_sha256"}}}
        return self.model_dump_json(by_alias=True, exclude=drop)

    def computed_digest(self) -> str:
        return manifest_digest(
            files=((f.path, f.size, f.sha256) for f in self.files),
            dirs=self.dirs,
            links=((link.path, link.target) for link in self.links),
            others=self.others,
        )


class FetchReport(meta.ApiModel):
    """A peer-mode download pod's termination message (at most 4 KiB)."""

    outcome: Literal["complete", "use-origin", "failed"]
    peer_bytes: int = Field(default=0, ge=0)
    origin_bytes: int = Field(default=0, ge=0)
    sources: dict[str, int] = Field(
        default_factory=dict, description="Bytes per source node.", max_length=MAX_SOURCES + 1
    )
    reason: str | None = Field(default=None, max_length=256)
    bad_sources: dict[str, str] = Field(
        default_factory=dict,
        description="Source nodes whose bytes failed verification (banned), with why.",
        max_length=MAX_SOURCES + 1,
    )

    @field_validator("bad_sources")
    @classmethod
    def _short_reasons(cls, value: dict[str, str]) -> dict[str, str]:
        if any(len(k) > MAX_NODE_NAME or len(v) > MAX_BAD_REASON for k, v in value.items()):
            raise ValueError("a bad source's name or reason is too long")
        return value


class ProofHead(meta.ApiModel):
    """One file of a proof: its manifest path and a presigned HEAD of its object."""

    path: str
    url: str = Field(max_length=MAX_PROOF_URL)

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_path(value)


class ProofNonce(meta.ApiModel):
    """`GET /p2p/v1/models/{storageKey}/proofs/nonce`: a single-use value the serving node
    issues to one requester; the proof's presigned HEADs sign it as their `If-None-Match`
    header (`nonce_header`), so they prove nothing to another node, or twice."""

    nonce: str = Field(pattern=NONCE_PATTERN)


class ProofRequest(meta.ApiModel):
    """`POST /p2p/v1/models/{storageKey}/proofs`: a download pod of another credential scope
    shows that it can read every file of the model at the origin (`s3://` only)."""

    uri: str = Field(max_length=MAX_URI)
    nonce: str = Field(pattern=NONCE_PATTERN)
    heads: list[ProofHead] = Field(max_length=MAX_FILES)


def nonce_header(nonce: str) -> str:
    """The `If-None-Match` value a proof's HEADs sign and the serving node sends: an entity
    tag no object has (S3 ETags are hex MD5s), so the origin answers the object."""
    return f'"{nonce}"'


class ProofAnswer(meta.ApiModel):
    """The answer to a proof: `proven` with the manifest digest the requester may fetch, or
    the reason it was refused."""

    proven: bool
    digest: str | None = Field(default=None, pattern=_DIGEST)
    reason: str | None = Field(default=None, max_length=MAX_BAD_REASON)


def check_path(value: str) -> str:
    """`value` if it is a safe relative path of a manifest entry, else `ValueError`."""
    parts = value.split("/")
    if (
        not value
        or len(value) > MAX_PATH
        or len(parts) > MAX_DEPTH
        or _CONTROL.search(value) is not None
        or value.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ValueError(f"unsafe manifest path {value[:80]!r}")
    return value


def manifest_digest(
    *,
    files: Iterable[tuple[str, int, str]],
    dirs: Iterable[str] = (),
    links: Iterable[tuple[str, str]] = (),
    others: Iterable[str] = (),
) -> str:
    """The content digest: SHA-256 over the sorted listing `d <path>`, `f <path> <size>
    <sha256>`, `l <path> <target>`, `o <path>` joined by newlines (`agent.disk.digest`)."""
    lines = [f"d {d}" for d in dirs]
    lines += [f"f {p} {size} {sha}" for p, size, sha in files]
    lines += [f"l {p} {target}" for p, target in links]
    lines += [f"o {o}" for o in others]
    listing = "\n".join(sorted(lines)).encode("utf-8", "surrogateescape")
    return DIGEST_PREFIX + hashlib.sha256(listing).hexdigest()
