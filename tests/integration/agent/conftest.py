"""Fixtures for the node agent's integration tests (the harness is in `harness.py`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from localcache.devenv.controlplane import ControlPlane
from tests.integration.agent.harness import Agent


@pytest.fixture
async def agent(
    control_plane: ControlPlane, crds: list[str], namespace: str, tmp_path: Path
) -> AsyncIterator[Agent]:
    """A configured node (config, node group with the models root as PV path) whose agent
    is not started yet."""
    root = tmp_path / "models-root"
    root.mkdir()
    harness = Agent(control_plane, namespace=namespace, root=root)
    await harness.configure()
    await harness.node_group()
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[Callable[[], str]]:
    """A second fresh namespace (for namespace-cache entries)."""
    created: list[str] = []

    def make() -> str:
        name = f"t-agent-{uuid.uuid4().hex[:8]}"
        control_plane.create_namespace(name)
        created.append(name)
        return name

    yield make
    for name in created:
        control_plane.delete_namespace(name)
