"""pytest plugin: the session control plane, a namespace per test, a task-leak guard.

Fixtures:
- `control_plane` (session): etcd + kube-apiserver + kube-controller-manager, started once.
- `kubeconfig_path` (session): the admin kubeconfig of that control plane.
- `namespace` (function): a fresh namespace for the test, deleted afterwards.
- `task_leak_guard` (function, autouse for async tests): fails tests that leak tasks.

Under pytest-xdist (`make test` runs two workers) the tests are split in two work units
(`worker_group`).

Tests marked `kcm` are skipped when no kube-controller-manager binary is available (for
example an envtest `KUBEBUILDER_ASSETS` directory).
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcache.devenv.controlplane import ControlPlane
from tests.support import leakguard

task_leak_guard = leakguard.task_leak_guard


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    plane = ControlPlane(with_kcm=False)
    plane.with_kcm = plane.kcm_available
    plane.start()
    os.environ["LOCALCACHE_TEST_KUBECONFIG"] = str(plane.kubeconfig_path)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kubeconfig_path(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig_path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:30].strip("-")


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"t-{_slug(request.node.name)}-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(name)
    try:
        yield name
    finally:
        control_plane.delete_namespace(name)


@pytest.fixture(autouse=True)
async def _async_task_leak_guard(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    if not asyncio.iscoroutinefunction(getattr(request.node, "function", None)):
        yield
        return
    before = set(asyncio.all_tasks())
    yield
    await leakguard.assert_no_leaked_tasks(before)


#: The end-to-end packages on the run's one shared real-node test bed (tests/e2e/conftest.py),
#: in the order they run (`pytest_collection_modifyitems`): KServe's serving controllers last,
#: after the packages that install KServe's add-on or a profile.
SHARED_BED_PACKAGES = (
    "tests/e2e/migration/",
    "tests/e2e/profiles/",
    "tests/e2e/realnodes/",
    "tests/e2e/kservectl/",
)


def _bed_rank(item: pytest.Item) -> int:
    """-1 off the shared bed, else the package's place in `SHARED_BED_PACKAGES`."""
    nodeid = item.nodeid
    return next((i for i, p in enumerate(SHARED_BED_PACKAGES) if nodeid.startswith(p)), -1)


def worker_group(nodeid: str) -> str:
    """The pytest-xdist work unit of a test (`make test` runs two workers): the shared-bed
    packages on one worker, in order, everything else on the other, so that the session
    control plane and the test bed each start once and their waits overlap."""
    return "shared-bed" if nodeid.startswith(SHARED_BED_PACKAGES) else "control-plane"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units by `worker_group`. (xdist's own `--dist loadgroup` does not group on pytest
    9.2, whose node ids it can no longer rewrite.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class TwoGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return TwoGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = sorted(items, key=_bed_rank)  # stable: the packages' own order is kept
    for item in items:
        path = item.path.as_posix()
        if "tests/integration" in path or "tests/e2e" in path:
            item.add_marker(pytest.mark.integration)
