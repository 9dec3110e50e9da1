"""Volume plans: names, owners, pre-binding and annotations per cache kind."""

from __future__ import annotations

from localcache.api import modelcache, nodegroup
from localcache.caching import keys
from localcache.controllers import clustercache, namespacecache, state, volumeplan, volumes
from localcache.csi import entitlement

GROUP = nodegroup.LocalModelNodeGroup.from_dict(
    {
        "metadata": {"name": "gpu1"},
        "spec": {
            "storageLimit": "10Gi",
            "persistentVolumeSpec": {
                "hostPath": {"path": "/models"},
                "capacity": {"storage": "1Gi"},
            },
            "persistentVolumeClaimSpec": {"storageClassName": "standard"},
        },
    }
)
SPEC = {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["gpu1", "missing"]}


def test_cluster_cache_plan_owns_everything_and_pre_binds_each_pv() -> None:
    cache = modelcache.LocalModelCache.from_dict(
        {"metadata": {"name": "iris", "uid": "u1"}, "spec": SPEC}
    )
    pairs = volumeplan.plan(
        clustercache.SCOPE,
        cache,
        groups={"gpu1": GROUP},
        serving=[("prod", "gpu1"), ("prod", "missing")],
        job_namespace="jobs",
    )
    assert [(p.role, p.pv_name, str(p.pvc_key)) for p in pairs] == [
        ("download", "iris-gpu1-download", "jobs/iris-gpu1"),
        ("serving", "iris-gpu1-prod", "prod/iris-gpu1"),
    ]
    download = pairs[0]
    assert download.pv["spec"]["claimRef"]["name"] == "iris-gpu1"
    assert download.pv["spec"]["claimRef"]["namespace"] == "jobs"
    assert "hostPath" not in download.pv["spec"], "the whole root is never a pod's volume"
    assert download.pv["spec"]["csi"] == {
        "driver": "localcache.csi.kserve.io",
        "volumeHandle": "iris-gpu1-download",
        "readOnly": False,
        "volumeAttributes": {
            entitlement.ROLE: "download",
            entitlement.CACHE: "iris",
            entitlement.STORAGE_KEY: keys.storage_key("s3://b/m"),
            entitlement.ROOT: "/models",
        },
    }
    assert pairs[1].pv["spec"]["csi"]["readOnly"] is True
    assert pairs[1].pv["spec"]["csi"]["volumeAttributes"][entitlement.ROLE] == "serving"
    assert download.pvc["spec"] == {
        "storageClassName": "standard",
        "volumeName": "iris-gpu1-download",
    }
    assert download.pv["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert download.pvc["metadata"]["annotations"] == {
        state.OWNER_ANNOTATION: "LocalModelCache/iris",
        state.ROLE_ANNOTATION: "download",
        volumeplan.STORAGE_KEY_ANNOTATION: keys.storage_key("s3://b/m"),
    }
    assert download.pv["metadata"]["annotations"] == download.pvc["metadata"]["annotations"]
    assert "claimRef" not in GROUP.spec.persistent_volume_spec, "the template is not mutated"


def test_host_path_volume_source_keeps_the_node_groups_own_source() -> None:
    cache = modelcache.LocalModelCache.from_dict(
        {"metadata": {"name": "iris", "uid": "u1"}, "spec": SPEC}
    )
    (download,) = volumeplan.plan(
        clustercache.SCOPE,
        cache,
        groups={"gpu1": GROUP},
        serving=[],
        job_namespace="jobs",
        volume_source="hostPath",
    )
    assert download.pv["spec"]["hostPath"] == {"path": "/models"}
    assert "csi" not in download.pv["spec"]


def test_namespace_cache_plan_keeps_pvs_ownerless_and_pvcs_in_its_namespace() -> None:
    cache = modelcache.LocalModelNamespaceCache.from_dict(
        {"metadata": {"name": "iris", "namespace": "team", "uid": "u2"}, "spec": SPEC}
    )
    pairs = volumeplan.plan(
        namespacecache.SCOPE,
        cache,
        groups={"gpu1": GROUP},
        serving=[("team", "gpu1")],
        job_namespace="jobs",
    )
    assert [(p.pv_name, str(p.pvc_key)) for p in pairs] == [
        ("iris-gpu1-team-download", "team/iris-gpu1-download"),
        ("iris-gpu1-team", "team/iris-gpu1"),
    ]
    for pair in pairs:
        assert "ownerReferences" not in pair.pv["metadata"]
        assert pair.pvc["metadata"]["ownerReferences"][0]["kind"] == "LocalModelNamespaceCache"


def _stores_with_pvs(*pvs: dict[str, object]) -> state.Stores:
    from localcache.runtime import store

    pv_store = store.Store(indexers=state.VOLUME_INDEXERS)
    for pv in pvs:
        pv_store.upsert(pv)
    empty = store.Store().view()
    return state.Stores(
        caches=empty, namespace_caches=empty, nodes=empty, local_model_nodes=empty,
        node_groups=empty, persistent_volumes=pv_store.view(), persistent_volume_claims=empty,
        inference_services=None,
    )  # fmt: skip


def _pv(name: str, claim_namespace: str, claim: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"claimRef": {"namespace": claim_namespace, "name": claim}},
    }


def test_a_namespace_cache_never_deletes_another_caches_pv_that_shares_its_implied_name() -> None:
    """Issue 13 bug 5: namespace cache `llama` in `gpu` on group `cpu` deleted cluster cache
    `llama-cpu`'s PV `llama-cpu-gpu-download` by its guessed name."""
    cache = modelcache.LocalModelNamespaceCache.from_dict(
        {
            "metadata": {"name": "llama", "namespace": "gpu", "uid": "u2"},
            "spec": {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["cpu"]},
        }
    )
    others = _pv("llama-cpu-gpu-download", "kserve-localmodel-jobs", "llama-cpu")
    assert volumes.ownerless_pvs(namespacecache.SCOPE, cache, stores=_stores_with_pvs(others)) == []
    kserves = _pv("llama-cpu-gpu-download", "gpu", "llama-cpu-download")
    assert volumes.ownerless_pvs(namespacecache.SCOPE, cache, stores=_stores_with_pvs(kserves)) == [
        "llama-cpu-gpu-download"
    ]
