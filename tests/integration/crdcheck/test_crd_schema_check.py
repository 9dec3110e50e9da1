"""On KServe's CRD schema, localcache's extras degrade visibly; on ours, nothing is reported.

The controller (built by the composition root, authenticated as its shipped ServiceAccount)
runs on the module's own control plane (`schema_plane`). With KServe-shaped CRDs installed
it logs `crd_schema_degraded`, records a Warning Event about each CRD and sets
`localcache_crd_schema_degraded{crd} 1`, each naming the missing fields; replacing the CRDs
with ours while it runs clears the gauge. Started on our CRDs, it reports nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import structlog
import yaml

from localcache import app
from localcache import settings as settings_mod
from localcache.devenv import crds as crd_install
from localcache.devenv.assets import free_port
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import manager
from localcache.runtime.crds import crdcheck
from tests import kserveshape
from tests.integration.crdcheck.conftest import OWN_CRDS

Obj = dict[str, Any]
CONTROLLER_SA = ("kserve", "kserve-localmodel-controller-manager")
NAMES = sorted(kserveshape.EXTRAS)
EVENTS_PATH = "/api/v1/namespaces/default/events"


def _install_kserve_shaped(plane: ControlPlane, tmp: Path) -> None:
    for crd in kserveshape.our_crds():
        path = tmp / f"{crd['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(kserveshape.kserve_shaped(crd)))
    crd_install.install_crds(plane, [tmp])


def _schema_events(plane: ControlPlane) -> list[Obj]:
    status, body = plane.rest("GET", f"{EVENTS_PATH}?fieldSelector=reason={crdcheck.REASON}")
    assert status == 200, body
    items: list[Obj] = body.get("items", [])
    return items


def _crd_uid(plane: ControlPlane, name: str) -> str:
    status, body = plane.rest("GET", f"{crd_install.CRD_PATH}/{name}")
    assert status == 200, body
    return str(body["metadata"]["uid"])


class Controller:
    """A running `localcache controller` process and its /metrics endpoint."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.scraped = ""

    async def scrape(self) -> str:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(f"http://127.0.0.1:{self.port}/metrics") as resp,
        ):
            self.scraped = await resp.text()
        return self.scraped

    def gauge(self, name: str) -> float | None:
        found = re.search(
            rf'^{crdcheck.DEGRADED_METRIC}\{{crd="{re.escape(name)}"\}} (\S+)$',
            self.scraped,
            re.MULTILINE,
        )
        return float(found.group(1)) if found else None

    async def gauges_are(self, value: float) -> bool:
        try:
            await self.scrape()
        except aiohttp.ClientError:
            return False
        return all(self.gauge(name) == value for name in NAMES)


@contextlib.asynccontextmanager
async def controller_as_its_service_account(
    plane: ControlPlane, tmp: Path
) -> AsyncIterator[Controller]:
    creds = plane.service_account_credentials(*CONTROLLER_SA)
    kubeconfig = plane.write_kubeconfig(creds, tmp / "controller.kubeconfig")
    port = free_port()
    settings = settings_mod.from_args(
        argparse.Namespace(),
        "controller",
        {
            "KUBECONFIG": str(kubeconfig),
            "POD_NAMESPACE": "kserve",
            "LOCALCACHE_METRICS_PORT": str(port),
            "LOCALCACHE_BIND_ADDRESS": "127.0.0.1",
            "LOCALCACHE_WEBHOOK_PORT": "0",
            "LOCALCACHE_LEASE_NAME": f"schema-check-{uuid.uuid4().hex[:6]}",
        },
    )
    built: list[manager.Manager] = []
    task = asyncio.create_task(
        app.run_components(
            settings, app.Components(controller=True), on_manager=built.append, handle_signals=False
        ),
        name="controller-schema-check",
    )
    try:
        await wait_until(
            lambda: (bool(built) and built[0].started.is_set()) or task.done(),
            timeout=60,
            what="the controller (as its ServiceAccount) synced every informer and started",
        )
        assert not task.done(), f"the controller stopped with exit code {task.result()}"
        yield Controller(port)
        assert not task.done(), f"the controller stopped with exit code {task.result()}"
    finally:
        for mgr in built:
            mgr.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=15)


def _lines(
    logs: Sequence[MutableMapping[str, Any]], event: str
) -> dict[str, MutableMapping[str, Any]]:
    return {line["crd"]: line for line in logs if line.get("event") == event}


async def test_on_kserve_shaped_crds_every_extra_off_is_logged_evented_and_counted(
    schema_plane: ControlPlane, tmp_path: Path
) -> None:
    _install_kserve_shaped(schema_plane, tmp_path)
    with structlog.testing.capture_logs() as logs:
        async with controller_as_its_service_account(schema_plane, tmp_path) as ctl:
            await wait_until(
                lambda: ctl.gauges_are(1.0),
                timeout=30,
                what=f"/metrics shows {crdcheck.DEGRADED_METRIC} 1 for each of {NAMES}",
            )
            await wait_until(
                lambda: (
                    {e["involvedObject"]["name"] for e in _schema_events(schema_plane)}
                    >= set(NAMES)
                ),
                timeout=30,
                what=f"a {crdcheck.REASON} Warning Event in default about each of {NAMES}",
            )
            degraded = _lines(logs, "crd_schema_degraded")
            assert set(degraded) == set(NAMES), logs
            for name in NAMES:
                fields, _ = kserveshape.EXTRAS[name]
                line = degraded[name]
                assert line["log_level"] == "warning"
                assert line["missing_fields"] == sorted(fields)
                assert (
                    "kubectl apply --server-side --force-conflicts -f manifests/crds"
                    in (line["fix"])
                )
            events = {e["involvedObject"]["name"]: e for e in _schema_events(schema_plane)}
            for name in NAMES:
                event = events[name]
                assert event["type"] == "Warning"
                assert event["involvedObject"]["kind"] == "CustomResourceDefinition"
                assert event["involvedObject"]["uid"] == _crd_uid(schema_plane, name)
                for field in kserveshape.EXTRAS[name][0]:
                    assert field in event["message"], event["message"]
                assert "manifests/crds" in event["message"]
            nodes = "localmodelnodes.serving.kserve.io"
            # where the README sends an operator: the CRD's own Events
            described = schema_plane.kubectl("describe", "crd", nodes).stdout
            assert crdcheck.REASON in described, described[-2000:]
            assert "status.modelProgress" in events[nodes]["message"]
            assert "spec.tolerations" in events["localmodelnodegroups.serving.kserve.io"]["message"]

            # Installing localcache's superset CRDs, as the README says, clears it at once.
            crd_install.install_crds(schema_plane, [OWN_CRDS])
            await wait_until(
                lambda: ctl.gauges_are(0.0),
                timeout=30,
                what=f"/metrics shows {crdcheck.DEGRADED_METRIC} 0 for each of {NAMES} "
                "after our CRDs replaced KServe's",
            )
            assert set(_lines(logs, "crd_schema_complete")) == set(NAMES)


async def test_on_our_crds_nothing_is_reported(schema_plane: ControlPlane, tmp_path: Path) -> None:
    crd_install.install_crds(schema_plane, [OWN_CRDS])
    for event in _schema_events(schema_plane):
        schema_plane.rest("DELETE", f"{EVENTS_PATH}/{event['metadata']['name']}")
    with structlog.testing.capture_logs() as logs:
        async with controller_as_its_service_account(schema_plane, tmp_path) as ctl:
            await wait_until(
                lambda: ctl.gauges_are(0.0),
                timeout=30,
                what=f"/metrics shows {crdcheck.DEGRADED_METRIC} 0 for each of {NAMES}",
            )
    assert set(_lines(logs, "crd_schema_complete")) == set(NAMES)
    assert _lines(logs, "crd_schema_degraded") == {}
    assert _schema_events(schema_plane) == []
