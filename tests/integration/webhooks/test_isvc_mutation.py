"""InferenceService mutation through the real apiserver: it calls our server over TLS.

The webhook configurations are the shipped ones (manifests/webhook/), rewritten to call the
test server by URL and scoped so they never touch other tests: namespaced rules by a
namespaceSelector on this test's namespaces, the cluster-scoped LocalModelCache rule by an
objectSelector on a label only this test's caches carry. Each configuration has a unique name
and is deleted when its test ends; cluster-scoped objects are deleted after that.

`Harness` (and the `harness` fixture) is shared with test_cache_validation.py.
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

import pytest
import yaml

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.runtime import admission, errors, informer, kube, manager, metrics
from localcache.runtime.keys import ObjectKey
from localcache.runtime.testing import webhooks as wh
from localcache.runtime.testing.controlplane import ControlPlane
from localcache.runtime.testing.waiting import wait_until
from localcache.webhooks import isvc, validation
from localcache.webhooks import setup as webhook_setup

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests" / "webhook"
SCOPE_LABEL = "localcache.test/webhook-scope"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

LMC = groupversion.LOCAL_MODEL_CACHE.api
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP.api
ISVC = groupversion.INFERENCE_SERVICE.api
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
    async def mutating(self) -> AsyncIterator[None]:
        async with wh.installed(self.plane, self.configuration("mutating")):
            probe = self._probe(ISVC, isvc_obj("probe", "gs://probe/model"), self.namespace)
            await wh.wait_until_called(self.server, isvc.MUTATE_PATH, probe)
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
        inf: informer.Informer,
        key: ObjectKey,
        pred: Callable[[Obj], bool] = lambda _: True,
    ) -> None:
        def holds() -> bool:
            obj = inf.store.get(key)
            return obj is not None and pred(obj)

        await wait_until(holds, timeout=15, what=f"the webhooks' {inf.name} informer holds {key}")

    async def gone(self, inf: informer.Informer, key: ObjectKey) -> None:
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


async def _stop(mgr: manager.Manager, task: asyncio.Task[int]) -> None:
    mgr.stop()
    assert await task == 0


@pytest.fixture
async def harness(
    control_plane: ControlPlane, crds: list[str], namespace: str
) -> AsyncIterator[Harness]:
    token = uuid.uuid4().hex[:6]
    second = f"{namespace[:50]}-b"
    await asyncio.to_thread(control_plane.create_namespace, second)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(asyncio.to_thread, control_plane.delete_namespace, second)
        client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
        stack.push_async_callback(client.close)
        adm = admission.AdmissionServer(metrics=metrics.Metrics())
        mgr = manager.Manager(handle_signals=False, shutdown_timeout=5)
        hooks = webhook_setup.setup(adm, mgr, client=client, local_model_enabled=lambda: True)
        task = asyncio.create_task(mgr.run(), name=f"webhook manager {token}")
        stack.push_async_callback(_stop, mgr, task)
        await wait_until(mgr.started.is_set, timeout=30, what="the webhook informers synced")
        assert hooks.synced()
        server = await stack.enter_async_context(wh.run_webhook_server(adm))
        env = Harness(control_plane, client, hooks, server, token, [namespace, second])
        stack.push_async_callback(env.cleanup)
        yield env


def local_model_metadata(obj: Obj) -> tuple[dict[str, str], dict[str, str]]:
    meta = obj.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k in isvc.LABEL_KEYS}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k in isvc.ANNOTATION_KEYS
    }
    return labels, annotations


# ------------------------------------------------------------------------------ tests


async def test_a_namespace_cache_wins_in_its_namespace_and_the_cluster_cache_elsewhere(
    harness: Harness,
) -> None:
    group = await harness.node_group()
    ns, other = harness.namespaces
    cluster_name = harness.name("shared")
    await harness.cache(cluster_name, "gs://bucket/model", status=DOWNLOADED)
    await harness.cache("ns-model", "gs://bucket/model", namespace=ns, status=DOWNLOADED)
    async with harness.mutating():
        for where in (ns, other):
            done = await harness.kubectl_create(isvc_obj("iris", "gs://bucket/model/v1"), where)
            assert done.returncode == 0, done.stderr
            assert "Warning" not in done.stderr
        own = local_model_metadata(await harness.get(ISVC, "iris", ns))
        assert own == (
            {isvc_api.LOCAL_MODEL_LABEL: "ns-model", isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: ns},
            {
                isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: "gs://bucket/model",
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: f"ns-model-{group}",
            },
        )
        elsewhere = local_model_metadata(await harness.get(ISVC, "iris", other))
        assert elsewhere == (
            {isvc_api.LOCAL_MODEL_LABEL: cluster_name},
            {
                isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: "gs://bucket/model",
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: f"{cluster_name}-{group}",
            },
        )


async def test_a_deeper_sub_path_picks_the_longest_matching_cache(harness: Harness) -> None:
    await harness.node_group()
    broad, deep = harness.name("a-broad"), harness.name("z-deep")
    await harness.cache(broad, "gs://bucket/llm", status=DOWNLOADED)
    await harness.cache(deep, "gs://bucket/llm/7b", status=DOWNLOADED)
    async with harness.mutating():
        for name, uri in (("deep", "gs://bucket/llm/7b/q4"), ("broad", "gs://bucket/llm/13b")):
            done = await harness.kubectl_create(isvc_obj(name, uri), harness.namespace)
            assert done.returncode == 0, done.stderr
        deep_labels, _ = local_model_metadata(await harness.get(ISVC, "deep", harness.namespace))
        broad_labels, _ = local_model_metadata(await harness.get(ISVC, "broad", harness.namespace))
    assert deep_labels == {isvc_api.LOCAL_MODEL_LABEL: deep}
    assert broad_labels == {isvc_api.LOCAL_MODEL_LABEL: broad}


async def test_an_unknown_node_group_gets_no_labels(harness: Harness) -> None:
    group = await harness.node_group()
    await harness.cache(harness.name("m"), "gs://bucket/model", status=DOWNLOADED)
    pinned = isvc_obj(
        "pinned", "gs://bucket/model", annotations={isvc_api.NODE_GROUP_ANNOTATION: "nope"}
    )
    async with harness.mutating():
        done = await harness.kubectl_create(pinned, harness.namespace)
        assert done.returncode == 0, done.stderr
        assert "is on node group nope: not using a local model cache" in done.stderr
        stored = await harness.get(ISVC, "pinned", harness.namespace)
    assert local_model_metadata(stored) == ({}, {})
    assert group not in json.dumps(stored["metadata"])


async def test_removing_the_storage_uri_removes_the_labels(harness: Harness) -> None:
    await harness.node_group()
    await harness.cache(harness.name("m"), "gs://bucket/model", status=DOWNLOADED)
    async with harness.mutating():
        done = await harness.kubectl_create(
            isvc_obj("iris", "gs://bucket/model"), harness.namespace
        )
        assert done.returncode == 0, done.stderr
        before = await harness.get(ISVC, "iris", harness.namespace)
        assert local_model_metadata(before)[0] == {isvc_api.LOCAL_MODEL_LABEL: harness.name("m")}
        patch = {"spec": {"predictor": {"model": {"storageUri": None}}}}
        patched = await harness.kubectl(
            "patch", "-n", harness.namespace, "inferenceservices.serving.kserve.io", "iris",
            "--type=merge", "-p", json.dumps(patch),
        )  # fmt: skip
        assert patched.returncode == 0, patched.stderr
        after = await harness.get(ISVC, "iris", harness.namespace)
    assert "storageUri" not in after["spec"]["predictor"]["model"]
    assert local_model_metadata(after) == ({}, {})


async def test_the_disable_annotation_leaves_the_isvc_untouched(harness: Harness) -> None:
    await harness.node_group()
    await harness.cache(harness.name("m"), "gs://bucket/model", status=DOWNLOADED)
    opted_out = isvc_obj(
        "opted-out", "gs://bucket/model",
        annotations={isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: "true"},
    )  # fmt: skip
    async with harness.mutating():
        calls = harness.server.calls(isvc.MUTATE_PATH)
        done = await harness.kubectl_create(opted_out, harness.namespace)
        assert done.returncode == 0, done.stderr
        assert harness.server.calls(isvc.MUTATE_PATH) > calls  # asked, and it said "no change"
        stored = await harness.get(ISVC, "opted-out", harness.namespace)
    assert stored["metadata"].get("labels") is None
    assert stored["metadata"]["annotations"] == {isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: "true"}


async def test_a_warning_is_printed_while_no_copy_is_downloaded(harness: Harness) -> None:
    await harness.node_group()
    name = harness.name("fresh")
    await harness.cache(name, "gs://bucket/model")
    async with harness.mutating():
        early = await harness.kubectl_create(
            isvc_obj("early", "gs://bucket/model"), harness.namespace
        )
        assert early.returncode == 0, early.stderr
        assert f"Warning: LocalModelCache {name} has no downloaded copy of the model yet" in (
            early.stderr
        )
        stored = await harness.get(ISVC, "early", harness.namespace)
        assert local_model_metadata(stored)[0] == {isvc_api.LOCAL_MODEL_LABEL: name}
        await harness.client.patch_status(LMC, name, {"status": DOWNLOADED})
        await harness.seen(harness.hooks.caches, ObjectKey("", name), lambda o: "status" in o)
        late = await harness.kubectl_create(
            isvc_obj("late", "gs://bucket/model"), harness.namespace
        )
        assert late.returncode == 0, late.stderr
        assert "Warning" not in late.stderr


async def test_with_the_server_stopped_isvcs_are_still_admitted(harness: Harness) -> None:
    await harness.node_group()
    await harness.cache(harness.name("m"), "gs://bucket/model", status=DOWNLOADED)
    async with harness.mutating():
        await harness.server.stop()
        done = await harness.kubectl_create(
            isvc_obj("iris", "gs://bucket/model"), harness.namespace
        )
        assert done.returncode == 0, done.stderr
        stored = await harness.get(ISVC, "iris", harness.namespace)
    assert local_model_metadata(stored) == ({}, {})
