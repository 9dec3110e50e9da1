"""Shared by the deploy tests: the kustomize builds of manifests/ and the names in them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from localcache.devenv.controlplane import ControlPlane

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
NS, JOBS_NS = "kserve", "kserve-localmodel-jobs"
CONTROLLER, AGENT = "kserve-localmodel-controller-manager", "kserve-localmodelnode-agent"
CONFIGMAP = "inferenceservice-config"
Doc = dict[str, Any]


def build(control_plane: ControlPlane, overlay: str) -> list[Doc]:
    """`kubectl kustomize manifests/<overlay>`, as documents."""
    out = control_plane.kubectl("kustomize", str(MANIFESTS / overlay)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    """The single document of `kind` named `name`."""
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found
