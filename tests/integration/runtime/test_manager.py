"""The manager against the real control plane: leader election between two managers (hand-over
on release, takeover after a crash, reconcilers stopped, not the process, while the lease is
lost), /metrics with every
metric name spec §7 lists, /readyz gated on sync, and SIGTERM stopping within 5 s."""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import signal
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import (
    controller,
    errors,
    handlers,
    keys,
    kube,
    leaderelection,
    manager,
    metrics,
    reconcile,
)
from localcache.runtime.serving import httpserver
from tests.integration.runtime.conftest import (
    RecordingReconciler,
    Spawn,
    configmap,
    configmap_informer,
    make_controller,
)

LEASE = "runtime-test-lock"


@dataclass
class Member:
    """One manager of a leader-election group, with what the test needs to look at."""

    mgr: manager.Manager
    elector: leaderelection.LeaderElector
    ctl: controller.Controller
    rec: RecordingReconciler
    task: asyncio.Task[int] | None = None


def build_member(
    client: kube.Kube,
    namespace: str,
    identity: str,
    *,
    spawn: Spawn,
    metrics_: metrics.Metrics | None = None,
    http: httpserver.HttpServer | None = None,
    release_on_cancel: bool = True,
    timings: tuple[float, float, float] = (15.0, 10.0, 2.0),
) -> Member:
    lease_duration, renew_deadline, retry_period = timings
    config = leaderelection.LeaderElectionConfig(
        namespace=namespace,
        name=LEASE,
        identity=identity,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        release_on_cancel=release_on_cancel,
    )
    elector = leaderelection.LeaderElector(
        client,
        config,
        metrics=metrics_.leader_election(LEASE) if metrics_ else None,
    )
    inf = configmap_informer(client, namespace)
    rec = RecordingReconciler(inf.reader())
    ctl = make_controller(
        f"cm-{identity}",
        rec,
        metrics=metrics_.controller(f"cm-{identity}") if metrics_ else None,
        queue_metrics=metrics_.workqueue(f"cm-{identity}") if metrics_ else None,
    )
    inf.add_handler(handlers.enqueue_self(ctl.queue))
    mgr = manager.Manager(http_server=http, elector=elector, handle_signals=False)
    mgr.add_informer(inf)
    mgr.add_controller(ctl)
    member = Member(mgr, elector, ctl, rec)
    member.task = spawn(mgr.run(), f"manager-{identity}")
    return member


def leaders(*members: Member) -> list[Member]:
    return [m for m in members if m.elector.is_leader]


async def holder(client: kube.Kube, namespace: str) -> str:
    lease = await client.get(kube.LEASES, LEASE, namespace=namespace)
    return str(lease["spec"].get("holderIdentity") or "")


async def exactly_one_leads_for(seconds: float, *members: Member) -> Member:
    """Observe the group for `seconds`: at every look exactly one member leads, the same one."""
    loop = asyncio.get_running_loop()
    # The elector says "leading" one loop turn before its manager starts the leader-only
    # components, so the watch begins once a leader has also started.
    first = await wait_until(
        lambda: [m for m in leaders(*members) if m.mgr.started.is_set()],
        timeout=30,
        what="a leader was elected and started its controllers",
    )
    leader = first[0]
    end = loop.time() + seconds
    while loop.time() < end:
        assert leaders(*members) == [leader]
        assert [m for m in members if m.mgr.started.is_set()] == [leader]
        await asyncio.sleep(0.1)
    return leader


@pytest.mark.slow
async def test_one_of_two_managers_leads_and_hands_over_on_stop(
    namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    one = build_member(kube_client, namespace, "one", spawn=spawn)
    two = build_member(kube_client, namespace, "two", spawn=spawn)
    leader = await exactly_one_leads_for(5.0, one, two)
    follower = two if leader is one else one
    assert await holder(kube_client, namespace) == leader.elector.identity

    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "work", v="1"))
    await wait_until(lambda: leader.rec.last_seen("work"), timeout=30, what="leader reconciled")
    assert follower.rec.seen == []

    loop = asyncio.get_running_loop()
    stopped_at = loop.time()
    leader.mgr.stop()
    assert leader.task is not None
    assert await leader.task == 0
    await wait_until(follower.mgr.started.is_set, timeout=20, what="the follower took over")
    assert loop.time() - stopped_at < 20
    assert await holder(kube_client, namespace) == follower.elector.identity
    await wait_until(lambda: follower.rec.last_seen("work"), timeout=30, what="new leader works")
    lease = await kube_client.get(kube.LEASES, LEASE, namespace=namespace)
    assert lease["spec"]["leaseTransitions"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_crashed_leader_is_replaced_once_its_lease_expires(
    namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    one = build_member(kube_client, namespace, "one", spawn=spawn, release_on_cancel=False)
    two = build_member(kube_client, namespace, "two", spawn=spawn, release_on_cancel=False)
    leader = await exactly_one_leads_for(3.0, one, two)
    follower = two if leader is one else one

    loop = asyncio.get_running_loop()
    crashed_at = loop.time()
    assert leader.task is not None
    leader.task.cancel()  # no release: the lease has to expire (15 s) first
    await asyncio.gather(leader.task, return_exceptions=True)
    assert await holder(kube_client, namespace) == leader.elector.identity
    await wait_until(follower.mgr.started.is_set, timeout=40, what="the follower took over")
    waited = loop.time() - crashed_at
    # Lease 15 s, seen up to one jittered retry (<= 4.4 s) late, then one more retry.
    assert 10.0 < waited < 15.0 + 2 * 4.4 + 1.0
    assert await holder(kube_client, namespace) == follower.elector.identity


@pytest.mark.slow
async def test_losing_the_lease_stops_the_controllers_and_they_resume_when_it_is_won_back(
    control_plane: ControlPlane, namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    only = build_member(kube_client, namespace, "only", spawn=spawn, timings=(4.0, 3.0, 0.5))
    await wait_until(only.mgr.started.is_set, timeout=30, what="the manager leads")
    await wait_until(lambda: only.ctl.stats().running, timeout=10, what="controller running")

    # Someone else grabs the lease for 6 s (as a partitioned-away leader would experience it).
    async def steal() -> bool:
        lease = await kube_client.get(kube.LEASES, LEASE, namespace=namespace)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"].update(holderIdentity="thief", renewTime=now, leaseDurationSeconds=6)
        try:
            await kube_client.replace(kube.LEASES, lease)
        except errors.Conflict:
            return False  # the leader renewed in between: try again
        return True

    await wait_until(steal, timeout=10, what="the lease was taken by someone else")
    await wait_until(
        lambda: not only.ctl.stats().running, timeout=10, what="the controller stopped"
    )
    assert not only.elector.is_leader
    assert not only.mgr.leading
    assert only.task is not None
    assert not only.task.done(), "the manager exited on losing the lease"

    # Once the thief's lease has expired the manager takes it back and reconciles again, on a
    # fresh queue that starts with every object (a ConfigMap created while it followed, too).
    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "meanwhile", v="1"))
    await wait_until(lambda: only.mgr.leading, timeout=30, what="the manager leads again")
    assert only.mgr.terms == 2
    assert await holder(kube_client, namespace) == "only"
    await wait_until(
        lambda: only.rec.last_seen("meanwhile"), timeout=30, what="reconciled after the return"
    )
    only.mgr.stop()
    assert await asyncio.wait_for(only.task, timeout=10) == 0


def metric_samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """metric name -> [(labels, value)] from the text exposition format."""
    samples: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if match:
            name, labels, value = match.groups()
            samples.setdefault(name, []).append((labels or "", float(value)))
    return samples


def value(samples: dict[str, list[tuple[str, float]]], name: str, *labels: str) -> float:
    for got, val in samples.get(name, []):
        if all(label in got for label in labels):
            return val
    raise AssertionError(f"{name} with {labels} not in /metrics")


async def http_get(port: int, path: str) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as resp,
    ):
        return resp.status, await resp.text()


@pytest.mark.slow
async def test_metrics_show_every_spec_metric_with_sensible_values(
    namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    registry = metrics.Metrics()
    http = httpserver.HttpServer(host="127.0.0.1", port=0, metrics=registry)
    member = build_member(kube_client, namespace, "m", spawn=spawn, metrics_=registry, http=http)
    member.rec.fail_once.add("flaky")
    await wait_until(member.mgr.started.is_set, timeout=30, what="manager started")
    for name in ("a", "b", "flaky"):
        await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, name, v="1"))
    ctl = 'controller="cm-m"'
    await wait_until(
        lambda: (
            (
                registry.value(
                    "controller_runtime_reconcile_total", controller="cm-m", result="success"
                )
                or 0
            )
            >= 3
        ),
        timeout=30,
        what="three successful reconciles (flaky after one retry)",
    )
    await wait_until(lambda: member.ctl.stats().active_workers == 0, timeout=10, what="idle")

    status, text = await http_get(http.port, "/metrics")
    assert status == 200
    s = metric_samples(text)
    assert value(s, "controller_runtime_reconcile_total", ctl, 'result="success"') >= 3
    assert value(s, "controller_runtime_reconcile_total", ctl, 'result="error"') == 1
    assert value(s, "controller_runtime_reconcile_errors_total", ctl) == 1
    assert value(s, "controller_runtime_reconcile_time_seconds_count", ctl) >= 4
    assert value(s, "controller_runtime_reconcile_time_seconds_sum", ctl) >= 0
    assert value(s, "controller_runtime_active_workers", ctl) == 0
    wq = 'name="cm-m"'
    assert value(s, "workqueue_depth", wq) == 0
    assert value(s, "workqueue_adds_total", wq) >= 4
    assert value(s, "workqueue_queue_duration_seconds_count", wq) >= 4
    assert value(s, "workqueue_work_duration_seconds_count", wq) >= 4
    assert value(s, "workqueue_retries_total", wq) >= 1
    assert value(s, "workqueue_unfinished_work_seconds", wq) == 0
    assert value(s, "workqueue_longest_running_processor_seconds", wq) == 0
    assert value(s, "leader_election_master_status", f'name="{LEASE}"') == 1
    assert await http_get(http.port, "/healthz") == (200, "ok")
    assert await http_get(http.port, "/readyz") == (200, "ok")


@pytest.mark.slow
async def test_readyz_fails_until_caches_sync_and_a_stop_during_startup_is_clean(
    control_plane: ControlPlane, namespace: str, spawn: Spawn, tmp_path: Any
) -> None:
    # A user without any RBAC: its LIST is forbidden, so the informer can never sync.
    nobody = control_plane.add_user("nobody", [])
    path = control_plane.write_kubeconfig(nobody, tmp_path / "nobody.kubeconfig")
    client = await kube.Kube.from_kubeconfig(path)
    try:
        http = httpserver.HttpServer(host="127.0.0.1", port=0, metrics=metrics.Metrics())
        mgr = manager.Manager(http_server=http, handle_signals=False)
        mgr.add_informer(configmap_informer(client, namespace))
        task = spawn(mgr.run(), "manager-forbidden")
        await wait_until(lambda: mgr.phase == "informers", timeout=10, what="waiting for sync")
        status, body = await http_get(http.port, "/readyz")
        assert status == 500
        assert "has not synced" in body
        assert (await http_get(http.port, "/healthz"))[0] == 200
        mgr.stop()
        assert await asyncio.wait_for(task, timeout=5) == 0
        assert not mgr.started.is_set()
    finally:
        await client.close()


@dataclass
class StuckReconciler:
    """Reconciles hang forever (until cancelled); records that one started."""

    started: asyncio.Event

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        self.started.set()
        await asyncio.Event().wait()
        return reconcile.Result()


@pytest.mark.slow
async def test_sigterm_stops_a_running_manager_within_five_seconds(
    namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    registry = metrics.Metrics()
    http = httpserver.HttpServer(host="127.0.0.1", port=0, metrics=registry)
    mgr = manager.Manager(http_server=http, handle_signals=True, shutdown_timeout=5.0)
    inf = mgr.add_informer(configmap_informer(kube_client, namespace))
    stuck = StuckReconciler(asyncio.Event())
    ctl = mgr.add_controller(make_controller("stuck", stuck), needs_leader=False)
    inf.add_handler(handlers.enqueue_self(ctl.queue))
    task = spawn(mgr.run(), "manager-sigterm")
    await wait_until(mgr.started.is_set, timeout=30, what="manager started")
    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "hang", v="1"))
    await wait_until(stuck.started.is_set, timeout=30, what="a reconcile is in flight")

    loop = asyncio.get_running_loop()
    signalled_at = loop.time()
    os.kill(os.getpid(), signal.SIGTERM)
    code = await asyncio.wait_for(task, timeout=5)
    assert code == 0
    assert loop.time() - signalled_at < 5
    assert mgr.phase == "stopped"
    assert not ctl.stats().running
    # The autouse task-leak guard then checks that nothing is left on the loop.
