"""The status merge patch: only what changed, removed map keys as null."""

from __future__ import annotations

from typing import Any, cast

from localcache.controllers import clustercache, state, status
from localcache.runtime import patch as patch_mod


def test_equal_status_gives_an_empty_patch() -> None:
    same = {"nodeStatus": {"a": "NodeDownloaded"}, "copies": {"total": 1}, "conditions": []}
    assert patch_mod.merge_patch_of_keys(same, same) == {}


def test_changed_and_removed_map_keys() -> None:
    old = {"nodeStatus": {"a": "NodeDownloaded", "gone": "NodeNotReady"}, "copies": {"total": 2}}
    new = {"nodeStatus": {"a": "NodeDownloading"}, "copies": {"total": 1}}
    assert patch_mod.merge_patch_of_keys(old, new) == {
        "nodeStatus": {"a": "NodeDownloading", "gone": None},
        "copies": {"total": 1},
    }


def test_lists_are_replaced_whole_and_unowned_fields_left_alone() -> None:
    old = {"inferenceServices": [{"name": "a"}], "llmInferenceServices": [{"name": "x"}]}
    new = {"inferenceServices": [{"name": "b"}]}
    assert patch_mod.merge_patch_of_keys(old, new) == {"inferenceServices": [{"name": "b"}]}


def test_missing_old_fields_are_written() -> None:
    assert patch_mod.merge_patch_of_keys({}, {"nodeStatus": {}}) == {"nodeStatus": {}}


class _RecordingApi:
    """Answers status patches like the apiserver: the object with the patch applied."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.patches: list[dict[str, Any]] = []

    async def patch_status(self, res: Any, name: str, patch: dict[str, Any], **_: Any) -> Any:
        self.patches.append(patch)
        status_ = dict(self.obj.get("status") or {})
        status_.update(patch["status"])
        rv = str(int(self.obj["metadata"]["resourceVersion"]) + 1)
        self.obj = {**self.obj, "metadata": {**self.obj["metadata"], "resourceVersion": rv}}
        self.obj["status"] = status_
        return self.obj


def _cache(rv: str, status_: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "iris", "uid": "u1", "resourceVersion": rv}, "status": status_}


async def test_a_store_behind_our_own_write_neither_repeats_it_nor_hides_a_change() -> None:
    """The informer store may still hold the copy a write was based on when the next
    reconcile runs (a retry after 5 ms): the diff is then taken against what was written."""
    stale = _cache("1", {"copies": {"failed": 0}})
    api = _RecordingApi(stale)
    written = status.WrittenStatus()
    sc = clustercache.SCOPE
    failed = {"copies": {"failed": 1}}
    assert await status.write_status(
        cast(state.Api, api), sc, current=stale, desired=failed, written=written
    )
    # same state again, store still stale: nothing to write (and so no Events twice)
    assert not await status.write_status(
        cast(state.Api, api), sc, current=stale, desired=failed, written=written
    )
    # back to the store's old state, still stale: that is a change, and it is written
    assert await status.write_status(
        cast(state.Api, api), sc, current=stale, desired={"copies": {"failed": 0}}, written=written
    )
    assert [p["status"] for p in api.patches] == [
        {"copies": {"failed": 1}},
        {"copies": {"failed": 0}},
    ]
    # once the store shows a newer version, it is the base again
    fresh = _cache("3", {"copies": {"failed": 0}})
    assert written.current(fresh) == {"copies": {"failed": 0}}
    assert not await status.write_status(
        cast(state.Api, api), sc, current=fresh, desired={"copies": {"failed": 0}}, written=written
    )
