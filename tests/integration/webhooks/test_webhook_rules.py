"""Issue 21's webhook rules through the real apiserver (it calls our server over TLS):
- a cache whose name cannot be a label value is refused on create, for both kinds, while an
  existing one stays updatable and deletable (its finalizer can be removed);
- an InferenceService whose predictor can only run on the second node group's nodes gets
  that group's claim; when no group has such a node, KServe's choice and a warning;
- an existing long-named cache gives a warning naming it, not an invalid label.
"""

from __future__ import annotations

import json
from typing import Any

from localcache.api import groupversion, modelcache
from localcache.api import inferenceservice as isvc_api
from localcache.caching import names
from localcache.runtime import kube
from localcache.runtime.keys import ObjectKey
from tests.integration.webhooks.harness import DOWNLOADED, ISVC, LMC, LMNC, LMNG, Harness, isvc_obj

Obj = dict[str, Any]
DENIED = "denied the request: "


def too_long(name: str) -> str:
    return (
        f"{DENIED}metadata.name: {name} is {len(name)} characters; a cache's name is written "
        "into the label internal.serving.kserve.io/localmodel of every InferenceService it "
        "serves and must be at most 63 characters"
    )


async def test_a_name_over_63_characters_is_refused_for_both_kinds(harness: Harness) -> None:
    await harness.node_group()
    long_name = harness.name("m" * 63)
    assert len(long_name) == 70
    async with harness.validating():
        done = await harness.kubectl_create(harness.cache_obj(long_name, "gs://b/m"))
        assert done.returncode != 0
        assert too_long(long_name) in done.stderr
        namespaced = harness.cache_obj(long_name, "gs://b/m", namespaced=True)
        done = await harness.kubectl_create(namespaced, harness.namespace)
        assert done.returncode != 0
        assert too_long(long_name) in done.stderr
        fine = harness.cache_obj("m" * 63, "gs://b/m", namespaced=True)
        done = await harness.kubectl_create(fine, harness.namespace)
        assert done.returncode == 0, done.stderr


async def test_an_existing_long_named_cache_stays_updatable_and_deletable(
    harness: Harness,
) -> None:
    """Created before the rule (directly, no webhook asked), with the controllers' finalizer:
    label edits, the delete and the finalizer's removal all pass the validating webhook."""
    await harness.node_group()
    long_name = harness.name("m" * 63)
    cases = [(LMC, None, modelcache.FINALIZER), (LMNC, harness.namespace, None)]
    for res, namespace, finalizer in cases:
        body = harness.cache_obj(long_name, "gs://b/m", namespaced=namespace is not None)
        body["metadata"]["finalizers"] = [finalizer or modelcache.NAMESPACE_CACHE_FINALIZER]
        await harness.client.create(res, body, namespace=namespace)
    async with harness.validating():
        for res, namespace, _ in cases:
            where = ["-n", namespace] if namespace else []
            kind = res.plural + "." + groupversion.GROUP
            labelled = await harness.kubectl("label", *where, kind, long_name, "team=ml")
            assert labelled.returncode == 0, labelled.stderr
            deleted = await harness.kubectl("delete", *where, kind, long_name, "--wait=false")
            assert deleted.returncode == 0, deleted.stderr
            patch = json.dumps({"metadata": {"finalizers": None}})
            released = await harness.kubectl(
                "patch", *where, kind, long_name, "--type=merge", "-p", patch
            )
            assert released.returncode == 0, released.stderr
            gone = await harness.kubectl("get", *where, kind, long_name, "--ignore-not-found")
            assert gone.returncode == 0
            assert gone.stdout.strip() == ""


def _group(harness: Harness, base: str) -> Obj:
    """A node group selecting the nodes labelled localcache.test/pool=<base>-<token>."""
    return {
        "apiVersion": groupversion.LOCAL_MODEL_NODE_GROUP.api_version,
        "kind": groupversion.LOCAL_MODEL_NODE_GROUP.kind,
        "metadata": {"name": harness.name(base)},
        "spec": {
            "storageLimit": "10Gi",
            "persistentVolumeSpec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "local": {"path": "/models"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "localcache.test/pool",
                                        "operator": "In",
                                        "values": [harness.name(base)],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
            "persistentVolumeClaimSpec": {"accessModes": ["ReadWriteOnce"]},
        },
    }


async def _two_groups_with_a_node_each(harness: Harness) -> tuple[str, str]:
    made = []
    for base, gpu in (("a100", "a100"), ("h100", "h100")):
        group = _group(harness, base)
        await harness.client.create(LMNG, group)
        harness.cluster_objects.append((LMNG, group["metadata"]["name"]))
        await harness.seen(harness.hooks.node_groups, ObjectKey("", harness.name(base)))
        node_name = harness.name(f"node-{base}")
        labels = {"localcache.test/pool": harness.name(base), "localcache.test/gpu": gpu}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node_name, "labels": labels},
        }
        await harness.client.create(kube.NODES, body)
        harness.cluster_objects.append((kube.NODES, node_name))
        await harness.seen(harness.hooks.nodes, ObjectKey("", node_name))
        made.append(harness.name(base))
    return made[0], made[1]


def _with_predictor(obj: Obj, **fields: Any) -> Obj:
    obj["spec"]["predictor"].update(fields)
    return obj


async def test_a_predictor_for_the_second_groups_nodes_gets_that_groups_claim(
    harness: Harness,
) -> None:
    first, second = await _two_groups_with_a_node_each(harness)
    cache = harness.name("llm")
    await harness.cache(cache, "gs://bucket/llm", groups=[first, second], status=DOWNLOADED)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "localcache.test/gpu", "operator": "NotIn", "values": ["a100"]}
                        ]
                    }
                ]
            }
        }
    }
    by_selector = _with_predictor(
        isvc_obj("by-selector", "gs://bucket/llm"), nodeSelector={"localcache.test/gpu": "h100"}
    )
    by_affinity = _with_predictor(isvc_obj("by-affinity", "gs://bucket/llm"), affinity=affinity)
    plain = isvc_obj("plain", "gs://bucket/llm")
    async with harness.mutating():
        for obj in (by_selector, by_affinity, plain):
            done = await harness.kubectl_create(obj, harness.namespace)
            assert done.returncode == 0, done.stderr
            assert "Warning" not in done.stderr
        claims = {}
        for name in ("by-selector", "by-affinity", "plain"):
            stored = await harness.get(ISVC, name, harness.namespace)
            claims[name] = stored["metadata"]["annotations"][
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION
            ]
    assert claims == {
        "by-selector": names.serving_pvc(cache, second),
        "by-affinity": names.serving_pvc(cache, second),
        "plain": names.serving_pvc(cache, first),  # no constraint: KServe's choice
    }


async def test_when_no_group_fits_the_first_is_kept_with_a_warning(harness: Harness) -> None:
    first, second = await _two_groups_with_a_node_each(harness)
    cache = harness.name("llm")
    await harness.cache(cache, "gs://bucket/llm", groups=[first, second], status=DOWNLOADED)
    nowhere = _with_predictor(
        isvc_obj("nowhere", "gs://bucket/llm"), nodeSelector={"localcache.test/gpu": "b200"}
    )
    async with harness.mutating():
        done = await harness.kubectl_create(nowhere, harness.namespace)
        assert done.returncode == 0, done.stderr
        assert (
            f"Warning: LocalModelCache {cache}: no node of node groups {first}, {second} "
            "matches both the group and the predictor's nodeSelector localcache.test/gpu=b200; "
            f"keeping its first node group {first}, as KServe would"
        ) in " ".join(done.stderr.split())
        stored = await harness.get(ISVC, "nowhere", harness.namespace)
    annotations = stored["metadata"]["annotations"]
    assert annotations[isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION] == names.serving_pvc(cache, first)


async def test_an_existing_long_named_cache_gives_a_warning_not_an_invalid_label(
    harness: Harness,
) -> None:
    await harness.node_group()
    long_name = harness.name("m" * 63)
    await harness.cache(long_name, "gs://bucket/model", status=DOWNLOADED)
    async with harness.mutating():
        done = await harness.kubectl_create(
            isvc_obj("iris", "gs://bucket/model"), harness.namespace
        )
        assert done.returncode == 0, done.stderr
        assert f"Warning: LocalModelCache {long_name} serves gs://bucket/model but is not used" in (
            done.stderr
        )
        stored = await harness.get(ISVC, "iris", harness.namespace)
    assert isvc_api.LOCAL_MODEL_LABEL not in (stored["metadata"].get("labels") or {})
