"""Cache validation: KServe's validator cases (reference §8.4) plus spec §3, §4, §6's rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localcache.api import inferenceservice as isvc_api
from localcache.api import modelcache, nodegroup
from localcache.caching import indexes
from localcache.runtime import store
from localcache.runtime.keys import ObjectKey
from localcache.runtime.serving import review
from localcache.webhooks import livegroups, validation

DELETING = "2026-01-01T00:00:00Z"


def cache_obj(
    name: str,
    uri: str = "gs://bucket/model",
    *,
    groups: tuple[str, ...] = ("gpu1",),
    size: str = "1Gi",
    namespace: str | None = None,
    deleting: bool = False,
    isvcs: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if deleting:
        meta["deletionTimestamp"] = DELETING
    obj: dict[str, Any] = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache" if namespace is not None else "LocalModelCache",
        "metadata": meta,
        "spec": {"sourceModelUri": uri, "modelSize": size, "nodeGroups": list(groups)},
    }
    if isvcs is not None:
        obj["status"] = {"inferenceServices": [{"namespace": n, "name": i} for n, i in isvcs]}
    return obj


def lmc(name: str, uri: str = "gs://bucket/model", **kw: Any) -> modelcache.LocalModelCache:
    return modelcache.LocalModelCache.from_dict(cache_obj(name, uri, **kw))


def lmnc(
    name: str, uri: str = "gs://bucket/model", namespace: str = "default", **kw: Any
) -> modelcache.LocalModelNamespaceCache:
    return modelcache.LocalModelNamespaceCache.from_dict(
        cache_obj(name, uri, namespace=namespace, **kw)
    )


def group_obj(name: str, limit: str = "10Gi") -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNodeGroup",
        "metadata": {"name": name},
        "spec": {
            "storageLimit": limit,
            "persistentVolumeSpec": {"local": {"path": "/models"}},
            "persistentVolumeClaimSpec": {},
        },
    }


def groups(**limits: str) -> dict[str, nodegroup.LocalModelNodeGroup]:
    return {
        n: nodegroup.LocalModelNodeGroup.from_dict(group_obj(n, lim)) for n, lim in limits.items()
    }


def snapshot(*caches: validation.AnyCache, **kw: Any) -> validation.Snapshot:
    kw.setdefault("node_groups", groups(gpu1="10Gi", gpu2="10Gi"))
    return validation.Snapshot(
        cluster_caches=[c for c in caches if isinstance(c, modelcache.LocalModelCache)],
        namespace_caches=[c for c in caches if isinstance(c, modelcache.LocalModelNamespaceCache)],
        **kw,
    )


def messages(violations: list[validation.Violation]) -> list[str]:
    return [str(v) for v in violations]


# ------------------------------------------------------------------ KServe's LocalModelCache cases


def test_a_cache_used_by_a_live_isvc_cannot_be_deleted() -> None:
    cache = lmc("foo", isvcs=[("default", "bar")])
    found = validation.validate_delete(
        cache, snapshot=snapshot(users=[ObjectKey("default", "bar")])
    )
    assert messages(found) == [
        "status.inferenceServices: LocalModelCache foo is being used by InferenceService "
        "default/bar"
    ]


def test_a_second_cache_with_the_same_uri_is_denied_naming_the_first() -> None:
    found = validation.validate_write(lmc("new"), snapshot=snapshot(lmc("existing")))
    assert messages(found) == [
        "spec.sourceModelUri: LocalModelCache existing has the same StorageURI gs://bucket/model"
    ]


def test_an_update_to_a_duplicate_uri_is_denied() -> None:
    old = lmc("mine", "gs://bucket/other")
    found = validation.validate_write(lmc("mine"), old=old, snapshot=snapshot(lmc("existing"), old))
    assert [v.field for v in found] == ["spec.sourceModelUri"]


def test_an_update_with_a_unique_uri_is_allowed() -> None:
    old = lmc("mine", "gs://bucket/other")
    new = lmc("mine", "gs://bucket/other", groups=("gpu1", "gpu2"))
    assert validation.validate_write(new, old=old, snapshot=snapshot(lmc("existing"), old)) == []


def test_an_update_of_a_cache_being_deleted_is_allowed() -> None:
    old = lmc("mine", "gs://bucket/other")
    new = lmc("mine", deleting=True, groups=("nowhere",))
    assert validation.validate_write(new, old=old, snapshot=snapshot(lmc("existing"))) == []


# ------------------------------------------------------------------ KServe's namespace cache cases


def test_a_namespace_cache_used_by_a_live_isvc_cannot_be_deleted() -> None:
    cache = lmnc("foo", namespace="team")
    found = validation.validate_delete(cache, snapshot=snapshot(users=[ObjectKey("team", "bar")]))
    assert messages(found) == [
        "status.inferenceServices: LocalModelNamespaceCache team/foo is being used by "
        "InferenceService team/bar"
    ]


def test_creating_with_a_missing_node_group_is_denied() -> None:
    found = validation.validate_write(lmnc("foo", groups=("gpu1", "gpu3")), snapshot=snapshot())
    assert messages(found) == ["spec.nodeGroups[1]: LocalModelNodeGroup gpu3 not found"]
    assert "NodeGroup gpu3 not found" in found[0].message  # KServe's wording, kept


def test_creating_with_existing_node_groups_is_allowed() -> None:
    assert (
        validation.validate_write(lmnc("foo", groups=("gpu1", "gpu2")), snapshot=snapshot()) == []
    )


def test_an_update_adding_a_missing_node_group_is_denied() -> None:
    new = lmnc("foo", groups=("gpu1", "nonexistent-nodegroup"))
    found = validation.validate_write(new, old=lmnc("foo"), snapshot=snapshot())
    assert messages(found) == [
        "spec.nodeGroups[1]: LocalModelNodeGroup nonexistent-nodegroup not found"
    ]


def test_an_update_keeping_a_node_group_deleted_since_is_allowed() -> None:
    cache = lmnc("foo", groups=("gpu1", "deleted-later"))
    new = copy.deepcopy(cache)
    new.metadata.labels = {"team": "a"}
    assert validation.validate_write(new, old=cache, snapshot=snapshot()) == []


def test_an_update_of_a_namespace_cache_being_deleted_is_allowed() -> None:
    new = lmnc("foo", groups=("missing",), deleting=True)
    assert validation.validate_write(new, old=lmnc("foo"), snapshot=snapshot()) == []


# ------------------------------------------------------------------ uniqueness and names


def test_uri_uniqueness_ignores_one_trailing_slash() -> None:
    found = validation.validate_write(lmc("new", "gs://bucket/model/"), snapshot=snapshot(lmc("a")))
    assert [v.field for v in found] == ["spec.sourceModelUri"]
    assert (
        validation.validate_write(lmc("n", "gs://bucket/model2"), snapshot=snapshot(lmc("a"))) == []
    )


def test_namespace_caches_may_share_a_uri_with_cluster_caches() -> None:
    found = validation.validate_write(
        lmnc("mine"), snapshot=snapshot(lmc("cluster"), lmnc("other"))
    )
    assert found == []


def test_a_cluster_cache_may_not_take_a_namespace_caches_name() -> None:
    found = validation.validate_write(
        lmc("shared", "gs://bucket/x"), snapshot=snapshot(lmnc("shared", namespace="team"))
    )
    assert messages(found) == [
        "metadata.name: LocalModelNamespaceCache team/shared has the same name: a "
        "LocalModelCache and a LocalModelNamespaceCache may not share a name, their serving "
        "PVCs would collide"
    ]


def test_a_namespace_cache_may_not_take_a_cluster_caches_name() -> None:
    found = validation.validate_write(
        lmnc("shared", "gs://bucket/x"), snapshot=snapshot(lmc("shared"))
    )
    assert [v.field for v in found] == ["metadata.name"]
    assert "LocalModelCache shared has the same name" in found[0].message


def test_same_named_namespace_caches_in_two_namespaces_are_fine() -> None:
    found = validation.validate_write(
        lmnc("m", namespace="a"), snapshot=snapshot(lmnc("m", namespace="b"))
    )
    assert found == []


def test_names_are_not_rechecked_on_update() -> None:
    cache = lmc("shared", "gs://bucket/x")
    found = validation.validate_write(cache, old=cache, snapshot=snapshot(lmnc("shared")))
    assert found == []


# ------------------------------------------------------------------ capacity


def test_capacity_sums_distinct_uris_and_names_both_numbers() -> None:
    existing: list[validation.AnyCache] = [
        lmc("a", "gs://b/a", size="4Gi"),
        lmnc("a-copy", "gs://b/a", size="4Gi", namespace="team"),  # same URI: counted once
        lmnc("c", "gs://b/c", size="3Gi", namespace="team"),
        lmc("elsewhere", "gs://b/e", size="9Gi", groups=("gpu2",)),
    ]
    assert (
        validation.validate_write(
            lmc("new", "gs://b/new", size="3Gi"), snapshot=snapshot(*existing)
        )
        == []
    )
    found = validation.validate_write(
        lmc("new", "gs://b/new", size="3500Mi"), snapshot=snapshot(*existing)
    )
    assert messages(found) == [
        "spec.modelSize: LocalModelNodeGroup gpu1 has storageLimit 10Gi, but its models would "
        "need 10668Mi: 7Gi used by 2 other model URI(s) plus 3500Mi for gs://b/new"
    ]


def test_a_cache_for_a_uri_already_on_the_group_adds_only_its_growth() -> None:
    existing = [lmc("a", "gs://b/a", size="9Gi")]
    same = lmnc("mine", "gs://b/a", size="9Gi")
    assert validation.validate_write(same, snapshot=snapshot(*existing)) == []
    bigger = lmnc("mine", "gs://b/a", size="11Gi")
    found = validation.validate_write(bigger, snapshot=snapshot(*existing))
    assert "would need 11Gi: 9Gi used by 1 other model URI(s) plus 2Gi" in found[0].message


def test_one_namespace_cannot_declare_a_whole_shared_group() -> None:
    """Security review finding 9: a tenant declaring a shared group's whole storageLimit
    blocked every later cache on it, of any tenant or admin; one namespace's caches now
    declare at most their share (50% by default) and the rest stays for the others."""
    grab = lmnc("grab", "gs://b/grab", namespace="team-a", size="10Gi")
    found = validation.validate_write(grab, snapshot=snapshot())
    assert messages(found) == [
        "spec.modelSize: the namespace caches of namespace team-a may declare at most 50% of "
        "LocalModelNodeGroup gpu1's storageLimit 10Gi (5Gi, "
        "localModel.namespaceStorageSharePercent), but would declare 10Gi: 0 already plus "
        "10Gi for gs://b/grab"
    ]
    first = lmnc("first", "gs://b/first", namespace="team-a", size="4Gi")
    assert validation.validate_write(first, snapshot=snapshot()) == []
    second = lmnc("second", "gs://b/second", namespace="team-a", size="2Gi")
    found = validation.validate_write(second, snapshot=snapshot(first))
    assert "would declare 6Gi: 4Gi already plus 2Gi" in found[0].message
    other_tenant = lmnc("theirs", "gs://b/theirs", namespace="team-b", size="5Gi")
    assert validation.validate_write(other_tenant, snapshot=snapshot(first)) == []
    admin = lmc("admin", "gs://b/admin", size="6Gi")
    assert validation.validate_write(admin, snapshot=snapshot(first)) == []
    everything = snapshot(node_groups=groups(gpu1="10Gi"), namespace_share_percent=100)
    assert validation.validate_write(grab, snapshot=everything) == []


def test_capacity_is_checked_on_each_node_group_of_the_cache() -> None:
    snap = snapshot(node_groups=groups(gpu1="10Gi", gpu2="1Gi"))
    found = validation.validate_write(
        lmc("big", size="2Gi", groups=("gpu1", "gpu2")), snapshot=snap
    )
    assert len(found) == 1
    assert found[0].message.startswith("LocalModelNodeGroup gpu2 has storageLimit 1Gi")


def test_an_update_growing_the_model_is_checked_and_one_not_growing_is_not() -> None:
    old = lmc("m", size="1Gi")
    snap = snapshot(old, lmc("other", "gs://b/o", size="9Gi"))
    grown = lmc("m", size="2Gi")
    assert [v.field for v in validation.validate_write(grown, old=old, snapshot=snap)] == [
        "spec.modelSize"
    ]
    shrunk_limit = snapshot(
        old, lmc("other", "gs://b/o", size="9Gi"), node_groups=groups(gpu1="5Gi")
    )
    relabelled = lmc("m", size="1Gi")
    assert validation.validate_write(relabelled, old=old, snapshot=shrunk_limit) == []


def test_an_update_adding_a_full_node_group_is_denied() -> None:
    old = lmc("m", size="2Gi")
    snap = snapshot(old, node_groups=groups(gpu1="10Gi", gpu2="1Gi"))
    found = validation.validate_write(
        lmc("m", size="2Gi", groups=("gpu1", "gpu2")), old=old, snapshot=snap
    )
    assert found[0].message.startswith("LocalModelNodeGroup gpu2 has storageLimit 1Gi")


def test_every_violation_is_reported() -> None:
    found = validation.validate_write(
        lmc("dup", groups=("gpu1", "missing"), size="20Gi"), snapshot=snapshot(lmc("existing"))
    )
    assert [v.field for v in found] == [
        "spec.nodeGroups[1]",
        "spec.sourceModelUri",
        "spec.modelSize",
    ]


# ------------------------------------------------------------------ deletion


def test_deletion_is_allowed_without_live_users() -> None:
    cache = lmc("foo", isvcs=[("default", "gone")])
    assert validation.validate_delete(cache, snapshot=snapshot()) == []


def test_several_users_are_summarised() -> None:
    users = [ObjectKey("b", "two"), ObjectKey("a", "one"), ObjectKey("c", "three")]
    found = validation.validate_delete(lmc("foo"), snapshot=snapshot(users=users))
    assert found[0].message == (
        "LocalModelCache foo is being used by InferenceService a/one (and 2 more)"
    )


def test_llm_inference_service_users_are_named_with_how_beside_isvc_users() -> None:
    llm = [
        (ObjectKey("b", "chat"), "LoRA adapter colorist"),
        (ObjectKey("a", "chat"), "base model"),
    ]
    found = validation.validate_delete(
        lmc("foo"), snapshot=snapshot(users=[ObjectKey("a", "one")], llm_users=llm)
    )
    assert messages(found) == [
        "status.inferenceServices: LocalModelCache foo is being used by InferenceService a/one",
        "status.llmInferenceServices: LocalModelCache foo is being used by LLMInferenceService "
        "a/chat (base model) (and 1 more)",
    ]
    only_llm = validation.validate_delete(lmc("foo"), snapshot=snapshot(llm_users=llm[:1]))
    assert messages(only_llm) == [
        "status.llmInferenceServices: LocalModelCache foo is being used by LLMInferenceService "
        "b/chat (LoRA adapter colorist)"
    ]


@pytest.mark.parametrize(
    ("namespace", "labels", "expected"),
    [
        ("ns", {isvc_api.LOCAL_MODEL_LABEL: "m"}, ["m"]),
        (
            "ns",
            {isvc_api.LOCAL_MODEL_LABEL: "m", isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: "ns"},
            ["ns/m"],
        ),
        ("ns", {isvc_api.LOCAL_MODEL_LABEL: "m", isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: "x"}, []),
        ("ns", {isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: "ns"}, []),
        ("ns", {}, []),
    ],
)
def test_isvcs_are_indexed_by_the_cache_their_labels_name(
    namespace: str, labels: dict[str, str], expected: list[str]
) -> None:
    obj = {"metadata": {"name": "i", "namespace": namespace, "labels": labels}}
    assert indexes.isvc_used_cache(obj) == expected


# ------------------------------------------------------------------ the admission handler


class Stores:
    def __init__(self) -> None:
        self.caches = store.Store({validation.NODE_GROUP_INDEX: indexes.cache_node_groups})
        self.namespace_caches = store.Store(
            {
                validation.NODE_GROUP_INDEX: indexes.cache_node_groups,
                validation.NAME_INDEX: indexes.cache_name,
            }
        )
        self.node_groups = store.Store()
        self.isvcs = store.Store({validation.USED_CACHE_INDEX: indexes.isvc_used_cache})
        self.synced = True
        for name in ("gpu1", "gpu2"):
            self.node_groups.upsert(group_obj(name, "10Gi"))

    def validator(
        self, *, namespaced: bool, read_node_group: livegroups.Reader | None = None
    ) -> validation.CacheValidator:
        return validation.CacheValidator(
            namespaced=namespaced,
            caches=self.caches.view(),
            namespace_caches=self.namespace_caches.view(),
            node_groups=self.node_groups.view(),
            inference_services=self.isvcs.view(),
            synced=lambda: self.synced,
            read_node_group=read_node_group,
        )


def request(
    operation: str,
    *,
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    namespace: str = "",
) -> review.Request:
    kind = (obj or old or {}).get("kind", "LocalModelCache")
    return review.Request(
        uid="uid-1",
        kind=review.GroupVersionKind("serving.kserve.io", "v1alpha1", kind),
        resource=review.GroupVersionResource("serving.kserve.io", "v1alpha1", "caches"),
        namespace=namespace,
        name=str(((obj or old or {}).get("metadata") or {}).get("name", "")),
        operation=operation,  # type: ignore[arg-type]
        user=review.UserInfo(),
        object=obj,
        old_object=old,
    )


def isvc_obj(
    name: str, namespace: str, labels: dict[str, str], uri: str = "gs://bucket/model/v1"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": uri}}},
    }


async def test_the_handler_denies_deleting_a_cache_a_live_isvc_is_labelled_for() -> None:
    stores = Stores()
    cache = cache_obj("foo", isvcs=[("default", "gone"), ("default", "live")])
    stores.caches.upsert(cache)
    stores.isvcs.upsert(isvc_obj("live", "default", {isvc_api.LOCAL_MODEL_LABEL: "foo"}))
    answer = await stores.validator(namespaced=False)(request("DELETE", old=cache))
    assert not answer.allowed
    assert answer.field == "status.inferenceServices"
    assert answer.message == (
        "status.inferenceServices: LocalModelCache foo is being used by InferenceService "
        "default/live"
    )


async def test_the_handler_allows_deleting_when_listed_isvcs_are_gone_or_relabelled() -> None:
    stores = Stores()
    cache = cache_obj("foo", isvcs=[("default", "gone"), ("default", "moved")])
    stores.isvcs.upsert(isvc_obj("moved", "default", {isvc_api.LOCAL_MODEL_LABEL: "other"}))
    # A same-named namespace cache's ISVC does not pin the cluster cache [P2].
    ns_labels = {isvc_api.LOCAL_MODEL_LABEL: "foo", isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: "t"}
    stores.isvcs.upsert(isvc_obj("ns-user", "t", ns_labels))
    answer = await stores.validator(namespaced=False)(request("DELETE", old=cache))
    assert answer.allowed


async def test_a_label_on_an_isvc_of_another_uri_does_not_block_deletion() -> None:
    """Security review finding 12's twin: a tenant labels its ISVC with a cluster cache's
    name (the webhook down, or the label added later); that is no use of the cache."""
    stores = Stores()
    cache = cache_obj("foo")
    labels = {isvc_api.LOCAL_MODEL_LABEL: "foo"}
    stores.isvcs.upsert(isvc_obj("forged", "tenant", labels, uri="s3://attacker/model"))
    stores.isvcs.upsert(isvc_obj("no-uri", "tenant", labels, uri=""))
    answer = await stores.validator(namespaced=False)(request("DELETE", old=cache))
    assert answer.allowed, answer.message
    # as the shared informer holds it (`indexes.isvc_use`), a real user still counts
    stores.isvcs.upsert(indexes.isvc_use(isvc_obj("real", "tenant", labels)))
    answer = await stores.validator(namespaced=False)(request("DELETE", old=cache))
    assert not answer.allowed


async def test_the_handler_checks_namespace_cache_users_by_both_labels() -> None:
    stores = Stores()
    cache = cache_obj("foo", namespace="t")
    labels = {isvc_api.LOCAL_MODEL_LABEL: "foo", isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: "t"}
    stores.isvcs.upsert(isvc_obj("user", "t", labels))
    answer = await stores.validator(namespaced=True)(request("DELETE", old=cache, namespace="t"))
    assert answer.message.endswith(
        "LocalModelNamespaceCache t/foo is being used by InferenceService t/user"
    )


async def test_the_handler_reads_every_rule_from_the_stores() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("existing", "gs://b/a", size="6Gi"))
    stores.namespace_caches.upsert(cache_obj("taken", "gs://b/t", size="3Gi", namespace="x"))
    validator = stores.validator(namespaced=False)
    dup = await validator(request("CREATE", obj=cache_obj("new", "gs://b/a")))
    assert dup.message == (
        "spec.sourceModelUri: LocalModelCache existing has the same StorageURI gs://b/a"
    )
    taken = await validator(request("CREATE", obj=cache_obj("taken", "gs://b/z")))
    assert "LocalModelNamespaceCache x/taken has the same name" in taken.message
    full = await validator(request("CREATE", obj=cache_obj("big", "gs://b/big", size="2Gi")))
    assert full.field == "spec.modelSize"
    assert "storageLimit 10Gi, but its models would need 11Gi" in full.message
    missing = await validator(request("CREATE", obj=cache_obj("m", "gs://b/m", groups=("gpu7",))))
    assert missing.message == "spec.nodeGroups[0]: LocalModelNodeGroup gpu7 not found"
    fine = await validator(request("CREATE", obj=cache_obj("ok", "gs://b/ok", size="1Gi")))
    assert fine.allowed


async def test_the_handler_denies_a_namespace_cache_named_like_a_cluster_cache() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("shared", "gs://b/a"))
    obj = cache_obj("shared", "gs://b/other", namespace="t")
    answer = await stores.validator(namespaced=True)(request("CREATE", obj=obj, namespace="t"))
    assert answer.field == "metadata.name"
    assert "LocalModelCache shared has the same name" in answer.message


async def test_the_handler_denies_an_object_of_the_wrong_shape() -> None:
    stores = Stores()
    answer = await stores.validator(namespaced=False)(
        request("CREATE", obj={"kind": "LocalModelCache", "metadata": {"name": "x"}, "spec": {}})
    )
    assert not answer.allowed
    assert answer.code == 400
    assert answer.message.startswith("expected a LocalModelCache")


async def test_the_handler_refuses_to_judge_before_the_stores_synced() -> None:
    stores = Stores()
    stores.synced = False
    answer = await stores.validator(namespaced=False)(request("CREATE", obj=cache_obj("x")))
    assert not answer.allowed
    assert answer.code == 503
