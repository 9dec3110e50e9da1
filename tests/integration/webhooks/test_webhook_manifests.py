"""The real apiserver accepts the shipped webhook manifests (server-side dry run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from localcache.devenv.controlplane import ControlPlane
from tests.support import webhooks as wh

ROOT = Path(__file__).resolve().parents[3] / "manifests" / "webhook"
_REG = "/apis/admissionregistration.k8s.io/v1"
COLLECTIONS = {
    "MutatingWebhookConfiguration": f"{_REG}/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": f"{_REG}/validatingwebhookconfigurations",
    "Service": "/api/v1/namespaces/{namespace}/services",
}


@pytest.mark.parametrize("name", ["mutating.yaml", "validating.yaml", "service.yaml"])
async def test_the_apiserver_accepts_the_shipped_manifest(
    control_plane: ControlPlane, namespace: str, name: str
) -> None:
    obj = yaml.safe_load((ROOT / name).read_text())
    if obj["kind"] == "Service":
        obj["metadata"]["namespace"] = namespace  # namespace kserve does not exist here
    path = COLLECTIONS[obj["kind"]].format(namespace=namespace)
    answer = await wh.api_request(control_plane, "POST", path, obj, dry_run=True)
    assert answer.status == 201, answer.body
    assert answer.warnings == ()
