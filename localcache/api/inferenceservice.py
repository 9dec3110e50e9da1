"""The part of KServe's InferenceService (serving.kserve.io/v1beta1) localcache reads and
writes: the predictor's storage URI, and the labels/annotations that tie an ISVC to a cache.

Everything else in the object is kept as extra fields, so a parsed ISVC writes back whole.
The label and annotation names are part of the compatibility contract with KServe's
controllers and pod mutator (reference §2.6).
"""

from __future__ import annotations

from typing import Final

from localcache.api import groupversion, meta

# Set by the mutating webhook; read by KServe's ISVC controller and pod mutator.
LOCAL_MODEL_LABEL: Final = "internal.serving.kserve.io/localmodel"
LOCAL_MODEL_NAMESPACE_LABEL: Final = "internal.serving.kserve.io/localmodel-namespace"
LOCAL_MODEL_SOURCE_URI_ANNOTATION: Final = "internal.serving.kserve.io/localmodel-sourceuri"
LOCAL_MODEL_PVC_NAME_ANNOTATION: Final = "internal.serving.kserve.io/localmodel-pvc-name"
# Set by users.
NODE_GROUP_ANNOTATION: Final = "serving.kserve.io/nodegroup"
DISABLE_LOCAL_MODEL_ANNOTATION: Final = "serving.kserve.io/disable-localmodel"

# KServe's `GetImplementations` order; a valid ISVC sets exactly one of them.
PREDICTOR_KEYS: Final = (
    "xgboost",
    "pytorch",
    "triton",
    "sklearn",
    "tensorflow",
    "onnx",
    "pmml",
    "lightgbm",
    "paddle",
    "huggingface",
    "model",
)


class PredictorImplementation(meta.ApiModel):
    """A predictor's model (`model`, or a framework key such as `sklearn`)."""

    storage_uri: str | None = None


class PredictorSpec(meta.ApiModel):
    model: PredictorImplementation | None = None
    sklearn: PredictorImplementation | None = None
    xgboost: PredictorImplementation | None = None
    tensorflow: PredictorImplementation | None = None
    pytorch: PredictorImplementation | None = None
    triton: PredictorImplementation | None = None
    onnx: PredictorImplementation | None = None
    pmml: PredictorImplementation | None = None
    lightgbm: PredictorImplementation | None = None
    paddle: PredictorImplementation | None = None
    huggingface: PredictorImplementation | None = None

    def implementation(self) -> PredictorImplementation | None:
        """The first implementation set, in KServe's order (`PREDICTOR_KEYS`)."""
        for key in PREDICTOR_KEYS:
            found: PredictorImplementation | None = getattr(self, key)
            if found is not None:
                return found
        return None


class InferenceServiceSpec(meta.ApiModel):
    predictor: PredictorSpec | None = None


class InferenceService(meta.KubeObject):
    """A KServe InferenceService, reduced to what localcache uses."""

    api_version: str | None = groupversion.INFERENCE_SERVICE.api_version
    kind: str | None = groupversion.INFERENCE_SERVICE.kind
    spec: InferenceServiceSpec | None = None

    @property
    def storage_uri(self) -> str | None:
        """The predictor implementation's `storageUri`; `None` when it has none."""
        predictor = self.spec.predictor if self.spec else None
        implementation = predictor.implementation() if predictor else None
        return implementation.storage_uri if implementation else None

    @property
    def local_model_disabled(self) -> bool:
        """The user opted out: the annotation's presence alone counts, whatever its value."""
        return DISABLE_LOCAL_MODEL_ANNOTATION in self.annotations

    @property
    def node_group(self) -> str | None:
        """The node group the user asked for with `serving.kserve.io/nodegroup`."""
        return self.annotations.get(NODE_GROUP_ANNOTATION)
