"""The agent's peer side at launch (`agent.peering`): no request when the group has peer
distribution off, the planner's LIST cached, the seed wait, the fallbacks, the peer numbers
in status, and the termination-message report read defensively."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import downloads, peering, peerplan, peerreports, plan, report, status
from localcache.agent.disk import layout
from localcache.agent.jobs import peerjob
from localcache.api import modelnode, nodegroup, peer
from localcache.caching import credentials, keys
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, kube, metrics

Obj = dict[str, Any]
URI = "s3://bucket/iris"
KEY = keys.storage_key(URI)
ENDPOINT = "https://10.0.0.9:8476"
DIGEST = "sha256:" + "3" * 64
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class FakeApi:
    """Records every call; LISTs answer `nodes` (LocalModelNodes) or `pods`."""

    def __init__(self, nodes: list[Obj] | None = None, pods: list[Obj] | None = None) -> None:
        self.nodes, self.pods = nodes or [], pods or []
        self.calls: list[tuple[str, str]] = []
        self.created: list[Obj] = []

    async def list(self, res: kube.Resource, **_kw: Any) -> kube.ObjList:
        self.calls.append(("list", res.plural))
        items = self.pods if res.plural == "pods" else self.nodes
        return kube.ObjList(items=items, resource_version="1")

    async def create(self, res: kube.Resource, obj: Obj, **_kw: Any) -> Obj:
        self.calls.append(("create", res.plural))
        self.created.append(obj)
        return obj

    async def get(self, res: kube.Resource, name: str, **_kw: Any) -> Obj:
        self.calls.append(("get", res.plural))
        return {}

    async def patch(self, res: kube.Resource, name: str, *_a: Any, **_kw: Any) -> Obj:
        self.calls.append(("patch", res.plural))
        return {}

    delete = get_status = patch_status = patch


def _group(enabled: bool | None) -> nodegroup.LocalModelNodeGroup:
    spec: Obj = {
        "storageLimit": "10Gi",
        "persistentVolumeSpec": {"hostPath": {"path": "/m"}, "capacity": {"storage": "10Gi"}},
        "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "10Gi"}}},
    }
    if enabled is not None:
        spec["peerDistribution"] = {"enabled": enabled}
    return nodegroup.LocalModelNodeGroup.model_validate({"metadata": {"name": "g"}, "spec": spec})


def _entry() -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": URI, "modelName": "iris", "nodeGroup": "g"}
    )


def _unit() -> downloads.Unit:
    [unit] = downloads.units([_entry()], node_name="me", job_namespace="jobs")
    return unit


def _node(name: str, status_: Obj | None = None) -> Obj:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"localModels": [_entry().to_dict()]},
        "status": status_ or {},
    }


def _serving(name: str, scope: str) -> Obj:
    model = {"storageKey": KEY, "digest": DIGEST, "scopes": [scope], "bytes": 5}
    return _node(name, {"modelStatus": {"iris": "ModelDownloaded"},
                        "peer": {"endpoint": ENDPOINT, "models": [model]}})  # fmt: skip


def _ref(*, peer: bool, name: str = "job-1", attempt: int = 0) -> downloads.JobRef:
    labels = {peerjob.PEER_LABEL: "true"} if peer else {}
    obj = {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}}
    unit = _unit()
    return downloads.JobRef("jobs", name, f"uid-{name}", "iris", KEY, unit.scope_id, attempt, obj)


def _pod(code: int, message: str | None, phase: str = "Failed") -> Obj:
    term: Obj = {"exitCode": code}
    if message is not None:
        term["message"] = message
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": peerjob.CONTAINER, "state": {"terminated": term}}],
        },
    }


def _is_seed_origin(mode: object) -> bool:
    """The origin Job of an `s3://` model in an enabled group: its transform adds the step
    that records the origin's checksums (`peerjob.seed_job`)."""
    if not isinstance(mode, peering.Mode) or mode.source != "origin" or mode.transform is None:
        return False
    origin = {
        "metadata": {"name": "j", "labels": {}},
        "spec": {"template": {"metadata": {"labels": {}}, "spec": {
            "containers": [{"name": peerjob.CONTAINER, "image": "si", "args": [URI]}]}}},
    }  # fmt: skip
    job = mode.transform(origin, credentials.Injection(uri=URI))
    [init] = job["spec"]["template"]["spec"]["initContainers"]
    return bool(job["metadata"]["labels"][peerjob.SUMS_LABEL] == "true" and init["image"] == "lc:1")


class Rig:
    def __init__(
        self, tmp_path: Path, api: FakeApi, *, image: str = "lc:1", seed_wait_s: float = 60
    ) -> None:
        ca = tmp_path / "ca.crt"
        ca.write_text(CA)
        self.api, self.clock, self.registry = api, clock_mod.FakeClock(), metrics.Metrics()
        reporter = report.Reporter(node_name="me", api=api, wall_clock=lambda: NOW)
        self.peers = peering.Peering(
            node_name="me",
            api=api,
            settings=peering.PeerSettings(image=image, ca_path=ca, seed_wait_s=seed_wait_s),
            clock=self.clock,
            reporter=reporter,
            p2p=report.AgentMetrics(self.registry).p2p,
        )
        self.me = modelnode.LocalModelNode.model_validate(_node("me"))

    async def mode(
        self, group: nodegroup.LocalModelNodeGroup, previous: downloads.JobRef | None = None
    ) -> peering.Mode | status.Outcome:
        return await self.peers.mode(
            _unit(), node=self.me, group=group, previous=previous, max_size=100
        )

    def fallbacks(self, reason: str) -> float:
        return self.registry.value("localcache_p2p_fallbacks_total", reason=reason) or 0.0


async def test_peer_distribution_off_makes_no_request(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeApi([_serving("a", _unit().scope_id)]))
    for group in (_group(None), _group(False)):
        assert await rig.mode(group) == peering.Mode()
        assert await rig.mode(group, _ref(peer=False)) == peering.Mode()
    outcome = plan.Downloaded(_manifest(), "job-1").outcome()
    assert (
        await rig.peers.completed(_ref(peer=False), outcome, group=_group(False), node=rig.me)
        is outcome
    )
    assert rig.api.calls == []


async def test_without_peer_image_the_origin_is_used_without_listing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeApi([_serving("a", _unit().scope_id)]), image="")
    assert await rig.mode(_group(True)) == peering.Mode("origin")  # no image: no seed step
    assert rig.api.calls == []


async def test_a_source_gives_a_peer_mode_transform_and_the_list_is_cached(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, FakeApi([_node("me"), _serving("a", _unit().scope_id)]))
    mode = await rig.mode(_group(True))
    assert isinstance(mode, peering.Mode)
    assert mode.source == "peer/a"
    assert mode.transform is not None
    origin = {
        "metadata": {"name": "j", "labels": {}},
        "spec": {"template": {"metadata": {"labels": {}}, "spec": {
            "containers": [{"name": peerjob.CONTAINER, "image": "si", "args": [URI]}],
            "volumes": []}}},
    }  # fmt: skip
    job = mode.transform(origin, credentials.Injection(uri=URI))
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--source") + 1] == f"a={ENDPOINT}"
    assert args[args.index("--max-size") + 1] == "100"
    await rig.mode(_group(True))
    assert rig.api.calls == [("list", "localmodelnodes")]
    await rig.clock.advance(peering.LIST_TTL_S + 1)
    await rig.mode(_group(True))
    assert rig.api.calls == [("list", "localmodelnodes")] * 2


async def test_the_origin_is_chosen_only_on_a_fresh_list(tmp_path: Path) -> None:
    """Seed election race (the benchmark at N = 4: two origin downloads): a node that saw
    itself as the only candidate in a kept LIST looks again before it downloads from the
    origin, and waits for the lower-named node that got the model meanwhile."""
    api = FakeApi([_node("me")])
    rig = Rig(tmp_path, api)
    settling = await rig.mode(_group(True))  # alone in a fresh LIST: settles first
    assert isinstance(settling, status.Outcome), settling
    assert settling.requeue_after == peerplan.SETTLE_S
    assert api.calls == [("list", "localmodelnodes")]
    api.nodes = [_node("me"), _node("a")]  # "a" got the model's entry after that LIST
    await rig.clock.advance(peerplan.SETTLE_S)  # the kept LIST (alone) says origin: relisted
    waiting = await rig.mode(_group(True))
    assert isinstance(waiting, status.Outcome), waiting
    assert waiting.status == modelnode.ModelStatus.DOWNLOAD_PENDING
    assert "node a" in (waiting.progress.message or "")
    assert api.calls == [("list", "localmodelnodes")] * 2


async def test_a_seed_is_waited_for_then_the_origin_used(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeApi([_node("me"), _node("a-seed")]))
    waiting = await rig.mode(_group(True))
    assert isinstance(waiting, status.Outcome)
    assert waiting.status is modelnode.ModelStatus.DOWNLOAD_PENDING
    assert "a-seed" in (waiting.progress.message or "")
    assert waiting.requeue_after is not None
    assert 0 < waiting.requeue_after <= peering.SEED_RECHECK_S
    await rig.clock.advance(61)
    assert _is_seed_origin(await rig.mode(_group(True)))
    assert rig.fallbacks("seed-wait-timeout") == 1


async def test_a_seed_whose_download_moves_is_waited_for_past_the_seed_wait(
    tmp_path: Path,
) -> None:
    """An http model the seed downloads for longer than `seed_wait_s`: its followers wait
    while its bytes grow (they cannot follow files written in place), not N times the
    origin's bytes; once it stops moving for `seed_wait_s`, the origin."""

    def seed(size: int) -> Obj:
        return _node("a-seed", {"modelStatus": {"iris": "ModelDownloading"},
                                "modelProgress": {"iris": {"bytesOnDisk": size}}})  # fmt: skip

    api = FakeApi([_node("me"), seed(0)])
    rig = Rig(tmp_path, api)  # seed_wait_s=60
    for size in (10, 20, 30):
        await rig.clock.advance(50)
        api.nodes = [_node("me"), seed(size)]
        waiting = await rig.mode(_group(True))
        assert isinstance(waiting, status.Outcome), f"gave up at {size} bytes"
    await rig.clock.advance(30)
    assert isinstance(await rig.mode(_group(True)), status.Outcome)
    await rig.clock.advance(31)
    assert _is_seed_origin(await rig.mode(_group(True)))
    assert rig.fallbacks("seed-wait-timeout") == 1


async def test_a_seed_that_never_starts_is_given_up_before_the_seed_wait(
    tmp_path: Path,
) -> None:
    """Its agent is down: its entry never leaves Pending, and nobody waits 5 minutes."""
    idle = _node("a-seed", {"modelStatus": {"iris": "ModelDownloadPending"}})
    rig = Rig(tmp_path, FakeApi([_node("me"), idle]), seed_wait_s=300)
    assert isinstance(await rig.mode(_group(True)), status.Outcome)
    await rig.clock.advance(peerplan.SEED_START_S)
    assert _is_seed_origin(await rig.mode(_group(True)))
    assert rig.fallbacks("seed-not-started") == 1
    assert rig.fallbacks("seed-wait-timeout") == 0


async def test_after_a_failed_peer_job_the_origin_is_used_and_counted(tmp_path: Path) -> None:
    said = json.dumps({"outcome": "use-origin"})
    rig = Rig(tmp_path, FakeApi([_serving("a", _unit().scope_id)], pods=[_pod(3, said)]))
    assert _is_seed_origin(await rig.mode(_group(True), _ref(peer=True)))
    assert rig.fallbacks("use-origin") == 1
    assert _is_seed_origin(await rig.mode(_group(True), _ref(peer=True)))
    assert rig.fallbacks("use-origin") == 1, "counted once per failed Job"
    assert ("create", "events") in rig.api.calls
    assert ("list", "localmodelnodes") not in rig.api.calls


async def test_a_peer_job_failing_otherwise_counts_as_peer_failed(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeApi(pods=[_pod(1, "Traceback ...")]))
    assert _is_seed_origin(await rig.mode(_group(True), _ref(peer=True)))
    assert rig.fallbacks("peer-failed") == 1


def _wait(failed: downloads.JobRef | None) -> plan.Wait:
    progress = modelnode.ModelProgress(message="download Job failed")
    return plan.Wait(status.Outcome(modelnode.ModelStatus.DOWNLOAD_ERROR, progress), failed)


@pytest.mark.parametrize(
    ("code", "message", "retried"),
    [
        (3, None, True),
        (1, json.dumps({"outcome": "use-origin"}), True),
        (1, json.dumps({"outcome": "failed"}), False),
        (1, "use-origin", False),
    ],
)
async def test_use_origin_skips_the_backoff(
    tmp_path: Path, code: int, message: str | None, retried: bool
) -> None:
    rig = Rig(tmp_path, FakeApi(pods=[_pod(code, message)]))
    failed = _ref(peer=True, attempt=2)
    action = await rig.peers.fast_fallback(_wait(failed), failed, NOW)
    if retried:
        assert action == plan.Launch(attempt=3, message="download Job failed", retry_of=failed)
    else:
        assert isinstance(action, plan.Wait)


async def test_origin_jobs_and_other_actions_keep_their_backoff(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeApi(pods=[_pod(3, None)]))
    origin_wait = _wait(_ref(peer=False))
    assert await rig.peers.fast_fallback(origin_wait, None, NOW) is origin_wait
    empty = _wait(None)
    assert await rig.peers.fast_fallback(empty, None, NOW) is empty
    assert rig.api.calls == []


def _manifest() -> layout.Manifest:
    return layout.Manifest(storage_key=KEY, uri=URI, bytes=10, completed_at="t", job="job-1")


async def test_a_completed_peer_job_reports_its_bytes_clipped_to_the_disk(
    tmp_path: Path,
) -> None:
    said = json.dumps({"outcome": "complete", "peerBytes": 10**12, "originBytes": 4})
    rig = Rig(tmp_path, FakeApi(pods=[_pod(0, said, phase="Succeeded")]))
    outcome = plan.Downloaded(_manifest(), "job-1").outcome()
    done = await rig.peers.completed(_ref(peer=True), outcome, group=_group(True), node=rig.me)
    assert (done.progress.peer_bytes, done.progress.origin_bytes) == (10, 4)


async def test_a_bad_source_named_by_the_report_is_counted_and_said_once_per_job(
    tmp_path: Path,
) -> None:
    why = "served bytes that fail the sha256 of 'model.bin'"
    said = json.dumps({"outcome": "complete", "peerBytes": 10, "badSources": {"node-b": why}})
    rig = Rig(tmp_path, FakeApi(pods=[_pod(0, said, phase="Succeeded")]))
    outcome = plan.Downloaded(_manifest(), "job-1").outcome()
    for _ in range(2):  # a second pass over the same Job says nothing again
        await rig.peers.completed(_ref(peer=True), outcome, group=_group(True), node=rig.me)
    assert rig.registry.value("localcache_p2p_verify_failures_total") == 1
    events = [o for o in rig.api.created if o.get("kind") == "Event"]
    assert len(events) == 1, rig.api.calls
    body = events[0]
    assert body["reason"] == "PeerSourceRejected"
    assert "node-b" in body["message"], body
    assert "sha256" in body["message"], body


def test_a_report_naming_too_many_or_too_long_bad_sources_is_ignored() -> None:
    many = {f"n{i}": "bad" for i in range(peer.MAX_SOURCES + 2)}
    long = {"n": "x" * (peer.MAX_BAD_REASON + 1)}
    for bad in (many, long):
        text = json.dumps({"outcome": "complete", "badSources": bad})
        assert peerreports.parse_report(text) is None


async def test_a_completed_origin_job_in_an_enabled_group_counts_origin_bytes(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, FakeApi())
    outcome = plan.Downloaded(_manifest(), "job-1").outcome()
    done = await rig.peers.completed(_ref(peer=False), outcome, group=_group(True), node=rig.me)
    assert (done.progress.source, done.progress.origin_bytes) == ("origin", 10)
    assert rig.registry.value("localcache_p2p_origin_bytes_total") == 10
    assert rig.api.calls == []


async def test_peer_fields_are_carried_for_the_same_job(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeApi())
    pending = modelnode.ModelProgress(job_name="job-1", source="peer/a")
    rig.peers.carry(status.Outcome(modelnode.ModelStatus.DOWNLOAD_PENDING, pending), None)
    running = status.Outcome(
        modelnode.ModelStatus.DOWNLOADING, modelnode.ModelProgress(job_name="job-1")
    )
    assert rig.peers.carry(running, None).progress.source == "peer/a"  # stale status
    other = status.Outcome(
        modelnode.ModelStatus.DOWNLOADING, modelnode.ModelProgress(job_name="job-2")
    )
    assert rig.peers.carry(other, pending).progress.source is None
    fresh = peering.Peering(
        node_name="me", api=FakeApi(), settings=peering.PeerSettings(),
        clock=rig.clock, reporter=report.Reporter(node_name="me", api=FakeApi(),
        wall_clock=lambda: NOW), p2p=None,
    )  # fmt: skip
    assert fresh.carry(running, pending).progress.source == "peer/a"  # after a restart
    unknown = status.Outcome(
        modelnode.ModelStatus.DOWNLOADING, modelnode.ModelProgress(job_name="job-3")
    )
    assert fresh.carry(unknown, modelnode.ModelProgress(job_name="job-3")) is unknown


@pytest.mark.parametrize(
    "text",
    [None, "", "not json", "[]", '{"outcome": "maybe"}', '{"outcome": "complete", "peerBytes": -1}',
     json.dumps({"outcome": "complete", "reason": "x" * 5000})],
)  # fmt: skip
def test_junk_termination_messages_are_no_report(text: str | None) -> None:
    assert peerreports.parse_report(text) is None


def test_a_report_is_read_from_the_newest_finished_pod() -> None:
    old = _pod(1, json.dumps({"outcome": "failed"}))
    new = _pod(3, json.dumps({"outcome": "use-origin", "peerBytes": 7}))
    new["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    running = {"metadata": {}, "status": {"phase": "Running"}}
    said = peerreports.read_pod_report([new, old, running])
    assert said.use_origin
    assert said.report is not None
    assert said.report.peer_bytes == 7
    assert peerreports.read_pod_report([running]) == peerreports.PodReport()


async def test_a_refused_list_means_the_origin(tmp_path: Path) -> None:
    class Refusing(FakeApi):
        async def list(self, res: kube.Resource, **kw: Any) -> kube.ObjList:
            await super().list(res, **kw)
            raise errors.Forbidden(403, "localmodelnodes is forbidden")

    rig = Rig(tmp_path, Refusing())
    assert _is_seed_origin(await rig.mode(_group(True)))


async def test_a_peer_job_that_finished_a_file_from_the_origin_is_a_fallback_said_once(
    tmp_path: Path,
) -> None:
    said = json.dumps({"outcome": "complete", "peerBytes": 6, "originBytes": 4})
    rig = Rig(tmp_path, FakeApi(pods=[_pod(0, said, phase="Succeeded")]))
    outcome = plan.Downloaded(_manifest(), "job-1").outcome()
    for _ in range(2):  # a second pass over the same Job says nothing again
        await rig.peers.completed(_ref(peer=True), outcome, group=_group(True), node=rig.me)
    assert rig.registry.value("localcache_p2p_fallbacks_total", reason="resumed-at-origin") == 1
    events = [o for o in rig.api.created if o.get("kind") == "Event"]
    assert len(events) == 1, rig.api.calls
    assert events[0]["reason"] == "PeerFallback"
    assert "from the origin by Range (4 bytes" in events[0]["message"], events[0]
