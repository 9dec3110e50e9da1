"""Pod mutation: serving pods wait for a complete copy of the cache whose claim they mount."""

from __future__ import annotations

from typing import Any

from localcache.caching import readiness
from localcache.runtime import store
from localcache.runtime.serving import review
from localcache.webhooks import podwait
from tests.unit.webhooks.test_isvc import apply

Obj = dict[str, Any]


def cache(name: str, *, groups: tuple[str, ...] = ("gpu",), namespace: str | None = None) -> Obj:
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": {"sourceModelUri": "s3://b/m", "nodeGroups": list(groups)}}


def pod(*claims: str, affinity: Obj | None = None) -> Obj:
    spec: Obj = {
        "containers": [{"name": "kserve-container", "image": "x"}],
        "volumes": [
            {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c, "readOnly": True}}
            for i, c in enumerate(claims)
        ]
        + [{"name": "scratch", "emptyDir": {}}],
    }
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"generateName": "m-", "labels": {"app": "m"}}, "spec": spec}


def request(obj: Obj, *, operation: str = "CREATE", namespace: str = "team-a") -> review.Request:
    return review.Request(
        uid="u",
        kind=review.GroupVersionKind("", "v1", "Pod"),
        resource=review.GroupVersionResource("", "v1", "pods"),
        namespace=namespace,
        name="",
        operation=operation,  # type: ignore[arg-type]
        user=review.UserInfo(),
        object=obj,
        old_object=None,
    )


class Fixture:
    def __init__(self) -> None:
        indexers = {podwait.SERVING_CLAIM_INDEX: podwait.index_serving_claims}
        self.caches = store.Store(indexers)
        self.namespace_caches = store.Store(indexers)
        self.enabled = True
        self.synced = True

    def mutator(self) -> podwait.PodWaitMutator:
        return podwait.PodWaitMutator(
            caches=self.caches.view(),
            namespace_caches=self.namespace_caches.view(),
            enabled=lambda: self.enabled,
            synced=lambda: self.synced,
        )


async def test_a_pod_mounting_a_serving_claim_waits_for_that_cache() -> None:
    fx = Fixture()
    fx.caches.upsert(cache("iris", groups=("cpu", "gpu")))
    obj = pod("iris-gpu")
    answer = await fx.mutator()(request(obj))
    assert answer.allowed
    got = apply(obj, answer.patch)
    assert readiness.required_keys(got) == {readiness.label_key("iris")}
    assert got["metadata"]["annotations"] == {readiness.WAITS_FOR_ANNOTATION: "iris"}
    assert got["metadata"]["labels"] == {"app": "m"}
    assert got["spec"]["volumes"] == obj["spec"]["volumes"]


async def test_the_pods_namespace_cache_wins_and_other_namespaces_do_not_count() -> None:
    fx = Fixture()
    fx.caches.upsert(cache("llama"))
    fx.namespace_caches.upsert(cache("llama", namespace="team-a"))
    fx.namespace_caches.upsert(cache("adapter", namespace="team-b"))
    obj = pod("llama-gpu", "adapter-gpu")
    got = apply(obj, (await fx.mutator()(request(obj))).patch)
    assert readiness.required_keys(got) == {readiness.label_key("team-a/llama")}
    assert got["metadata"]["annotations"][readiness.WAITS_FOR_ANNOTATION] == "team-a/llama"


async def test_every_mounted_cache_is_required_in_every_term() -> None:
    fx = Fixture()
    fx.caches.upsert(cache("base"))
    fx.caches.upsert(cache("lora"))
    gpu = {"key": "gpu", "operator": "Exists"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [gpu]}, {"matchExpressions": []}]
            }
        }
    }
    obj = pod("base-gpu", "lora-gpu", affinity=affinity)
    got = apply(obj, (await fx.mutator()(request(obj))).patch)
    terms = got["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    wanted = [readiness.requirement("base"), readiness.requirement("lora")]
    assert terms == [{"matchExpressions": [gpu, *wanted]}, {"matchExpressions": wanted}]


async def test_pods_are_left_unchanged_when_off_unsynced_unrelated_or_not_created() -> None:
    fx = Fixture()
    fx.caches.upsert(cache("iris"))
    deleting = cache("old")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    fx.caches.upsert(deleting)
    assert (await fx.mutator()(request(pod("other-claim")))).patch == ()
    assert (await fx.mutator()(request(pod("old-gpu")))).patch == ()
    assert (await fx.mutator()(request(pod("iris-gpu"), operation="UPDATE"))).patch == ()
    fx.enabled = False
    assert (await fx.mutator()(request(pod("iris-gpu")))).patch == ()
    fx.enabled, fx.synced = True, False
    answer = await fx.mutator()(request(pod("iris-gpu")))
    assert answer.allowed
    assert answer.patch == ()
