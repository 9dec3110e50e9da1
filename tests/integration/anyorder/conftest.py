"""Fixtures for the start-in-any-order tests: a control plane of their own.

These tests install and delete KServe's stand-in CRDs (`manifests/test`), which the other
integration tests rely on, so they never touch the session control plane: the module gets
its own etcd + kube-apiserver (no kube-controller-manager) with only localcache's CRDs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.devenv import crds as crd_install
from localcache.devenv.controlplane import ControlPlane

REPO_ROOT = Path(__file__).resolve().parents[3]
OWN_CRDS = REPO_ROOT / "manifests" / "crds"
KSERVE_CRDS = REPO_ROOT / "manifests" / "test"
ISVC_CRD = KSERVE_CRDS / "inferenceservice-crd.yaml"
CSC_CRD = KSERVE_CRDS / "clusterstoragecontainer-crd.yaml"


@pytest.fixture(scope="module")
def private_plane() -> Iterator[ControlPlane]:
    """A control plane for this module only, with localcache's CRDs and none of KServe's."""
    plane = ControlPlane(with_kcm=False).start()
    try:
        crd_install.install_crds(plane, [OWN_CRDS])
        yield plane
    finally:
        plane.stop()
