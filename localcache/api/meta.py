"""The base of every API model, and the ObjectMeta, OwnerReference and Condition subset we use.

Contract of every model in `localcache.api`:
- attributes are snake_case, JSON names camelCase (`source_model_uri` <-> `sourceModelUri`);
  both spellings are accepted on input;
- unknown fields are kept (`extra="allow"`) and written back unchanged, at every level, so we
  never drop what another controller or a newer KServe wrote;
- optional fields default to `None` and are left out on output, so
  `Model.model_validate(obj).to_dict() == obj` for any valid object;
- `to_dict()` gives plain JSON types (enums as strings, quantities as written), ready for
  the API client; `from_dict()` is `model_validate`.
Models are not frozen, but code that holds one read from an informer store must copy
(`model_copy(deep=True)`) before changing it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

# Patterns and limits of metav1.Condition, as the Kubernetes API declares them.
CONDITION_TYPE_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
DATE_TIME: Final[JsonDict] = {"format": "date-time"}


class ApiModel(BaseModel):
    """Base of all API models: camelCase JSON, unknown fields kept, `None` means absent."""

    model_config = ConfigDict(
        extra="allow",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """The object as Kubernetes JSON (plain dicts, lists, strings and numbers)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        """Parse Kubernetes JSON; raises `pydantic.ValidationError` naming the bad field."""
        return cls.model_validate(data)


class OwnerReference(ApiModel):
    """A reference to an owning object (metav1.OwnerReference)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    """The metav1.ObjectMeta fields localcache reads; all others are kept as extras."""

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None


class KubeObject(ApiModel):
    """A top-level object: apiVersion, kind and metadata. Subclasses set the defaults."""

    api_version: str | None = None
    kind: str | None = None
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @property
    def name(self) -> str:
        """`metadata.name`; "" when the object has none yet (generateName)."""
        return self.metadata.name or ""

    @property
    def namespace(self) -> str:
        """`metadata.namespace`; "" for cluster-scoped objects."""
        return self.metadata.namespace or ""

    @property
    def labels(self) -> dict[str, str]:
        """`metadata.labels`, or an empty dict (not attached to the model) when absent."""
        return self.metadata.labels or {}

    @property
    def annotations(self) -> dict[str, str]:
        """`metadata.annotations`, or an empty dict (not attached to the model) when absent."""
        return self.metadata.annotations or {}


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """One aspect of an object's state (the standard metav1.Condition shape)."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="Type of condition in CamelCase, for example Ready or Degraded.",
    )
    status: ConditionStatus = Field(description="Status of the condition: True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        json_schema_extra={"format": "int64"},
        description=(
            "The .metadata.generation that the condition was set based upon. If it is older "
            "than the object's generation, the condition is out of date."
        ),
    )
    last_transition_time: str = Field(
        json_schema_extra=DATE_TIME,
        description="Last time the condition changed from one status to another (RFC 3339).",
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="Programmatic identifier, in CamelCase, of the reason for the last transition.",
    )
    message: str = Field(
        max_length=32768,
        description="Human-readable message with details about the transition; may be empty.",
    )
