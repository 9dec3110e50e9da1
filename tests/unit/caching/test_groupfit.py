"""`groupfit.pick_group`: the node group follows the workload's nodeSelector and required node
affinity (KServe #5914), the annotation still wins, and no fit keeps KServe's first group."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import nodegroup
from localcache.caching import groupfit

Obj = dict[str, Any]
ZONE = "topology.kubernetes.io/zone"


def group(name: str, pool: str) -> nodegroup.LocalModelNodeGroup:
    """A group selecting the nodes labelled pool=<pool>."""
    return nodegroup.LocalModelNodeGroup.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {
                    "local": {"path": "/models"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": [pool]}
                                    ]
                                }
                            ]
                        }
                    },
                },
                "persistentVolumeClaimSpec": {},
            },
        }
    )


def node(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": labels}}


GROUPS = {"a100": group("a100", "a"), "h100": group("h100", "h")}
NODES = [
    node("n-a", pool="a", gpu="a100", gpus="4", **{ZONE: "z1"}),
    node("n-h", pool="h", gpu="h100", gpus="8", **{ZONE: "z2"}),
]


def required(*terms: list[Obj]) -> Obj:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": exprs} for exprs in terms]
            }
        }
    }


def req(key: str, op: str, *values: str) -> Obj:
    out: Obj = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def pick(
    *workloads: groupfit.Workload,
    cache_groups: tuple[str, ...] = ("a100", "h100"),
    nodes: list[Obj] | None = NODES,
    requested: str | None = None,
    current: str | None = None,
) -> groupfit.GroupPick:
    return groupfit.pick_group(
        cache_groups,
        node_groups=GROUPS,
        nodes=nodes,
        workloads=workloads,
        requested=requested,
        current=current,
    )


def predictor(selector: Obj | None = None, affinity: Obj | None = None) -> groupfit.Workload:
    spec: Obj = {}
    if selector is not None:
        spec["nodeSelector"] = selector
    if affinity is not None:
        spec["affinity"] = affinity
    return groupfit.Workload.of(spec, "the predictor")


def test_without_constraints_the_first_group_is_kept_unjudged() -> None:
    assert pick(predictor()) == groupfit.GroupPick("a100")
    assert pick() == groupfit.GroupPick("a100")


def test_a_node_selector_for_the_second_groups_nodes_picks_the_second_group() -> None:
    assert pick(predictor({"gpu": "h100"})) == groupfit.GroupPick("h100", True)


def test_a_node_selector_needs_every_label() -> None:
    assert pick(predictor({"gpu": "h100", ZONE: "z2"})).group == "h100"
    missed = pick(predictor({"gpu": "h100", ZONE: "z1"}))
    assert missed.group == "a100"
    assert missed.fits is False


@pytest.mark.parametrize(
    ("expressions", "expected"),
    [
        ([req("gpu", "In", "h100", "b200")], "h100"),
        ([req("gpu", "NotIn", "a100")], "h100"),
        ([req("gpus", "Gt", "4")], "h100"),
        ([req("gpus", "Lt", "8")], "a100"),
        ([req("gpu", "Exists"), req("pool", "NotIn", "a")], "h100"),
        ([req("gpu", "DoesNotExist")], None),
        ([req("gpu", "In", "a100"), req("gpus", "Gt", "4")], None),  # ANDed within a term
    ],
)
def test_required_affinity_operators(expressions: list[Obj], expected: str | None) -> None:
    found = pick(predictor(affinity=required(expressions)))
    if expected is None:
        assert (found.group, found.fits) == ("a100", False)
    else:
        assert found == groupfit.GroupPick(expected, True)


def test_terms_are_ored() -> None:
    affinity = required([req("gpu", "In", "b200")], [req("gpu", "In", "h100")])
    assert pick(predictor(affinity=affinity)) == groupfit.GroupPick("h100", True)


def test_match_fields_on_the_node_name_count() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-h"]}]}
                ]
            }
        }
    }
    assert pick(predictor(affinity=affinity)).group == "h100"


def test_node_selector_and_affinity_must_both_hold() -> None:
    both = predictor({"gpu": "h100"}, required([req(ZONE, "In", "z1")]))
    found = pick(both)
    assert (found.group, found.fits) == ("a100", False)


def test_preferred_affinity_alone_is_no_constraint() -> None:
    preferred: Obj = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert pick(predictor(affinity=preferred)) == groupfit.GroupPick("a100")


def test_the_first_fitting_group_in_spec_order_wins() -> None:
    anywhere = predictor(affinity=required([req("gpu", "Exists")]))
    assert pick(anywhere, cache_groups=("h100", "a100")).group == "h100"


def test_groups_that_do_not_exist_are_skipped() -> None:
    assert pick(predictor({"gpu": "a100"}), cache_groups=("gone", "a100")).group == "a100"
    assert pick(predictor(), cache_groups=("gone",)) == groupfit.GroupPick(None)


def test_the_annotation_wins_even_when_another_group_fits() -> None:
    found = pick(predictor({"gpu": "h100"}), requested="a100")
    assert (found.group, found.fits) == ("a100", False)
    assert found.why is not None
    assert "node group a100 " in found.why
    assert pick(predictor({"gpu": "a100"}), requested="a100") == groupfit.GroupPick("a100", True)


def test_an_annotation_naming_no_group_of_the_cache_picks_nothing() -> None:
    assert pick(predictor({"gpu": "h100"}), requested="other").group is None


def test_no_fit_keeps_the_first_group_and_says_why() -> None:
    found = pick(predictor({"gpu": "b200"}))
    assert found.group == "a100"
    assert found.fits is False
    assert found.why == (
        "no node of node groups a100, h100 matches both the group and the predictor's "
        "nodeSelector gpu=b200"
    )


def test_the_reason_names_the_required_affinity_too() -> None:
    found = pick(predictor({"gpu": "b200"}, required([req("gpu", "Exists")])))
    assert found.why is not None
    assert found.why.endswith("the predictor's nodeSelector gpu=b200 and required node affinity")


def test_unknown_nodes_keep_the_first_group_unjudged() -> None:
    assert pick(predictor({"gpu": "h100"}), nodes=None) == groupfit.GroupPick("a100")


def test_no_nodes_at_all_fit_nothing() -> None:
    assert pick(predictor({"gpu": "h100"}), nodes=[]).fits is False


def test_every_workload_must_fit_on_the_same_group() -> None:
    """LLMInferenceService: decode and worker templates both need a node of the group."""
    decode = groupfit.Workload.of({"nodeSelector": {ZONE: "z2"}}, "spec.template")
    worker = groupfit.Workload.of({"nodeSelector": {"gpu": "h100"}}, "spec.worker")
    assert pick(decode, worker).group == "h100"
    apart = groupfit.Workload.of({"nodeSelector": {"gpu": "a100"}}, "spec.worker")
    found = pick(decode, apart)
    assert found.fits is False
    assert found.why is not None
    assert "spec.template's nodeSelector" in found.why
    assert "spec.worker's nodeSelector gpu=a100" in found.why


def test_a_group_fit_picks_per_cache() -> None:
    fit = groupfit.GroupFit(GROUPS, NODES, (predictor({"gpu": "h100"}),))
    assert fit.constrained
    assert fit.pick("llm", ["a100", "h100"]).group == "h100"
    assert fit.pick("llm", ["a100"]).fits is False


def test_the_current_group_is_kept_while_it_fits() -> None:
    """An update must not move running pods because an earlier group started to fit."""
    anywhere = predictor(affinity=required([req("gpu", "Exists")]))
    assert pick(anywhere).group == "a100"
    assert pick(anywhere, current="h100") == groupfit.GroupPick("h100", True)
    h100_only = predictor({"gpu": "h100"})
    assert pick(h100_only, current="a100").group == "h100"  # no longer fits: moves
    assert pick(anywhere, current="gone").group == "a100"


def test_a_group_fit_reads_the_current_group_from_the_claim_name() -> None:
    anywhere = predictor(affinity=required([req("gpu", "Exists")]))
    fit = groupfit.GroupFit(GROUPS, NODES, (anywhere,), current_claim="llm-h100")
    assert fit.pick("llm", ["a100", "h100"]).group == "h100"
    assert fit.pick("other", ["a100", "h100"]).group == "a100"  # another cache's claim
    assert fit.pick("llm", ["a100", "h100"], requested="a100").group == "a100"


def test_workload_of_ignores_what_is_not_a_dict() -> None:
    assert not groupfit.Workload.of(None).constrained
    assert not groupfit.Workload.of({"nodeSelector": "x", "affinity": []}).constrained
