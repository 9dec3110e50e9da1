"""Node membership, stable group choice, desired LocalModelNode entries and group usage."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import modelcache, nodegroup
from localcache.api.quantity import Quantity
from localcache.caching import entries, placement


def _node(name: str, labels: dict[str, str] | None = None, *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _terms(*terms: dict[str, Any]) -> list[dict[str, Any]]:
    return list(terms)


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    req: dict[str, Any] = {"key": key, "operator": op}
    if values:
        req["values"] = list(values)
    return {"matchExpressions": [req]}


def _group(name: str, instance_type: str, limit: str = "10Gi") -> nodegroup.LocalModelNodeGroup:
    return nodegroup.LocalModelNodeGroup.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "storageLimit": limit,
                "persistentVolumeSpec": {
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                _expr("node.kubernetes.io/instance-type", "In", instance_type)
                            ]
                        }
                    }
                },
                "persistentVolumeClaimSpec": {},
            },
        }
    )


def _cache(
    name: str,
    groups: list[str],
    *,
    namespace: str = "",
    uri: str = "s3://b/m",
    size: str = "1Gi",
    deleting: bool = False,
    created: str = "",
    **extra: Any,
) -> placement.PlacedCache:
    spec = modelcache.LocalModelCacheSpec.model_validate(
        {"sourceModelUri": uri, "modelSize": size, "nodeGroups": groups, **extra}
    )
    return placement.PlacedCache(
        name=name, namespace=namespace, spec=spec, deleting=deleting, created=created
    )


# ------------------------------------------------------------------------ selectors


@pytest.mark.parametrize(
    ("term", "labels", "expected"),
    [
        (_expr("t", "In", "a", "b"), {"t": "b"}, True),
        (_expr("t", "In", "a"), {"t": "c"}, False),
        (_expr("t", "In", "a"), {}, False),
        (_expr("t", "NotIn", "a"), {}, True),
        (_expr("t", "NotIn", "a"), {"t": "a"}, False),
        (_expr("t", "Exists"), {"t": ""}, True),
        (_expr("t", "Exists"), {}, False),
        (_expr("t", "DoesNotExist"), {}, True),
        (_expr("t", "DoesNotExist"), {"t": "x"}, False),
        (_expr("gpus", "Gt", "2"), {"gpus": "4"}, True),
        (_expr("gpus", "Gt", "2"), {"gpus": "2"}, False),
        (_expr("gpus", "Lt", "2"), {"gpus": "1"}, True),
        (_expr("gpus", "Lt", "2"), {"gpus": "many"}, False),
        (_expr("t", "Bogus", "a"), {"t": "a"}, False),
    ],
)
def test_node_selector_operators_follow_kubernetes(
    term: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert placement.node_matches(_node("n", labels), [term]) is expected


def test_requirements_of_one_term_must_all_hold() -> None:
    term = {
        "matchExpressions": [
            {"key": "a", "operator": "In", "values": ["1"]},
            {"key": "b", "operator": "Exists"},
        ]
    }
    assert placement.node_matches(_node("n", {"a": "1", "b": "x"}), [term])
    assert not placement.node_matches(_node("n", {"a": "1"}), [term])


def test_any_term_may_match() -> None:
    terms = _terms(_expr("a", "In", "1"), _expr("b", "In", "2"))
    assert placement.node_matches(_node("n", {"b": "2"}), terms)


def test_empty_term_and_missing_affinity_match_no_node() -> None:
    assert not placement.node_matches(_node("n", {"a": "1"}), [{}])
    assert not placement.node_matches(_node("n", {"a": "1"}), None)
    assert not placement.node_matches(_node("n", {"a": "1"}), [])


def test_match_fields_select_by_node_name() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert placement.node_matches(_node("n1"), [term])
    assert not placement.node_matches(_node("n2"), [term])
    other_field = {"matchFields": [{"key": "spec.x", "operator": "In", "values": ["n1"]}]}
    assert not placement.node_matches(_node("n1"), [other_field])


def test_readiness_comes_from_the_ready_condition() -> None:
    assert placement.node_is_ready(_node("n", ready=True))
    assert not placement.node_is_ready(_node("n", ready=False))
    assert not placement.node_is_ready({"metadata": {"name": "n"}})


def test_group_without_node_affinity_has_no_members() -> None:
    group = nodegroup.LocalModelNodeGroup.from_dict(
        {
            "metadata": {"name": "g"},
            "spec": {
                "storageLimit": "1Gi",
                "persistentVolumeSpec": {"hostPath": {"path": "/models"}},
                "persistentVolumeClaimSpec": {},
            },
        }
    )
    assert placement.groups_of(_node("n", {"a": "b"}), {"g": group}) == frozenset()


# ------------------------------------------------------------------------ snapshot


def _snapshot(caches: list[placement.PlacedCache]) -> placement.Snapshot:
    return placement.Snapshot(
        nodes={
            "n1": _node("n1", {"node.kubernetes.io/instance-type": "gpu1"}),
            "n2": _node("n2", {"node.kubernetes.io/instance-type": "gpu2"}, ready=False),
            "n3": _node("n3", {"node.kubernetes.io/instance-type": "cpu"}),
        },
        groups={"gpu1": _group("gpu1", "gpu1"), "gpu2": _group("gpu2", "gpu2")},
        caches=caches,
    )


def test_members_include_not_ready_nodes_and_name_their_group() -> None:
    snap = _snapshot([])
    assert snap.members(["gpu1", "gpu2"]) == {"n1": "gpu1", "n2": "gpu2"}
    assert snap.members(["gpu2"]) == {"n2": "gpu2"}
    assert not snap.is_ready("n2")
    assert snap.is_ready("n1")


def test_overlapping_groups_place_a_node_through_the_first_listed() -> None:
    snap = placement.Snapshot(
        nodes={"n": _node("n", {"node.kubernetes.io/instance-type": "gpu1"})},
        groups={"a": _group("a", "gpu1"), "b": _group("b", "gpu1")},
        caches=[],
    )
    assert snap.members(["b", "a"]) == {"n": "b"}
    assert snap.members(["a", "b"]) == {"n": "a"}


def test_missing_groups_are_reported_in_spec_order() -> None:
    assert _snapshot([]).missing_groups(["zz", "gpu1", "aa", "zz"]) == ["zz", "aa"]


def test_desired_entries_list_every_cache_of_both_kinds_on_the_node() -> None:
    caches = [
        _cache("iris", ["gpu1", "gpu2"]),
        _cache("iris", ["gpu1"], namespace="team", serviceAccountName="sa"),
        _cache("other", ["gpu2"]),
        _cache("gone", ["gpu1"], deleting=True),
    ]
    desired = _snapshot(caches).desired_entries("n1").entries
    assert sorted(desired) == [("", "iris"), ("team", "iris")]
    assert desired[("team", "iris")] == {
        "sourceModelUri": "s3://b/m",
        "modelName": "iris",
        "namespace": "team",
        "nodeGroup": "gpu1",
        "serviceAccountName": "sa",
    }
    assert len(_snapshot(caches).desired_entries("n3")) == 0
    assert len(_snapshot(caches).desired_entries("unknown")) == 0


def _wide(name: str, namespace: str, second: int) -> placement.PlacedCache:
    """A namespace cache with a URI of the longest length the CRDs allow."""
    uri = "https://models.example/" + "a" * (modelcache.MAX_SOURCE_URI_LENGTH - 40) + f"/{name}"
    return _cache(
        name, ["gpu1"], namespace=namespace, uri=uri, created=f"2026-12-04T10:00:{second:02}Z"
    )


def test_one_namespace_passing_its_budget_loses_only_its_newest_entries() -> None:
    """Security review finding 5: one namespace's caches can no longer fill a node's
    LocalModelNode; the entries already there stay, the newest ones are left out and said why,
    and the other namespaces' and the cluster caches' entries are written."""
    flood = [_wide(f"wide-{i:02}", "team-a", 59 - i) for i in range(40)]
    caches = [
        *flood,
        _cache("victim", ["gpu1"], namespace="team-b", created="2026-12-04T11:00:00Z"),
        _cache("shared", ["gpu1"], created="2026-12-04T12:00:00Z"),
    ]
    desired = _snapshot(caches).desired_entries("n1")
    kept = sorted(k for k in desired.entries if k[0] == "team-a")
    cost = entries.entry_cost(desired.entries[kept[0]])
    assert len(kept) == entries.NAMESPACE_BUDGET // cost > 0
    oldest_first = sorted(flood, key=lambda c: c.created)
    assert kept == sorted(c.entry_key for c in oldest_first[: len(kept)])
    assert ("team-b", "victim") in desired.entries
    assert ("", "shared") in desired.entries
    left = set(desired.left_out)
    assert left == {c.entry_key for c in oldest_first[len(kept) :]}
    why = _snapshot(caches).left_out("n1", oldest_first[-1].entry_key)
    assert why is not None
    assert "namespace team-a" in why
    assert "64 KiB" in why
    assert _snapshot(caches).left_out("n1", ("team-b", "victim")) is None


def test_the_node_budget_keeps_cluster_caches_before_any_namespace() -> None:
    namespaces = [
        _wide(f"w{i}", f"ns-{i:03}", i % 60) for i in range(entries.NODE_BUDGET // 3000 + 10)
    ]
    caches = [*namespaces, _cache("admin", ["gpu1"], created="2026-12-04T23:00:00Z")]
    desired = _snapshot(caches).desired_entries("n1")
    assert ("", "admin") in desired.entries
    assert desired.left_out
    assert all("would take more than 1024 KiB" in why for why in desired.left_out.values())
    total = sum(entries.entry_cost(e) for e in desired.entries.values())
    assert total <= entries.NODE_BUDGET


def test_nodes_with_the_same_groups_share_one_desired_list() -> None:
    gpu1 = {"node.kubernetes.io/instance-type": "gpu1"}
    snap = placement.Snapshot(
        nodes={"a": _node("a", gpu1), "b": _node("b", gpu1)},
        groups={"gpu1": _group("gpu1", "gpu1")},
        caches=[_cache("iris", ["gpu1"])],
    )
    assert snap.desired_entries("a") is snap.desired_entries("b")


def test_merge_keeps_order_and_unknown_fields_of_unchanged_entries() -> None:
    caches = [_cache("a", ["gpu1"]), _cache("b", ["gpu1"])]
    desired = _snapshot(caches).desired_entries("n1")
    current: list[dict[str, Any]] = [
        {"sourceModelUri": "s3://b/m", "modelName": "b", "nodeGroup": "gpu1", "future": 1},
        {"sourceModelUri": "s3://b/m", "modelName": "a", "nodeGroup": "gpu1", "namespace": ""},
    ]
    assert entries.merge_entries(current, desired) is None
    memoised = entries.signature(current)
    assert entries.merge_entries(current, desired, current_signature=memoised) is None


def test_merge_drops_exact_duplicates() -> None:
    desired = _snapshot([_cache("a", ["gpu1"])]).desired_entries("n1")
    entry = {"sourceModelUri": "s3://b/m", "modelName": "a", "nodeGroup": "gpu1"}
    assert entries.merge_entries([entry, dict(entry)], desired) == [entry]


def test_merge_replaces_changed_drops_stale_and_appends_new_entries() -> None:
    caches = [_cache("a", ["gpu1"], uri="s3://b/new"), _cache("c", ["gpu1"])]
    desired = _snapshot(caches).desired_entries("n1")
    current = [
        {"sourceModelUri": "s3://b/old", "modelName": "a", "nodeGroup": "gpu1"},
        {"sourceModelUri": "s3://b/m", "modelName": "stale", "nodeGroup": "gpu1"},
        {"sourceModelUri": "s3://b/old", "modelName": "a", "nodeGroup": "gpu1"},
    ]
    merged = entries.merge_entries(current, desired)
    assert merged is not None
    assert [(e["modelName"], e["sourceModelUri"]) for e in merged] == [
        ("a", "s3://b/new"),
        ("c", "s3://b/m"),
    ]


def test_storage_parameters_are_compared_as_a_map() -> None:
    cache = _cache("a", ["gpu1"], storage={"key": "k", "parameters": {"x": "1", "y": "2"}})
    desired = _snapshot([cache]).desired_entries("n1")
    same: list[dict[str, Any]] = [
        {
            "sourceModelUri": "s3://b/m",
            "modelName": "a",
            "nodeGroup": "gpu1",
            "storage": {"parameters": {"y": "2", "x": "1"}, "key": "k"},
        }
    ]
    assert entries.merge_entries(same, desired) is None
    other = [{**same[0], "storage": {"key": "k", "parameters": {"x": "1"}}}]
    assert entries.merge_entries(other, desired) is not None


# ------------------------------------------------------------------------ usage


def test_group_usage_counts_each_uri_once_with_its_largest_size() -> None:
    caches = [
        _cache("a", ["g"], uri="s3://b/one", size="1Gi"),
        _cache("b", ["g", "h"], namespace="ns", uri="s3://b/one", size="2Gi"),
        _cache("c", ["g"], uri="s3://b/two", size="512Mi"),
        _cache("d", ["h"], uri="s3://b/three", size="5Gi"),
        _cache("e", ["g"], uri="s3://b/four", size="5Gi", deleting=True),
    ]
    usage = placement.group_usage("g", Quantity("4Gi"), caches)
    assert usage.used == Quantity("2560Mi")
    assert usage.available == Quantity("1536Mi")
    assert str(usage.used) == "2560Mi"


def test_over_committed_group_reports_negative_available() -> None:
    usage = placement.group_usage("g", Quantity("1Gi"), [_cache("a", ["g"], size="2Gi")])
    assert usage.available == Quantity("-1Gi")


def test_unused_group_reports_zero_used() -> None:
    usage = placement.group_usage("g", Quantity("1Gi"), [])
    assert str(usage.used) == "0"
    assert usage.available == Quantity("1Gi")


def test_a_shared_volume_cache_is_on_no_node_and_in_no_group_usage() -> None:
    """Issue 22: a pvcRef cache has `nodeGroups == []`: nothing node-local is planned for it."""
    spec = modelcache.LocalModelNamespaceCacheSpec.model_validate(
        {"sourceModelUri": "s3://b/shared", "modelSize": "5Gi", "pvcRef": "shared"}
    )
    shared = placement.PlacedCache(name="shared", namespace="team", spec=spec)
    snap = _snapshot([shared, _cache("iris", ["gpu1"])])
    assert snap.members(spec.node_groups) == {}
    assert snap.missing_groups(spec.node_groups) == []
    for node in ("n1", "n2", "n3"):
        assert ("team", "shared") not in snap.desired_entries(node).entries
    usage = placement.group_usage("gpu1", Quantity("10Gi"), [shared])
    assert usage.used == Quantity(0)
