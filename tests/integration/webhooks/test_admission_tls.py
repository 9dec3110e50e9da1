"""The real kube-apiserver calls the AdmissionServer over TLS (ConfigMaps in the test namespace)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import metrics
from localcache.runtime.serving import admission, review
from tests.support import webhooks as wh

VALIDATE = "/validate-configmap"
MUTATE = "/mutate-configmap"
MUTATED_LABEL = "localcache.test/mutated"
ODD_ANNOTATION = "localcache.test/slash-escaped"


async def validate(req: review.Request) -> review.Response:
    obj = req.object or {}
    data = obj.get("data") or {}
    if "forbidden" in data:
        return review.denied(
            f"value {data['forbidden']!r} is not allowed in ConfigMap {req.name}",
            field="data.forbidden",
        )
    if (obj.get("metadata") or {}).get("labels", {}).get("warn") == "yes":
        return review.allowed(warnings=[f"ConfigMap {req.name} asked for a warning"])
    return review.allowed()


async def mutate(req: review.Request) -> review.Response:
    ops = review.metadata_patch(
        req.object or {}, labels={MUTATED_LABEL: "yes"}, annotations={ODD_ANNOTATION: "tilde"}
    )
    return review.patched(ops)


@pytest.fixture
async def server() -> AsyncIterator[wh.WebhookServer]:
    adm = admission.AdmissionServer(metrics=metrics.Metrics(), max_body_bytes=64 * 1024)
    adm.register(VALIDATE, validate)
    adm.register(MUTATE, mutate)
    async with wh.run_webhook_server(adm) as running:
        yield running


def _cm(
    name: str, *, data: dict[str, str] | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}},
        "data": data or {},
    }


def _cms(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


async def _effective(
    plane: ControlPlane,
    server: wh.WebhookServer,
    path: str,
    namespace: str,
    labels: dict[str, str] | None = None,
) -> None:
    async def probe() -> wh.ApiAnswer:
        name = f"probe-{uuid.uuid4().hex[:8]}"
        return await wh.api_request(
            plane, "POST", _cms(namespace), _cm(name, labels=labels), dry_run=True
        )

    await wh.wait_until_called(server, path, probe)


def _config(
    kind: wh.ConfigurationKind,
    namespace: str,
    server: wh.WebhookServer,
    path: str,
    *,
    policy: Any = "Fail",
    object_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    entry = wh.webhook_entry(
        f"{kind.lower()}.{path.strip('/')}.localcache.test",
        url=server.url(path),
        ca_pem=server.ca_pem,
        rules=[wh.rule()],
        failure_policy=policy,
        namespace=namespace,
        object_selector=object_selector,
    )
    return wh.configuration(kind, f"{namespace}-{kind.lower()}-{path.strip('/')}", [entry])


@contextlib.asynccontextmanager
async def _active(
    plane: ControlPlane,
    server: wh.WebhookServer,
    kind: wh.ConfigurationKind,
    path: str,
    namespace: str,
) -> AsyncIterator[None]:
    """`_config(kind, ...)` installed, and seen calling `server` at `path`."""
    async with wh.installed(plane, _config(kind, namespace, server, path)):
        await _effective(plane, server, path, namespace)
        yield


async def _kubectl_create(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> Any:
    return await asyncio.to_thread(
        plane.kubectl, "create", "-n", namespace, "-f", "-", check=False, input_text=json.dumps(obj)
    )


async def test_a_denial_message_reaches_the_client(
    control_plane: ControlPlane, namespace: str, server: wh.WebhookServer
) -> None:
    async with _active(control_plane, server, "Validating", VALIDATE, namespace):
        answer = await wh.api_request(
            control_plane, "POST", _cms(namespace), _cm("bad", data={"forbidden": "x"})
        )
        assert answer.status == 403, answer.body
        assert "denied the request: data.forbidden: value 'x' is not allowed" in answer.message
        assert "ConfigMap bad" in answer.message
        done = await _kubectl_create(control_plane, namespace, _cm("bad2", data={"forbidden": "y"}))
        assert done.returncode != 0
        assert "data.forbidden: value 'y' is not allowed in ConfigMap bad2" in done.stderr
        missing = await wh.api_request(control_plane, "GET", f"{_cms(namespace)}/bad")
        assert missing.status == 404


async def test_a_mutation_patch_is_applied(
    control_plane: ControlPlane, namespace: str, server: wh.WebhookServer
) -> None:
    async with _active(control_plane, server, "Mutating", MUTATE, namespace):
        created = await wh.api_request(control_plane, "POST", _cms(namespace), _cm("plain"))
        assert created.status == 201, created.body
        stored = await wh.api_request(control_plane, "GET", f"{_cms(namespace)}/plain")
        meta = stored.body["metadata"]
        assert meta["labels"][MUTATED_LABEL] == "yes"
        assert meta["annotations"][ODD_ANNOTATION] == "tilde"


async def test_a_warning_reaches_the_client(
    control_plane: ControlPlane, namespace: str, server: wh.WebhookServer
) -> None:
    async with _active(control_plane, server, "Validating", VALIDATE, namespace):
        answer = await wh.api_request(
            control_plane, "POST", _cms(namespace), _cm("noisy", labels={"warn": "yes"})
        )
        assert answer.status == 201, answer.body
        assert answer.warnings == ("ConfigMap noisy asked for a warning",)
        done = await _kubectl_create(
            control_plane, namespace, _cm("noisy2", labels={"warn": "yes"})
        )
        assert done.returncode == 0, done.stderr
        assert "Warning: ConfigMap noisy2 asked for a warning" in done.stderr


async def test_failure_policy_ignore_admits_and_fail_rejects_while_the_server_is_down(
    control_plane: ControlPlane, namespace: str, server: wh.WebhookServer
) -> None:
    ignore = _config(
        "Mutating",
        namespace,
        server,
        MUTATE,
        policy="Ignore",
        object_selector={"matchLabels": {"policy": "ignore"}},
    )
    fail = _config(
        "Validating",
        namespace,
        server,
        VALIDATE,
        policy="Fail",
        object_selector={"matchLabels": {"policy": "fail"}},
    )
    async with wh.installed(control_plane, ignore), wh.installed(control_plane, fail):
        await _effective(control_plane, server, MUTATE, namespace, {"policy": "ignore"})
        await _effective(control_plane, server, VALIDATE, namespace, {"policy": "fail"})
        await server.stop()

        admitted = await wh.api_request(
            control_plane, "POST", _cms(namespace), _cm("ignored", labels={"policy": "ignore"})
        )
        assert admitted.status == 201, admitted.body
        assert MUTATED_LABEL not in admitted.body["metadata"]["labels"]

        rejected = await wh.api_request(
            control_plane, "POST", _cms(namespace), _cm("failed", labels={"policy": "fail"})
        )
        assert rejected.status >= 500, rejected.body
        assert "failed calling webhook" in rejected.message


async def test_malformed_and_oversized_bodies_over_tls_get_400_and_413(
    server: wh.WebhookServer,
) -> None:
    ctx = ssl.create_default_context(cadata=server.ca_pem.decode())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        json_headers = {"Content-Type": "application/json"}
        async with session.post(
            server.url(VALIDATE), data=b"{", headers=json_headers, ssl=ctx
        ) as resp:
            assert resp.status == 400
            assert "malformed AdmissionReview" in await resp.text()
        big = b'{"pad": "' + b"x" * (65 * 1024) + b'"}'
        async with session.post(
            server.url(VALIDATE), data=big, headers=json_headers, ssl=ctx
        ) as resp:
            assert resp.status == 413
    assert server.server.stats().count(VALIDATE, "malformed") == 1
    assert server.server.stats().count(VALIDATE, "too_large") == 1
