"""What differs between the two cache kinds: names, keys, owners, InferenceService matching."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import inferenceservice, modelcache
from localcache.caching import indexes, names
from localcache.controllers import clustercache, namespacecache, state, users
from localcache.runtime import store
from localcache.runtime.keys import ObjectKey

SPEC = {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["gpu1", "gpu2"]}


def _cluster() -> modelcache.LocalModelCache:
    return modelcache.LocalModelCache.from_dict(
        {"metadata": {"name": "iris", "uid": "u1"}, "spec": SPEC}
    )


def _namespaced() -> modelcache.LocalModelNamespaceCache:
    return modelcache.LocalModelNamespaceCache.from_dict(
        {"metadata": {"name": "iris", "namespace": "team", "uid": "u2"}, "spec": SPEC}
    )


def _isvc(namespace: str, labels: dict[str, str], **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "svc",
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        }
    }


def test_volume_names_follow_the_spec_for_each_kind() -> None:
    sc, cache = clustercache.SCOPE, _cluster()
    assert sc.download_pv_name(cache, "gpu1") == "iris-gpu1-download"
    assert sc.download_pvc(cache, "gpu1", job_namespace="jobs") == ("jobs", "iris-gpu1")
    assert sc.serving_pv_name(cache, "gpu1", "prod") == "iris-gpu1-prod"
    assert sc.serving_pvc_name(cache, "gpu1") == "iris-gpu1"
    assert sc.pvs_owned
    ns, ncache = namespacecache.SCOPE, _namespaced()
    assert ns.download_pv_name(ncache, "gpu1") == "iris-gpu1-team-download"
    assert ns.download_pvc(ncache, "gpu1", job_namespace="jobs") == ("team", "iris-gpu1-download")
    assert ns.serving_pv_name(ncache, "gpu1", "team") == "iris-gpu1-team"
    assert ns.serving_pvc_name(ncache, "gpu1") == "iris-gpu1"


def _named(kind: type[Any], name: str, namespace: str | None = None) -> Any:
    meta = {"name": name, "uid": "u", **({"namespace": namespace} if namespace else {})}
    return kind.from_dict({"metadata": meta, "spec": SPEC})


def test_volume_names_of_different_caches_and_groups_never_collide() -> None:
    """Issue 14: `a-b`+`c` and `a`+`b-c` were both `a-b-c`; issue 13: cluster cache
    `llama-cpu` on `gpu` and namespace cache `llama` on `cpu` in `gpu` shared a PV name.
    Issue 21: the serving PVC alone is KServe's plain join (LoRA adapters), so its clash is
    reported at plan time (`VolumeNameTaken`); its PV names still differ."""
    sc, ns = clustercache.SCOPE, namespacecache.SCOPE
    ab, a = _named(modelcache.LocalModelCache, "a-b"), _named(modelcache.LocalModelCache, "a")
    assert sc.serving_pvc_name(ab, "c") == sc.serving_pvc_name(a, "b-c") == "a-b-c"
    assert sc.download_pvc(ab, "c", job_namespace="j") != sc.download_pvc(
        a, "b-c", job_namespace="j"
    )
    assert sc.serving_pv_name(ab, "c", "p") != sc.serving_pv_name(a, "b-c", "p")
    assert sc.download_pv_name(ab, "c") != sc.download_pv_name(a, "b-c")
    llama_cpu = _named(modelcache.LocalModelCache, "llama-cpu")
    llama = _named(modelcache.LocalModelNamespaceCache, "llama", "gpu")
    assert sc.download_pv_name(llama_cpu, "gpu") != ns.download_pv_name(llama, "cpu")


def test_volume_names_of_a_long_namespace_cache_name_are_valid() -> None:
    long = _named(modelcache.LocalModelNamespaceCache, "m" * 240, "team-" + "t" * 58)
    ns = namespacecache.SCOPE
    derived = [
        ns.download_pv_name(long, "gpu1"),
        ns.download_pvc(long, "gpu1", job_namespace="j")[1],
        ns.serving_pv_name(long, "gpu1", long.namespace),
        ns.serving_pvc_name(long, "gpu1"),
    ]
    assert all(len(name) <= 253 for name in derived), [len(n) for n in derived]
    assert len(set(derived)) == len(derived)
    assert not ns.pvs_owned


def test_finalizers_and_status_keys_per_kind() -> None:
    assert clustercache.SCOPE.finalizer == "localmodel.kserve.io/finalizer"
    assert namespacecache.SCOPE.finalizer == "localmodelnamespacecache.kserve.io/finalizer"
    assert clustercache.SCOPE.status_key(_cluster()) == "iris"
    assert namespacecache.SCOPE.status_key(_namespaced()) == "team/iris"
    assert clustercache.SCOPE.key_of_status_key("iris") == ObjectKey("", "iris")
    assert clustercache.SCOPE.key_of_status_key("team/iris") is None
    assert namespacecache.SCOPE.key_of_status_key("team/iris") == ObjectKey("team", "iris")
    assert namespacecache.SCOPE.key_of_status_key("iris") is None


def test_owner_ids_round_trip_to_keys_of_their_kind_only() -> None:
    cluster_id = clustercache.SCOPE.owner_id(_cluster())
    namespaced_id = namespacecache.SCOPE.owner_id(_namespaced())
    assert cluster_id == "LocalModelCache/iris"
    assert namespaced_id == "LocalModelNamespaceCache/team/iris"
    assert clustercache.SCOPE.key_of_owner_id(cluster_id) == ObjectKey("", "iris")
    assert clustercache.SCOPE.key_of_owner_id(namespaced_id) is None
    assert namespacecache.SCOPE.key_of_owner_id(namespaced_id) == ObjectKey("team", "iris")
    assert namespacecache.SCOPE.key_of_owner_id(cluster_id) is None


def test_volume_index_reads_our_annotation_and_kserve_owner_references() -> None:
    pvc = {
        "metadata": {
            "namespace": "team",
            "annotations": {state.OWNER_ANNOTATION: "LocalModelCache/a"},
            "ownerReferences": [
                {
                    "apiVersion": "serving.kserve.io/v1alpha1",
                    "kind": "LocalModelNamespaceCache",
                    "name": "b",
                    "uid": "x",
                },
                {"apiVersion": "apps/v1", "kind": "LocalModelCache", "name": "c", "uid": "y"},
            ],
        }
    }
    assert state.index_owner(pvc) == ["LocalModelCache/a", "LocalModelNamespaceCache/team/b"]


@pytest.mark.parametrize(
    ("isvc", "cluster_key", "namespaced_key"),
    [
        (_isvc("prod", {inferenceservice.LOCAL_MODEL_LABEL: "iris"}), ObjectKey("", "iris"), None),
        (
            _isvc(
                "team",
                {
                    inferenceservice.LOCAL_MODEL_LABEL: "iris",
                    inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL: "team",
                },
            ),
            None,
            ObjectKey("team", "iris"),
        ),
        (
            _isvc(
                "elsewhere",
                {
                    inferenceservice.LOCAL_MODEL_LABEL: "iris",
                    inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL: "team",
                },
            ),
            None,
            None,
        ),
        (_isvc("prod", {}), None, None),
    ],
)
def test_inference_services_resolve_to_the_cache_their_labels_name(
    isvc: dict[str, Any], cluster_key: ObjectKey | None, namespaced_key: ObjectKey | None
) -> None:
    assert clustercache.SCOPE.cache_key_of_isvc(isvc) == cluster_key
    assert namespacecache.SCOPE.cache_key_of_isvc(isvc) == namespaced_key


def test_serving_pairs_use_the_annotated_group_or_the_first() -> None:
    cache = _cluster()
    isvcs = [
        _isvc("a", {}),
        _isvc("b", {}, **{inferenceservice.NODE_GROUP_ANNOTATION: "gpu2"}),
        _isvc("c", {}, **{inferenceservice.NODE_GROUP_ANNOTATION: "unknown"}),
    ]
    wanted = users.serving(cache, isvcs=isvcs, llm_users=[])
    assert wanted.pairs == {("a", "gpu1"), ("b", "gpu2")}
    assert wanted.legacy == set()


def test_serving_pairs_follow_the_claim_the_webhook_chose() -> None:
    """The webhook may pick a later group (the one the predictor can run on): the claim its
    `localmodel-pvc-name` annotation names is the one created, whatever the other keys say."""
    cache = _cluster()
    chosen = names.serving_pvc(cache.name, "gpu2")
    isvcs = [
        _isvc("a", {}, **{inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION: chosen}),
        _isvc(
            "b",
            {},
            **{
                inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION: chosen,
                inferenceservice.NODE_GROUP_ANNOTATION: "unknown",
            },
        ),
        _isvc("c", {}, **{inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION: "someone-else"}),
    ]
    wanted = users.serving(cache, isvcs=isvcs, llm_users=[])
    assert wanted.pairs == {("a", "gpu2"), ("b", "gpu2"), ("c", "gpu1")}


def _isvc_of(name: str, uri: str | None) -> dict[str, Any]:
    obj = _isvc("prod", {inferenceservice.LOCAL_MODEL_LABEL: "iris"})
    obj["metadata"]["name"] = name
    obj["metadata"]["uid"] = f"u-{name}"
    model = {"modelFormat": {"name": "onnx"}, **({"storageUri": uri} if uri else {})}
    obj["spec"] = {"predictor": {"model": model}}
    return obj


def test_a_label_is_no_use_of_a_cache_unless_the_cache_serves_the_isvcs_uri() -> None:
    """Security review finding 12: with the webhook down, a tenant labelled its ISVC with any
    cluster cache's name and the controller planned a serving claim of that model for it."""
    isvcs = store.Store(indexers=state.ISVC_INDEXERS)
    for obj in (
        _isvc_of("exact", "s3://b/m"),
        _isvc_of("below", "s3://b/m/v2/weights"),
        _isvc_of("forged", "s3://attacker/bucket"),
        _isvc_of("prefix-only", "s3://b/model"),
        _isvc_of("no-uri", None),
    ):
        isvcs.upsert(indexes.isvc_use(obj))  # what the shared informer holds
    empty = store.Store().view()
    stores = state.Stores(
        caches=empty,
        namespace_caches=empty,
        nodes=empty,
        local_model_nodes=empty,
        node_groups=empty,
        persistent_volumes=empty,
        persistent_volume_claims=empty,
        inference_services=isvcs.view(),
    )
    used = clustercache.SCOPE.isvcs_of(stores, _cluster())
    assert sorted(o["metadata"]["name"] for o in used) == ["below", "exact"]
