"""Tenants can use namespace caches with the roles they already have (issue 20 item 4): the
shipped ClusterRoles aggregate into the built-in `edit`/`admin` and `view`, so a user with
`edit` in a namespace creates a LocalModelNamespaceCache there (before, `edit` could not), a
`view` user reads it, and neither may write its status or touch the cluster-scoped kinds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from localcache.api import groupversion
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until_sync

pytestmark = pytest.mark.kcm  # the clusterrole-aggregation controller runs in KCM
TENANT_RBAC = Path(__file__).resolve().parents[3] / "manifests" / "base" / "tenant-rbac.yaml"
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
RESOURCE = f"{LMNC.plural}.{groupversion.GROUP}"


@pytest.fixture
def tenant_roles(control_plane: ControlPlane, crds: list[str]) -> Iterator[list[str]]:
    control_plane.kubectl("apply", "-f", str(TENANT_RBAC))
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(TENANT_RBAC.read_text())]
    try:
        yield names
    finally:
        control_plane.kubectl("delete", "clusterrole", *names, "--ignore-not-found")


def _can(
    plane: ControlPlane, user: str, verb: str, resource: str, namespace: str, *extra: str
) -> bool:
    done = plane.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={user}",
                         *extra, check=False)  # fmt: skip
    return done.stdout.strip() == "yes"


def test_edit_manages_namespace_caches_and_view_reads_them(
    control_plane: ControlPlane, namespace: str, tenant_roles: list[str]
) -> None:
    editor, viewer = f"editor-{uuid.uuid4().hex[:6]}", f"viewer-{uuid.uuid4().hex[:6]}"
    for user, role in ((editor, "edit"), (viewer, "view")):
        control_plane.kubectl("create", "rolebinding", f"{user}", f"--clusterrole={role}",
                              f"--user={user}", "-n", namespace)  # fmt: skip

    def aggregated() -> bool:
        assert _can(control_plane, editor, "create", RESOURCE, namespace), "edit cannot create"
        assert _can(control_plane, viewer, "list", RESOURCE, namespace), "view cannot list"
        return True

    wait_until_sync(aggregated, timeout=30, interval=0.5, what="the roles were aggregated")
    cache = {
        "apiVersion": LMNC.api_version,
        "kind": LMNC.kind,
        "metadata": {"name": "tenant-cache", "namespace": namespace},
        "spec": {"sourceModelUri": "hf://org/model", "modelSize": "1Gi", "nodeGroups": ["g"]},
    }
    control_plane.kubectl("create", f"--as={editor}", "-f", "-", input_text=yaml.safe_dump(cache))
    got = control_plane.kubectl("get", RESOURCE, "tenant-cache", "-n", namespace, f"--as={viewer}")
    assert "tenant-cache" in got.stdout
    for verb in ("create", "delete", "patch"):
        assert not _can(control_plane, viewer, verb, RESOURCE, namespace), f"view may {verb}"
    for user in (editor, viewer):
        assert not _can(control_plane, user, "patch", RESOURCE, namespace, "--subresource=status")
        for kind in ("localmodelcaches", "localmodelnodegroups", "localmodelnodes"):
            assert not _can(control_plane, user, "create", f"{kind}.serving.kserve.io", namespace)
