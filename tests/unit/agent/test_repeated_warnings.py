"""The agent warns about a download that cannot start (or a Job the apiserver rejects) once
per change of its state, not on every resync (issue 14 item 8: `download_not_started`
repeated for every model on every pass). Runs the reconciler of test_reconciler on its
in-memory stores and recording API."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.unit.agent.test_reconciler import World, _entry

BROKEN_CONTAINER: dict[str, Any] = {
    "metadata": {"name": "broken"},
    "spec": {
        "container": {"image": "x"},
        "supportedUriFormats": [{"regex": "("}],
        "workloadType": "localModelDownloadJob",
    },
}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [line for line in logs if line["event"] == name]


async def test_download_not_started_is_warned_once_per_state_not_per_resync(
    world: World,
) -> None:
    world.stores["storage_containers"].upsert(BROKEN_CONTAINER)
    world.models(_entry(nodeGroup="gpu"))
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            await world.reconcile()
    warned = _events(logs, "download_not_started")
    assert len(warned) == 1, warned
    assert warned[0]["log_level"] == "warning"
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadError"}, "still reported"

    # Another problem is a new state: warned again, once.
    world.stores["storage_containers"].upsert(
        {
            **BROKEN_CONTAINER,
            "spec": {**BROKEN_CONTAINER["spec"], "supportedUriFormats": [{"regex": "["}]},
        }
    )
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            await world.reconcile()
    assert len(_events(logs, "download_not_started")) == 1


async def test_a_model_that_left_and_came_back_is_warned_again(world: World) -> None:
    world.stores["storage_containers"].upsert(BROKEN_CONTAINER)
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    world.models()  # the entry leaves the spec: its key is forgotten
    await world.reconcile()
    world.models(_entry(nodeGroup="gpu"))
    with structlog.testing.capture_logs() as logs:
        await world.reconcile()
        await world.reconcile()
    assert len(_events(logs, "download_not_started")) == 1


async def test_a_rejected_job_is_warned_once_per_state(world: World) -> None:
    world.api.full.add("team-a")
    world.models(_entry("tenant", namespace="team-a", nodeGroup="gpu"))
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            await world.reconcile()
    assert len(_events(logs, "download_job_rejected")) == 1
    assert world.status()["modelStatus"] == {"team-a/tenant": "ModelDownloadError"}
