"""Fixtures of the admission-policy tests: the shipped policies (manifests/policies) and the
agent's RBAC applied to the session's control plane once for this package (deleting and
re-creating the PersistentVolume-parameter bindings within one apiserver's life was seen to
leave them unenforced), removed when the package's tests are done, so that later packages
(the webhook tests) see only what they install; a tenant user with its own Role."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.devenv.clientconfig import Credentials
from localcache.devenv.controlplane import ControlPlane
from tests.integration.security import harness

REPO = Path(__file__).resolve().parents[3]
POLICIES = REPO / "manifests" / "policies"
BASE = REPO / "manifests" / "base"


@pytest.fixture(scope="package")
def policies(control_plane: ControlPlane, crds: list[str]) -> Iterator[None]:
    files = [BASE / "namespaces.yaml", BASE / "agent-rbac.yaml"]
    control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", *(a for f in files for a in ("-f", str(f)))
    )
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(POLICIES))
    yield
    control_plane.kubectl("delete", "--ignore-not-found", "-k", str(POLICIES), check=False)
    control_plane.kubectl(
        "delete", "--ignore-not-found", "-f", str(BASE / "agent-rbac.yaml"), check=False
    )


@pytest.fixture
def tenant(control_plane: ControlPlane, namespace: str) -> Credentials:
    """A user who may create pods, Jobs and PVCs in `namespace` (Role `workloads`)."""
    user = f"tenant-{namespace}"
    harness.grant(control_plane, namespace, user)
    return control_plane.add_user(user, [])
