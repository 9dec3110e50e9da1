"""Where and how a model is fetched: the `storage` credentials spec shared by the cache kinds
and LocalModelNode entries, and the part of KServe's ClusterStorageContainer that download
Jobs use (we read ClusterStorageContainers, never write them)."""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import Field

from localcache.api import groupversion, meta

WORKLOAD_INIT_CONTAINER: Final = "initContainer"
WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB: Final = "localModelDownloadJob"


class LocalModelStorageSpec(meta.ApiModel):
    """Credentials from the storage-config secret (KServe's LocalModelStorageSpec)."""

    key: str | None = Field(
        default=None,
        description=(
            "Key inside the storage-config secret whose JSON describes the storage "
            "(type, bucket, endpoint, credentials) used to download the model."
        ),
    )
    parameters: dict[str, str] | None = Field(
        default=None,
        description=(
            "Parameters that override the storage-config entry (for example type, bucket, "
            "region); passed to the download as STORAGE_OVERRIDE_CONFIG."
        ),
    )


class SupportedUriFormat(meta.ApiModel):
    """A URI format a storage container handles: a prefix, or else a regular expression."""

    prefix: str | None = None
    regex: str | None = None


class StorageContainerSpec(meta.ApiModel):
    container: dict[str, Any]
    supported_uri_formats: list[SupportedUriFormat]
    workload_type: str | None = None
    supports_multi_model_download: bool | None = None


class ClusterStorageContainer(meta.KubeObject):
    """KServe's ClusterStorageContainer: a container template for URIs it declares support for."""

    api_version: str | None = groupversion.CLUSTER_STORAGE_CONTAINER.api_version
    kind: str | None = groupversion.CLUSTER_STORAGE_CONTAINER.kind
    spec: StorageContainerSpec
    disabled: bool | None = None

    @property
    def is_disabled(self) -> bool:
        return self.disabled is True

    @property
    def workload_type(self) -> str:
        """`spec.workloadType`, defaulting to `initContainer` as KServe does."""
        return self.spec.workload_type or WORKLOAD_INIT_CONTAINER

    def supports_uri(self, uri: str) -> bool:
        """KServe's `IsStorageUriSupported`: a non-empty prefix that `uri` starts with, else
        a non-empty regex found anywhere in `uri`. A bad regex raises `ValueError` naming
        this container."""
        for fmt in self.spec.supported_uri_formats:
            if fmt.prefix:
                if uri.startswith(fmt.prefix):
                    return True
            elif fmt.regex:
                try:
                    if re.search(fmt.regex, uri):
                        return True
                except re.error as exc:
                    raise ValueError(
                        f"error checking storage container {self.name}: bad regex "
                        f"{fmt.regex!r}: {exc}"
                    ) from exc
        return False
