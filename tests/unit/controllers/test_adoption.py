"""Adoption of the PVs/PVCs KServe's localmodel add-on created: who is provably the cache's
(`adoption`), and what `reconcile_volumes` writes for each verdict."""

from __future__ import annotations

import copy
import json
from typing import Any, cast

import pytest

from localcache.api import modelcache, nodegroup
from localcache.caching import conditions
from localcache.controllers import (
    adoption,
    clustercache,
    namespacecache,
    state,
    volumeplan,
    volumes,
)
from localcache.runtime import errors, kube, store
from localcache.runtime.keys import ObjectKey

Obj = dict[str, Any]
JOBS = "jobs"
KSERVE_JOBS = "kserve-localmodel-jobs"
AFFINITY = {
    "required": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu1"]}]}
        ]
    }
}
GROUP = nodegroup.LocalModelNodeGroup.from_dict(
    {
        "metadata": {"name": "gpu1"},
        "spec": {
            "storageLimit": "10Gi",
            "persistentVolumeSpec": {
                "local": {"path": "/models"},
                "capacity": {"storage": "1Gi"},
                "persistentVolumeReclaimPolicy": "Retain",
                "nodeAffinity": AFFINITY,
            },
            "persistentVolumeClaimSpec": {"storageClassName": "standard"},
        },
    }
)
SPEC = {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["gpu1"]}
CLUSTER = modelcache.LocalModelCache.from_dict(
    {"metadata": {"name": "iris", "uid": "cache-uid"}, "spec": SPEC}
)
NAMESPACED = modelcache.LocalModelNamespaceCache.from_dict(
    {"metadata": {"name": "iris", "namespace": "team", "uid": "ns-cache-uid"}, "spec": SPEC}
)


def _owner_ref(kind: str = "LocalModelCache", uid: str = "cache-uid") -> Obj:
    """The controller reference KServe's `SetControllerReference` writes."""
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": kind,
        "name": "iris",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _kserve_pv(
    name: str, *, claim: tuple[str, str, str] | None, owner: Obj | None, policy: str = "Retain"
) -> Obj:
    """A PV as KServe creates it (the node group's spec, an ownerReference or none) after the
    binder set its claimRef (namespace, name, uid)."""
    spec = copy.deepcopy(GROUP.spec.persistent_volume_spec)
    spec["persistentVolumeReclaimPolicy"] = policy
    if claim is not None:
        ns, claim_name, uid = claim
        spec["claimRef"] = {
            "kind": "PersistentVolumeClaim",
            "namespace": ns,
            "name": claim_name,
            "uid": uid,
        }
    meta: Obj = {"name": name, "uid": f"pv-{name}", "resourceVersion": "10"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": spec, "status": {"phase": "Bound" if claim else "Available"}}


def _kserve_pvc(namespace: str, name: str, *, volume: str, owner: Obj | None, uid: str) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "11"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "metadata": meta,
        "spec": {"storageClassName": "standard", "volumeName": volume},
        "status": {"phase": "Bound"},
    }


def _claims(*pvcs: Obj) -> store.Reader:
    found = store.Store(indexers=state.VOLUME_INDEXERS)
    for pvc in pvcs:
        found.upsert(pvc)
    return found.view()


def _cluster_pairs(serving: tuple[tuple[str, str], ...] = (("prod", "gpu1"),)) -> list[Any]:
    return volumeplan.plan(
        clustercache.SCOPE, CLUSTER, groups={"gpu1": GROUP}, serving=serving, job_namespace=JOBS
    )


CLUSTER_OWNER = adoption.Owner("LocalModelCache/iris", "LocalModelCache", "cache-uid")
NS_OWNER = adoption.Owner(
    "LocalModelNamespaceCache/team/iris", "LocalModelNamespaceCache", "ns-cache-uid"
)


# ------------------------------------------------------------------------ claims


SERVING_PV = _kserve_pv("iris-gpu1-prod", claim=("prod", "iris-gpu1", "c1"), owner=_owner_ref())


def test_a_claim_owned_by_the_cache_uid_and_naming_the_wanted_pv_is_adopted() -> None:
    pvc = _kserve_pvc("prod", "iris-gpu1", volume="iris-gpu1-prod", owner=_owner_ref(), uid="c1")
    verdict = adoption.judge_claim(
        pvc, owner=CLUSTER_OWNER, pv_name="iris-gpu1-prod", pv=SERVING_PV
    )
    assert verdict.verdict == "adopt"


def test_a_claim_is_the_caches_only_when_the_caches_pv_records_its_uid() -> None:
    """Security review finding 1 (`ephemeral` variant): a tenant's claim under the wanted name
    with our annotation (or the cache's ownerReference) was taken as the cache's; the marks
    are forgeable, the PV's claimRef uid is not."""
    marked = _kserve_pvc("prod", "iris-gpu1", volume="iris-gpu1-prod", owner=_owner_ref(), uid="c1")
    marked["metadata"]["annotations"] = {state.OWNER_ANNOTATION: CLUSTER_OWNER.id}
    judge = adoption.judge_claim
    assert judge(marked, owner=CLUSTER_OWNER, pv_name="iris-gpu1-prod", pv=SERVING_PV) == (
        adoption.OURS
    )
    other_uid = copy.deepcopy(SERVING_PV)
    other_uid["spec"]["claimRef"]["uid"] = "c-forged-over"
    pre_bound = copy.deepcopy(SERVING_PV)
    del pre_bound["spec"]["claimRef"]["uid"]
    for pv in (None, other_uid, pre_bound):
        verdict = judge(marked, owner=CLUSTER_OWNER, pv_name="iris-gpu1-prod", pv=pv)
        assert verdict.verdict == "unproven", pv
    kserves = _kserve_pvc(
        "prod", "iris-gpu1", volume="iris-gpu1-prod", owner=_owner_ref(), uid="c1"
    )
    verdict = judge(kserves, owner=CLUSTER_OWNER, pv_name="iris-gpu1-prod", pv=None)
    assert verdict.verdict == "taken"
    assert "no PersistentVolume of this cache records its uid" in verdict.reason
    ephemeral = copy.deepcopy(marked)
    ephemeral["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "thief", "uid": "p1", "controller": True}
    ]
    verdict = judge(ephemeral, owner=CLUSTER_OWNER, pv_name="iris-gpu1-prod", pv=None)
    assert (verdict.verdict, verdict.reason) == ("taken", "it is owned by Pod thief (uid p1)")


@pytest.mark.parametrize(
    ("owner", "volume", "why"),
    [
        (None, "iris-gpu1-prod", "no ownerReference to this cache"),
        (_owner_ref(uid="earlier-iris"), "iris-gpu1-prod", "owned by LocalModelCache iris"),
        (_owner_ref(kind="LocalModelNamespaceCache"), "iris-gpu1-prod", "owned by"),
        (_owner_ref(), "someone-elses-pv", "names PersistentVolume someone-elses-pv"),
    ],
)
def test_a_claim_under_the_wanted_name_that_is_not_provably_the_caches_is_taken(
    owner: Obj | None, volume: str, why: str
) -> None:
    pvc = _kserve_pvc("prod", "iris-gpu1", volume=volume, owner=owner, uid="c1")
    verdict = adoption.judge_claim(
        pvc, owner=CLUSTER_OWNER, pv_name="iris-gpu1-prod", pv=SERVING_PV
    )
    assert verdict.verdict == "taken"
    assert why in verdict.reason


def test_our_annotation_decides_before_any_owner_reference() -> None:
    ours = _kserve_pvc("prod", "iris-gpu1", volume="x", owner=None, uid="c1")
    ours["metadata"]["annotations"] = {state.OWNER_ANNOTATION: CLUSTER_OWNER.id}
    pv = _kserve_pv("x", claim=("prod", "iris-gpu1", "c1"), owner=None)
    verdict = adoption.judge_claim(ours, owner=CLUSTER_OWNER, pv_name="x", pv=pv)
    assert verdict.verdict == "ours"
    other = copy.deepcopy(ours)
    other["metadata"]["annotations"] = {state.OWNER_ANNOTATION: "LocalModelCache/llama"}
    other["metadata"]["ownerReferences"] = [_owner_ref()]
    verdict = adoption.judge_claim(other, owner=CLUSTER_OWNER, pv_name="x", pv=pv)
    assert (verdict.verdict, verdict.reason) == ("taken", "it belongs to LocalModelCache/llama")


# ------------------------------------------------------------------------ volumes


def _judge_pv(pv: Obj, pair: Any, owner: adoption.Owner, *pvcs: Obj) -> adoption.Judgement:
    return adoption.judge_volume(
        pv,
        owner=owner,
        role=pair.role,
        template=pair.pv,
        wanted_claim=pair.pvc_key,
        claims=_claims(*pvcs),
    )


def test_a_cluster_cache_pv_owned_by_its_uid_is_adopted_and_another_uid_is_taken() -> None:
    serving = _cluster_pairs()[1]
    pv = _kserve_pv("iris-gpu1-prod", claim=("prod", "iris-gpu1", "c1"), owner=_owner_ref())
    assert _judge_pv(pv, serving, CLUSTER_OWNER).verdict == "adopt"
    earlier = _kserve_pv(
        "iris-gpu1-prod", claim=("prod", "iris-gpu1", "c1"), owner=_owner_ref(uid="earlier-iris")
    )
    verdict = _judge_pv(earlier, serving, CLUSTER_OWNER)
    assert verdict.verdict == "taken"
    assert "earlier-iris" in verdict.reason


def _ns_serving() -> Any:
    return volumeplan.plan(
        namespacecache.SCOPE,
        NAMESPACED,
        groups={"gpu1": GROUP},
        serving=[("team", "gpu1")],
        job_namespace=JOBS,
    )[1]


def test_an_ownerless_pv_is_adopted_when_its_bound_claim_is_the_caches_wanted_pvc() -> None:
    serving = _ns_serving()
    assert (serving.pv_name, str(serving.pvc_key)) == ("iris-gpu1-team", "team/iris-gpu1")
    pvc = _kserve_pvc(
        "team",
        "iris-gpu1",
        volume="iris-gpu1-team",
        owner=_owner_ref("LocalModelNamespaceCache", "ns-cache-uid"),
        uid="c7",
    )
    pv = _kserve_pv("iris-gpu1-team", claim=("team", "iris-gpu1", "c7"), owner=None)
    assert _judge_pv(pv, serving, NS_OWNER, pvc).verdict == "adopt"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("claim-uid", "not the claim team/iris-gpu1 that exists now"),
        ("claim-owner", "its claim team/iris-gpu1 is not this cache's"),
        ("claim-missing", "not the claim team/iris-gpu1 that exists now"),
        ("path", "path or nodeAffinity differ"),
        ("affinity", "path or nodeAffinity differ"),
        ("unbound", "bound to no claim"),
        ("other-claim", "bound to claim team/other, not team/iris-gpu1"),
    ],
)
def test_an_ownerless_pv_without_full_proof_is_taken(change: str, why: str) -> None:
    serving = _ns_serving()
    owner = (
        None if change == "claim-owner" else _owner_ref("LocalModelNamespaceCache", "ns-cache-uid")
    )
    pvc = _kserve_pvc("team", "iris-gpu1", volume="iris-gpu1-team", owner=owner, uid="c7")
    claim_uid = "c-earlier" if change == "claim-uid" else "c7"
    claim = (
        None
        if change == "unbound"
        else ("team", "other" if change == "other-claim" else "iris-gpu1", claim_uid)
    )
    pv = _kserve_pv("iris-gpu1-team", claim=claim, owner=None)
    if change == "path":
        pv["spec"]["local"] = {"path": "/elsewhere"}
    if change == "affinity":
        pv["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": []}}
    verdict = _judge_pv(pv, serving, NS_OWNER, *(() if change == "claim-missing" else (pvc,)))
    assert verdict.verdict == "taken"
    assert why in verdict.reason


def test_kserves_download_pv_bound_to_its_claim_in_kserves_job_namespace_is_stale() -> None:
    """After a migration the cluster cache's download PV is bound to KServe's download PVC in
    `kserve-localmodel-jobs`, not to ours in the configured job namespace."""
    download = _cluster_pairs()[0]
    assert str(download.pvc_key) == f"{JOBS}/iris-gpu1"
    old = _kserve_pvc(
        KSERVE_JOBS, "iris-gpu1", volume="iris-gpu1-download", owner=_owner_ref(), uid="old"
    )
    pv = _kserve_pv(
        "iris-gpu1-download", claim=(KSERVE_JOBS, "iris-gpu1", "old"), owner=_owner_ref()
    )
    verdict = _judge_pv(pv, download, CLUSTER_OWNER, old)
    assert verdict.verdict == "stale"
    assert verdict.old_claim is old
    gone = _judge_pv(pv, download, CLUSTER_OWNER)
    assert (gone.verdict, gone.old_claim) == ("stale", None)
    strangers = copy.deepcopy(old)
    del strangers["metadata"]["ownerReferences"]
    verdict = _judge_pv(pv, download, CLUSTER_OWNER, strangers)
    assert verdict.verdict == "taken"
    assert f"claim {KSERVE_JOBS}/iris-gpu1, which is not provably this cache's" in verdict.reason


def test_kserves_namespace_cache_download_pv_is_taken_its_claim_proves_nothing() -> None:
    """KServe's namespace-cache download PV has no owner and is bound to an ownerless PVC in
    KServe's job namespace: nothing proves whose it is (reported, never deleted)."""
    download = volumeplan.plan(
        namespacecache.SCOPE, NAMESPACED, groups={"gpu1": GROUP}, serving=(), job_namespace=JOBS
    )[0]
    claim = (KSERVE_JOBS, "iris-gpu1-team-download", "k1")
    pv = _kserve_pv(download.pv_name, claim=claim, owner=None)
    pvc = _kserve_pvc(KSERVE_JOBS, claim[1], volume=download.pv_name, owner=None, uid="k1")
    verdict = _judge_pv(pv, download, NS_OWNER, pvc)
    assert verdict.verdict == "taken"
    assert "Retain" in verdict.remedy
    assert f"delete claim {KSERVE_JOBS}/iris-gpu1-team-download" in verdict.remedy


def test_a_serving_pv_of_the_cache_bound_to_another_claim_is_not_replaced() -> None:
    serving = _cluster_pairs()[1]
    pv = _kserve_pv("iris-gpu1-prod", claim=("prod", "other", "c1"), owner=_owner_ref())
    assert _judge_pv(pv, serving, CLUSTER_OWNER).verdict == "taken"


def test_the_adoption_patch_adds_our_marks_only_guarded_by_resource_version() -> None:
    serving = _cluster_pairs()[1]
    pv = _kserve_pv("iris-gpu1-prod", claim=("prod", "iris-gpu1", "c1"), owner=_owner_ref())
    assert adoption.adoption_patch(pv, serving.pv) == {
        "metadata": {
            "resourceVersion": "10",
            "annotations": serving.pv["metadata"]["annotations"],
            "labels": {state.MANAGED_BY_LABEL: state.MANAGED_BY},
        }
    }
    assert set(serving.pv["metadata"]["annotations"]) == {
        state.OWNER_ANNOTATION,
        state.ROLE_ANNOTATION,
        volumeplan.STORAGE_KEY_ANNOTATION,
    }


def test_the_retain_patch_is_needed_only_for_other_policies() -> None:
    assert adoption.retain_patch(_kserve_pv("a", claim=None, owner=None)) is None
    recycle = _kserve_pv("a", claim=None, owner=None, policy="Recycle")
    assert adoption.retain_patch(recycle) == {
        "metadata": {"resourceVersion": "10"},
        "spec": {"persistentVolumeReclaimPolicy": "Retain"},
    }


# ------------------------------------------------------------------------ reconcile_volumes


class RecordingApi:
    """Records writes as "verb Kind ns/name"; patches answer `conflict` when set."""

    def __init__(self, conflict: bool = False, refuse_pvs: bool = False) -> None:
        self.writes: list[str] = []
        self.patches: list[Obj] = []
        self.created: list[Obj] = []
        self.conflict = conflict
        self.refuse_pvs = refuse_pvs

    @staticmethod
    def _where(res: kube.Resource, name: str, namespace: str | None) -> str:
        return f"{res.kind} {namespace}/{name}" if namespace else f"{res.kind} {name}"

    async def create(self, res: kube.Resource, obj: Obj, **kw: Any) -> Obj:
        self.writes.append(
            "create " + self._where(res, obj["metadata"]["name"], kw.get("namespace"))
        )
        self.created.append(obj)
        if self.refuse_pvs and res.kind == "PersistentVolume":
            raise errors.ApiError(403, "forbidden", reason="Forbidden")
        made = copy.deepcopy(obj)
        made["metadata"]["uid"] = f"uid-{len(self.created)}"
        return made

    async def patch(self, res: kube.Resource, name: str, patch: Obj, **kw: Any) -> Obj:
        self.writes.append("patch " + self._where(res, name, kw.get("namespace")))
        self.patches.append(patch)
        if self.conflict:
            raise errors.Conflict(409, "the object has been modified", reason="Conflict")
        return {}

    async def delete(self, res: kube.Resource, name: str, **kw: Any) -> Obj:
        self.writes.append("delete " + self._where(res, name, kw.get("namespace")))
        return {}


def _stores(pvs: list[Obj], pvcs: list[Obj]) -> state.Stores:
    empty = store.Store().view()
    pv_store, pvc_store = store.Store(state.VOLUME_INDEXERS), store.Store(state.VOLUME_INDEXERS)
    for pv in pvs:
        pv_store.upsert(pv)
    for pvc in pvcs:
        pvc_store.upsert(pvc)
    return state.Stores(
        caches=empty,
        namespace_caches=empty,
        nodes=empty,
        local_model_nodes=empty,
        node_groups=empty,
        persistent_volumes=pv_store.view(),
        persistent_volume_claims=pvc_store.view(),
        inference_services=None,
    )


async def _reconcile(api: RecordingApi, stores: state.Stores, pairs: list[Any], **kw: Any) -> Any:
    return await volumes.reconcile_volumes(
        cast(state.Api, api),
        stores=stores,
        owner=CLUSTER_OWNER.id,
        pairs=pairs,
        manage_serving=True,
        **kw,
    )


def _kserve_cluster_objects(policy: str = "Retain") -> tuple[list[Obj], list[Obj]]:
    """What KServe's controller leaves for cluster cache iris: a serving pair in `prod` and a
    download pair whose PVC is in KServe's job namespace."""
    pvs = [
        _kserve_pv("iris-gpu1-prod", claim=("prod", "iris-gpu1", "s1"), owner=_owner_ref()),
        _kserve_pv(
            "iris-gpu1-download",
            claim=(KSERVE_JOBS, "iris-gpu1", "d1"),
            owner=_owner_ref(),
            policy=policy,
        ),
    ]
    pvcs = [
        _kserve_pvc("prod", "iris-gpu1", volume="iris-gpu1-prod", owner=_owner_ref(), uid="s1"),
        _kserve_pvc(
            KSERVE_JOBS, "iris-gpu1", volume="iris-gpu1-download", owner=_owner_ref(), uid="d1"
        ),
    ]
    return pvs, pvcs


async def test_kserves_serving_pair_is_adopted_and_its_download_pair_released() -> None:
    api = RecordingApi()
    outcome = await _reconcile(api, _stores(*_kserve_cluster_objects()), _cluster_pairs())
    assert api.writes == [
        f"delete PersistentVolumeClaim {KSERVE_JOBS}/iris-gpu1",
        "delete PersistentVolume iris-gpu1-download",
        "patch PersistentVolume iris-gpu1-prod",
        "patch PersistentVolumeClaim prod/iris-gpu1",
    ]
    assert [(a.kind, a.name, a.namespace) for a in outcome.adopted] == [
        ("PersistentVolume", "iris-gpu1-prod", ""),
        ("PersistentVolumeClaim", "iris-gpu1", "prod"),
    ]
    assert outcome.taken == []
    assert outcome.error is None


async def test_a_stale_download_pv_is_set_to_retain_before_its_claim_is_released() -> None:
    api = RecordingApi()
    pvs, pvcs = _kserve_cluster_objects(policy="Recycle")
    await _reconcile(api, _stores(pvs, pvcs), _cluster_pairs(serving=()))
    assert api.writes == ["patch PersistentVolume iris-gpu1-download"]
    assert api.patches == [
        {"metadata": {"resourceVersion": "10"}, "spec": {"persistentVolumeReclaimPolicy": "Retain"}}
    ]


async def test_our_old_download_claim_is_not_released_before_its_pv_is_retain() -> None:
    """Our own pair after a jobNamespace change: the old claim is annotated and no longer
    wanted, yet it is kept until the PV is Retain, then deleted with the PV."""
    download = _cluster_pairs(serving=())[0]
    pv = _kserve_pv(
        "iris-gpu1-download",
        claim=("old-jobs", "iris-gpu1", "d1"),
        owner=_owner_ref(),
        policy="Delete",
    )
    pv["metadata"]["annotations"] = dict(download.pv["metadata"]["annotations"])
    old = _kserve_pvc(
        "old-jobs", "iris-gpu1", volume="iris-gpu1-download", owner=_owner_ref(), uid="d1"
    )
    old["metadata"]["annotations"] = dict(download.pvc["metadata"]["annotations"])
    api = RecordingApi()
    await _reconcile(api, _stores([pv], [old]), [download])
    assert api.writes == ["patch PersistentVolume iris-gpu1-download"]
    pv["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    api = RecordingApi()
    await _reconcile(api, _stores([pv], [old]), [download])
    assert api.writes == [
        "delete PersistentVolumeClaim old-jobs/iris-gpu1",
        "delete PersistentVolume iris-gpu1-download",
    ]


async def test_a_name_taken_leaves_the_pair_untouched_and_is_reported() -> None:
    """A stranger's PV under the wanted serving PV name (even Released, which would replace
    a pair of ours): no write at all for that pair, and no claim pre-bound to it by name."""
    api = RecordingApi()
    stranger = _kserve_pv("iris-gpu1-prod", claim=("prod", "iris-gpu1", "x"), owner=None)
    stranger["status"]["phase"] = "Released"
    outcome = await _reconcile(api, _stores([stranger], []), _cluster_pairs()[1:])
    assert api.writes == []
    assert [(t.kind, t.name, t.namespace) for t in outcome.taken] == [
        ("PersistentVolume", "iris-gpu1-prod", "")
    ]
    text = outcome.taken[0].describe()
    assert text.startswith("PersistentVolume iris-gpu1-prod is not this cache's: ")
    assert "delete it" in text


async def test_an_adoption_that_meets_a_newer_version_waits_and_is_retried() -> None:
    api = RecordingApi(conflict=True)
    pvs, pvcs = _kserve_cluster_objects()
    outcome = await _reconcile(api, _stores(pvs[:1], pvcs[:1]), _cluster_pairs()[1:])
    assert api.writes == ["patch PersistentVolume iris-gpu1-prod"]
    assert isinstance(outcome.error, errors.Conflict)
    assert (outcome.refused, outcome.adopted) == ([], [])


async def test_an_adopted_pv_whose_claim_is_gone_is_replaced_once_released() -> None:
    """A PV records one claim's uid: a claim made anew under its name would not be the one it
    records, so the pair is replaced instead (no claim is created for the old PV)."""
    pvs, _ = _kserve_cluster_objects()
    api = RecordingApi()
    await _reconcile(api, _stores(pvs[:1], []), _cluster_pairs()[1:])
    assert api.writes == ["patch PersistentVolume iris-gpu1-prod"]
    released = copy.deepcopy(pvs[0])
    released["metadata"]["annotations"] = dict(_cluster_pairs()[1].pv["metadata"]["annotations"])
    released["status"]["phase"] = "Released"
    api = RecordingApi()
    await _reconcile(api, _stores([released], []), _cluster_pairs()[1:])
    assert api.writes == ["delete PersistentVolume iris-gpu1-prod"]


async def test_a_pair_is_made_claim_first_and_its_pv_records_the_claims_uid() -> None:
    api = RecordingApi()
    created = volumes.CreatedClaims()
    serving = _cluster_pairs()[1]
    outcome = await volumes.reconcile_volumes(
        cast(state.Api, api),
        stores=_stores([], []),
        owner=CLUSTER_OWNER.id,
        pairs=[serving],
        manage_serving=True,
        created=created,
    )
    assert api.writes == [
        "create PersistentVolumeClaim prod/iris-gpu1",
        "create PersistentVolume iris-gpu1-prod",
        "patch PersistentVolumeClaim prod/iris-gpu1",
    ]
    claim_ref = api.created[1]["spec"]["claimRef"]
    assert (claim_ref["namespace"], claim_ref["name"], claim_ref["uid"]) == (
        "prod",
        "iris-gpu1",
        "uid-1",
    )
    assert api.patches == [{"metadata": {"annotations": {volumes.VOLUME_UID_ANNOTATION: "uid-2"}}}]
    assert "uid" not in serving.pv["spec"]["claimRef"], "the plan is not mutated"
    assert outcome.writes == 3
    claim = copy.deepcopy(api.created[0])
    claim["metadata"]["uid"] = "uid-1"
    api = RecordingApi()
    await volumes.reconcile_volumes(
        cast(state.Api, api),
        stores=_stores([], [claim]),
        owner=CLUSTER_OWNER.id,
        pairs=[serving],
        manage_serving=True,
        created=created,
    )
    assert api.writes == [], "our own claim whose PV the store has not shown yet is waited for"


async def test_an_unproven_claim_is_deleted_and_the_pair_made_anew() -> None:
    """A claim with our marks that no PV records: a tenant's forgery made before the cache's
    claim, or ours left by a crash between the two creates; either way it serves nothing."""
    serving = _cluster_pairs()[1]
    forged = copy.deepcopy(serving.pvc)
    forged["metadata"]["uid"] = "forged"
    forged["status"] = {"phase": "Pending"}
    api = RecordingApi()
    await _reconcile(api, _stores([], [forged]), [serving])
    assert api.writes == ["delete PersistentVolumeClaim prod/iris-gpu1"]
    pre_bound = copy.deepcopy(serving.pv)
    pre_bound["status"] = {"phase": "Available"}
    api = RecordingApi()
    await _reconcile(api, _stores([pre_bound], []), [serving])
    assert api.writes == ["delete PersistentVolume iris-gpu1-prod"], "a PV any claim could bind"


async def test_a_pv_that_cannot_be_made_takes_its_new_claim_with_it() -> None:
    api = RecordingApi(refuse_pvs=True)
    outcome = await _reconcile(api, _stores([], []), _cluster_pairs()[1:])
    assert api.writes == [
        "create PersistentVolumeClaim prod/iris-gpu1",
        "create PersistentVolume iris-gpu1-prod",
        "delete PersistentVolumeClaim prod/iris-gpu1",
    ]
    assert [(r.verb, r.kind) for r in outcome.refused] == [("create", "PersistentVolume")]


# ------------------------------------------------------------------------ status


def test_a_taken_name_degrades_the_cache_and_is_announced_once() -> None:
    taken = conditions.NameTaken(
        "PersistentVolume",
        "iris-gpu1-prod",
        "",
        "it is owned by Foo x (uid 1)",
        adoption.LEFTOVER_REMEDY,
    )
    conds = conditions.conditions(
        {}, missing_groups=[], previous=None, generation=1, now="t", taken=[taken]
    )
    degraded = next(c for c in conds if c.type == conditions.DEGRADED)
    assert degraded.reason == conditions.REASON_VOLUME_NAME_TAKEN
    assert taken.describe() in degraded.message
    first = conditions.events(
        old_nodes={}, new_nodes={}, old_conditions=[], new_conditions=conds, taken=[taken]
    )
    assert [(e.type, e.reason) for e in first] == [
        ("Warning", conditions.REASON_VOLUME_NAME_TAKEN),
        ("Warning", "Degraded"),
    ]
    again = conditions.events(
        old_nodes={}, new_nodes={}, old_conditions=conds, new_conditions=conds, taken=[taken]
    )
    assert again == []


def test_pair_owner_is_the_caches_reference() -> None:
    pair = _cluster_pairs()[0]
    assert pair.owner(CLUSTER_OWNER.id) == CLUSTER_OWNER
    assert ObjectKey.of(pair.pvc) == pair.pvc_key


def test_the_controller_keeps_only_what_it_reads_of_a_claim() -> None:
    """Security review finding 6: claims with megabytes of annotations, held whole."""
    huge = "x" * (250 * 1024)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "iris-gpu",
            "namespace": "team",
            "uid": "u",
            "resourceVersion": "7",
            "annotations": {"tenant/blob": huge, state.OWNER_ANNOTATION: "LocalModelCache/iris"},
            "labels": {"blob": "y" * 63, state.MANAGED_BY_LABEL: state.MANAGED_BY},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "X", "name": str(i), "uid": "u"} for i in range(50)
            ],
            "managedFields": [{"manager": huge}],
        },
        "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": huge}}},
        "status": {"phase": "Bound", "conditions": [{"message": huge}]},
    }
    kept = adoption.observed_claim(claim)
    assert len(json.dumps(kept)) < 4096
    assert kept["metadata"]["annotations"] == {state.OWNER_ANNOTATION: "LocalModelCache/iris"}
    assert kept["metadata"]["labels"] == {state.MANAGED_BY_LABEL: state.MANAGED_BY}
    assert len(kept["metadata"]["ownerReferences"]) == adoption.MAX_OWNERS
    assert kept["spec"] == {"volumeName": "pv-1", "resources": {"requests": {"storage": "x" * 64}}}
    assert kept["status"] == {"phase": "Bound"}
    assert state.index_owner(kept) == state.index_owner(claim)
    owner = adoption.Owner("LocalModelCache/iris", "LocalModelCache", "u1")
    pv = _kserve_pv("pv-1", claim=("team", "iris-gpu", "u"), owner=None)
    verdict = adoption.judge_claim(kept, owner=owner, pv_name="pv-1", pv=pv)
    assert verdict.verdict == "taken", "the foreign ownerReferences are kept"
    assert (
        verdict.verdict == adoption.judge_claim(claim, owner=owner, pv_name="pv-1", pv=pv).verdict
    )
    claim = {**claim, "metadata": {**cast(Obj, claim["metadata"]), "ownerReferences": []}}
    kept = adoption.observed_claim(claim)
    verdict = adoption.judge_claim(kept, owner=owner, pv_name="pv-1", pv=pv)
    assert verdict == adoption.judge_claim(claim, owner=owner, pv_name="pv-1", pv=pv)
    assert verdict == adoption.OURS


def test_the_claim_keeps_what_a_shared_volume_preflight_reads() -> None:
    claim = {
        "metadata": {"name": "shared", "namespace": "team", "uid": "u"},
        "spec": {
            "volumeName": "pv-9",
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
            "resources": {"requests": {"storage": "10Gi"}, "limits": {"storage": "20Gi"}},
            "storageClassName": "nfs",
        },
        "status": {"phase": "Bound", "capacity": {"storage": "12Gi"}},
    }
    kept = adoption.observed_claim(claim)
    assert kept["metadata"]["uid"] == "u"
    assert kept["spec"] == {
        "volumeName": "pv-9",
        "volumeMode": "Filesystem",
        "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
        "resources": {"requests": {"storage": "10Gi"}},
    }
    assert kept["status"] == {"phase": "Bound", "capacity": {"storage": "12Gi"}}
