"""Store: keyed objects, named indexes kept in step with every write, replace with tombstones,
and read-only namespace views."""

from __future__ import annotations

import pytest

from localcache.runtime import keys, store
from tests.unit.runtime.fake_source import cm

A = keys.ObjectKey("ns", "a")


def owner_index(obj: store.Obj) -> list[str]:
    return [r["name"] for r in obj["metadata"].get("ownerReferences", [])]


def test_get_list_and_keys_follow_upserts_and_deletes() -> None:
    s = store.Store()
    assert s.upsert(cm("a", "1")) is None
    old = s.upsert(cm("a", "2"))
    assert old is not None
    assert old["metadata"]["resourceVersion"] == "1"
    s.upsert(cm("b", "3", namespace="other"))
    assert s.get(A) == cm("a", "2")
    assert s.keys() == [A, keys.ObjectKey("other", "b")]
    assert [o["metadata"]["name"] for o in s.list("ns")] == ["a"]
    assert s.delete(A) == cm("a", "2")
    assert s.delete(A) is None
    assert A not in s
    assert len(s) == 1


def test_indexes_track_changed_values_and_drop_empty_buckets() -> None:
    s = store.Store({"owner": owner_index})
    s.upsert(cm("a", "1", ownerReferences=[{"name": "x"}, {"name": "y"}]))
    s.upsert(cm("b", "1", ownerReferences=[{"name": "x"}]))
    assert [o["metadata"]["name"] for o in s.by_index("owner", "x")] == ["a", "b"]
    s.upsert(cm("a", "2", ownerReferences=[{"name": "y"}]))
    assert [o["metadata"]["name"] for o in s.by_index("owner", "x")] == ["b"]
    s.delete(keys.ObjectKey("ns", "b"))
    assert s.by_index("owner", "x") == []
    assert s.index_values("owner") == ["y"]


def test_indexers_added_later_index_existing_objects() -> None:
    s = store.Store()
    s.upsert(cm("a", "1", labels={"app": "web"}))
    s.add_indexers({"app": store.label_index("app")})
    assert s.index_keys("app", "web") == [A]
    with pytest.raises(ValueError, match="already exists"):
        s.add_indexers({"app": store.label_index("app")})


def test_unknown_index_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="no index"):
        store.Store().by_index("missing", "x")


def test_replace_reports_added_updated_unchanged_and_tombstones() -> None:
    s = store.Store()
    s.upsert(cm("keep", "1"))
    s.upsert(cm("change", "1"))
    s.upsert(cm("gone", "1"))
    delta = s.replace([cm("keep", "1"), cm("change", "2"), cm("new", "3")])
    assert [o["metadata"]["name"] for o in delta.added] == ["new"]
    assert [
        (o["metadata"]["resourceVersion"], n["metadata"]["resourceVersion"])
        for o, n in delta.updated
    ] == [("1", "2")]
    assert delta.deleted == [store.Tombstone(keys.ObjectKey("ns", "gone"), cm("gone", "1"))]
    assert delta.unchanged == 1
    assert sorted(str(k) for k in s) == ["ns/change", "ns/keep", "ns/new"]
    assert s.by_index(store.NAMESPACE_INDEX, "ns") == s.list("ns")


def test_view_is_limited_to_its_namespace() -> None:
    s = store.Store({"app": store.label_index("app")})
    s.upsert(cm("a", "1", labels={"app": "web"}))
    s.upsert(cm("b", "1", namespace="other", labels={"app": "web"}))
    view: store.Reader = s.view("ns")
    assert view.get(keys.ObjectKey("other", "b")) is None
    assert view.get(A) is not None
    assert view.keys() == [A]
    assert [o["metadata"]["name"] for o in view.by_index("app", "web")] == ["a"]
    assert view.list("other") == []
    assert len(s.view().list()) == 2
    assert not hasattr(view, "upsert")


def test_cluster_scoped_objects_have_an_empty_namespace() -> None:
    s = store.Store()
    s.upsert({"metadata": {"name": "node-1", "resourceVersion": "1"}})
    assert s.keys() == [keys.ObjectKey("", "node-1")]
    assert len(s.list("")) == 1


def test_a_write_overlay_stands_in_for_the_store_until_the_store_moves_on() -> None:
    overlay: store.WriteOverlay[str, dict[str, str]] = store.WriteOverlay()
    overlay.wrote("n1", replaced="5", value={"rv": "6"})
    assert overlay.get("n1", stored_version="5") == {"rv": "6"}, "the store still shows rv 5"
    assert overlay.get("n1", stored_version="6") is None, "the store caught up"
    assert overlay.get("n1", stored_version="5") is None, "and the entry is gone"
    overlay.wrote("created", replaced="", value={"rv": "1"})
    assert overlay.get("created", stored_version="") == {"rv": "1"}, "a create: no copy yet"
    overlay.forget("created")
    assert list(overlay.keys()) == []


def test_a_write_overlay_forgets_the_least_recently_written_first() -> None:
    overlay: store.WriteOverlay[str, int] = store.WriteOverlay(limit=2)
    for name in ("a", "b", "a", "c"):
        overlay.wrote(name, replaced="1", value=0)
    assert sorted(overlay.keys()) == ["a", "c"]
