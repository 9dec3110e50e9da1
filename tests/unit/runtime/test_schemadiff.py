"""The CRD schema comparison: our generated CRDs against KServe-shaped and other served ones."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localcache.runtime.crds import schemadiff
from tests import kserveshape
from tests.support import schemastrip

Obj = dict[str, Any]
CRDS = {crd["metadata"]["name"]: crd for crd in kserveshape.our_crds()}
NODES = "localmodelnodes.serving.kserve.io"
CACHES = "localmodelcaches.serving.kserve.io"
GROUPS = "localmodelnodegroups.serving.kserve.io"


def _schema(crd: Obj) -> Obj:
    schema: Obj = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("name", sorted(CRDS))
def test_our_crds_served_as_generated_report_nothing(name: str) -> None:
    finding = schemadiff.compare(CRDS[name], copy.deepcopy(CRDS[name]))
    assert finding == schemadiff.SchemaFinding(name)
    assert not finding.degraded


@pytest.mark.parametrize("name", sorted(CRDS))
def test_kserve_shaped_crds_report_exactly_our_extras(name: str) -> None:
    fields, rule_paths = kserveshape.EXTRAS[name]
    finding = schemadiff.compare(CRDS[name], kserveshape.kserve_shaped(CRDS[name]))
    assert finding.crd == name
    assert finding.missing_fields == tuple(sorted(fields))
    assert sorted({r.split(":")[0] for r in finding.missing_rules}) == sorted(rule_paths)
    assert finding.degraded


def test_the_extras_the_issue_names_are_found_without_a_hand_written_list() -> None:
    found = {
        name: schemadiff.compare(crd, kserveshape.kserve_shaped(crd)).missing_fields
        for name, crd in CRDS.items()
    }
    assert "status.conditions" in found[CACHES]
    assert {"status.modelProgress", "status.summary"} <= set(found[NODES])
    assert "spec.tolerations" in found[GROUPS]


def test_a_missing_rule_names_its_path_and_message() -> None:
    finding = schemadiff.compare(CRDS[GROUPS], kserveshape.kserve_shaped(CRDS[GROUPS]))
    assert finding.missing_rules == ("spec.storageLimit: storageLimit must be greater than zero",)


def test_below_a_missing_field_nothing_more_is_listed() -> None:
    served = schemastrip.strip(_schema(CRDS[NODES]), ["status"])
    assert schemadiff.missing_fields(_schema(CRDS[NODES]), served) == ["status"]


def test_nested_paths_name_array_items_and_map_values() -> None:
    ours = _schema(CRDS[NODES])
    served = schemastrip.strip(
        ours, ["spec.localModels[*].storage.parameters.*", "status.modelProgress.*.percent"]
    )
    assert sorted(schemadiff.missing_fields(ours, served)) == [
        "spec.localModels[*].storage.parameters.*",
        "status.modelProgress.*.percent",
    ]


def test_a_served_node_that_preserves_unknown_fields_prunes_nothing() -> None:
    # KServe's "minimal" CRDs: spec and status keep whatever is written
    ours = _schema(CRDS[NODES])
    served = copy.deepcopy(ours)
    for part in ("spec", "status"):
        served["properties"][part] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    assert schemadiff.missing_fields(ours, served) == []


def test_a_served_map_keeps_any_key_with_its_values_schema() -> None:
    ours = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    served = {"type": "object", "additionalProperties": {"type": "string"}}
    assert schemadiff.missing_fields(ours, served) == []


def test_a_version_the_crd_does_not_serve_is_reported() -> None:
    served = copy.deepcopy(CRDS[CACHES])
    served["spec"]["versions"][0]["served"] = False
    finding = schemadiff.compare(CRDS[CACHES], served)
    assert finding.missing_fields == ("versions[v1alpha1]",)


def test_only_the_rules_the_served_node_lacks_are_reported() -> None:
    ours = _schema(CRDS[CACHES])
    served = schemastrip.drop_rules(ours, ["spec.modelSize"])
    # the immutability rule on sourceModelUri is KServe's too: not reported
    assert schemadiff.missing_rules(ours, served) == [
        "spec.modelSize: modelSize must be greater than zero"
    ]
    assert schemadiff.missing_rules(ours, copy.deepcopy(ours)) == []
