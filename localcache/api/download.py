"""`spec.download` of caches (both kinds) and node groups: environment and resources of the
download container, without a ClusterStorageContainer (issue 21; KServe #5326: xet downloads
over ~8 GB need more than the 1 Gi default memory limit; `HF_HUB_DISABLE_XET=1`).

localcache's own field: KServe's CRDs (the with-kserve profile) do not declare it, so the
apiserver prunes it there. Values are literal or by reference (`secretKeyRef`,
`configMapKeyRef`, resolved in the namespace the download Job runs in: a namespace cache's
own, `jobNamespace` for a cluster cache); a secret's value is never copied. Bounds (counts,
lengths) are the CRD's (a tenant writes namespace caches); which names may be set is
`caching.downloadenv` (the validating webhook refuses the names localcache sets for
credentials). The pydantic models keep the bounds in the schema only, so an object stored
before parses whatever it holds.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field

from localcache.api import meta
from localcache.api.quantity import Quantity

MAX_ENV: Final = 32
MAX_NAME: Final = 128
MAX_VALUE: Final = 4096
ENV_NAME_PATTERN: Final = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
"""Kubernetes' own rule for environment variable names (C identifiers and more)."""
_REF_NAME: Final = 253


class KeyRef(meta.ApiModel):
    """A key of a Secret or ConfigMap in the download Job's namespace."""

    name: str = Field(
        description="Name of the Secret or ConfigMap.",
        json_schema_extra={"maxLength": _REF_NAME, "minLength": 1},
    )
    key: str = Field(
        description="The key to select.", json_schema_extra={"maxLength": _REF_NAME, "minLength": 1}
    )
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class EnvVarSource(meta.ApiModel):
    """Where a variable's value comes from: exactly one of the two."""

    secret_key_ref: KeyRef | None = Field(
        default=None, description="A key of a Secret in the download Job's namespace."
    )
    config_map_key_ref: KeyRef | None = Field(
        default=None, description="A key of a ConfigMap in the download Job's namespace."
    )


class EnvVar(meta.ApiModel):
    """One environment variable of the download container: `value` or `valueFrom`."""

    name: str = Field(
        description="Variable name.",
        json_schema_extra={"maxLength": MAX_NAME, "minLength": 1, "pattern": ENV_NAME_PATTERN},
    )
    value: str | None = Field(
        default=None, description="Literal value.", json_schema_extra={"maxLength": MAX_VALUE}
    )
    value_from: EnvVarSource | None = Field(
        default=None, description="The value by reference (never copied)."
    )


class ResourceAmounts(meta.ApiModel):
    """Memory and CPU of the download container."""

    memory: Quantity | None = Field(default=None, description="Memory, e.g. 8Gi.")
    cpu: Quantity | None = Field(default=None, description="CPU, e.g. 2.")


class DownloadResources(meta.ApiModel):
    requests: ResourceAmounts | None = Field(default=None, description="Requested resources.")
    limits: ResourceAmounts | None = Field(default=None, description="Resource limits.")


class DownloadSpec(meta.ApiModel):
    """Download-container settings; a cache's win over its node group's, which win over the
    defaults (the Hugging Face variables KServe sets, `storageInitializer` resources)."""

    env: list[EnvVar] | None = Field(
        default=None,
        description=(
            "Environment of the download container, e.g. HF_HUB_DISABLE_XET=1; a cache's "
            "variable replaces its node group's of the same name. Names localcache sets for "
            "credentials are refused."
        ),
        json_schema_extra={"maxItems": MAX_ENV},
    )
    resources: DownloadResources | None = Field(
        default=None,
        description=(
            "Memory and CPU requests and limits of the download container (each amount "
            "replaces the node group's, then the storageInitializer default)."
        ),
    )
