"""The shipped RBAC is enough for the code as it runs: the real controller and agent,
authenticated as the shipped ServiceAccounts (no admin rights), sync every informer and carry
a namespace cache from creation to a download Job and per-node status.

A hand-written permission table can only check what it lists; this test fails whenever the
code makes a call the manifests do not allow (a 403 stops an informer's sync or a write).

The peer data plane's TLS bundle (controllers/peertls.py), with the controller's shipped
permissions: the controller issues Secret localcache-peer-tls on start, with no agent running
(agents mount it optionally and pick it up whenever it appears), keeps a good one as it is
across restarts, and renews it before expiry with the same CA, so a fetcher holding the old
ca.crt trusts the new certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from localcache import app
from localcache import settings as settings_mod
from localcache.api import groupversion, peer
from localcache.caching import keys
from localcache.controllers import peertls
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, kube, manager
from localcache.runtime.serving import certgen, kubecerts, secretbundle

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "manifests" / "base"
RBAC_FILES = ("namespaces.yaml", "config.yaml", "controller-rbac.yaml", "agent-rbac.yaml")
CONTROLLER_SA = ("kserve", "kserve-localmodel-controller-manager")
AGENT_SA = ("kserve", "kserve-localmodelnode-agent")
Obj = dict[str, Any]


@dataclass
class Running:
    manager: manager.Manager
    task: asyncio.Task[int]
    client: kube.Kube


def _settings(command: str, **env: str) -> settings_mod.Settings:
    base = {
        "POD_NAMESPACE": "kserve",
        "LOCALCACHE_METRICS_PORT": "0",
        "LOCALCACHE_BIND_ADDRESS": "127.0.0.1",
        "LOCALCACHE_WEBHOOK_PORT": "0",
        "LOCALCACHE_LEASE_NAME": f"rbac-test-{uuid.uuid4().hex[:6]}",
    }
    return settings_mod.from_args(argparse.Namespace(), command, {**base, **env})


async def _client_as(plane: ControlPlane, tmp: Path, sa: tuple[str, str]) -> kube.Kube:
    creds = plane.service_account_credentials(*sa)
    path = plane.write_kubeconfig(creds, tmp / f"{sa[1]}.kubeconfig")
    return await kube.Kube.from_kubeconfig(path)


@contextlib.asynccontextmanager
async def _run_as(
    plane: ControlPlane,
    tmp: Path,
    sa: tuple[str, str],
    settings: settings_mod.Settings,
    components: app.Components,
) -> AsyncIterator[Running]:
    client = await _client_as(plane, tmp, sa)
    built: list[manager.Manager] = []
    task = asyncio.create_task(
        app.run_components(
            settings, components, client=client, on_manager=built.append, handle_signals=False
        ),
        name=f"manager-as-{sa[1]}",
    )
    try:
        await wait_until(lambda: built or task.done(), timeout=30, what=f"{sa[1]} built")
        assert built, f"{sa[1]}'s manager failed while starting: {task.result()}"
        running = Running(built[0], task, client)
        await wait_until(
            lambda: running.manager.started.is_set() or task.done(),
            timeout=60,
            what=f"{sa[1]} (as its ServiceAccount) synced every informer and started",
        )
        assert not task.done(), f"{sa[1]} stopped with exit code {task.result()}"
        yield running
    finally:
        for mgr in built:
            mgr.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=15)
        await client.close()


@pytest.fixture
def shipped_rbac(control_plane: ControlPlane, crds: list[str]) -> Any:
    args = [a for f in RBAC_FILES for a in ("-f", str(BASE / f))]
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", *args)
    yield
    # The namespaces stay (other tests share them); roles, bindings and accounts go.
    for name in ("controller-rbac.yaml", "agent-rbac.yaml"):
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(BASE / name), check=False)


async def _get(client: kube.Kube, res: kube.Resource, name: str, ns: str | None = None) -> Obj:
    try:
        return await client.get(res, name, namespace=ns)
    except errors.NotFound:
        return {}


async def test_controller_and_agent_work_with_only_their_shipped_permissions(
    control_plane: ControlPlane,
    shipped_rbac: None,
    namespace: str,
    tmp_path: Path,
) -> None:
    admin = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    suffix = uuid.uuid4().hex[:6]
    node, group, cache = f"rbac-node-{suffix}", f"rbac-group-{suffix}", f"rbac-cache-{suffix}"
    models = tmp_path / "models-root"
    models.mkdir()
    lmnc, lmng, lmn = (
        groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api,
        groupversion.LOCAL_MODEL_NODE_GROUP.api,
        groupversion.LOCAL_MODEL_NODE.api,
    )
    uri = f"gs://rbac-test/{suffix}/model"
    status_key = keys.status_key(cache, namespace)
    try:
        created = await admin.create(
            kube.NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {"kubernetes.io/hostname": node, "rbac-test": suffix},
                },
            },
        )
        await admin.patch_status(
            kube.NODES,
            node,
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        )
        del created
        await admin.create(
            lmng,
            {
                "apiVersion": groupversion.API_VERSION,
                "kind": "LocalModelNodeGroup",
                "metadata": {"name": group},
                "spec": {
                    "storageLimit": "10Gi",
                    "persistentVolumeSpec": {
                        "accessModes": ["ReadWriteOnce"],
                        "capacity": {"storage": "10Gi"},
                        "local": {"path": str(models)},
                        "nodeAffinity": {
                            "required": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "rbac-test",
                                                "operator": "In",
                                                "values": [suffix],
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                    },
                    "persistentVolumeClaimSpec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "10Gi"}},
                    },
                },
            },
        )
        controller_settings = _settings("controller")
        agent_settings = _settings("agent", NODE_NAME=node, LOCALCACHE_MODELS_ROOT=str(models))
        async with (
            _run_as(
                control_plane,
                tmp_path,
                CONTROLLER_SA,
                controller_settings,
                app.Components(controller=True),
            ),
            _run_as(
                control_plane,
                tmp_path,
                AGENT_SA,
                agent_settings,
                app.Components(agent_nodes=((node, models),)),
            ),
        ):
            await admin.create(
                lmnc,
                {
                    "apiVersion": groupversion.API_VERSION,
                    "kind": "LocalModelNamespaceCache",
                    "metadata": {"name": cache, "namespace": namespace},
                    "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": [group]},
                },
            )

            async def entry_listed() -> bool:
                obj = await _get(admin, lmn, node)
                models_ = (obj.get("spec") or {}).get("localModels") or []
                return any(m.get("modelName") == cache for m in models_)

            await wait_until(
                entry_listed,
                timeout=60,
                what=f"the controller (as its ServiceAccount) lists {cache} on LMN {node}",
            )

            async def job_created() -> bool:
                listed = await admin.list(kube.JOBS, namespace=namespace)
                return bool(listed.items)

            await wait_until(
                job_created,
                timeout=60,
                what=f"the agent (as its ServiceAccount) creates a download Job in {namespace}",
            )

            async def node_status_written() -> bool:
                obj = await _get(admin, lmn, node)
                return status_key in ((obj.get("status") or {}).get("modelStatus") or {})

            await wait_until(
                node_status_written,
                timeout=60,
                what=f"the agent writes modelStatus[{status_key}] on LocalModelNode {node}",
            )

            async def cache_status_written() -> bool:
                obj = await _get(admin, lmnc, cache, namespace)
                return node in ((obj.get("status") or {}).get("nodeStatus") or {})

            await wait_until(
                cache_status_written,
                timeout=60,
                what=f"the controller writes nodeStatus[{node}] on {namespace}/{cache}",
            )

            await admin.delete(lmnc, cache, namespace=namespace)

            async def cache_gone() -> bool:
                return not await _get(admin, lmnc, cache, namespace)

            await wait_until(
                cache_gone,
                timeout=60,
                what=f"the controller (as its ServiceAccount) finalizes {namespace}/{cache}",
            )
    finally:
        for res, name in ((lmng, group), (kube.NODES, node), (lmn, node)):
            with contextlib.suppress(errors.NotFound):
                await admin.delete(res, name)
        await admin.close()


async def _peer_secret(client: kube.Kube) -> Obj:
    return await _get(client, kube.SECRETS, peertls.SECRET_NAME, CONTROLLER_SA[0])


def _bundle(secret: Obj) -> certgen.CertBundle:
    bundle = certgen.bundle_from_secret(secret)
    assert bundle is not None, f"Secret {peertls.SECRET_NAME} lacks a key: {sorted(secret)}"
    return bundle


def _verifies(bundle: certgen.CertBundle, ca_pem: bytes) -> bool:
    """The serving certificate chains to a CA of `ca_pem` and names `localcache-peer`."""
    cert = bundle.certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    if san.get_values_for_type(x509.DNSName) != [peer.SERVER_NAME]:
        return False
    for ca in x509.load_pem_x509_certificates(ca_pem):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


async def test_the_controller_issues_the_peer_tls_secret_with_its_shipped_permissions(
    control_plane: ControlPlane, shipped_rbac: None, tmp_path: Path
) -> None:
    admin = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    ns = CONTROLLER_SA[0]
    try:
        with contextlib.suppress(errors.NotFound):
            await admin.delete(kube.SECRETS, peertls.SECRET_NAME, namespace=ns)
        async with _run_as(
            control_plane, tmp_path, CONTROLLER_SA, _settings("controller"),
            app.Components(controller=True),
        ):  # fmt: skip
            await wait_until(
                lambda: _peer_secret(admin),
                timeout=60,
                what=f"the controller (as its ServiceAccount) creates Secret {peertls.SECRET_NAME}",
            )
        secret = await _peer_secret(admin)
        assert secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "peer"
        issued = _bundle(secret)
        assert _verifies(issued, issued.ca_cert_pem)
        days = (issued.not_after - datetime.datetime.now(datetime.UTC)).days
        assert days >= 364, f"the peer certificate is valid for {days} days only"
        # A restart keeps a good bundle as it is (no rewrite, so no agent reload).
        async with _run_as(
            control_plane, tmp_path, CONTROLLER_SA, _settings("controller"),
            app.Components(controller=True),
        ):  # fmt: skip
            client = await _client_as(control_plane, tmp_path, CONTROLLER_SA)
            async with client:
                kept = await secretbundle.settle(
                    kubecerts.KubeCertStore(client), peertls.spec(ns), now=secretbundle.utcnow
                )
        again = await _peer_secret(admin)
        assert kept == issued
        assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    finally:
        await admin.close()


async def test_the_peer_tls_bundle_is_renewed_before_expiry_keeping_its_ca(
    control_plane: ControlPlane, shipped_rbac: None, tmp_path: Path
) -> None:
    """Run by the manager itself (as the controller's ServiceAccount, so `update` is shown to
    be allowed), on a clock 340 days ahead: within 30 days of the certificate's expiry."""
    admin = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    client = await _client_as(control_plane, tmp_path, CONTROLLER_SA)
    ns = CONTROLLER_SA[0]
    store = kubecerts.KubeCertStore(client)
    try:
        with contextlib.suppress(errors.NotFound):
            await admin.delete(kube.SECRETS, peertls.SECRET_NAME, namespace=ns)
        first = await secretbundle.SecretBundleManager(store, peertls.spec(ns)).ensure()
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=340)
        renewer = secretbundle.SecretBundleManager(store, peertls.spec(ns), now=lambda: later)
        task = asyncio.create_task(renewer.run(), name="peer-tls-renewer")
        try:

            async def renewed() -> certgen.CertBundle | None:
                bundle = certgen.bundle_from_secret(await _peer_secret(admin))
                return bundle if bundle is not None and bundle.serial != first.serial else None

            fresh = await wait_until(
                renewed, timeout=30, what="the peer certificate is renewed 25 days before expiry"
            )
            assert fresh is not None
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert fresh.ca_key_pem == first.ca_key_pem, "the CA changed on a certificate renewal"
        assert _verifies(fresh, first.ca_cert_pem), "the old ca.crt does not trust the new cert"
        assert fresh.not_after > later + datetime.timedelta(days=300)
        data = (await _peer_secret(admin))["data"]
        assert base64.b64decode(data["ca.crt"]) == first.ca_cert_pem
    finally:
        await client.close()
        await admin.close()
