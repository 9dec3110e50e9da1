"""Issue 13 bug 4 (b): a deletion that fails is reported by the agent, once, with the folder
and the error, as a Warning Event on its LocalModelNode (not hidden, not repeated each pass)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localcache.agent.disk import tree
from tests.unit.agent.test_reconciler import World

KEY = "0123456789abcdef"


def _refuse(path: Path) -> None:
    raise PermissionError(13, "Permission denied", str(path / "weights" / "model.bin"))


async def test_a_failed_deletion_is_an_event_naming_folder_and_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path)
    world.models()
    (world.disk.models / KEY / "weights").mkdir(parents=True)
    monkeypatch.setattr(tree, "remove", _refuse)

    await world.reconcile()

    [event] = [e for e in world.api.events() if e["reason"] == "ModelDeletionFailed"]
    assert event["type"] == "Warning"
    assert f"could not delete models/{KEY}" in event["message"]
    assert "Permission denied" in event["message"]
    assert os.listdir(world.disk.trash), "the bytes are still there, and said to be"

    await world.reconcile()
    assert len([e for e in world.api.events() if e["reason"] == "ModelDeletionFailed"]) == 1
