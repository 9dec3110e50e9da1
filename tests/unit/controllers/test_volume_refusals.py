"""A PV/PVC write the apiserver refuses is reported, not only raised: `reconcile_volumes`
carries on with the other objects and returns each refusal with the apiserver's words."""

from __future__ import annotations

from typing import Any, cast

from localcache.api import modelcache, nodegroup
from localcache.controllers import clustercache, state, volumeplan, volumes
from localcache.runtime import errors, kube, store

Obj = dict[str, Any]

GROUP = nodegroup.LocalModelNodeGroup.from_dict(
    {
        "metadata": {"name": "gpu1"},
        "spec": {
            "storageLimit": "10Gi",
            "persistentVolumeSpec": {"hostPath": {"path": "/models"}},
            "persistentVolumeClaimSpec": {"storageClassName": "standard"},
        },
    }
)


class RefusingApi:
    """Creates answer with the error `refuse` maps "kind/namespace/name" to, else succeed."""

    def __init__(self, refuse: dict[str, errors.ApiError]) -> None:
        self.refuse = refuse
        self.created: list[str] = []
        self.attempted: list[str] = []
        self.deleted: list[str] = []

    async def create(self, res: kube.Resource, obj: Obj, **_: Any) -> Obj:
        name = str(obj["metadata"]["name"])
        where = f"{res.kind}/{obj['metadata'].get('namespace') or ''}/{name}"
        self.attempted.append(where)
        if where in self.refuse:
            raise self.refuse[where]
        self.created.append(where)
        return {**obj, "metadata": {**obj["metadata"], "uid": f"uid-{len(self.created)}"}}

    async def delete(self, res: kube.Resource, name: str, **kw: Any) -> Obj:
        self.deleted.append(f"{res.kind}/{kw.get('namespace') or ''}/{name}")
        return {}


def _stores() -> state.Stores:
    empty = store.Store().view()
    volumes_ = store.Store(state.VOLUME_INDEXERS).view()
    return state.Stores(
        caches=empty,
        namespace_caches=empty,
        nodes=empty,
        local_model_nodes=empty,
        node_groups=empty,
        persistent_volumes=volumes_,
        persistent_volume_claims=volumes_,
        inference_services=None,
    )


async def test_refused_writes_are_returned_with_the_apiservers_words_and_others_go_on() -> None:
    cache = modelcache.LocalModelCache.from_dict(
        {
            "metadata": {"name": "iris", "uid": "u1"},
            "spec": {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["gpu1"]},
        }
    )
    download, serving = volumeplan.plan(
        clustercache.SCOPE, cache, groups={"gpu1": GROUP}, serving=[("prod", "gpu1")],
        job_namespace="jobs",
    )  # fmt: skip
    quota = errors.Forbidden(403, "exceeded quota: q", reason="Forbidden")
    invalid = errors.Invalid(422, "metadata.name: Invalid value", reason="Invalid")
    api = RefusingApi(
        {
            f"PersistentVolumeClaim/jobs/{download.pvc_key.name}": quota,
            f"PersistentVolume//{serving.pv_name}": invalid,
        }
    )
    outcome = await volumes.reconcile_volumes(
        cast(state.Api, api),
        stores=_stores(),
        owner=clustercache.SCOPE.owner_id(cache),
        pairs=[download, serving],
        manage_serving=True,
    )
    serving_claim = f"PersistentVolumeClaim/prod/{serving.pvc_key.name}"
    assert api.created == [serving_claim]
    assert f"PersistentVolume//{download.pv_name}" not in api.attempted, (
        "no PV is made for a claim that could not be made"
    )
    assert api.deleted == [serving_claim], "a claim whose PV could not be made is deleted"
    assert outcome.writes == 2
    assert outcome.error is quota
    assert [(r.verb, r.kind, r.name, r.namespace, r.code, r.reason, r.message) for r in
            outcome.refused] == [
        ("create", "PersistentVolumeClaim", download.pvc_key.name, "jobs", 403, "Forbidden",
         "exceeded quota: q"),
        ("create", "PersistentVolume", serving.pv_name, "", 422, "Invalid",
         "metadata.name: Invalid value"),
    ]  # fmt: skip
