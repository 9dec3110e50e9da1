"""InferenceService mutation: KServe's defaulter cases (reference §8.5) plus spec §6's changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localcache.api import inferenceservice as isvc_api
from localcache.api import modelcache
from localcache.caching import sharedroute
from localcache.runtime import store
from localcache.runtime.serving import review
from localcache.webhooks import isvc, isvchandler

LABEL = isvc_api.LOCAL_MODEL_LABEL
NS_LABEL = isvc_api.LOCAL_MODEL_NAMESPACE_LABEL
SOURCE = isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION
PVC = isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION
SHARED = sharedroute.SHARED_VOLUME_CACHE_ANNOTATION
DOWNLOADED = {"copies": {"available": 1, "total": 1}, "nodeStatus": {"n1": "NodeDownloaded"}}


def cache_obj(
    name: str,
    uri: str,
    *,
    groups: tuple[str, ...] = ("gpu1", "gpu2"),
    namespace: str | None = None,
    status: dict[str, Any] | None = DOWNLOADED,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj: dict[str, Any] = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache" if namespace is not None else "LocalModelCache",
        "metadata": meta,
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": list(groups)},
    }
    if status is not None:
        obj["status"] = copy.deepcopy(status)
    return obj


def cluster(name: str, uri: str, **kw: Any) -> modelcache.LocalModelCache:
    return modelcache.LocalModelCache.from_dict(cache_obj(name, uri, **kw))


def namespaced(
    name: str, uri: str, namespace: str = "default", **kw: Any
) -> modelcache.LocalModelNamespaceCache:
    return modelcache.LocalModelNamespaceCache.from_dict(
        cache_obj(name, uri, namespace=namespace, **kw)
    )


def isvc_obj(
    uri: str | None,
    *,
    name: str = "foo",
    namespace: str = "default",
    framework: str = "model",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    impl: dict[str, Any] = {"storageUri": uri} if uri is not None else {"image": "custom"}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": {framework: impl}},
    }


def parse(obj: dict[str, Any]) -> isvc_api.InferenceService:
    return isvc_api.InferenceService.from_dict(obj)


def decide(obj: dict[str, Any], *caches: isvc.AnyCache, **kw: Any) -> isvc.Decision:
    return isvc.decide(
        parse(obj),
        namespace_caches=[c for c in caches if isinstance(c, modelcache.LocalModelNamespaceCache)],
        cluster_caches=[c for c in caches if isinstance(c, modelcache.LocalModelCache)],
        **kw,
    )


def cleared() -> tuple[dict[str, None], dict[str, None]]:
    return {LABEL: None, NS_LABEL: None}, {SOURCE: None, PVC: None, SHARED: None}


# ------------------------------------------------------------------ KServe's defaulter cases


def test_the_first_node_group_is_used_without_an_annotation() -> None:
    decision = decide(
        isvc_obj("gs://testbucket/testmodel"), cluster("model1", "gs://testbucket/testmodel")
    )
    assert decision.labels == {LABEL: "model1", NS_LABEL: None}
    assert decision.annotations == {
        SOURCE: "gs://testbucket/testmodel",
        PVC: "model1-gpu1",
        SHARED: None,
    }
    assert decision.warnings == ()


def test_the_node_group_annotation_chooses_the_pvc() -> None:
    obj = isvc_obj(
        "gs://testbucket/testmodel", annotations={isvc_api.NODE_GROUP_ANNOTATION: "gpu2"}
    )
    decision = decide(obj, cluster("model1", "gs://testbucket/testmodel"))
    assert decision.annotations[PVC] == "model1-gpu2"


def test_a_uri_that_only_shares_a_prefix_does_not_match() -> None:
    caches = (cluster("model1", "gs://bucket/model"), cluster("model2", "gs://bucket/model2"))
    assert decide(isvc_obj("gs://bucket/model2"), *caches).labels[LABEL] == "model2"
    assert decide(isvc_obj("gs://bucket/model-evil"), *caches).choice is None


def test_no_matching_cache_gives_no_labels() -> None:
    decision = decide(isvc_obj("gs://other/model"), cluster("model1", "gs://bucket/model"))
    assert (decision.labels, decision.annotations) == cleared()
    assert decision.warnings == ()


def test_an_unknown_node_group_gives_no_labels_and_says_why() -> None:
    obj = isvc_obj("gs://bucket/model", annotations={isvc_api.NODE_GROUP_ANNOTATION: "gpu3"})
    decision = decide(obj, cluster("model1", "gs://bucket/model"))
    assert (decision.labels, decision.annotations) == cleared()
    assert decision.warnings == (
        "no local model cache of gs://bucket/model is on node group gpu3: "
        "not using a local model cache",
    )


@pytest.mark.parametrize("framework", ["tensorflow", "sklearn", "huggingface", "model"])
def test_framework_predictors_are_matched_by_their_storage_uri(framework: str) -> None:
    obj = isvc_obj("gs://bucket/model/v1", framework=framework)
    assert decide(obj, cluster("model1", "gs://bucket/model")).labels[LABEL] == "model1"


def test_a_namespace_cache_sets_both_labels_and_both_annotations() -> None:
    decision = decide(isvc_obj("gs://bucket/model"), namespaced("model1", "gs://bucket/model"))
    assert decision.labels == {LABEL: "model1", NS_LABEL: "default"}
    assert decision.annotations == {SOURCE: "gs://bucket/model", PVC: "model1-gpu1", SHARED: None}


# ------------------------------------------------------------------ spec §6 changes


def test_a_namespace_cache_of_another_namespace_is_ignored() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model", namespace="team-b"),
        namespaced("ns-model", "gs://bucket/model", namespace="team-a"),
        cluster("cluster-model", "gs://bucket/model"),
    )
    assert decision.labels == {LABEL: "cluster-model", NS_LABEL: None}


def test_the_own_namespace_cache_wins_over_a_more_specific_cluster_cache() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model/sub/x"),
        namespaced("ns-model", "gs://bucket/model"),
        cluster("cluster-model", "gs://bucket/model/sub"),
    )
    assert decision.labels[LABEL] == "ns-model"


def test_the_longest_source_uri_wins_whatever_the_order() -> None:
    caches = [
        cluster("a-broad", "gs://bucket/model"),
        cluster("z-deep", "gs://bucket/model/sub"),
        cluster("m-mid", "gs://bucket/model/sub/"),
    ]
    for order in (caches, caches[::-1]):
        decision = decide(isvc_obj("gs://bucket/model/sub/part"), *order)
        assert decision.labels[LABEL] == "m-mid"  # ties with z-deep (trailing / ignored): by name
    assert decide(isvc_obj("gs://bucket/model/x"), *caches).labels[LABEL] == "a-broad"


def test_ties_are_broken_by_name() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model"),
        cluster("b-cache", "gs://bucket/model"),
        cluster("a-cache", "gs://bucket/model/"),
    )
    assert decision.labels[LABEL] == "a-cache"
    assert decision.annotations[SOURCE] == "gs://bucket/model/"


def test_no_storage_uri_clears_the_labels() -> None:
    decision = decide(isvc_obj(None), cluster("model1", "gs://bucket/model"))
    assert (decision.labels, decision.annotations) == cleared()


@pytest.mark.parametrize(
    ("annotations", "enabled"),
    [({isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: "false"}, True), ({}, False)],
)
def test_disabled_local_models_clear_the_labels(annotations: dict[str, str], enabled: bool) -> None:
    obj = isvc_obj("gs://bucket/model", annotations=annotations)
    decision = decide(obj, cluster("model1", "gs://bucket/model"), enabled=enabled)
    assert (decision.labels, decision.annotations) == cleared()


def test_a_cache_being_deleted_is_not_chosen() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model/x"),
        cluster("deep", "gs://bucket/model/x", deleting=True),
        cluster("broad", "gs://bucket/model"),
    )
    assert decision.labels[LABEL] == "broad"


def test_missing_node_groups_are_skipped_when_they_can_be_looked_up() -> None:
    cache = cluster("model1", "gs://bucket/model", groups=("gone", "gpu2"))
    obj = isvc_obj("gs://bucket/model")
    assert decide(obj, cache).annotations[PVC] == "model1-gone"  # no lookup: KServe's default
    exists = {"gpu2"}.__contains__
    assert decide(obj, cache, node_group_exists=exists).annotations[PVC] == "model1-gpu2"
    pinned = isvc_obj("gs://bucket/model", annotations={isvc_api.NODE_GROUP_ANNOTATION: "gone"})
    assert decide(pinned, cache, node_group_exists=exists).choice is None
    nothing = decide(obj, cache, node_group_exists=lambda _: False)
    assert nothing.choice is None
    assert nothing.warnings == (
        "the node groups of the local model caches of gs://bucket/model do not exist: "
        "not using a local model cache",
    )


@pytest.mark.parametrize(
    "status",
    [
        None,
        {"copies": {"total": 2}, "nodeStatus": {"n1": "NodeDownloading"}},
        {"copies": {"available": 0, "total": 2}, "nodeStatus": {"n1": "NodeDownloaded"}},
        {"copies": {"available": 1, "total": 2}, "nodeStatus": {"n1": "NodeDownloadPending"}},
    ],
)
def test_a_cache_without_a_downloaded_copy_gives_a_warning(status: dict[str, Any] | None) -> None:
    decision = decide(
        isvc_obj("gs://bucket/model"), cluster("model1", "gs://bucket/model", status=status)
    )
    assert decision.labels[LABEL] == "model1"
    (warning,) = decision.warnings
    assert warning.startswith("LocalModelCache model1 has no downloaded copy of the model yet")


def test_the_warning_names_a_namespace_cache_with_its_namespace() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model"), namespaced("m", "gs://bucket/model", status=None)
    )
    assert decision.warnings[0].startswith("LocalModelNamespaceCache default/m has no downloaded")


# ------------------------------------------------------------------ the admission handler


def request(
    obj: dict[str, Any] | None, *, operation: str = "CREATE", namespace: str = "default"
) -> review.Request:
    return review.Request(
        uid="uid-1",
        kind=review.GroupVersionKind("serving.kserve.io", "v1beta1", "InferenceService"),
        resource=review.GroupVersionResource("serving.kserve.io", "v1beta1", "inferenceservices"),
        namespace=namespace,
        name="foo",
        operation=operation,  # type: ignore[arg-type]
        user=review.UserInfo(),
        object=obj,
        old_object=None,
    )


def apply(obj: dict[str, Any], ops: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """A JSON-patch applier for the object paths the mutator writes."""
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]
        ]
        target: Any = out
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        index: Any = int(last) if isinstance(target, list) else last
        if op["op"] == "remove":
            del target[index]
        else:
            assert op["op"] in ("add", "replace")
            target[index] = op["value"]
    return out


class Stores:
    def __init__(self) -> None:
        self.caches = store.Store()
        self.namespace_caches = store.Store()
        self.node_groups = store.Store()
        self.synced = True
        self.enabled = True
        for group in ("gpu1", "gpu2"):
            self.node_groups.upsert({"metadata": {"name": group}, "spec": {}})

    def mutator(self) -> isvchandler.IsvcMutator:
        return isvchandler.IsvcMutator(
            caches=self.caches.view(),
            namespace_caches=self.namespace_caches.view(),
            node_groups=self.node_groups.view(),
            enabled=lambda: self.enabled,
            synced=lambda: self.synced,
        )


async def test_the_handler_patches_labels_and_annotations_from_the_stores() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("cluster-model", "gs://bucket/model"))
    stores.namespace_caches.upsert(cache_obj("ns-model", "gs://bucket/model", namespace="default"))
    stores.namespace_caches.upsert(cache_obj("elsewhere", "gs://bucket/model/x", namespace="b"))
    obj = isvc_obj("gs://bucket/model/x")
    answer = await stores.mutator()(request(obj))
    assert answer.allowed
    assert answer.warnings == ()
    meta = apply(obj, answer.patch)["metadata"]
    assert meta["labels"] == {LABEL: "ns-model", NS_LABEL: "default"}
    assert meta["annotations"] == {SOURCE: "gs://bucket/model", PVC: "ns-model-gpu1"}
    other = await stores.mutator()(
        request(isvc_obj("gs://bucket/model", namespace="c"), namespace="c")
    )
    assert apply(obj, other.patch)["metadata"]["labels"] == {LABEL: "cluster-model"}


async def test_the_handler_removes_stale_labels_and_keeps_foreign_ones() -> None:
    stores = Stores()
    stale = {LABEL: "gone", NS_LABEL: "default", "app": "x"}
    obj = isvc_obj("gs://bucket/model", labels=stale, annotations={SOURCE: "gs://bucket/model"})
    answer = await stores.mutator()(request(obj, operation="UPDATE"))
    meta = apply(obj, answer.patch)["metadata"]
    assert meta["labels"] == {"app": "x"}
    assert meta["annotations"] == {}


async def test_the_handler_is_idempotent() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("model1", "gs://bucket/model"))
    obj = isvc_obj("gs://bucket/model")
    first = await stores.mutator()(request(obj))
    again = await stores.mutator()(request(apply(obj, first.patch), operation="UPDATE"))
    assert first.patch
    assert again.patch == ()
    assert again.result == "allowed"


async def test_the_handler_leaves_a_disabled_isvc_untouched() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("model1", "gs://bucket/model"))
    obj = isvc_obj("gs://bucket/model", annotations={isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: ""})
    assert (await stores.mutator()(request(obj))).patch == ()
    stores.enabled = False
    assert (await stores.mutator()(request(isvc_obj("gs://bucket/model")))).patch == ()


async def test_the_handler_warns_while_no_copy_is_downloaded() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("model1", "gs://bucket/model", status=None))
    answer = await stores.mutator()(request(isvc_obj("gs://bucket/model")))
    assert answer.patch
    assert answer.warnings[0].startswith("LocalModelCache model1 has no downloaded copy")


async def test_the_handler_skips_node_groups_that_do_not_exist() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("model1", "gs://bucket/model", groups=("gpu9",)))
    answer = await stores.mutator()(request(isvc_obj("gs://bucket/model")))
    assert answer.patch == ()
    assert "do not exist" in answer.warnings[0]


async def test_the_handler_changes_nothing_before_the_stores_synced() -> None:
    stores = Stores()
    stores.synced = False
    obj = isvc_obj("gs://bucket/model", labels={LABEL: "model1"})
    answer = await stores.mutator()(request(obj, operation="UPDATE"))
    assert answer.allowed
    assert answer.patch == ()
    assert answer.warnings == ("localcache is starting: local model labels were not updated",)


async def test_the_handler_takes_the_namespace_from_the_request() -> None:
    stores = Stores()
    stores.namespace_caches.upsert(cache_obj("m", "gs://bucket/model", namespace="team"))
    obj = isvc_obj("gs://bucket/model")
    del obj["metadata"]["namespace"]
    answer = await stores.mutator()(request(obj, namespace="team"))
    assert apply(obj, answer.patch)["metadata"]["labels"] == {LABEL: "m", NS_LABEL: "team"}


async def test_the_handler_ignores_deletes_and_objects_being_deleted() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("model1", "gs://bucket/model"))
    assert (await stores.mutator()(request(None, operation="DELETE"))).patch == ()
    obj = isvc_obj("gs://bucket/model")
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert (await stores.mutator()(request(obj, operation="UPDATE"))).patch == ()


async def test_the_handler_skips_a_cache_it_cannot_parse() -> None:
    stores = Stores()
    broken = cache_obj("broken", "gs://bucket/model/x")
    broken["spec"]["modelSize"] = "lots"
    stores.caches.upsert(broken)
    stores.caches.upsert(cache_obj("fine", "gs://bucket/model"))
    answer = await stores.mutator()(request(isvc_obj("gs://bucket/model/x")))
    assert apply(isvc_obj("x"), answer.patch)["metadata"]["labels"] == {LABEL: "fine"}


@pytest.mark.parametrize("metadata", [["not", "an", "object"], "name", 7])
async def test_metadata_that_is_not_an_object_is_refused_naming_the_field(metadata: Any) -> None:
    """Issue 13: the handler raised (HTTP 500) on such input from callers other than the
    apiserver."""
    answer = await Stores().mutator()(request({"metadata": metadata, "spec": {}}))
    assert not answer.allowed
    assert answer.code == 400
    assert "metadata must be an object" in answer.message
