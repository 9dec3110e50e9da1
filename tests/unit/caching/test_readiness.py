"""Copy readiness labels and the node affinity that makes serving pods wait for them."""

from __future__ import annotations

import re
from typing import Any

from localcache.caching import readiness

Obj = dict[str, Any]
LABEL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")


def lmn(entries: list[tuple[str, str | None]], states: dict[str, str]) -> Obj:
    return {
        "metadata": {"name": "n1"},
        "spec": {
            "localModels": [
                {"sourceModelUri": "s3://b/m", "modelName": name, "namespace": ns}
                for name, ns in entries
            ]
        },
        "status": {"modelStatus": states},
    }


def test_label_keys_are_valid_distinct_and_under_our_prefix_for_any_cache_name() -> None:
    long_key = f"{'n' * 63}/{'c' * 253}"
    keys = {readiness.label_key(k) for k in ("iris", "team-a/iris", long_key)}
    assert len(keys) == 3
    for key in keys:
        prefix, name = key.split("/")
        assert prefix == readiness.PREFIX
        assert len(name) <= 63
        assert LABEL_NAME.match(name)
        assert readiness.is_own(key)
    assert readiness.label_key("iris") == readiness.label_key("iris")  # stable
    assert not readiness.is_own("kubernetes.io/hostname")


def test_only_listed_and_downloaded_entries_get_a_label() -> None:
    obj = lmn(
        [("iris", None), ("llama", "team-a"), ("slow", None)],
        {
            "iris": "ModelDownloaded",
            "team-a/llama": "ModelDownloaded",
            "slow": "ModelDownloading",
            "gone": "ModelDownloaded",  # status left over after its entry was removed
        },
    )
    assert readiness.desired_labels(obj, enabled=True) == {
        readiness.label_key("iris"): "true",
        readiness.label_key("team-a/llama"): "true",
    }
    assert readiness.desired_labels(obj, enabled=False) == {}
    assert readiness.desired_labels(None, enabled=True) == {}


def test_label_patch_touches_only_our_labels() -> None:
    mine, stale = readiness.label_key("iris"), readiness.label_key("old")
    current = {"kubernetes.io/hostname": "n1", "team": "gpu", stale: "true"}
    patch = readiness.label_patch(current, {mine: "true"})
    assert patch == {"metadata": {"labels": {mine: "true", stale: None}}}
    assert readiness.label_patch({**current, mine: "true"}, {stale: "true", mine: "true"}) is None
    assert readiness.label_patch(current, {}) == {"metadata": {"labels": {stale: None}}}
    assert readiness.label_patch({"team": "gpu"}, {}) is None


def test_a_pod_without_node_affinity_gets_one_term() -> None:
    req = readiness.requirement("iris")
    got = readiness.with_requirements(None, [req])
    assert got == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [req]}]
            }
        }
    }
    assert readiness.required_keys({"spec": {"affinity": got}}) == {readiness.label_key("iris")}


def test_the_requirement_is_anded_into_every_existing_term_and_other_affinity_kept() -> None:
    req = readiness.requirement("iris")
    gpu = {"key": "gpu", "operator": "In", "values": ["a100"]}
    affinity: Obj = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"x": 1}]},
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [gpu]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
        },
    }
    got = readiness.with_requirements(affinity, [req])
    assert got is not None
    terms = got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"] == [gpu, req]
    assert terms[1]["matchExpressions"] == [req]
    assert (
        terms[1]["matchFields"]
        == affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][1]["matchFields"]
    )
    assert got["podAntiAffinity"] == affinity["podAntiAffinity"]
    assert got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1}]
    # the input is not mutated, and applying again changes nothing
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"] == [gpu]
    assert readiness.with_requirements(got, [req]) is None
