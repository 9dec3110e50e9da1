"""Predicates and handlers: change predicates filter only updates, combinators compose, and
handlers turn events into self, owner and mapped keys (old and new owners on updates)."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.runtime import handlers, informer, keys, predicates
from tests.unit.runtime.fake_source import cm

Obj = dict[str, Any]


class RecordingQueue:
    def __init__(self) -> None:
        self.added: list[keys.ObjectKey] = []

    def add(self, key: keys.ObjectKey) -> None:
        self.added.append(key)


def update(old_meta: dict[str, Any], new_meta: dict[str, Any]) -> informer.Updated:
    return informer.Updated(cm("a", "1", **old_meta), cm("a", "2", **new_meta))


@pytest.mark.parametrize(
    ("predicate", "old", "new", "passes"),
    [
        pytest.param(
            predicates.generation_changed,
            {"generation": 1},
            {"generation": 2},
            True,
            id="gen-bumped",
        ),
        pytest.param(
            predicates.generation_changed,
            {"generation": 1},
            {"generation": 1},
            False,
            id="gen-same",
        ),
        pytest.param(
            predicates.labels_changed,
            {"labels": {"a": "1"}},
            {"labels": {"a": "2"}},
            True,
            id="labels-changed",
        ),
        pytest.param(
            predicates.labels_changed, {}, {"labels": {}}, False, id="labels-empty-vs-missing"
        ),
        pytest.param(
            predicates.annotations_changed,
            {"annotations": {"x": "1"}},
            {},
            True,
            id="annotations-removed",
        ),
        pytest.param(
            predicates.annotations_changed, {"labels": {"a": "1"}}, {}, False, id="annotations-same"
        ),
        pytest.param(predicates.resource_version_changed, {}, {}, True, id="rv-changed"),
    ],
)
def test_change_predicates_filter_updates(
    predicate: predicates.Predicate, old: dict[str, Any], new: dict[str, Any], passes: bool
) -> None:
    assert predicate(update(old, new)) is passes


def test_resource_version_unchanged_update_is_filtered() -> None:
    same = cm("a", "1")
    assert not predicates.resource_version_changed(informer.Updated(same, same))


@pytest.mark.parametrize(
    "predicate",
    [
        predicates.generation_changed,
        predicates.labels_changed,
        predicates.annotations_changed,
        predicates.resource_version_changed,
    ],
)
def test_change_predicates_pass_adds_and_deletes(predicate: predicates.Predicate) -> None:
    assert predicate(informer.Added(cm("a", "1")))
    assert predicate(informer.Deleted(cm("a", "1"), final_state_unknown=True))


def test_combinators_compose() -> None:
    yes: predicates.Predicate = lambda ev: True  # noqa: E731
    no: predicates.Predicate = lambda ev: False  # noqa: E731
    ev = informer.Added(cm("a", "1"))
    assert predicates.all_of(yes, yes)(ev)
    assert not predicates.all_of(yes, no)(ev)
    assert predicates.all_of()(ev)
    assert predicates.any_of(no, yes)(ev)
    assert not predicates.any_of()(ev)
    assert predicates.not_(no)(ev)
    assert not predicates.not_(predicates.generation_changed)(ev)


def test_funcs_and_matching_check_the_right_object() -> None:
    only_big = predicates.matching(lambda o: o["metadata"]["name"].startswith("big"))
    assert only_big(informer.Updated(cm("small", "1"), cm("big", "2")))
    assert not only_big(informer.Deleted(cm("small", "1")))
    per_kind = predicates.funcs(added=lambda o: False, updated=lambda old, new: True)
    assert not per_kind(informer.Added(cm("a", "1")))
    assert per_kind(update({}, {}))
    assert per_kind(informer.Deleted(cm("a", "1")))


def test_enqueue_self_applies_every_predicate() -> None:
    queue = RecordingQueue()
    handle = handlers.enqueue_self(queue, predicates.generation_changed)
    handle(update({"generation": 1}, {"generation": 1}))
    handle(update({"generation": 1}, {"generation": 2}))
    handle(informer.Deleted(cm("b", "3")))
    assert queue.added == [keys.ObjectKey("ns", "a"), keys.ObjectKey("ns", "b")]


def owned(name: str, *refs: dict[str, Any]) -> Obj:
    return cm(name, "1", ownerReferences=list(refs))


def ref(name: str, *, kind: str = "Widget", api: str = "example.com/v1", ctl: bool = True) -> Obj:
    return {"apiVersion": api, "kind": kind, "name": name, "controller": ctl}


def test_enqueue_owner_matches_group_and_kind_of_the_controller_reference() -> None:
    queue = RecordingQueue()
    handle = handlers.enqueue_owner(queue, owner_api_version="example.com/v2", owner_kind="Widget")
    handle(informer.Added(owned("x", ref("w1"), ref("w2", ctl=False), ref("o", kind="Other"))))
    handle(informer.Added(owned("y", ref("w3", api="other.io/v1"))))
    assert queue.added == [keys.ObjectKey("ns", "w1")]


def test_enqueue_owner_reaches_old_and_new_owner_and_cluster_scoped_owners() -> None:
    queue = RecordingQueue()
    handle = handlers.enqueue_owner(
        queue,
        owner_api_version="example.com/v1",
        owner_kind="Widget",
        owner_namespaced=False,
        only_controller=False,
    )
    handle(informer.Updated(owned("x", ref("old")), owned("x", ref("new", ctl=False))))
    assert queue.added == [keys.ObjectKey("", "old"), keys.ObjectKey("", "new")]


def test_enqueue_owner_of_core_group() -> None:
    queue = RecordingQueue()
    handle = handlers.enqueue_owner(queue, owner_api_version="v1", owner_kind="Pod")
    handle(informer.Added(owned("x", ref("p", kind="Pod", api="v1"))))
    assert queue.added == [keys.ObjectKey("ns", "p")]


def test_enqueue_mapped_deduplicates_keys_of_old_and_new() -> None:
    queue = RecordingQueue()

    def mapper(obj: Obj) -> list[keys.ObjectKey]:
        return [keys.ObjectKey("", "all"), keys.ObjectKey("", obj["metadata"]["resourceVersion"])]

    handle = handlers.enqueue_mapped(queue, mapper, predicates.resource_version_changed)
    handle(informer.Updated(cm("a", "1"), cm("a", "2")))
    handle(informer.Updated(cm("a", "2"), cm("a", "2")))
    assert queue.added == [
        keys.ObjectKey("", "all"),
        keys.ObjectKey("", "1"),
        keys.ObjectKey("", "2"),
    ]
