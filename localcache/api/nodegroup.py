"""LocalModelNodeGroup: a set of nodes (selected by its PV's node affinity) with a disk budget
and the PV/PVC templates for the volumes that expose the models. Compatible with KServe's
kind; localcache adds optional `spec.tolerations` and `spec.download` (`api.download`) for
download Jobs and fills in
`status.used`/`status.available` (there is no status subresource, as in KServe).

The PV and PVC specs are plain core/v1 JSON in the models: we copy them into the objects we
create and read only a few paths (`node_selector_terms`, `local_path`). The CRD gives them the
full core/v1 schemas of the Kubernetes version we build (`coreschema`), so the apiserver
refuses invalid specs on write and `kubectl explain` describes them.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import Field

from localcache.api import coreschema, groupversion, meta, schema
from localcache.api.download import DownloadSpec
from localcache.api.peer import PeerDistributionSpec
from localcache.api.quantity import Quantity


class Toleration(meta.ApiModel):
    """A core/v1 Toleration."""

    key: str | None = Field(default=None, description="Taint key that the toleration applies to.")
    operator: str | None = Field(default=None, description="Exists or Equal (the default).")
    value: str | None = Field(default=None, description="Taint value the toleration matches.")
    effect: str | None = Field(
        default=None, description="Taint effect to match: NoSchedule, PreferNoSchedule, NoExecute."
    )
    toleration_seconds: int | None = Field(
        default=None,
        json_schema_extra={"format": "int64"},
        description="How long a NoExecute taint is tolerated; unset means forever.",
    )


class LocalModelNodeGroupSpec(meta.ApiModel):
    storage_limit: Quantity = Field(
        description="Disk space each node of the group reserves for cached models.",
        json_schema_extra=schema.positive_quantity("storageLimit"),
    )
    persistent_volume_spec: Annotated[
        dict[str, Any], coreschema.CoreSchema("PersistentVolumeSpec")
    ] = Field(
        description=(
            "core/v1 PersistentVolumeSpec copied into every PV created for this group. Its "
            "nodeAffinity.required selects the group's nodes; its local or hostPath path must "
            "be the agent's models root."
        ),
    )
    persistent_volume_claim_spec: Annotated[
        dict[str, Any], coreschema.CoreSchema("PersistentVolumeClaimSpec")
    ] = Field(
        description=(
            "core/v1 PersistentVolumeClaimSpec copied into every PVC created for this group "
            "(volumeName is set to the matching PV)."
        ),
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description="Tolerations added to download Jobs, so tainted nodes can cache models.",
    )
    download: DownloadSpec | None = Field(
        default=None,
        description=(
            "localcache: environment and memory of the download container for the group's "
            "caches (a cache's own spec.download wins). References resolve in the namespace "
            "the download Job runs in."
        ),
    )

    peer_distribution: PeerDistributionSpec | None = Field(
        default=None,
        description=(
            "localcache: nodes of the group fill each other with verified files, so one copy "
            "of each model leaves the origin (on by default: the apiserver fills in "
            "{enabled: true}; under KServe's CRDs the field does not exist and it is off)."
        ),
        json_schema_extra={"default": {}},
    )

    def node_selector_terms(self) -> list[dict[str, Any]] | None:
        """`persistentVolumeSpec.nodeAffinity.required.nodeSelectorTerms`; `None` when absent
        (then the group matches no node)."""
        affinity = self.persistent_volume_spec.get("nodeAffinity")
        required = affinity.get("required") if isinstance(affinity, dict) else None
        terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
        return cast("list[dict[str, Any]]", terms) if isinstance(terms, list) else None

    def local_path(self) -> str | None:
        """The host path the PV exposes (`local.path`, else `hostPath.path`), if any."""
        for source in ("local", "hostPath"):
            volume = self.persistent_volume_spec.get(source)
            if isinstance(volume, dict) and isinstance(volume.get("path"), str):
                return cast(str, volume["path"])
        return None


class LocalModelNodeGroupStatus(meta.ApiModel):
    used: Quantity | None = Field(
        default=None,
        description="Sum of modelSize over the distinct model URIs placed on this group.",
    )
    available: Quantity | None = Field(default=None, description="storageLimit minus used.")


class LocalModelNodeGroup(meta.KubeObject):
    """LocalModelNodeGroup is a group of nodes that cache models, with their disk budget and
    the volume templates used to expose the models to InferenceServices."""

    api_version: str | None = groupversion.LOCAL_MODEL_NODE_GROUP.api_version
    kind: str | None = groupversion.LOCAL_MODEL_NODE_GROUP.kind
    spec: LocalModelNodeGroupSpec = Field(
        description="The nodes of the group, their disk budget and volume templates."
    )
    status: LocalModelNodeGroupStatus | None = Field(
        default=None, description="Disk space used by and left for cached models."
    )
