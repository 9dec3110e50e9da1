"""Fixtures shared by the integration tests: the CRDs installed once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcache.devenv import crds as crd_install
from localcache.devenv.controlplane import ControlPlane

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIRS = (REPO_ROOT / "manifests" / "crds", REPO_ROOT / "manifests" / "test")


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> list[str]:
    """Our CRDs (manifests/crds) and the test stand-ins for KServe's (manifests/test),
    installed and serving; the value is the list of CRD names."""
    return crd_install.install_crds(control_plane, CRD_DIRS)
