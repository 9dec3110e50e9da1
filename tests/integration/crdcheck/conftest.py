"""Fixtures for the CRD schema check: a control plane of its own.

These tests replace localcache's CRDs with KServe-shaped ones (`tests.kserveshape`: ours minus
localcache's extras), which would break every other integration test on the session control
plane, so the module gets its own etcd + kube-apiserver (no kube-controller-manager), with
the shipped namespaces, settings ConfigMap and controller RBAC applied: the controller under
test runs as its shipped ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.devenv.controlplane import ControlPlane

REPO_ROOT = Path(__file__).resolve().parents[3]
BASE = REPO_ROOT / "manifests" / "base"
OWN_CRDS = REPO_ROOT / "manifests" / "crds"
RBAC_FILES = ("namespaces.yaml", "config.yaml", "controller-rbac.yaml")


@pytest.fixture(scope="module")
def schema_plane() -> Iterator[ControlPlane]:
    """A control plane for this module only, with the controller's shipped RBAC (no CRDs:
    each test installs the ones it needs)."""
    plane = ControlPlane(with_kcm=False).start()
    try:
        if plane.kubectl_path is None:
            pytest.skip("no kubectl beside the control-plane binaries")
        args = [a for f in RBAC_FILES for a in ("-f", str(BASE / f))]
        plane.kubectl("apply", "--server-side", "--force-conflicts", *args)
        yield plane
    finally:
        plane.stop()
