"""`placement.node_matches`, the one node-selector matcher of controller and agent, against
Kubernetes' semantics (k8s.io/component-helpers nodeaffinity, apimachinery labels)."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.caching import placement

Obj = dict[str, Any]

NODE_OBJ = {"metadata": {"name": "node-1", "labels": {"instance-type": "gpu", "gpus": "4"}}}
GPU_NODE = {"metadata": {"name": "node-1", "uid": "6f1c", "labels": {"gpu": "a100"}}}


def _term(*exprs: Obj, fields: list[Obj] | None = None) -> Obj:
    term: Obj = {"matchExpressions": list(exprs)}
    if fields:
        term["matchFields"] = fields
    return term


def _req(key: str, op: str, *values: str) -> Obj:
    return {"key": key, "operator": op, "values": list(values)}


def _bare(key: str, op: str) -> Obj:
    """A requirement without a `values` field at all."""
    return {"key": key, "operator": op}


# ---- the cases on which the agent's former copy said True and the controller False --------
DISAGREED: list[tuple[str, Obj]] = [
    ("an Exists requirement that carries values", _term(_req("gpu", "Exists", "a100"))),
    ("a DoesNotExist requirement that carries values", _term(_req("zone", "DoesNotExist", "a"))),
    (
        "matchFields on metadata.uid",
        _term(fields=[_req("metadata.uid", "NotIn", "another-uid")]),
    ),
    ("matchFields with an Exists operator", _term(fields=[_bare("metadata.name", "Exists")])),
]


@pytest.mark.parametrize(("case", "term"), DISAGREED, ids=[c for c, _ in DISAGREED])
def test_an_invalid_term_matches_no_node(case: str, term: Obj) -> None:
    """Kubernetes rejects these terms (the requirement is invalid), so no node matches: the
    controller and the agent must agree on that."""
    assert placement.node_matches(GPU_NODE, [term]) is False, case


# ---- the general semantics -------------------------------------------------------------
@pytest.mark.parametrize(
    ("term", "matches"),
    [
        pytest.param(_term(_req("instance-type", "In", "gpu", "tpu")), True, id="In one of two"),
        pytest.param(_term(_req("instance-type", "In", "cpu")), False, id="In other"),
        pytest.param(_term(_req("instance-type", "NotIn", "cpu")), True, id="NotIn other"),
        pytest.param(_term(_req("zone", "NotIn", "a")), True, id="NotIn absent key"),
        pytest.param(_term(_req("instance-type", "Exists")), True, id="Exists"),
        pytest.param(
            _term(_bare("instance-type", "Exists")), True, id="Exists without values field"
        ),
        pytest.param(_term(_req("zone", "DoesNotExist")), True, id="DoesNotExist absent"),
        pytest.param(
            _term(_req("instance-type", "DoesNotExist")), False, id="DoesNotExist present"
        ),
        pytest.param(_term(_req("gpus", "Gt", "2")), True, id="Gt"),
        pytest.param(_term(_req("gpus", "Gt", "4")), False, id="Gt equal"),
        pytest.param(_term(_req("gpus", "Lt", "2")), False, id="Lt"),
        pytest.param(_term(_req("gpus", "Lt", "+5")), True, id="Lt plus sign"),
        pytest.param(_term(_req("zone", "Lt", "5")), False, id="Lt absent key"),
        pytest.param(_term(_req("instance-type", "Gt", "2")), False, id="Gt non-integer label"),
        pytest.param(
            _term(_req("instance-type", "In", "gpu"), _req("zone", "Exists")),
            False,
            id="one requirement fails",
        ),
        pytest.param(
            _term(_req("instance-type", "In", "gpu"), _req("gpus", "Gt", "1")),
            True,
            id="all requirements hold",
        ),
        pytest.param(_term(fields=[_req("metadata.name", "In", "node-1")]), True, id="fields In"),
        pytest.param(
            _term(fields=[_req("metadata.name", "In", "node-2")]), False, id="fields In other"
        ),
        pytest.param(
            _term(fields=[_req("metadata.name", "NotIn", "node-2")]), True, id="fields NotIn"
        ),
        pytest.param(
            _term(_req("gpus", "Gt", "8"), fields=[_req("metadata.name", "In", "node-1")]),
            False,
            id="expressions and fields ANDed",
        ),
        pytest.param(_term(), False, id="empty term"),
        # invalid requirements: the whole term matches nothing
        pytest.param(_term(_req("instance-type", "In")), False, id="In without values"),
        pytest.param(_term(_bare("zone", "NotIn")), False, id="NotIn without values field"),
        pytest.param(_term(_req("gpus", "Gt", "1", "2")), False, id="Gt two values"),
        pytest.param(_term(_req("gpus", "Lt")), False, id="Lt no value"),
        pytest.param(_term(_req("gpus", "Gt", "two")), False, id="Gt non-integer bound"),
        pytest.param(_term(_req("gpus", "Gt", "1_0")), False, id="Gt Go-invalid integer"),
        pytest.param(_term(_req("gpus", "Gt", str(2**63))), False, id="Gt beyond int64"),
        pytest.param(_term(_req("instance-type", "Bogus", "gpu")), False, id="unknown operator"),
        pytest.param(_term(_req("not a key", "DoesNotExist")), False, id="invalid key"),
        pytest.param(_term(_req("a/b/c", "DoesNotExist")), False, id="key with two slashes"),
        pytest.param(_term(_req("", "DoesNotExist")), False, id="empty key"),
        pytest.param(_term(_req("zone", "NotIn", "not a value")), False, id="invalid value"),
        pytest.param(
            _term(_req("instance-type", "In", "gpu"), _req("zone", "Exists", "x")),
            False,
            id="one invalid requirement among valid",
        ),
        pytest.param(
            _term(fields=[_req("metadata.name", "In", "node-1", "node-2")]),
            False,
            id="fields two values",
        ),
        pytest.param(
            _term(fields=[_req("metadata.name", "NotIn")]), False, id="fields NotIn without values"
        ),
        pytest.param(
            _term(fields=[_req("spec.providerID", "In", "node-1")]), False, id="fields other key"
        ),
        pytest.param(
            _term(_req("instance-type", "In", "gpu"), fields=[_req("metadata.uid", "In", "x")]),
            False,
            id="fields on uid beside valid expression",
        ),
    ],
)
def test_node_selector_terms(term: Obj, matches: bool) -> None:
    assert placement.node_matches(NODE_OBJ, [term]) is matches


def test_prefixed_keys_are_labels_like_any_other() -> None:
    node = {"metadata": {"name": "n", "labels": {"node.kubernetes.io/instance-type": "g5"}}}
    term = _term(_req("node.kubernetes.io/instance-type", "In", "g5"))
    assert placement.node_matches(node, [term])


def test_terms_are_ored_and_absent_terms_match_nothing() -> None:
    terms = [_term(_req("zone", "Exists")), _term(_req("instance-type", "In", "gpu"))]
    assert placement.node_matches(NODE_OBJ, terms)
    assert not placement.node_matches(NODE_OBJ, None)
    assert not placement.node_matches(NODE_OBJ, [])


def test_an_invalid_or_empty_term_does_not_hide_a_matching_one() -> None:
    """Kubernetes skips an erroring term and goes on with the others."""
    invalid = _term(_req("gpu", "Exists", "a100"))
    valid = _term(_req("gpu", "In", "a100"))
    assert placement.node_matches(GPU_NODE, [invalid, {}, valid])
    assert not placement.node_matches(GPU_NODE, [invalid, {}])


def test_a_node_without_labels_matches_only_absence() -> None:
    node = {"metadata": {"name": "bare"}}
    assert placement.node_matches(node, [_term(_req("gpu", "DoesNotExist"))])
    assert placement.node_matches(node, [_term(_req("gpu", "NotIn", "a100"))])
    assert not placement.node_matches(node, [_term(_req("gpu", "Exists"))])
    assert not placement.node_matches(node, [_term(_req("gpu", "Gt", "0"))])
