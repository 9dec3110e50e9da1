"""LocalModelCache (cluster-scoped) and LocalModelNamespaceCache (namespaced): one model URI
to keep on the nodes of some node groups. Both kinds share spec and status, field for field
compatible with KServe's `serving.kserve.io/v1alpha1`, plus localcache's `status.conditions`."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import Field, JsonValue

from localcache.api import groupversion, meta, schema
from localcache.api.download import DownloadSpec
from localcache.api.quantity import Quantity
from localcache.api.storage import LocalModelStorageSpec

FINALIZER: Final = "localmodel.kserve.io/finalizer"
NAMESPACE_CACHE_FINALIZER: Final = "localmodelnamespacecache.kserve.io/finalizer"

MAX_SOURCE_URI_LENGTH: Final = 2048
"""Characters of a `sourceModelUri` (`caching.uris.malformed` says why): room for an S3 or GCS
key of 1024 bytes with its bucket and scheme, or a long https URL."""

CONDITION_READY: Final = "Ready"
CONDITION_DEGRADED: Final = "Degraded"


class NodeStatus(StrEnum):
    """Download state of the cache's model on one node (`status.nodeStatus` values)."""

    UNKNOWN = ""
    NOT_READY = "NodeNotReady"
    DOWNLOAD_PENDING = "NodeDownloadPending"
    DOWNLOADING = "NodeDownloading"
    DOWNLOADED = "NodeDownloaded"
    DOWNLOAD_ERROR = "NodeDownloadError"


class LocalModelCacheSpec(meta.ApiModel):
    """What to cache and where. Shared by LocalModelCache and LocalModelNamespaceCache."""

    source_model_uri: str = Field(
        description=(
            "URI of the model to cache, for example gs://bucket/model or hf://org/model. "
            "InferenceServices whose storageUri equals it or lies under it use the cache. "
            "Immutable."
        ),
        # maxLength in the CRDs only: an object stored before (KServe's CRDs set none) still
        # parses, so it can be deleted; the controller leaves it out of LocalModelNodes
        json_schema_extra={
            "maxLength": MAX_SOURCE_URI_LENGTH,
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "StorageUri is immutable"}
            ],
        },
    )
    model_size: Quantity = Field(
        description=(
            "Size of the model on disk. It must not exceed the disk space reserved on the "
            "node group (its storageLimit)."
        ),
        json_schema_extra=schema.positive_quantity("modelSize"),
    )
    node_groups: list[str] = Field(
        min_length=1,
        description=(
            "LocalModelNodeGroups whose nodes keep a copy. The first is the default group "
            "for InferenceServices that do not name one."
        ),
    )
    service_account_name: str | None = Field(
        default=None,
        description=(
            "ServiceAccount whose secrets give the download Job its credentials; the Job "
            "pod also runs as it."
        ),
    )
    storage: LocalModelStorageSpec | None = Field(
        default=None,
        description=(
            "Credentials from the storage-config secret; when key is set it is used "
            "instead of serviceAccountName's secrets."
        ),
    )
    download: DownloadSpec | None = Field(
        default=None,
        description=(
            "localcache: environment and memory of the download container (over the node "
            "group's). Pruned where KServe's own CRDs are installed."
        ),
    )


PVC_REF_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A DNS-1123 subdomain: what a PersistentVolumeClaim's name must be (KServe's `pvcRef`)."""
MAX_PVC_REF_LENGTH: Final = 253
MODE_RULES: Final[list[JsonValue]] = [
    {
        "rule": "!(has(self.nodeGroups) && has(self.pvcRef))",
        "message": "nodeGroups and pvcRef are mutually exclusive",
    },
    {
        "rule": "has(self.nodeGroups) || has(self.pvcRef)",
        "message": "exactly one of nodeGroups or pvcRef must be set",
    },
]
"""KServe's (#6107) rules on a namespace cache's spec: per-node copies or one shared claim."""


class LocalModelNamespaceCacheSpec(LocalModelCacheSpec):
    """A namespace cache's spec: the cluster cache's, with KServe's shared-volume mode
    (`pvcRef`, exclusive with `nodeGroups`)."""

    node_groups: list[str] = Field(
        default_factory=list,
        min_length=1,
        description=(
            "LocalModelNodeGroups whose nodes keep a copy. The first is the default group "
            "for InferenceServices that do not name one. Exclusive with pvcRef."
        ),
    )
    pvc_ref: str | None = Field(
        default=None,
        max_length=MAX_PVC_REF_LENGTH,
        pattern=PVC_REF_PATTERN,
        description=(
            "A ReadWriteMany PersistentVolumeClaim of the cache's namespace: one import Job "
            "copies the model onto it (at models/<storage key>) instead of one copy per node. "
            "Exclusive with nodeGroups. Immutable."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "pvcRef is immutable"}
            ],
        },
    )

    @property
    def shared_volume(self) -> bool:
        """KServe's shared-PVC mode: the model lives on the tenant's claim, not on nodes."""
        return self.pvc_ref is not None


class ModelCopies(meta.ApiModel):
    """Counts over the nodes of the cache's groups. Absent counts mean 0."""

    available: int | None = Field(default=None, description="Nodes with the model downloaded.")
    total: int | None = Field(default=None, description="Nodes that should hold the model.")
    failed: int | None = Field(default=None, description="Nodes whose download failed.")


class NamespacedName(meta.ApiModel):
    namespace: str | None = Field(default=None, description="Namespace of the object.")
    name: str | None = Field(default=None, description="Name of the object.")


class ImportJobRef(meta.ApiModel):
    """The import Job the controller created, trusted by its uid (never by its name)."""

    name: str | None = Field(default=None, description="Name of the Job.")
    uid: str | None = Field(default=None, description="UID of the Job the controller created.")


class SharedVolumeStatus(meta.ApiModel):
    """localcache: the import onto a shared-volume cache's claim (pvcRef). Pruned where
    KServe's own CRDs are installed."""

    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description="UID of the claim the current import targets or landed on.",
    )
    job: ImportJobRef | None = Field(default=None, description="The import Job created.")
    attempt: int | None = Field(default=None, ge=0, description="Import attempts started.")
    failed_attempts: int | None = Field(
        default=None, ge=0, description="Import attempts that failed in a row."
    )
    next_attempt_time: str | None = Field(
        default=None,
        json_schema_extra=meta.DATE_TIME,
        description="When the failed import is tried again (RFC 3339), while backing off.",
    )
    bytes: int | None = Field(
        default=None,
        ge=0,
        json_schema_extra={"format": "int64"},
        description="Bytes imported so far, or of the placed model once imported.",
    )
    message: str | None = Field(
        default=None, max_length=1024, description="What the import is doing or why it failed."
    )


class LocalModelCacheStatus(meta.ApiModel):
    """Observed state of a cache. Shared by both cache kinds."""

    node_status: dict[str, NodeStatus] | None = Field(
        default=None, description="Download state of the model on each node, keyed by node name."
    )
    copies: ModelCopies | None = Field(
        default=None, description="How many nodes hold the model, should hold it, or failed."
    )
    inference_services: list[NamespacedName] | None = Field(
        default=None, description="InferenceServices that use this cache."
    )
    llm_inference_services: list[NamespacedName] | None = Field(
        default=None, description="LLMInferenceServices that use this cache."
    )
    conditions: list[meta.Condition] | None = Field(
        default=None,
        description=(
            "Standard conditions: Ready when every member node has the model, Degraded "
            "when some downloads failed or a node group is missing."
        ),
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    shared_volume: SharedVolumeStatus | None = Field(
        default=None,
        description=(
            "localcache: the import of a shared-volume namespace cache (pvcRef). Pruned "
            "where KServe's own CRDs are installed."
        ),
    )


class LocalModelCache(meta.KubeObject):
    """LocalModelCache keeps one model on the local disks of the nodes in its node groups,
    for every namespace's InferenceServices."""

    api_version: str | None = groupversion.LOCAL_MODEL_CACHE.api_version
    kind: str | None = groupversion.LOCAL_MODEL_CACHE.kind
    spec: LocalModelCacheSpec = Field(
        description="The model to cache and the node groups to cache it on."
    )
    status: LocalModelCacheStatus | None = Field(
        default=None, description="Where the model is downloaded, and who uses the cache."
    )


class LocalModelNamespaceCache(meta.KubeObject):
    """LocalModelNamespaceCache keeps one model on the local disks of the nodes in its node
    groups, or on one ReadWriteMany claim of its namespace (pvcRef), for the InferenceServices
    of its own namespace, downloaded with that namespace's credentials."""

    api_version: str | None = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version
    kind: str | None = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind
    spec: LocalModelNamespaceCacheSpec = Field(
        description=(
            "The model to cache, and the node groups to cache it on or the shared claim to "
            "import it onto."
        ),
        json_schema_extra={"x-kubernetes-validations": MODE_RULES},
    )
    status: LocalModelCacheStatus | None = Field(
        default=None, description="Where the model is downloaded, and who uses the cache."
    )
