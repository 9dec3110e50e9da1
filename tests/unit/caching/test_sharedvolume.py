"""Shared-volume caches: the claim preflight, the destination owner rule, the users' proof."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import modelcache
from localcache.api.quantity import Quantity
from localcache.caching import keys, sharedroute, sharedvolume

Obj = dict[str, Any]
GI = Quantity("1Gi")


def _claim(
    *,
    mode: str | None = None,
    access: list[str] | None = None,
    request: str | None = "2Gi",
    phase: str = "Pending",
    capacity: str | None = None,
) -> Obj:
    spec: Obj = {"accessModes": ["ReadWriteMany"] if access is None else access}
    if mode is not None:
        spec["volumeMode"] = mode
    if request is not None:
        spec["resources"] = {"requests": {"storage": request}}
    status: Obj = {"phase": phase}
    if capacity is not None:
        status["capacity"] = {"storage": capacity}
    return {"metadata": {"name": "shared", "uid": "u"}, "spec": spec, "status": status}


def test_a_usable_claim_passes_the_preflight() -> None:
    assert sharedvolume.preflight(_claim(), GI) is None
    bound = _claim(mode="Filesystem", phase="Bound", capacity="1Gi")
    assert sharedvolume.preflight(bound, GI) is None


def test_an_unbound_claim_without_a_request_passes() -> None:
    assert sharedvolume.preflight(_claim(request=None), GI) is None


def test_a_block_claim_is_refused_first() -> None:
    found = sharedvolume.preflight(_claim(mode="Block", access=["ReadWriteOnce"]), GI)
    assert found is not None
    assert found.reason == sharedvolume.REASON_UNSUPPORTED_VOLUME_MODE
    assert "Block" in found.message
    assert "Filesystem" in found.message


@pytest.mark.parametrize("modes", [["ReadWriteOnce"], ["ReadOnlyMany"], []])
def test_a_claim_without_read_write_many_is_refused(modes: list[str]) -> None:
    found = sharedvolume.preflight(_claim(access=modes), GI)
    assert found is not None
    assert found.reason == sharedvolume.REASON_UNSUPPORTED_ACCESS_MODE
    assert "ReadWriteMany" in found.message


def test_rwx_among_other_modes_is_enough() -> None:
    assert sharedvolume.preflight(_claim(access=["ReadWriteOnce", "ReadWriteMany"]), GI) is None


def test_a_small_request_is_refused_naming_both_sizes() -> None:
    found = sharedvolume.preflight(_claim(request="500Mi"), GI)
    assert found == sharedvolume.Verdict(
        sharedvolume.REASON_INSUFFICIENT_CAPACITY,
        "PVC requested storage 500Mi is smaller than model size 1Gi",
    )


def test_a_small_bound_capacity_is_refused_naming_both_sizes() -> None:
    found = sharedvolume.preflight(_claim(phase="Bound", capacity="512Mi"), GI)
    assert found == sharedvolume.Verdict(
        sharedvolume.REASON_INSUFFICIENT_CAPACITY,
        "PVC bound capacity 512Mi is smaller than model size 1Gi",
    )


def test_capacity_of_an_unbound_claim_is_not_judged() -> None:
    assert sharedvolume.preflight(_claim(phase="Pending", capacity="1Mi"), GI) is None


def test_claim_not_found_names_claim_and_namespace() -> None:
    found = sharedvolume.claim_not_found("shared", "team")
    assert found.reason == sharedvolume.REASON_PVC_NOT_FOUND
    assert "'shared'" in found.message
    assert "'team'" in found.message


def _cache(name: str, uid: str, created: str, *, ref: str = "shared", uri: str = "s3://b/m") -> Obj:
    return {
        "metadata": {"name": name, "uid": uid, "creationTimestamp": created},
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "pvcRef": ref},
    }


def _claimant(obj: Obj) -> sharedvolume.Claimant:
    found = sharedvolume.Claimant.of(obj)
    assert found is not None
    return found


def test_the_first_created_cache_owns_the_destination() -> None:
    first = _claimant(_cache("zeta", "u2", "2026-01-01T00:00:00Z"))
    later = _claimant(_cache("alpha", "u1", "2026-01-01T00:00:05Z"))
    assert sharedvolume.destination_owner(first, [first, later]) is None
    assert sharedvolume.destination_owner(later, [first, later]) == first
    verdict = sharedvolume.conflict(later, first, "team")
    assert verdict.reason == sharedvolume.REASON_DESTINATION_CONFLICT
    assert "team/zeta" in verdict.message


def test_ties_are_broken_by_name_then_uid() -> None:
    when = "2026-01-01T00:00:00Z"
    a, b = _claimant(_cache("a", "u9", when)), _claimant(_cache("b", "u1", when))
    assert sharedvolume.destination_owner(b, [a, b]) == a
    c1, c2 = _claimant(_cache("c", "u1", when)), _claimant(_cache("c", "u2", when))
    assert sharedvolume.destination_owner(c2, [c1, c2]) == c1
    assert sharedvolume.destination_owner(c1, [c1, c2]) is None


def test_other_claims_keys_and_node_group_caches_do_not_conflict() -> None:
    me = _claimant(_cache("me", "u2", "2026-01-02T00:00:00Z"))
    other_claim = _claimant(_cache("x", "u1", "2026-01-01T00:00:00Z", ref="other"))
    other_model = _claimant(_cache("y", "u3", "2026-01-01T00:00:00Z", uri="s3://b/other"))
    node_groups = {"metadata": {"name": "z"}, "spec": {"sourceModelUri": "s3://b/m"}}
    assert sharedvolume.Claimant.of(node_groups) is None
    assert sharedvolume.destination_owner(me, [other_claim, other_model]) is None


def test_users_are_proven_by_source_uri_or_by_the_place_on_the_claim() -> None:
    key = keys.storage_key("s3://b/m")
    assert sharedvolume.served_uri("shared", key) == f"pvc://shared/models/{key}"
    ok = {"cache_uri": "s3://b/m", "pvc_ref": "shared"}
    assert sharedvolume.uses("s3://b/m", **ok)
    assert sharedvolume.uses("s3://b/m/sub", **ok)
    assert sharedvolume.uses(f"pvc://shared/models/{key}", **ok)
    assert sharedvolume.uses(f"pvc://shared/models/{key}/adapter", **ok)
    assert not sharedvolume.uses("s3://b/mx", **ok)
    assert not sharedvolume.uses(f"pvc://other/models/{key}", **ok)
    assert not sharedvolume.uses(None, **ok)


def test_only_a_pvc_ref_cache_is_shared() -> None:
    def cache(kind: type[sharedroute.AnyCache], **spec: object) -> sharedroute.AnyCache:
        body = {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", **spec}
        return kind.model_validate({"metadata": {"name": "c", "namespace": "n"}, "spec": body})

    assert sharedroute.is_shared(cache(modelcache.LocalModelNamespaceCache, pvcRef="shared"))
    assert not sharedroute.is_shared(cache(modelcache.LocalModelNamespaceCache, nodeGroups=["g"]))
    assert not sharedroute.is_shared(cache(modelcache.LocalModelCache, nodeGroups=["g"]))
