"""The part of KServe's LLMInferenceService and LLMInferenceServiceConfig
(serving.kserve.io v1alpha1 and v1alpha2: the fields read here are the same in both) that
localcache reads: the model URI, the LoRA adapters, the storage initializer switch and the
base configurations (reference kserve-after-v0.20 §4.1).

KServe's CRD keeps `spec.model.lora.adapters` schemaless, and the models here accept anything
there (`adapters()` returns only well-formed entries); every other field is typed loosely
enough that a spec the apiserver accepted parses. Everything else is kept as extra fields.
The label and annotation names are those of `inferenceservice`, plus the LoRA annotation of
KServe #5690 (`pkg/localmodelcache/metadata.go`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from localcache.api import groupversion, meta
from localcache.api import inferenceservice as isvc_api

# Set by the mutating webhook; read by KServe's LLMInferenceService controller (after #5690):
# JSON `{"<adapter name>": {"cache": ..., "namespace": ..., "sourceUri": ..., "pvcName": ...}}`.
LOCAL_MODEL_LORA_ANNOTATION: Final = "internal.serving.kserve.io/localmodel-lora"


@dataclass(frozen=True, slots=True)
class Adapter:
    """One well-formed LoRA adapter: a non-empty name and URI."""

    name: str
    uri: str


class LoRASpec(meta.ApiModel):
    adapters: Any = None


class ModelSpec(meta.ApiModel):
    uri: str | None = None
    name: str | None = None
    lora: LoRASpec | None = None


class StorageInitializerSpec(meta.ApiModel):
    enabled: bool | None = None


class BaseRef(meta.ApiModel):
    name: str | None = None


class LLMInferenceServiceSpec(meta.ApiModel):
    model: ModelSpec | None = None
    storage_initializer: StorageInitializerSpec | None = None
    base_refs: list[BaseRef] | None = None

    @property
    def model_uri(self) -> str | None:
        """`model.uri`; None when absent or empty (KServe's merge ignores an empty URI)."""
        return (self.model.uri if self.model else None) or None

    @property
    def raw_adapters(self) -> Any:
        """`model.lora.adapters` as written (None when absent)."""
        return self.model.lora.adapters if self.model and self.model.lora else None

    @property
    def storage_initializer_enabled(self) -> bool | None:
        return self.storage_initializer.enabled if self.storage_initializer else None

    @property
    def base_ref_names(self) -> list[str | None]:
        """The names of `baseRefs`, in order (None for an entry without a name)."""
        return [ref.name or None for ref in self.base_refs or ()]


def adapters(raw: Any, *, limit: int) -> tuple[list[Adapter], list[str]]:
    """The well-formed adapters of a schemaless `lora.adapters` value (at most `limit`), and
    a description of each problem found (entries skipped, list cut)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], ["spec.model.lora.adapters is not a list"]
    found: list[Adapter] = []
    problems: list[str] = []
    if len(raw) > limit:
        problems.append(f"only the first {limit} of {len(raw)} LoRA adapters were matched")
    for index, entry in enumerate(raw[:limit]):
        name = entry.get("name") if isinstance(entry, dict) else None
        uri = entry.get("uri") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or not isinstance(uri, str) or not uri:
            problems.append(f"spec.model.lora.adapters[{index}] has no name or no uri")
            continue
        found.append(Adapter(name, uri))
    return found, problems


class LLMInferenceService(meta.KubeObject):
    """A KServe LLMInferenceService, reduced to what localcache uses."""

    api_version: str | None = groupversion.LLM_INFERENCE_SERVICE.api_version
    kind: str | None = groupversion.LLM_INFERENCE_SERVICE.kind
    spec: LLMInferenceServiceSpec | None = None

    @property
    def local_model_disabled(self) -> bool:
        """The user opted out: the annotation's presence alone counts, whatever its value."""
        return isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION in self.annotations

    @property
    def node_group(self) -> str | None:
        """The node group the user asked for with `serving.kserve.io/nodegroup`."""
        return self.annotations.get(isvc_api.NODE_GROUP_ANNOTATION)


class LLMInferenceServiceConfig(meta.KubeObject):
    """A KServe LLMInferenceServiceConfig (a base configuration named by `spec.baseRefs`)."""

    api_version: str | None = groupversion.LLM_INFERENCE_SERVICE_CONFIG.api_version
    kind: str | None = groupversion.LLM_INFERENCE_SERVICE_CONFIG.kind
    spec: LLMInferenceServiceSpec | None = None
