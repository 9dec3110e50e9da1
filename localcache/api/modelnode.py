"""LocalModelNode: the models one node must hold (spec, written by the cache reconcilers) and
their download state (status, written by that node's agent). The object's name is the node's
name.

`status.modelStatus` is KServe's map of status key (`name` or `namespace/name`, see
`localcache.caching.keys`) to a state string, unchanged. localcache adds, as optional fields
KServe ignores: `status.modelProgress` (bytes, percent, retries and the last failure per
status key) and `status.summary` (counts for `kubectl get`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field

from localcache.api import groupversion, meta, modelcache
from localcache.api.peer import PeerStatus
from localcache.api.storage import LocalModelStorageSpec


class ModelStatus(StrEnum):
    """Download state of one model entry on the node (`status.modelStatus` values)."""

    UNKNOWN = ""
    DOWNLOAD_PENDING = "ModelDownloadPending"
    DOWNLOADING = "ModelDownloading"
    DOWNLOADED = "ModelDownloaded"
    DOWNLOAD_ERROR = "ModelDownloadError"


class LocalModelInfo(meta.ApiModel):
    """One model the node must hold, for one cache. Identified by (namespace, modelName)."""

    source_model_uri: str = Field(
        description="URI of the model to download.",
        json_schema_extra={"maxLength": modelcache.MAX_SOURCE_URI_LENGTH},
    )
    model_name: str = Field(description="Name of the LocalModelCache or LocalModelNamespaceCache.")
    namespace: str | None = Field(
        default=None,
        description="Namespace of a LocalModelNamespaceCache; empty for a LocalModelCache.",
    )
    node_group: str | None = Field(
        default=None, description="The LocalModelNodeGroup this entry was placed through."
    )
    service_account_name: str | None = Field(
        default=None, description="ServiceAccount that provides the download credentials."
    )
    storage: LocalModelStorageSpec | None = Field(
        default=None, description="Credentials from the storage-config secret."
    )


class LocalModelNodeSpec(meta.ApiModel):
    local_models: list[LocalModelInfo] = Field(
        description="Models this node must hold, with their source URIs and cache names."
    )


class ModelProgress(meta.ApiModel):
    """localcache's detail on one entry's download, keyed like `modelStatus`."""

    bytes_on_disk: int | None = Field(
        default=None,
        ge=0,
        json_schema_extra={"format": "int64"},
        description="Bytes downloaded so far (or in total once downloaded).",
    )
    percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Download progress in percent of the cache's modelSize.",
    )
    attempts: int | None = Field(
        default=None, ge=0, description="Download Jobs run for this entry so far."
    )
    job_name: str | None = Field(default=None, description="The latest download Job.")
    message: str | None = Field(
        default=None, description="Why the last download failed, or what the entry waits for."
    )
    next_retry_time: str | None = Field(
        default=None,
        json_schema_extra=meta.DATE_TIME,
        description="When a failed download is retried (RFC 3339).",
    )
    completion_time: str | None = Field(
        default=None,
        json_schema_extra=meta.DATE_TIME,
        description="When the download completed (RFC 3339).",
    )
    folder: str | None = Field(
        default=None,
        max_length=33,
        pattern=r"^[0-9a-f]{16}\.[0-9a-f]{16}$",
        description=(
            "The model folder serving this entry when it is not the storage key's own: "
            "this entry's credential scope downloaded different content "
            "(models/<storage key>.<variant>); localcache's volumes show it at "
            "models/<storage key>."
        ),
    )

    source: str | None = Field(
        default=None,
        max_length=80,
        description="Where the bytes came from: origin, or peer/<node> (the first peer used).",
    )
    origin_bytes: int | None = Field(
        default=None,
        ge=0,
        json_schema_extra={"format": "int64"},
        description="Bytes the download took from the origin (peer distribution).",
    )
    peer_bytes: int | None = Field(
        default=None,
        ge=0,
        json_schema_extra={"format": "int64"},
        description="Bytes the download took from peer nodes (peer distribution).",
    )


class ModelSummary(meta.ApiModel):
    """Counts over `modelStatus`, for `kubectl get localmodelnodes`."""

    total: int | None = Field(default=None, ge=0, description="Model entries on this node.")
    downloaded: int | None = Field(default=None, ge=0, description="Entries downloaded.")
    failed: int | None = Field(default=None, ge=0, description="Entries whose download failed.")

    @classmethod
    def of(cls, model_status: Mapping[str, ModelStatus]) -> ModelSummary:
        values = list(model_status.values())
        return cls(
            total=len(values),
            downloaded=values.count(ModelStatus.DOWNLOADED),
            failed=values.count(ModelStatus.DOWNLOAD_ERROR),
        )


class DownloadJob(meta.ApiModel):
    """A download Job this node's agent created, recorded by the agent from the create
    response. The agent trusts a Job only when its namespace, name and uid match a record:
    tenants can write Jobs, labels and ownerReferences, but not this status."""

    namespace: str = Field(description="Namespace of the Job.")
    name: str = Field(description="Name of the Job.")
    uid: str = Field(description="UID of the Job the agent created.")
    status_key: str = Field(description="The entry the Job was created for (modelStatus key).")
    storage_key: str = Field(description="The model folder the Job downloads into.")
    scope: str = Field(description="SHA-256 of the credential scope the Job downloads in.")
    attempt: int = Field(ge=0, description="Which download attempt of the entry it is.")


class LocalModelNodeStatus(meta.ApiModel):
    model_status: dict[str, ModelStatus] | None = Field(
        default=None,
        description=(
            "Download state of each model, keyed by status key: the cache name for a "
            "LocalModelCache, namespace/name for a LocalModelNamespaceCache."
        ),
    )
    model_progress: dict[str, ModelProgress] | None = Field(
        default=None, description="Download progress and failures, keyed like modelStatus."
    )
    summary: ModelSummary | None = Field(default=None, description="Counts over modelStatus.")
    download_jobs: list[DownloadJob] | None = Field(
        default=None,
        description="Download Jobs this node's agent created and trusts (matched by uid).",
    )
    peer: PeerStatus | None = Field(
        default=None, description="What this node serves to peers (peer distribution)."
    )


class LocalModelNode(meta.KubeObject):
    """LocalModelNode lists the models one node must keep on its local disk and their
    download state. Its name is the node's name."""

    api_version: str | None = groupversion.LOCAL_MODEL_NODE.api_version
    kind: str | None = groupversion.LOCAL_MODEL_NODE.kind
    spec: LocalModelNodeSpec = Field(description="The models this node must hold.")
    status: LocalModelNodeStatus | None = Field(
        default=None, description="Download state of each model on this node."
    )
