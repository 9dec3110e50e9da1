"""The webhook harness of the integration tests: a running webhook server (built by
`webhooks.setup.setup`) and the shipped webhook configurations, rewritten to call it by URL
and scoped so they never touch other tests: namespaced rules by a namespaceSelector on the
test's namespaces, the cluster-scoped LocalModelCache rule by an objectSelector on a label
only the test's caches carry. Each configuration has a unique name and is deleted when its
test ends; cluster-scoped objects are deleted after that. The `harness` fixture is in
conftest.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from localcache.api import groupversion
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, informer, kube
from localcache.runtime.crds import optional
from localcache.runtime.keys import ObjectKey
from localcache.webhooks import isvc, llmisvc, validation
from localcache.webhooks import setup as webhook_setup
from tests.support import webhooks as wh

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests" / "webhook"
SCOPE_LABEL = "localcache.test/webhook-scope"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

LMC = groupversion.LOCAL_MODEL_CACHE.api
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP.api
ISVC = groupversion.INFERENCE_SERVICE.api
LLMISVC = groupversion.LLM_INFERENCE_SERVICE.api
LLMISVC_CONFIG = groupversion.LLM_INFERENCE_SERVICE_CONFIG.api
DOWNLOADED = {"copies": {"available": 1, "total": 1}, "nodeStatus": {"node-1": "NodeDownloaded"}}

Obj = dict[str, Any]


@dataclass
class Harness:
    """A running webhook server (built by `webhooks.setup.setup`) and helpers to drive it."""

    plane: ControlPlane
    client: kube.Kube
    hooks: webhook_setup.Webhooks
    server: wh.WebhookServer
    token: str
    namespaces: list[str]
    cluster_objects: list[tuple[kube.Resource, str]] = field(default_factory=list)
    switches: dict[str, bool] = field(default_factory=dict)
    """Live settings the handlers read at each request (e.g. `servingPodsWaitForCopy`)."""

    @property
    def namespace(self) -> str:
        return self.namespaces[0]

    @property
    def scope(self) -> dict[str, str]:
        return {SCOPE_LABEL: self.token}

    def name(self, base: str) -> str:
        """A cluster-unique name for a cluster-scoped object of this test."""
        return f"{base}-{self.token}"

    # ------------------------------------------------------------ configurations

    def configuration(self, kind: Literal["mutating", "validating"]) -> Obj:
        """The shipped configuration, calling the test server and scoped to this test."""
        doc: Obj = yaml.safe_load((MANIFESTS / f"{kind}.yaml").read_text())
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": self.server.url(path),
                "caBundle": base64.b64encode(self.server.ca_pem).decode(),
            }
            hook["name"] = f"t{self.token}.{hook['name']}"
            if hook["rules"][0]["scope"] == "Cluster":
                hook["objectSelector"] = {"matchLabels": self.scope}
            else:
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": self.namespaces}
                    ]
                }
        doc["metadata"] = {"name": f"t{self.token}-{doc['metadata']['name']}"}
        return doc

    @contextlib.asynccontextmanager
    async def mutating(self, *, llm: bool = False) -> AsyncIterator[None]:
        """The shipped mutating configuration, in effect; with `llm`, for LLMInferenceServices
        too (their CRD must be installed)."""
        async with wh.installed(self.plane, self.configuration("mutating")):
            probe = self._probe(ISVC, isvc_obj("probe", "gs://probe/model"), self.namespace)
            await wh.wait_until_called(self.server, isvc.MUTATE_PATH, probe)
            if llm:
                llm_obj = llmisvc_obj("probe", "hf://probe/m")
                llm_probe = self._probe(LLMISVC, llm_obj, self.namespace)
                await wh.wait_until_called(self.server, llmisvc.MUTATE_PATH, llm_probe)
            yield

    @contextlib.asynccontextmanager
    async def validating(self) -> AsyncIterator[None]:
        async with wh.installed(self.plane, self.configuration("validating")):
            probe = self._probe(LMC, self.cache_obj("probe", "gs://probe/model"), None)
            await wh.wait_until_called(self.server, validation.CACHE_PATH, probe)
            ns_probe = self._probe(
                LMNC, self.cache_obj("probe", "gs://probe/model", namespaced=True), self.namespace
            )
            await wh.wait_until_called(self.server, validation.NAMESPACE_CACHE_PATH, ns_probe)
            yield

    def _probe(self, res: kube.Resource, obj: Obj, namespace: str | None) -> Callable[[], Any]:
        async def probe() -> wh.ApiAnswer:
            body = copy.deepcopy(obj)
            body["metadata"]["name"] = f"probe-{uuid.uuid4().hex[:8]}"
            return await wh.api_request(
                self.plane, "POST", res.path(namespace=namespace), body, dry_run=True
            )

        return probe

    # ------------------------------------------------------------ objects

    async def kubectl(
        self, *args: str, stdin: Obj | None = None
    ) -> subprocess.CompletedProcess[str]:
        text = json.dumps(stdin) if stdin is not None else None
        return await asyncio.to_thread(self.plane.kubectl, *args, check=False, input_text=text)

    async def kubectl_create(
        self, obj: Obj, namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        where = ["-n", namespace] if namespace else []
        return await self.kubectl("create", *where, "-f", "-", stdin=obj)

    def cache_obj(
        self,
        name: str,
        uri: str,
        *,
        groups: list[str] | None = None,
        size: str = "1Gi",
        namespaced: bool = False,
    ) -> Obj:
        info = (
            groupversion.LOCAL_MODEL_NAMESPACE_CACHE
            if namespaced
            else groupversion.LOCAL_MODEL_CACHE
        )
        return {
            "apiVersion": info.api_version,
            "kind": info.kind,
            "metadata": {"name": name, "labels": dict(self.scope)},
            "spec": {
                "sourceModelUri": uri,
                "modelSize": size,
                "nodeGroups": groups if groups is not None else [self.name("gpu")],
            },
        }

    async def node_group(self, base: str = "gpu", *, limit: str = "10Gi") -> str:
        name = self.name(base)
        body = {
            "apiVersion": groupversion.LOCAL_MODEL_NODE_GROUP.api_version,
            "kind": groupversion.LOCAL_MODEL_NODE_GROUP.kind,
            "metadata": {"name": name},
            "spec": {
                "storageLimit": limit,
                "persistentVolumeSpec": {
                    "capacity": {"storage": limit},
                    "accessModes": ["ReadWriteOnce"],
                    "local": {"path": "/models"},
                },
                "persistentVolumeClaimSpec": {"accessModes": ["ReadWriteOnce"]},
            },
        }
        await self.client.create(LMNG, body)
        self.cluster_objects.append((LMNG, name))
        await self.seen(self.hooks.node_groups, ObjectKey("", name))
        return name

    async def cache(
        self,
        name: str,
        uri: str,
        *,
        namespace: str | None = None,
        status: Obj | None = None,
        **kw: Any,
    ) -> Obj:
        """Create a cache (directly: no validating webhook is asked) and wait until the
        webhooks' informer holds it, with `status` when given."""
        res = LMNC if namespace else LMC
        body = self.cache_obj(name, uri, namespaced=namespace is not None, **kw)
        created = await self.client.create(res, body, namespace=namespace)
        if status is not None:
            await self.client.patch_status(res, name, {"status": status}, namespace=namespace)
        inf = self.hooks.namespace_caches if namespace else self.hooks.caches
        await self.seen(
            inf, ObjectKey(namespace or "", name), lambda o: bool(o.get("status")) == bool(status)
        )
        return created

    async def seen(
        self,
        inf: informer.Informer | optional.OptionalInformer,
        key: ObjectKey,
        pred: Callable[[Obj], bool] = lambda _: True,
    ) -> None:
        def holds() -> bool:
            obj = inf.store.get(key)
            return obj is not None and pred(obj)

        await wait_until(holds, timeout=15, what=f"the webhooks' {inf.name} informer holds {key}")

    async def gone(
        self, inf: informer.Informer | optional.OptionalInformer, key: ObjectKey
    ) -> None:
        await wait_until(
            lambda: inf.store.get(key) is None,
            timeout=15,
            what=f"the webhooks' {inf.name} informer drops {key}",
        )

    async def get(self, res: kube.Resource, name: str, namespace: str | None = None) -> Obj:
        return await self.client.get(res, name, namespace=namespace)

    async def cleanup(self) -> None:
        """Delete this test's cluster-scoped objects (its caches carry the scope label)."""
        labelled = await self.client.list(LMC, label_selector=f"{SCOPE_LABEL}={self.token}")
        names = [(LMC, o["metadata"]["name"]) for o in labelled.items]
        for res, name in [*names, *reversed(self.cluster_objects)]:
            with contextlib.suppress(errors.NotFound):
                await self.client.delete(res, name)


def isvc_obj(name: str, uri: str | None, *, annotations: dict[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    model: Obj = {"modelFormat": {"name": "sklearn"}}
    if uri is not None:
        model["storageUri"] = uri
    return {
        "apiVersion": groupversion.INFERENCE_SERVICE.api_version,
        "kind": groupversion.INFERENCE_SERVICE.kind,
        "metadata": meta,
        "spec": {"predictor": {"model": model}},
    }


def llmisvc_obj(
    name: str,
    uri: str | None,
    *,
    version: str = groupversion.LLM_INFERENCE_SERVICE.version,
    annotations: dict[str, str] | None = None,
    spec: Obj | None = None,
) -> Obj:
    meta: Obj = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    body: Obj = dict(spec or {})
    if uri is not None:
        body["model"] = {**body.get("model", {}), "uri": uri}
    return {
        "apiVersion": f"{groupversion.GROUP}/{version}",
        "kind": groupversion.LLM_INFERENCE_SERVICE.kind,
        "metadata": meta,
        "spec": body,
    }
