"""The harness can restart kube-apiserver in place, keeping its port and etcd data."""

from __future__ import annotations

from localcache.devenv.controlplane import ControlPlane


def test_restarted_apiserver_keeps_port_and_data(
    control_plane: ControlPlane, namespace: str
) -> None:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    status, body = control_plane.rest(
        "POST",
        base,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "survivor"},
            "data": {"a": "1"},
        },
    )
    assert status == 201, body
    port = control_plane.api_port

    control_plane.restart_apiserver()

    assert control_plane.api_port == port
    status, body = control_plane.rest("GET", f"{base}/survivor")
    assert status == 200, body
    assert body["data"] == {"a": "1"}
