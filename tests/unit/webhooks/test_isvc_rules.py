"""InferenceService mutation, issue 21: the node group follows the predictor's node
constraints (items 3), and a cache whose name cannot be a label value is skipped with a
warning instead of an invalid label (item 4). Cache validation refuses such names on create."""

from __future__ import annotations

from typing import Any

from localcache.api import modelcache
from localcache.caching import groupfit
from localcache.runtime import store
from localcache.webhooks import isvchandler, validation
from tests.unit.caching.test_groupfit import GROUPS, NODES, group, node
from tests.unit.webhooks import test_validation as tv
from tests.unit.webhooks.test_isvc import (
    LABEL,
    NS_LABEL,
    PVC,
    Stores,
    apply,
    cache_obj,
    cluster,
    decide,
    isvc_obj,
    namespaced,
    request,
)

Obj = dict[str, Any]
URI = "gs://bucket/model"
LONG = "m" * 70


def with_predictor(obj: Obj, **fields: Any) -> Obj:
    obj["spec"]["predictor"].update(fields)
    return obj


def fit_for(obj: Obj, nodes: list[Obj] | None = NODES) -> groupfit.GroupFit:
    return groupfit.GroupFit(
        GROUPS, nodes, (groupfit.Workload.of(obj["spec"]["predictor"], "the predictor"),)
    )


def test_a_predictor_node_selector_for_the_second_group_gets_its_claim() -> None:
    obj = with_predictor(isvc_obj(URI), nodeSelector={"gpu": "h100"})
    decision = decide(obj, cluster("model1", URI, groups=("a100", "h100")), fit=fit_for(obj))
    assert decision.annotations[PVC] == "model1-h100"
    assert decision.warnings == ()


def test_without_constraints_the_fit_is_not_consulted() -> None:
    obj = isvc_obj(URI)
    # a fit that knows only h100: consulted, it would pick model1-h100
    only_h100 = groupfit.GroupFit(
        {"h100": GROUPS["h100"]}, NODES, (groupfit.Workload.of(obj["spec"]["predictor"]),)
    )
    decision = decide(obj, cluster("model1", URI, groups=("a100", "h100")), fit=only_h100)
    assert decision.annotations[PVC] == "model1-a100"


def test_no_fitting_group_keeps_the_first_and_warns_why() -> None:
    obj = with_predictor(isvc_obj(URI), nodeSelector={"gpu": "b200"})
    decision = decide(obj, cluster("model1", URI, groups=("a100", "h100")), fit=fit_for(obj))
    assert decision.annotations[PVC] == "model1-a100"
    assert decision.warnings == (
        "LocalModelCache model1: no node of node groups a100, h100 matches both the group and "
        "the predictor's nodeSelector gpu=b200; keeping its first node group a100, as KServe "
        "would (claim model1-a100): the pods cannot be scheduled where the model is cached",
    )


def test_the_annotation_wins_and_warns_when_it_does_not_fit() -> None:
    obj = with_predictor(
        isvc_obj(URI, annotations={"serving.kserve.io/nodegroup": "a100"}),
        nodeSelector={"gpu": "h100"},
    )
    decision = decide(obj, cluster("model1", URI, groups=("a100", "h100")), fit=fit_for(obj))
    assert decision.annotations[PVC] == "model1-a100"
    assert len(decision.warnings) == 1
    assert (
        "using node group a100 as annotation serving.kserve.io/nodegroup asks"
        in (decision.warnings[0])
    )


def test_a_long_named_cache_is_skipped_with_a_warning_naming_it() -> None:
    decision = decide(isvc_obj(URI), cluster(LONG, URI))
    assert decision.labels == {LABEL: None, NS_LABEL: None}
    assert decision.warnings == (
        f"LocalModelCache {LONG} serves {URI} but is not used: metadata.name {LONG} is 70 "
        "characters; a cache's name is written into the label "
        "internal.serving.kserve.io/localmodel of every InferenceService it serves and must "
        "be at most 63 characters; create a cache with a shorter name",
    )


def test_a_valid_cache_still_serves_beside_a_long_named_one() -> None:
    decision = decide(isvc_obj(f"{URI}/v1"), cluster(LONG, f"{URI}/v1"), cluster("short", URI))
    assert decision.labels[LABEL] == "short"
    assert len(decision.warnings) == 1
    assert LONG in decision.warnings[0]


def test_a_long_named_namespace_cache_falls_back_to_the_cluster_cache() -> None:
    decision = decide(isvc_obj(URI), namespaced(LONG, URI), cluster("shared", URI))
    assert decision.labels[LABEL] == "shared"
    assert f"LocalModelNamespaceCache default/{LONG}" in decision.warnings[0]


def test_a_63_character_name_is_used() -> None:
    name = "m" * 63
    assert decide(isvc_obj(URI), cluster(name, URI)).labels[LABEL] == name


async def test_an_update_keeps_the_claim_the_isvc_has_while_its_group_fits() -> None:
    stores = Stores()
    for g in ("a100", "h100"):
        stores.node_groups.upsert(group(g, g[0]).to_dict())
    nodes = store.Store()
    for n in NODES:
        nodes.upsert(n)
    stores.caches.upsert(cache_obj("model1", URI, groups=("a100", "h100")))
    mutator = isvchandler.IsvcMutator(
        caches=stores.caches.view(),
        namespace_caches=stores.namespace_caches.view(),
        node_groups=stores.node_groups.view(),
        nodes=nodes.view(),
        enabled=lambda: True,
        synced=lambda: True,
    )
    anywhere = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    ]}}  # fmt: skip
    obj = with_predictor(isvc_obj(URI), affinity={"nodeAffinity": anywhere})
    created = apply(obj, (await mutator(request(obj))).patch)
    assert created["metadata"]["annotations"][PVC] == "model1-a100"
    created["metadata"]["annotations"][PVC] = "model1-h100"  # chosen when only h100 fitted
    updated = apply(created, (await mutator(request(created, operation="UPDATE"))).patch)
    assert updated["metadata"]["annotations"][PVC] == "model1-h100"


async def test_the_handler_judges_the_group_by_the_nodes_it_sees() -> None:
    stores = Stores()
    for g in ("a100", "h100"):
        stores.node_groups.upsert(group(g, g[0]).to_dict())
    nodes = store.Store()
    stores.caches.upsert(cache_obj("model1", URI, groups=("a100", "h100")))
    mutator = isvchandler.IsvcMutator(
        caches=stores.caches.view(),
        namespace_caches=stores.namespace_caches.view(),
        node_groups=stores.node_groups.view(),
        nodes=nodes.view(),
        enabled=lambda: True,
        synced=lambda: True,
    )
    obj = with_predictor(isvc_obj(URI), nodeSelector={"gpu": "h100"})
    before = await mutator(request(obj))
    assert "no node of node groups a100, h100" in " ".join(before.warnings)
    nodes.upsert(node("n-h", pool="h", gpu="h100"))
    after = await mutator(request(obj))
    assert after.warnings == ()
    assert apply(obj, after.patch)["metadata"]["annotations"][PVC] == "model1-h100"


def test_validation_refuses_creating_a_long_named_cache_of_either_kind() -> None:
    for cache in (tv.lmc(LONG), tv.lmnc(LONG)):
        violations = validation.validate_write(cache, snapshot=tv.snapshot())
        assert [str(v) for v in violations] == [
            f"metadata.name: {LONG} is 70 characters; a cache's name is written into the label "
            "internal.serving.kserve.io/localmodel of every InferenceService it serves and must "
            "be at most 63 characters"
        ]


def test_validation_allows_updating_and_deleting_an_existing_long_named_cache() -> None:
    old = tv.lmc(LONG)
    new = modelcache.LocalModelCache.from_dict(tv.cache_obj(LONG, size="2Gi"))
    assert validation.validate_write(new, old=old, snapshot=tv.snapshot()) == []
    assert validation.validate_delete(old, snapshot=validation.Snapshot()) == []
    assert validation.validate_write(tv.lmc("m" * 63), snapshot=tv.snapshot()) == []
