"""Issue 13 bug 3, reported: a scratch directory of the models root replaced by a symlink is
repaired with a Warning Event; `models` replaced by one is refused with one Warning Event per
problem, every pass raising (retried with backoff) until an operator fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcache.agent.disk import layout
from localcache.runtime import errors
from tests.unit.agent.test_reconciler import World


async def test_a_symlinked_trash_is_repaired_and_reported(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.models()
    await world.reconcile()
    world.disk.trash.rmdir()
    world.disk.trash.symlink_to(world.disk.models)

    await world.reconcile()

    [event] = [e for e in world.api.events() if e["reason"] == "ModelsRootRepaired"]
    assert event["type"] == "Warning"
    assert f"{world.disk.trash} was a symlink" in event["message"]
    assert world.disk.trash.is_dir()
    assert not world.disk.trash.is_symlink()


async def test_a_symlinked_models_directory_is_refused_and_reported_once(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.models()
    await world.reconcile()
    world.disk.models.rename(tmp_path / "moved")
    world.disk.models.symlink_to(tmp_path / "moved")

    for _ in range(2):
        with pytest.raises(errors.LocalcacheError, match="symlink"):
            await world.reconcile()
    [event] = [e for e in world.api.events() if e["reason"] == "ModelsRootUnsafe"]
    assert event["type"] == "Warning"
    assert f"{world.disk.models} is a symlink" in event["message"]
    assert world.disk.models.is_symlink(), "the agent never repairs models itself"
    assert layout.MODELS_DIR in event["message"]
