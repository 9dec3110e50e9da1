"""What the API client speaks: where kinds live (`Resource`), list answers, patch bodies.

`Resource` records name a kind's REST location; the predefined ones cover the core kinds the
runtime and the operator use, and CRDs get theirs from their group/version/plural. These
names are re-exported by `runtime.kube`, which is where callers normally find them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Obj = dict[str, Any]
"""A Kubernetes object as decoded JSON. Objects handed out by stores must not be mutated."""

PatchType = Literal["merge", "json", "strategic", "apply"]
Patch = Obj | list[Obj]
"""A patch body: an object (merge, strategic, apply) or a list of JSON-patch operations."""

PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind lives in the API: group ("" for core), version, plural, kind, scope."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, *, namespace: str | None = None, name: str | None = None, subresource: str = ""
    ) -> str:
        """The REST path; `namespace=None` on a namespaced resource means all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base = f"{base}/namespaces/{namespace}"
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.plural} is cluster-scoped; got namespace {namespace!r}")
        path = f"{base}/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError("empty object name")
            path = f"{path}/{name}"
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return f"{path}/{subresource}" if subresource else path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
EVENTS = Resource("", "v1", "events", "Event")
PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
PERSISTENT_VOLUME_CLAIMS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
JOBS = Resource("batch", "v1", "jobs", "Job")
DAEMON_SETS = Resource("apps", "v1", "daemonsets", "DaemonSet")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
CUSTOM_RESOURCE_DEFINITIONS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)
TOKEN_REVIEWS = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
)


@dataclass(frozen=True, slots=True)
class ObjList:
    """One LIST answer: the items, the list's resourceVersion, and the continue token
    ("" when this was the last page)."""

    items: list[Obj]
    resource_version: str
    continue_token: str = ""
    remaining_item_count: int | None = None
