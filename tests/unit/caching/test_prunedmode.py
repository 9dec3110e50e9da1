import json
from typing import Any

from localcache.caching import prunedmode


def _cache(spec: dict[str, Any], applied: Any = None, *, raw: str | None = None) -> dict[str, Any]:
    annotations = {}
    if applied is not None:
        annotations[prunedmode.LAST_APPLIED] = json.dumps(applied)
    if raw is not None:
        annotations[prunedmode.LAST_APPLIED] = raw
    return {"metadata": {"name": "m", "annotations": annotations}, "spec": spec}


def test_a_pvc_ref_the_apiserver_pruned_is_found_in_the_last_applied_configuration() -> None:
    applied = {"spec": {"pvcRef": "shared-models", "nodeGroups": ["g"]}}
    assert prunedmode.dropped_pvc_ref(_cache({"nodeGroups": ["g"]}, applied)) == "shared-models"


def test_a_stored_pvc_ref_or_none_applied_is_not_reported() -> None:
    assert prunedmode.dropped_pvc_ref(_cache({"pvcRef": "c"}, {"spec": {"pvcRef": "c"}})) is None
    assert prunedmode.dropped_pvc_ref(_cache({"nodeGroups": ["g"]}, {"spec": {}})) is None
    assert prunedmode.dropped_pvc_ref(_cache({"nodeGroups": ["g"]})) is None


def test_a_hostile_annotation_is_ignored() -> None:
    for raw in ("not json", "[1]", '{"spec": 3}', '{"spec": {"pvcRef": 7}}'):
        assert prunedmode.dropped_pvc_ref(_cache({}, raw=raw)) is None
    huge = json.dumps({"spec": {"pvcRef": "c"}, "x": "y" * prunedmode.MAX_LAST_APPLIED})
    assert prunedmode.dropped_pvc_ref(_cache({}, raw=huge)) is None


def test_the_message_names_the_field_the_cause_and_the_fix() -> None:
    text = prunedmode.message("shared-models")
    assert "spec.pvcRef (shared-models)" in text
    assert "KServe v0.20" in text
    assert "Install localcache's CRDs" in text
