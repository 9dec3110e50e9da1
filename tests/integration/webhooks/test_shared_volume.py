"""Shared-volume namespace caches (issue 22) at admission, through the real apiserver and the
real webhook server: serving objects are routed to `pvc://<pvcRef>/models/<key><subPath>` only
once the cache is Ready (its status set by a status patch, as the controller sets it), and the
validation rules. With localcache's CRD the apiserver's CEL rules refuse a wrong storage mode
before any webhook is called; the webhook's own answer to those (what a CRD without CEL
relies on) is checked by posting AdmissionReviews to the same server."""

from __future__ import annotations

import ssl
import uuid
from typing import Any

import aiohttp

from localcache.api import inferenceservice as isvc_api
from localcache.api import llminferenceservice as llm_api
from localcache.caching import keys
from localcache.runtime.keys import ObjectKey
from localcache.webhooks import validation
from tests.integration.webhooks.harness import (
    DOWNLOADED,
    ISVC,
    LLMISVC,
    LMNC,
    Harness,
    Obj,
    isvc_obj,
    llmisvc_obj,
)
from tests.support import webhooks as wh

SHARED = "localcache.kserve.io/shared-volume-cache"  # the contract: spelled out
SOURCE = isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION
DENIED = "denied the request: "
KEY = keys.storage_key("gs://bucket/model")


def shared_obj(harness: Harness, name: str, uri: str, claim: str = "models-rwx") -> Obj:
    body = harness.cache_obj(name, uri, namespaced=True)
    del body["spec"]["nodeGroups"]
    body["spec"]["pvcRef"] = claim
    return body


async def shared_cache(harness: Harness, name: str, uri: str, claim: str = "models-rwx") -> None:
    """Create a shared-volume cache directly (no validating webhook installed yet)."""
    ns = harness.namespace
    await harness.client.create(LMNC, shared_obj(harness, name, uri, claim), namespace=ns)
    await harness.seen(harness.hooks.namespace_caches, ObjectKey(ns, name))


async def set_ready(
    harness: Harness, name: str, status: str, reason: str, message: str = ""
) -> None:
    """Write the Ready condition as the controller does (status subresource), for the cache's
    current generation, and wait until the webhooks' informer holds it."""
    ns = harness.namespace
    current = await harness.get(LMNC, name, ns)
    condition = {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": current["metadata"]["generation"],
        "lastTransitionTime": "2026-12-05T00:00:00Z",
    }
    copies = {"total": 1, "available": 1 if status == "True" else 0}
    body = {"status": {"conditions": [condition], "copies": copies}}
    await harness.client.patch_status(LMNC, name, body, namespace=ns)

    def holds(obj: Obj) -> bool:
        conditions = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("status") == status and c.get("reason") == reason for c in conditions)

    await harness.seen(harness.hooks.namespace_caches, ObjectKey(ns, name), holds)


async def create(harness: Harness, res: Any, obj: Obj) -> wh.ApiAnswer:
    answer = await wh.api_request(harness.plane, "POST", res.path(namespace=harness.namespace), obj)
    assert answer.status == 201, answer.body
    return answer


def storage_uri(obj: Obj) -> str:
    return str(obj["spec"]["predictor"]["model"]["storageUri"])


def local_keys(obj: Obj) -> tuple[dict[str, str], dict[str, str]]:
    meta = obj.get("metadata") or {}
    labels = {
        k: v for k, v in (meta.get("labels") or {}).items() if k.startswith("internal.serving")
    }
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith(("internal.serving", "localcache.kserve.io"))
    }
    return labels, annotations


# ------------------------------------------------------------------------------ routing


async def test_an_isvc_before_ready_keeps_its_uri_with_a_warning_and_after_ready_is_routed(
    harness: Harness,
) -> None:
    ns = harness.namespace
    await shared_cache(harness, "shared", "gs://bucket/model")
    async with harness.mutating():
        early = await create(harness, ISVC, isvc_obj("early", "gs://bucket/model/v1"))
        assert any(
            f"LocalModelNamespaceCache {ns}/shared (claim models-rwx) is not Ready "
            "(no status yet)" in w
            for w in early.warnings
        ), early.warnings
        await set_ready(harness, "shared", "False", "ImportRunning", "the import Job is running")
        running = await create(harness, ISVC, isvc_obj("running", "gs://bucket/model/v1"))
        assert any(
            "Ready is False (ImportRunning: the import Job is running)" in w
            for w in running.warnings
        ), running.warnings
        await set_ready(harness, "shared", "True", "ImportSucceeded")
        late = await create(harness, ISVC, isvc_obj("late", "gs://bucket/model/v1"))
        assert late.warnings == ()
        for name in ("early", "running"):
            stored = await harness.get(ISVC, name, ns)
            assert storage_uri(stored) == "gs://bucket/model/v1"
            assert local_keys(stored) == ({}, {})
        routed = await harness.get(ISVC, "late", ns)
        assert storage_uri(routed) == f"pvc://models-rwx/models/{KEY}/v1"
        assert local_keys(routed) == ({}, {SOURCE: "gs://bucket/model/v1", SHARED: "shared"})
        # re-admission (an update) leaves a routed object alone
        routed["metadata"].setdefault("labels", {})["team"] = "a"
        await harness.client.replace(ISVC, routed, namespace=ns)
        again = await harness.get(ISVC, "late", ns)
        assert storage_uri(again) == f"pvc://models-rwx/models/{KEY}/v1"
        assert local_keys(again) == local_keys(routed)


async def test_a_not_ready_shared_cache_counts_as_absent_and_a_ready_one_beats_the_cluster_cache(
    harness: Harness,
) -> None:
    await harness.node_group()
    cluster = harness.name("global")
    await harness.cache(cluster, "gs://bucket/model", status=DOWNLOADED)
    await shared_cache(harness, "shared", "gs://bucket/model")
    async with harness.mutating():
        before = await create(harness, ISVC, isvc_obj("before", "gs://bucket/model"))
        assert any("is not Ready (no status yet)" in w for w in before.warnings)
        stored = await harness.get(ISVC, "before", harness.namespace)
        assert storage_uri(stored) == "gs://bucket/model"
        assert local_keys(stored)[0] == {isvc_api.LOCAL_MODEL_LABEL: cluster}
        await set_ready(harness, "shared", "True", "ImportSucceeded")
        after = await create(harness, ISVC, isvc_obj("after", "gs://bucket/model"))
        assert after.warnings == ()
        stored = await harness.get(ISVC, "after", harness.namespace)
        assert storage_uri(stored) == f"pvc://models-rwx/models/{KEY}"
        assert local_keys(stored) == ({}, {SOURCE: "gs://bucket/model", SHARED: "shared"})


async def test_an_llmisvc_base_model_and_lora_adapter_are_routed_only_after_ready(
    harness: Harness,
) -> None:
    ns = harness.namespace
    await shared_cache(harness, "base", "hf://org/llama")
    await shared_cache(harness, "lora", "hf://org/adapter", claim="loras")
    adapters = [{"name": "a", "uri": "hf://org/adapter/v2"}, {"name": "b", "uri": "hf://x/y"}]
    spec = {"model": {"lora": {"adapters": adapters}}}
    async with harness.mutating(llm=True):
        early = await create(harness, LLMISVC, llmisvc_obj("early", "hf://org/llama", spec=spec))
        assert any(f"{ns}/base (claim models-rwx) is not Ready" in w for w in early.warnings)
        assert any(
            w.startswith("LoRA adapter a: ") and f"{ns}/lora" in w for w in early.warnings
        ), early.warnings
        for name in ("base", "lora"):
            await set_ready(harness, name, "True", "ImportSucceeded")
        late = await create(harness, LLMISVC, llmisvc_obj("late", "hf://org/llama", spec=spec))
        assert late.warnings == ()
        kept = await harness.get(LLMISVC, "early", ns)
        assert kept["spec"]["model"]["uri"] == "hf://org/llama"
        assert kept["spec"]["model"]["lora"]["adapters"] == adapters
        routed = await harness.get(LLMISVC, "late", ns)
    model = routed["spec"]["model"]
    assert model["uri"] == f"pvc://models-rwx/models/{keys.storage_key('hf://org/llama')}"
    assert model["lora"]["adapters"] == [
        {"name": "a", "uri": f"pvc://loras/models/{keys.storage_key('hf://org/adapter')}/v2"},
        {"name": "b", "uri": "hf://x/y"},
    ]
    labels, annotations = local_keys(routed)
    assert labels == {}
    assert annotations == {SOURCE: "hf://org/llama", SHARED: "base,lora"}
    assert llm_api.LOCAL_MODEL_LORA_ANNOTATION not in annotations


# ------------------------------------------------------------------------------ validation


async def test_a_destination_conflict_is_denied_on_create_only(harness: Harness) -> None:
    ns = harness.namespace
    await shared_cache(harness, "first", "gs://bucket/model")
    await shared_cache(harness, "second", "gs://bucket/model")  # before the webhook: a pair
    async with harness.validating():
        third = await harness.kubectl_create(shared_obj(harness, "third", "gs://bucket/model"), ns)
        assert third.returncode != 0
        assert (
            f"{DENIED}spec.pvcRef: LocalModelNamespaceCache {ns}/first already imports "
            "gs://bucket/model onto claim models-rwx"
        ) in third.stderr
        other_claim = shared_obj(harness, "fourth", "gs://bucket/model", claim="elsewhere")
        done = await harness.kubectl_create(other_claim, ns)
        assert done.returncode == 0, done.stderr
        # the pair in conflict stays updatable (KServe's validator refuses this)
        done = await harness.kubectl("label", "-n", ns, "localmodelnamespacecache", "second", "a=b")
        assert done.returncode == 0, done.stderr
        done = await harness.kubectl(
            "patch", "-n", ns, "localmodelnamespacecache", "first", "--type=merge",
            "-p", '{"spec":{"modelSize":"2Gi"}}',
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


async def review_directly(harness: Harness, operation: str, obj: Obj, old: Obj | None) -> Obj:
    """The webhook server's answer to an AdmissionReview posted to it (not via the apiserver:
    with localcache's CRD the apiserver's CEL rules refuse these first)."""
    review_body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "serving.kserve.io", "version": "v1alpha1", "kind": obj["kind"]},
            "resource": {
                "group": "serving.kserve.io",
                "version": "v1alpha1",
                "resource": "localmodelnamespacecaches",
            },
            "namespace": harness.namespace,
            "name": obj["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "tenant"},
            "object": obj,
            "oldObject": old,
        },
    }
    ctx = ssl.create_default_context(cadata=harness.server.ca_pem.decode())
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.post(
            harness.server.url(validation.NAMESPACE_CACHE_PATH), json=review_body, ssl=ctx
        ) as resp,
    ):
        assert resp.status == 200
        answer: Obj = (await resp.json())["response"]
        return answer


async def test_the_webhook_denies_each_storage_mode_rule_naming_the_field(
    harness: Harness,
) -> None:
    good = shared_obj(harness, "m", "gs://bucket/model")
    both = shared_obj(harness, "m", "gs://bucket/model")
    both["spec"]["nodeGroups"] = ["gpu"]
    neither = shared_obj(harness, "m", "gs://bucket/model")
    del neither["spec"]["pvcRef"]
    bad_name = shared_obj(harness, "m", "gs://bucket/model", claim="Models_RWX")
    moved = shared_obj(harness, "m", "gs://bucket/model", claim="other")
    cases = [
        ("CREATE", both, None, "spec.pvcRef", "mutually exclusive"),
        ("CREATE", neither, None, "spec.nodeGroups", "exactly one of spec.nodeGroups"),
        ("CREATE", bad_name, None, "spec.pvcRef", "is not a PersistentVolumeClaim name"),
        ("UPDATE", moved, good, "spec.pvcRef", "spec.pvcRef is immutable"),
        ("UPDATE", neither, good, "spec.nodeGroups", "spec.pvcRef is immutable"),
    ]
    for operation, obj, old, field, text in cases:
        answer = await review_directly(harness, operation, obj, old)
        assert not answer["allowed"], (operation, obj["spec"])
        status = answer["status"]
        assert status["message"].startswith(f"{field}: "), status
        assert text in status["message"], status
        assert status["details"]["causes"][0]["field"] == field
    assert (await review_directly(harness, "CREATE", good, None))["allowed"]
