"""Self-managed certificates against the real apiserver: the Secret, caBundle and rotation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from localcache.devenv import assets
from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import errors, metrics
from localcache.runtime.serving import admission, certgen, certs, review
from localcache.runtime.serving import tls as tls_mod
from tests.support import webhooks as wh

PATH = "/validate-configmap"
_REG = "/apis/admissionregistration.k8s.io/v1"


class RestCertStore:
    """certs.CertStore over the harness's REST client (runtime/kube.py is not used here)."""

    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        answer = await wh.api_request(self._plane, method, path, body)
        if answer.status >= 300:
            detail = answer.body if isinstance(answer.body, dict) else {}
            raise errors.api_error(
                answer.status, answer.message, reason=detail.get("reason", ""), body=detail
            )
        assert isinstance(answer.body, dict)
        return answer.body

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", f"/api/v1/namespaces/{namespace}/secrets", body)

    async def replace_secret(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        return await self._call("PUT", f"/api/v1/namespaces/{namespace}/secrets/{name}", body)

    async def get_webhook_configuration(
        self, kind: certs.ConfigurationKind, name: str
    ) -> dict[str, Any]:
        return await self._call("GET", f"{_REG}/{kind}webhookconfigurations/{name}")

    async def patch_webhook_configuration(
        self, kind: certs.ConfigurationKind, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        path = f"{_REG}/{kind}webhookconfigurations/{name}"
        status, body = await asyncio.to_thread(
            self._plane.rest, "PATCH", path, ops, content_type="application/json-patch+json"
        )
        if status >= 300:
            raise errors.api_error(status, str(body))
        assert isinstance(body, dict)
        return body


async def _allow(req: review.Request) -> review.Response:
    return review.allowed()


@pytest.fixture
def port() -> int:
    return assets.free_port()


@pytest.fixture
def settings(namespace: str, tmp_path: Path) -> certs.CertSettings:
    return certs.CertSettings(
        cert_dir=tmp_path / "replica-0",
        namespace=namespace,
        service_name="hook",
        secret_name="hook-serving-cert",
        extra_names=("127.0.0.1",),
        mutating_configurations=(f"{namespace}-m",),
        validating_configurations=(f"{namespace}-v",),
    )


def _entry(name: str, namespace: str, port: int) -> dict[str, Any]:
    entry = wh.webhook_entry(
        name,
        url=f"https://127.0.0.1:{port}{PATH}",
        ca_pem=b"",
        rules=[wh.rule()],
        namespace=namespace,
    )
    del entry["clientConfig"]["caBundle"]  # the CertManager's job
    return entry


@pytest.fixture
async def configurations(
    control_plane: ControlPlane, namespace: str, port: int
) -> AsyncIterator[None]:
    mutating = wh.configuration(
        "Mutating", f"{namespace}-m", [_entry("m.localcache.test", namespace, port)]
    )
    validating = wh.configuration(
        "Validating",
        f"{namespace}-v",
        [_entry(f"v{i}.localcache.test", namespace, port) for i in (1, 2)],
    )
    async with wh.installed(control_plane, mutating), wh.installed(control_plane, validating):
        yield


async def _ca_bundles(plane: ControlPlane, settings: certs.CertSettings) -> list[str]:
    bundles = []
    for kind, names in (
        ("mutating", settings.mutating_configurations),
        ("validating", settings.validating_configurations),
    ):
        for name in names:
            answer = await wh.api_request(
                plane, "GET", f"{_REG}/{kind}webhookconfigurations/{name}"
            )
            bundles += [h["clientConfig"].get("caBundle", "") for h in answer.body["webhooks"]]
    return bundles


@contextlib.asynccontextmanager
async def _serving(
    settings: certs.CertSettings, port: int
) -> AsyncIterator[tuple[wh.WebhookServer, tls_mod.ReloadableTLS]]:
    adm = admission.AdmissionServer(metrics=metrics.Metrics())
    adm.register(PATH, _allow)
    tls = tls_mod.ReloadableTLS(settings.cert_path, settings.key_path)
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(
        tls_mod.serve(adm.app(), host="127.0.0.1", port=port, ssl_context=tls.context)
    )
    handle = wh.WebhookServer(
        adm, "127.0.0.1", port, settings.ca_path.read_bytes(), settings.cert_dir, stack
    )
    try:
        yield handle, tls
    finally:
        await handle.stop()


async def _apiserver_calls(plane: ControlPlane, server: wh.WebhookServer, namespace: str) -> None:
    async def probe() -> wh.ApiAnswer:
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"p-{uuid.uuid4().hex[:6]}"},
        }
        return await wh.api_request(
            plane, "POST", f"/api/v1/namespaces/{namespace}/configmaps", cm, dry_run=True
        )

    await wh.wait_until_called(server, PATH, probe)


async def _served_serial(port: int, ca_pem: bytes) -> int:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx), 10)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.usefixtures("configurations")
async def test_certificates_are_created_on_first_start_and_reused_on_restart(
    control_plane: ControlPlane, namespace: str, settings: certs.CertSettings, port: int
) -> None:
    store = RestCertStore(control_plane)
    first = await certs.CertManager(store, settings).ensure()

    secret = await store.get_secret(namespace, settings.secret_name)
    assert certgen.bundle_from_secret(secret) == first
    expected = base64.b64encode(first.ca_cert_pem).decode()
    assert await _ca_bundles(control_plane, settings) == [expected] * 3

    async with _serving(settings, port) as (server, _):
        await _apiserver_calls(control_plane, server, namespace)  # the patched caBundle is trusted
        assert await _served_serial(port, first.ca_cert_pem) == first.serial

    restarted = dataclasses.replace(settings, cert_dir=settings.cert_dir.parent / "r1")
    again = await certs.CertManager(store, restarted).ensure()
    assert again.serial == first.serial
    after = await store.get_secret(namespace, settings.secret_name)
    assert after["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]


@pytest.mark.usefixtures("configurations")
async def test_concurrent_replicas_share_one_secret(
    control_plane: ControlPlane, settings: certs.CertSettings
) -> None:
    store = RestCertStore(control_plane)
    replicas = [
        certs.CertManager(
            store, dataclasses.replace(settings, cert_dir=settings.cert_dir.parent / f"r{i}")
        )
        for i in range(3)
    ]
    bundles = await asyncio.gather(*(r.ensure() for r in replicas))
    assert len({b.serial for b in bundles}) == 1


@pytest.mark.usefixtures("configurations")
async def test_rotation_is_served_without_a_restart(
    control_plane: ControlPlane, namespace: str, settings: certs.CertSettings, port: int
) -> None:
    store = RestCertStore(control_plane)
    first = await certs.CertManager(store, settings).ensure()
    async with _serving(settings, port) as (server, tls):
        await _apiserver_calls(control_plane, server, namespace)
        reloaded: list[bool] = []
        # A threshold longer than the validity makes the stored certificate due for renewal now.
        due = dataclasses.replace(settings, renew_before=datetime.timedelta(days=400))
        rotating = certs.CertManager(store, due, on_change=lambda _: reloaded.append(tls.reload()))
        renewed = await rotating.ensure()
        assert reloaded == [True]
        assert renewed.serial != first.serial
        assert renewed.ca_cert_pem == first.ca_cert_pem
        assert await _served_serial(port, first.ca_cert_pem) == renewed.serial
        await _apiserver_calls(control_plane, server, namespace)
