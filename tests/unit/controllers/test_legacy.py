"""Legacy pairs (a PV adopted from KServe's add-on, whose source is the whole models root) are
replaced by CSI pairs once no pod mounts their claim, and never while one does."""

from __future__ import annotations

import copy
import json
from typing import Any, cast

from localcache.caching import config
from localcache.controllers import adoption, legacy, state, volumegate
from localcache.runtime import kube
from localcache.runtime.keys import ObjectKey
from tests.unit.controllers.test_adoption import (
    RecordingApi,
    _cluster_pairs,
    _kserve_pv,
    _kserve_pvc,
    _owner_ref,
    _reconcile,
    _stores,
)

Obj = dict[str, Any]


class PodListingApi(RecordingApi):
    """A RecordingApi that lists `pods` in pages of the size asked for."""

    def __init__(self, pods: list[Obj]) -> None:
        super().__init__()
        self.pods = pods
        self.lists = 0

    async def list(
        self,
        res: kube.Resource,
        *,
        namespace: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> kube.ObjList:
        assert res is kube.PODS
        self.lists += 1
        start = int(continue_token or 0)
        end = start + (limit or len(self.pods))
        more = str(end) if end < len(self.pods) else ""
        return kube.ObjList(items=self.pods[start:end], resource_version="1", continue_token=more)


def _pod(name: str, claim: str, phase: str = "Running") -> Obj:
    return {
        "metadata": {"name": name, "namespace": "prod"},
        "spec": {"volumes": [{"name": "m", "persistentVolumeClaim": {"claimName": claim}}]},
        "status": {"phase": phase},
    }


def _adopted(obj: Obj, wanted: Obj) -> Obj:
    """`obj` after the adoption patch."""
    out = copy.deepcopy(obj)
    patch = adoption.adoption_patch(obj, wanted)["metadata"]
    out["metadata"].setdefault("annotations", {}).update(patch["annotations"])
    out["metadata"].setdefault("labels", {}).update(patch.get("labels") or {})
    return out


def _adopted_serving_pair() -> tuple[list[Any], state.Stores]:
    (serving,) = [p for p in _cluster_pairs() if p.role == "serving"]
    pv = _adopted(
        _kserve_pv("iris-gpu1-prod", claim=("prod", "iris-gpu1", "s1"), owner=_owner_ref()),
        serving.pv,
    )
    pvc = _adopted(
        _kserve_pvc("prod", "iris-gpu1", volume="iris-gpu1-prod", owner=_owner_ref(), uid="s1"),
        serving.pvc,
    )
    return [serving], _stores([pv], [pvc])


def test_only_a_pv_without_the_wanted_csi_source_is_legacy() -> None:
    (serving,) = [p for p in _cluster_pairs() if p.role == "serving"]
    assert serving.pv["spec"]["csi"]
    assert legacy.is_legacy({"spec": {"local": {"path": "/models"}}}, serving.pv)
    assert not legacy.is_legacy(serving.pv, serving.pv)
    host_path_wanted = {"spec": {"hostPath": {"path": "/models"}}}
    assert not legacy.is_legacy({"spec": {"local": {"path": "/models"}}}, host_path_wanted)


async def test_an_adopted_pair_that_no_running_pod_mounts_is_replaced_without_a_download() -> None:
    pairs, stores = _adopted_serving_pair()
    finished = [_pod("done", "iris-gpu1", phase="Succeeded"), _pod("other", "another-claim")]
    api = PodListingApi(finished)
    outcome = await _reconcile(api, stores, pairs)
    assert api.writes == [
        "delete PersistentVolumeClaim prod/iris-gpu1",
        "delete PersistentVolume iris-gpu1-prod",
    ]
    assert not outcome.waiting


async def test_an_adopted_pair_is_kept_while_a_pod_mounts_it_and_looked_at_again_later() -> None:
    pairs, stores = _adopted_serving_pair()
    pods = [_pod(f"filler-{i}", "other") for i in range(250)] + [_pod("server", "iris-gpu1")]
    api = PodListingApi(pods)
    now = [100.0]
    users = legacy.ClaimUsers(clock=lambda: now[0])
    outcome = await _reconcile(api, stores, pairs, users=users)
    assert api.writes == []
    assert outcome.waiting
    assert api.lists == 3  # pages of 100 up to the user
    await _reconcile(api, stores, pairs, users=users)
    assert api.lists == 3, "listed again before RECHECK"
    api.pods = pods[:-1]
    now[0] += legacy.RECHECK
    outcome = await _reconcile(api, stores, pairs, users=users)
    assert not outcome.waiting
    assert api.writes[-2:] == [
        "delete PersistentVolumeClaim prod/iris-gpu1",
        "delete PersistentVolume iris-gpu1-prod",
    ]


async def test_a_namespace_with_too_many_pods_to_scan_counts_as_in_use() -> None:
    api = PodListingApi([_pod(f"p{i}", "other") for i in range(legacy.MAX_PODS_SCANNED + 50)])
    holder = await legacy.ClaimUsers().holder(cast(state.Api, api), ObjectKey("prod", "iris-gpu1"))
    assert "not scanned" in holder
    assert api.lists == legacy.MAX_PODS_SCANNED // legacy.PAGE


async def test_a_legacy_pv_with_a_delete_policy_is_made_retain_before_anything_is_deleted() -> None:
    pairs, stores = _adopted_serving_pair()
    pv = stores.persistent_volumes.get(ObjectKey("", "iris-gpu1-prod"))
    assert pv is not None
    deleting = copy.deepcopy(pv)
    deleting["spec"]["persistentVolumeReclaimPolicy"] = "Delete"
    claim = stores.persistent_volume_claims.get(ObjectKey("prod", "iris-gpu1"))
    assert claim is not None
    api = PodListingApi([])
    await _reconcile(api, _stores([deleting], [claim]), pairs)
    assert api.writes == ["patch PersistentVolume iris-gpu1-prod"]
    assert api.patches[0]["spec"] == {"persistentVolumeReclaimPolicy": "Retain"}


def test_switching_the_volume_source_reconciles_every_cache_again() -> None:
    """Without it, pairs made with `hostPath` would wait for an unrelated event to be replaced."""
    configs = iter(
        config.parse_config({"localModel": json.dumps({"volumeSource": source})})
        for source in ("hostPath", "hostPath", "csi", "csi")
    )
    current = [next(configs)]
    gate = volumegate.VolumeManagement(lambda: current[0])
    flips = []
    for _ in range(4):
        flips.append(gate.flipped())
        current[0] = next(configs, current[0])
    assert flips == [False, False, True, False]
