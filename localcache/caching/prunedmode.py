"""A shared-volume cache the apiserver turned into something else (issue 22).

KServe v0.20's LocalModelNamespaceCache CRD has no `spec.pvcRef`. Where it is still the served
schema, the apiserver prunes the field from a client that does not ask for strict field
validation (kubectl does, and gets `unknown field "spec.pvcRef"`). What is left is a node-group
cache when the object also names `nodeGroups`, which would download the model onto every node
of those groups: not what its author asked for. The only trace of the pruned field is kubectl's
`last-applied-configuration` annotation, read here (bounded, since a tenant writes it). Such a
cache is reported as unavailable (condition, Event, log line; the validating webhook refuses it
when it is up) and placed on no node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
MAX_LAST_APPLIED: Final = 256 * 1024
"""Characters of the annotation read; the apiserver caps all annotations at 256 KiB."""
REASON: Final = "SharedVolumeUnavailable"


def dropped_pvc_ref(obj: Mapping[str, Any]) -> str | None:
    """The `spec.pvcRef` the object was last applied with, when the stored object has none
    (the served CRD pruned it); None otherwise, or when the annotation is absent, too long or
    not a JSON object."""
    spec = obj.get("spec")
    if isinstance(spec, Mapping) and spec.get("pvcRef"):
        return None
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    text = annotations.get(LAST_APPLIED) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str) or len(text) > MAX_LAST_APPLIED:
        return None
    try:
        applied = json.loads(text)
    except ValueError:
        return None
    applied_spec = applied.get("spec") if isinstance(applied, dict) else None
    ref = applied_spec.get("pvcRef") if isinstance(applied_spec, dict) else None
    return ref if isinstance(ref, str) and ref else None


def message(pvc_ref: str) -> str:
    """Why the cache does nothing, and what to do."""
    shown = pvc_ref if len(pvc_ref) <= 253 else f"{pvc_ref[:250]}..."
    return (
        f"spec.pvcRef ({shown}) was dropped by the apiserver: the served "
        "LocalModelNamespaceCache CRD has no pvcRef (KServe v0.20's schema), so the shared-volume "
        "mode is unavailable and the cache is placed on no node. Install localcache's CRDs "
        '(README "KServe\'s CRD schema"), then delete this cache and create it again'
    )
