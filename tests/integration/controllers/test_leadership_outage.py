"""Issue 14 item 4 on the real control plane: an apiserver outage longer than the lease.

Two real `localcache controller` processes (subprocesses, leader election on with a 4 s
lease) run against the control plane; kube-apiserver is stopped for longer than the lease
and started again. Shown: neither process exits; both admission servers answer a cache
AdmissionReview over HTTPS throughout the outage; the leader stops reconciling when its
renew deadline passes; reconciling resumes within 15 s of the apiserver's return (a cache
created afterwards reaches its LocalModelNode); and the leadership terms the two processes
log never overlap.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import itertools
import json
import signal
import ssl
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from localcache.api import groupversion
from localcache.devenv import assets, controlplane, processes
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, kube
from localcache.webhooks import validation
from tests.integration.controllers.conftest import URI, Env

pytestmark = [pytest.mark.kcm, pytest.mark.slow]

# Lease duration, renew deadline, retry period (stop margin 2 s): short, yet with room for
# the event-loop stalls of a loaded 2-core machine (start-up alone has stalled for ~3 s).
LEASE = (8.0, 6.0, 1.0)
RESUME_WITHIN_S = 15.0


@dataclass
class Replica:
    """One `localcache controller` subprocess and where it serves."""

    identity: str
    proc: processes.ManagedProcess
    metrics_port: int
    webhook_port: int
    answered: list[float] = field(default_factory=list)

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines of event `name`, in order."""
        return processes.log_events(self.proc.log_path, name)

    def lines(self) -> list[str]:
        """Leadership-related log lines, for a failure report."""
        text = self.proc.log_path.read_text(errors="replace")
        marks = (
            "leader_election_acquired",
            "leader_election_lost",
            "leader_election_released",
            "manager_",
            "Traceback",
        )
        return [line[:400] for line in text.splitlines() if any(m in line for m in marks)]

    def alive(self) -> bool:
        return self.proc.running()


def start_replica(
    plane: controlplane.ControlPlane, env: Env, identity: str, tmp_path: Path
) -> Replica:
    metrics_port, webhook_port = assets.free_port(), assets.free_port()
    args = [
        sys.executable,
        "-m",
        "localcache",
        "controller",
        f"--kubeconfig={plane.kubeconfig_path}",
        "--bind-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
        f"--webhook-port={webhook_port}",
        f"--webhook-cert-dir={tmp_path / identity / 'certs'}",
        f"--config-namespace={env.namespace}",
        f"--lease-name=lease-{env.suffix}",
        f"--identity={identity}",
        f"--leader-elect-lease-duration={LEASE[0]:g}",
        f"--leader-elect-renew-deadline={LEASE[1]:g}",
        f"--leader-elect-retry-period={LEASE[2]:g}",
        "--log-format=json",
        "--shutdown-timeout=5",
    ]
    proc = processes.ManagedProcess(f"controller-{identity}", args, tmp_path / f"{identity}.log")
    proc.start()
    return Replica(identity, proc, metrics_port, webhook_port)


def stop_replica(replica: Replica) -> int | None:
    """SIGTERM and the exit code (None if it had to be killed)."""
    popen = replica.proc.popen
    if popen is None:
        return None
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            return popen.wait(15)
        except Exception:
            replica.proc.stop()
            return None
    return popen.returncode


def admission_review(name: str) -> dict[str, Any]:
    info = groupversion.LOCAL_MODEL_CACHE
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "serving.kserve.io", "version": "v1alpha1", "kind": info.kind},
            "resource": {
                "group": "serving.kserve.io",
                "version": "v1alpha1",
                "resource": "localmodelcaches",
            },
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "test"},
            "object": {
                "apiVersion": info.api_version,
                "kind": info.kind,
                "metadata": {"name": name},
                "spec": {"sourceModelUri": URI, "modelSize": "1Gi", "nodeGroups": ["none"]},
            },
            "dryRun": False,
        },
    }


async def review(session: aiohttp.ClientSession, replica: Replica) -> dict[str, Any]:
    """POST one cache AdmissionReview straight to the replica's admission server."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # reaching the server is the point, not its certificate
    url = f"https://127.0.0.1:{replica.webhook_port}{validation.CACHE_PATH}"
    async with session.post(url, json=admission_review("probe"), ssl=ctx) as resp:
        assert resp.status == 200, f"{replica.identity}: admission answered {resp.status}"
        body: dict[str, Any] = await resp.json()
    assert "allowed" in body["response"], body
    replica.answered.append(time.monotonic())
    return body


async def get_text(session: aiohttp.ClientSession, port: int, path: str) -> tuple[int, str]:
    async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, await resp.text()


async def leads(session: aiohttp.ClientSession, replica: Replica) -> bool:
    status, text = await get_text(session, replica.metrics_port, "/metrics")
    return status == 200 and any(
        line.startswith("leader_election_master_status{") and line.endswith(" 1.0")
        for line in text.splitlines()
    )


def terms(replica: Replica) -> list[tuple[datetime.datetime, datetime.datetime]]:
    """[start, stop] of each period the replica ran its reconcilers (an open one ends now)."""

    def at(entry: dict[str, Any]) -> datetime.datetime:
        return datetime.datetime.fromisoformat(entry["timestamp"])

    starts = [at(e) for e in replica.events("manager_leading_started")]
    stops = [at(e) for e in replica.events("manager_leading_stopped")]
    assert len(stops) in (len(starts), len(starts) - 1), (replica.identity, starts, stops)
    far = datetime.datetime.max.replace(tzinfo=datetime.UTC)
    return list(zip(starts, [*stops, far], strict=False))


async def lists_model(env: Env, node: str, name: str) -> bool:
    try:
        return ("", name) in await env.entries(node)
    except errors.TransportError:
        return False  # the tests' own client reconnecting after the restart


@pytest.mark.timeout(300)
async def test_an_apiserver_outage_longer_than_the_lease_stops_reconcilers_not_processes(
    control_plane: controlplane.ControlPlane, env: Env, tmp_path: Path
) -> None:
    group = await env.group(env.name("gpu"), env.name("gpu"))
    node = await env.node(env.name("node"), group)
    await env.api.create(
        kube.CONFIG_MAPS,
        {
            "metadata": {"name": "inferenceservice-config", "namespace": env.namespace},
            "data": {"localModel": json.dumps({"jobNamespace": env.namespace})},
        },
        namespace=env.namespace,
    )
    replicas = [start_replica(control_plane, env, name, tmp_path) for name in ("one", "two")]
    apiserver_down = False
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for replica in replicas:
                await wait_until(
                    functools.partial(get_ready, session, replica),
                    timeout=60,
                    what=f"replica {replica.identity} is ready",
                )
            await wait_until(
                functools.partial(one_leader, session, replicas),
                timeout=30,
                what="exactly one replica leads",
            )
            before = env.name("before")
            await env.cache(before, [group])
            await wait_until(
                functools.partial(lists_model, env, node, before),
                timeout=30,
                what=f"LocalModelNode {node} lists {before} before the outage",
            )
            for replica in replicas:
                await review(session, replica)

            # The outage: kube-apiserver down for longer than the lease.
            leader = await wait_until(
                functools.partial(one_leader, session, replicas),
                timeout=30,
                what="exactly one replica leads when the outage begins",
            )
            assert leader is not None
            terms_before = len(leader.events("manager_leading_started"))
            await asyncio.to_thread(control_plane.stop_apiserver)
            apiserver_down = True
            down_at = time.monotonic()

            async def outage_long_enough() -> bool:
                for replica in replicas:
                    assert replica.alive(), f"{replica.identity} exited:\n{replica.proc.log_tail()}"
                    await review(session, replica)
                nobody_leads = all(
                    len(r.events("manager_leading_stopped"))
                    == len(r.events("manager_leading_started"))
                    for r in replicas
                )
                return (
                    nobody_leads
                    and len(leader.events("manager_leading_stopped")) >= terms_before
                    and time.monotonic() - down_at > LEASE[0] + 2
                )

            await wait_until(
                outage_long_enough,
                timeout=60,
                interval=0.25,
                what="the leader stopped its reconcilers while the apiserver was down",
            )
            stopped = leader.events("manager_leading_stopped")[-1]
            assert float(stopped["seconds"]) < LEASE[0] - LEASE[1]

            await asyncio.to_thread(control_plane.restart_apiserver)
            apiserver_down = False
            back_at = time.monotonic()
            after = env.name("after")
            await wait_until(
                lambda: create_cache(env, after, group),
                timeout=RESUME_WITHIN_S,
                what=f"cache {after} created after the apiserver came back",
            )
            await wait_until(
                functools.partial(lists_model, env, node, after),
                timeout=RESUME_WITHIN_S - (time.monotonic() - back_at),
                what=f"LocalModelNode {node} lists {after} within 15 s of the apiserver's return",
            )
            assert time.monotonic() - back_at < RESUME_WITHIN_S
            for replica in replicas:
                assert replica.alive(), f"{replica.identity} exited:\n{replica.proc.log_tail()}"
                await review(session, replica)
                assert (await get_text(session, replica.metrics_port, "/readyz"))[0] == 200
            answered_during = [t for r in replicas for t in r.answered if down_at < t < back_at]
            assert len(answered_during) >= 2 * 2, "admission was not exercised during the outage"

        periods = [(r.identity, start, stop) for r in replicas for start, stop in terms(r)]
        assert len(periods) >= 2, periods
        periods.sort(key=lambda p: p[1])
        for (who_a, _, stop_a), (who_b, start_b, _) in itertools.pairwise(periods):
            assert stop_a <= start_b, f"{who_a} still led when {who_b} started leading"
    finally:
        if apiserver_down:
            await asyncio.to_thread(control_plane.restart_apiserver)
        codes = {r.identity: stop_replica(r) for r in replicas}
        for replica in replicas:  # shown by pytest when the test fails
            print(f"--- {replica.identity}: leadership log", *replica.lines(), sep="\n")
    assert codes == {"one": 0, "two": 0}, codes


async def get_ready(session: aiohttp.ClientSession, replica: Replica) -> bool:
    try:
        status, _ = await get_text(session, replica.metrics_port, "/readyz")
    except (aiohttp.ClientError, TimeoutError):
        assert replica.alive(), f"{replica.identity} exited:\n{replica.proc.log_tail()}"
        return False
    return status == 200


async def one_leader(session: aiohttp.ClientSession, replicas: list[Replica]) -> Replica | None:
    leading = [r for r in replicas if await leads(session, r)]
    return leading[0] if len(leading) == 1 else None


async def create_cache(env: Env, name: str, group: str) -> bool:
    try:
        await env.cache(name, [group])
    except errors.TransportError:
        return False  # the tests' own client reconnecting after the restart
    except errors.Conflict as exc:
        return exc.already_exists  # created by an attempt whose answer was lost
    return True
