"""InferenceService mutation through the real apiserver: it calls our server over TLS.

The webhook configurations are the shipped ones (manifests/webhook/), scoped to each test by
the `harness` fixture (harness.py, conftest.py).
"""

from __future__ import annotations

import json

from localcache.api import inferenceservice as isvc_api
from localcache.caching import names
from localcache.runtime.keys import ObjectKey
from localcache.webhooks import isvc
from tests.integration.webhooks.harness import DOWNLOADED, ISVC, LMC, Harness, Obj, isvc_obj


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
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: names.serving_pvc("ns-model", group),
            },
        )
        elsewhere = local_model_metadata(await harness.get(ISVC, "iris", other))
        assert elsewhere == (
            {isvc_api.LOCAL_MODEL_LABEL: cluster_name},
            {
                isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: "gs://bucket/model",
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: names.serving_pvc(cluster_name, group),
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
