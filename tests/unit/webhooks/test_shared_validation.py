"""Validation of shared-volume namespace caches (issue 22): storage mode, claim name,
immutability, destination conflicts on create only; node-group rules skipped."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from localcache.runtime.serving import review
from localcache.webhooks import sharedvalidation
from tests.unit.webhooks.test_validation import Stores, cache_obj, request

NS = "team"


def shared_obj(
    name: str = "shared",
    uri: str = "gs://bucket/model",
    *,
    claim: Any = "models-rwx",
    deleting: bool = False,
) -> dict[str, Any]:
    obj = cache_obj(name, uri, namespace=NS, deleting=deleting)
    obj["spec"].pop("nodeGroups")
    obj["spec"]["pvcRef"] = claim
    return obj


async def answer(
    stores: Stores, operation: str, obj: dict[str, Any], old: dict[str, Any] | None = None
) -> review.Response:
    validator = stores.validator(namespaced=True)
    return await validator(request(operation, obj=obj, old=old, namespace=NS))


def denial(response: review.Response) -> tuple[str, str]:
    assert not response.allowed
    return response.message, response.field


# ------------------------------------------------------------------ pure rules


def test_both_modes_are_denied_naming_pvc_ref() -> None:
    obj = shared_obj()
    obj["spec"]["nodeGroups"] = ["gpu1"]
    (found,) = sharedvalidation.check_mode(obj, old=None)
    assert found.field == "spec.pvcRef"
    assert "spec.nodeGroups and spec.pvcRef are mutually exclusive" in found.message


def test_a_pvc_ref_the_apiserver_pruned_is_denied_not_run_as_a_node_group_cache() -> None:
    # KServe v0.20's CRD has no pvcRef: a client without strict field validation gets it pruned
    # and, with nodeGroups also set, would silently get a copy on every node of the groups
    applied = shared_obj()
    applied["spec"]["nodeGroups"] = ["gpu1"]
    stored = copy.deepcopy(applied)
    stored["spec"].pop("pvcRef")
    stored["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied)
    }
    (found,) = sharedvalidation.check_mode(stored, old=None)
    assert found.field == "spec.pvcRef"
    assert "spec.pvcRef (models-rwx) was dropped by the apiserver" in found.message
    assert "KServe v0.20" in found.message
    # an update (the controller's finalizer, a label) of one that got in is not refused
    assert sharedvalidation.check_mode(stored, old=stored) == []


def test_neither_mode_is_denied_naming_node_groups() -> None:
    obj = shared_obj()
    obj["spec"].pop("pvcRef")
    (found,) = sharedvalidation.check_mode(obj, old=None)
    assert found.field == "spec.nodeGroups"
    assert "exactly one of spec.nodeGroups or spec.pvcRef" in found.message


@pytest.mark.parametrize("claim", ["", "Models", "models_rwx", "-models", "a" * 254, 7, "a..b"])
def test_a_pvc_ref_that_is_no_claim_name_is_denied(claim: Any) -> None:
    (found,) = sharedvalidation.check_mode(shared_obj(claim=claim), old=None)
    assert found.field == "spec.pvcRef"
    assert "is not a PersistentVolumeClaim name" in found.message


@pytest.mark.parametrize("claim", ["models", "models-rwx.nfs", "a" * 253, "0"])
def test_claim_names_are_accepted(claim: str) -> None:
    assert sharedvalidation.check_mode(shared_obj(claim=claim), old=None) == []


@pytest.mark.parametrize(
    ("before", "after"), [("models-rwx", "other"), (None, "models-rwx"), ("models-rwx", None)]
)
def test_pvc_ref_is_immutable_also_against_adding_or_removing_it(
    before: str | None, after: str | None
) -> None:
    old, new = shared_obj(claim=before), shared_obj(claim=after)
    for obj, claim in ((old, before), (new, after)):
        if claim is None:
            obj["spec"].pop("pvcRef")
            obj["spec"]["nodeGroups"] = ["gpu1"]
    found = sharedvalidation.check_mode(new, old=old)
    assert [v.field for v in found] == ["spec.pvcRef"]
    assert "spec.pvcRef is immutable" in found[0].message


def test_an_update_of_a_cache_being_deleted_is_not_checked() -> None:
    old = shared_obj()
    new = shared_obj(claim="other", deleting=True)
    assert sharedvalidation.check_mode(new, old=old) == []


# ------------------------------------------------------------------ the handler


async def test_a_shared_cache_is_admitted_without_node_groups() -> None:
    stores = Stores()
    assert (await answer(stores, "CREATE", shared_obj())).allowed


async def test_the_handler_denies_both_modes_naming_the_field() -> None:
    obj = shared_obj()
    obj["spec"]["nodeGroups"] = ["gpu1"]
    message, field = denial(await answer(Stores(), "CREATE", obj))
    assert field == "spec.pvcRef"
    assert "mutually exclusive" in message


async def test_a_second_cache_of_the_same_model_on_the_same_claim_is_denied_on_create() -> None:
    stores = Stores()
    stores.namespace_caches.upsert(shared_obj("first"))
    message, field = denial(await answer(stores, "CREATE", shared_obj("second")))
    assert field == "spec.pvcRef"
    assert f"LocalModelNamespaceCache {NS}/first already imports gs://bucket/model" in message


async def test_other_models_claims_and_deleting_caches_do_not_conflict() -> None:
    stores = Stores()
    stores.namespace_caches.upsert(shared_obj("other-model", "gs://bucket/model/v2"))
    stores.namespace_caches.upsert(shared_obj("other-claim", claim="elsewhere"))
    stores.namespace_caches.upsert(shared_obj("going", deleting=True))
    stores.namespace_caches.upsert(cache_obj("node-local", namespace=NS))
    assert (await answer(stores, "CREATE", shared_obj("second"))).allowed


async def test_an_update_of_a_cache_in_conflict_is_allowed() -> None:
    stores = Stores()
    first, second = shared_obj("first"), shared_obj("second")
    stores.namespace_caches.upsert(first)
    stores.namespace_caches.upsert(second)
    updated = copy.deepcopy(second)
    updated["metadata"]["labels"] = {"team": "a"}
    updated["metadata"]["finalizers"] = ["localmodelnamespacecache.kserve.io/finalizer"]
    assert (await answer(stores, "UPDATE", updated, old=second)).allowed


async def test_node_group_and_name_rules_skip_shared_caches() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("shared"))  # a cluster cache of the same name
    assert (await answer(stores, "CREATE", shared_obj())).allowed
