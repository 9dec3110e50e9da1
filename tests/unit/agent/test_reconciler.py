"""The reconciler's edge paths on in-memory stores and a recording API (no network): no
good config yet, the node-group fallback, an empty download, a bad storage container, and
a Job the cache has not shown yet. The main flows run on the real control plane in
tests/integration/agent."""

from __future__ import annotations

import builtins
import copy
import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import downloads, plan, reconciler, report
from localcache.agent.disk import folders, roots
from localcache.agent.jobs import launcher, peerjob
from localcache.api import originpaths
from localcache.caching import keys
from localcache.runtime import clock, errors, kube, metrics, store
from localcache.runtime import keys as rkeys

Obj = dict[str, Any]
URI = "s3://mybucket/mymodel"
KEY = keys.storage_key(URI)
NODE = "node-1"
NS = "jobs"
T0 = datetime.datetime(2026, 3, 1, 10, tzinfo=datetime.UTC)


class FakeApi:
    """Records writes; serves GETs from `objects`; applies status patches to the node."""

    def __init__(self, nodes: store.Store) -> None:
        self.nodes = nodes
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.created: builtins.list[Obj] = []
        self.deleted: builtins.list[str] = []
        self.pods: builtins.list[Obj] = []
        self.full: set[str] = set()
        self.taken: set[str] = set()

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj:
        try:
            return self.objects[(res.plural, namespace or "", name)]
        except KeyError:
            raise errors.NotFound(404, f"{res.plural} {name} not found") from None

    async def list(
        self, res: kube.Resource, *, namespace: str | None = None, label_selector: str | None = None
    ) -> kube.ObjList:
        return kube.ObjList(items=builtins.list(self.pods), resource_version="1")

    async def create(self, res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        if namespace in self.full:
            raise errors.Forbidden(403, "exceeded quota: jobs", reason="Forbidden")
        name = obj["metadata"].get("name")
        if res.plural == "jobs" and (
            name in self.taken or any(c["metadata"].get("name") == name for c in self.created)
        ):
            raise errors.Conflict(409, "already exists", reason="AlreadyExists")
        obj = copy.deepcopy(obj)
        obj["metadata"]["uid"] = f"uid-{len(self.created)}"
        self.created.append(obj)
        return obj

    async def delete(
        self,
        res: kube.Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Any = None,
        uid: str | None = None,
    ) -> Obj:
        self.deleted.append(name)
        return {}

    async def get_status(
        self, res: kube.Resource, name: str, *, namespace: str | None = None
    ) -> Obj:
        found = self.nodes.get(rkeys.ObjectKey("", name))
        assert found is not None
        return found

    async def patch(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj:
        """Events only: a repeated Event's count bump."""
        assert res.plural == "events", res
        assert isinstance(patch, dict), patch
        (event,) = (e for e in self.events() if e["metadata"]["name"] == name)
        event.update(patch)
        return event

    async def patch_status(
        self, res: kube.Resource, name: str, patch: kube.Patch, *, namespace: str | None = None
    ) -> Obj:
        assert isinstance(patch, dict)
        node = copy.deepcopy(self.nodes.get(rkeys.ObjectKey("", name)))
        assert node is not None
        status = node.setdefault("status", {})
        for field, value in patch["status"].items():
            status[field] = _apply(status.get(field), value)
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        self.nodes.upsert(node)
        return node

    def jobs(self) -> builtins.list[Obj]:
        return [o for o in self.created if o["kind"] == "Job"]

    def events(self) -> builtins.list[Obj]:
        return [o for o in self.created if o["kind"] == "Event"]


def _apply(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply(result.get(key), value)
    return result


class World:
    def __init__(
        self,
        root: Path,
        *,
        suffixes: builtins.list[str] | None = None,
        disks: roots.Disks | None = None,
    ) -> None:
        self.stores = {name: store.Store() for name in reconciler.Stores.__dataclass_fields__}
        self.api = FakeApi(self.stores["nodes"])
        self.disks = disks or roots.Disks([folders.ModelDisk(root)])
        self.disk = self.disks.all[0]
        self.now = T0
        self.clock = clock.FakeClock()
        self.rec = reconciler.Reconciler(
            node_name=NODE,
            api=self.api,
            disk=self.disks,
            stores=reconciler.Stores(**{k: v.view() for k, v in self.stores.items()}),
            agent_metrics=report.AgentMetrics(metrics.Metrics()),
            config_namespace="kserve",
            clock=self.clock,
            wall_clock=lambda: self.now,
            job_name_suffix=(lambda: suffixes.pop(0)) if suffixes else None,
        )
        self.configure(json.dumps({"jobNamespace": NS}))
        self.group("gpu", roots.served_path(self.disk))

    def configure(self, local_model: str) -> None:
        self.stores["config_maps"].upsert(
            {
                "metadata": {
                    "name": "inferenceservice-config",
                    "namespace": "kserve",
                    "resourceVersion": str(id(local_model)),
                },
                "data": {"localModel": local_model},
            }
        )

    def group(self, name: str, path: str, *, pool: str | None = None) -> None:
        term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": [pool or name]}]}
        self.stores["node_groups"].upsert(
            {
                "metadata": {"name": name},
                "spec": {
                    "storageLimit": "1Gi",
                    "persistentVolumeClaimSpec": {},
                    "persistentVolumeSpec": {
                        "hostPath": {"path": path},
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
                    },
                },
            }
        )

    def models(self, *entries: Obj) -> None:
        self.stores["nodes"].upsert(
            {
                "metadata": {"name": NODE, "uid": "u-1", "resourceVersion": "1", "generation": 1},
                "spec": {"localModels": list(entries)},
            }
        )

    async def reconcile(self) -> float | None:
        result = await self.rec.reconcile(rkeys.ObjectKey("", NODE))
        return result.requeue_after

    def status(self) -> Obj:
        node = self.stores["nodes"].get(rkeys.ObjectKey("", NODE))
        assert node is not None
        return dict(node.get("status") or {})

    def job_seen(self, job: Obj, **status: Any) -> None:
        """The Jobs informer shows `job` with `status`."""
        self.stores["jobs"].upsert({**job, "status": status})

    def job_done(self, job: Obj, files: dict[str, bytes]) -> None:
        """`job` wrote `files` into its staging folder, and the informer shows it Complete."""
        staging = self.disk.staging_path(KEY, job["metadata"]["name"])
        for name, data in files.items():
            (staging / name).write_bytes(data)
        done = [{"type": "Complete", "status": "True"}]
        self.job_seen(job, completionTime=plan.format_time(T0), conditions=done)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _entry(name: str = "iris", uri: str = URI, **extra: Any) -> Obj:
    return {"sourceModelUri": uri, "modelName": name, **extra}


async def test_nothing_runs_before_a_first_good_config(world: World) -> None:
    world.configure("{broken")
    world.models(_entry(nodeGroup="gpu"))
    assert await world.reconcile() == reconciler.NO_CONFIG_RETRY_S
    assert world.api.jobs() == []
    [event] = world.api.events()
    assert event["reason"] == "InvalidConfiguration"
    assert "localModel" in event["message"]
    await world.reconcile()
    assert len(world.api.events()) == 1, "one Event per bad ConfigMap version"


async def test_entry_without_node_group_uses_the_group_matching_the_node(world: World) -> None:
    world.group("cpu", str(world.disk.root))
    world.api.objects[("nodes", "", NODE)] = {"metadata": {"name": NODE, "labels": {"pool": "cpu"}}}
    world.models(_entry())
    await world.reconcile()
    [job] = world.api.jobs()
    claim = job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == "iris-cpu"


async def test_no_matching_node_group_is_an_error(world: World) -> None:
    world.api.objects[("nodes", "", NODE)] = {"metadata": {"name": NODE, "labels": {}}}
    world.models(_entry())
    await world.reconcile()
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadError"}
    message = world.status()["modelProgress"]["iris"]["message"]
    assert message == f"did not find matching nodegroup for node: {NODE}"


async def test_bad_storage_container_regex_is_an_error_without_job(world: World) -> None:
    world.stores["storage_containers"].upsert(
        {
            "metadata": {"name": "broken"},
            "spec": {
                "container": {"image": "x"},
                "supportedUriFormats": [{"regex": "("}],
                "workloadType": "localModelDownloadJob",
            },
        }
    )
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    assert world.api.jobs() == []
    assert "storage container broken" in world.status()["modelProgress"]["iris"]["message"]


async def test_job_not_yet_in_the_cache_is_not_created_twice(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    await world.reconcile()
    assert len(world.api.jobs()) == 1
    [job] = world.api.jobs()
    assert world.disk.staging_path(KEY, job["metadata"]["name"]).is_dir(), "staging kept"
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}
    [record] = world.status()["downloadJobs"]
    assert (record["name"], record["uid"]) == (job["metadata"]["name"], job["metadata"]["uid"])
    await world.clock.advance(launcher.CREATED_MEMORY_S + 1)
    await world.reconcile()  # memory expired and never seen: that Job is gone, start another
    assert len(world.api.jobs()) == 2
    assert [r["uid"] for r in world.status()["downloadJobs"]] == ["uid-1"]


async def test_empty_download_is_an_error_retried_after_backoff(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    done = {
        "conditions": [
            {"type": "Complete", "status": "True", "lastTransitionTime": plan.format_time(T0)}
        ]
    }
    world.job_seen(job, **done)
    requeue = await world.reconcile()
    status = world.status()
    assert status["modelStatus"] == {"iris": "ModelDownloadError"}
    assert "wrote nothing" in status["modelProgress"]["iris"]["message"]
    assert status["modelProgress"]["iris"]["nextRetryTime"] == "2026-03-01T10:01:00Z"
    assert requeue == 60
    assert not world.disk.is_complete(KEY)

    world.now = T0 + datetime.timedelta(seconds=61)
    await world.reconcile()
    names = [j["metadata"]["name"] for j in world.api.jobs()]
    assert [n.rsplit("-", 2)[1] for n in names] == ["0", "1"]
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}


async def test_completed_download_is_promoted_and_reported(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"), _entry("twin", nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    (world.disk.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    world.job_seen(
        job,
        completionTime=plan.format_time(T0),
        startTime="2026-03-01T09:59:00Z",
        conditions=[{"type": "Complete", "status": "True"}],
    )
    assert await world.reconcile() == 60
    status = world.status()
    assert status["modelStatus"] == {"iris": "ModelDownloaded", "twin": "ModelDownloaded"}
    assert status["modelProgress"]["iris"] == {
        "bytesOnDisk": 5,
        "percent": 100,
        "jobName": job["metadata"]["name"],
        "completionTime": "2026-03-01T10:00:00Z",
    }
    assert world.disk.is_complete(KEY)
    assert [e["reason"] for e in world.api.events()] == ["ModelDownloaded", "ModelDownloaded"]


async def test_other_nodes_are_ignored(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    result = await world.rec.reconcile(rkeys.ObjectKey("", "node-2"))
    assert result.requeue_after is None
    assert world.api.created == []


async def test_rejected_job_is_this_entrys_error_only(world: World) -> None:
    world.api.full.add("team-a")
    world.models(
        _entry("tenant", namespace="team-a", nodeGroup="gpu"),
        _entry("other", "s3://b/other", nodeGroup="gpu"),
    )
    await world.reconcile()
    status = world.status()
    assert status["modelStatus"] == {
        "team-a/tenant": "ModelDownloadError",
        "other": "ModelDownloadPending",
    }
    assert "exceeded quota" in status["modelProgress"]["team-a/tenant"]["message"]
    assert [j["metadata"]["namespace"] for j in world.api.jobs()] == [NS]
    assert [p.name for p in world.disk.staging.iterdir()] == [
        f"{keys.storage_key('s3://b/other')}-{world.api.jobs()[0]['metadata']['name']}"
    ]


# ---- Job trust (issue 13, bug 1) -------------------------------------------------------------
def _complete(world: World, job: Obj, *, files: bool = True) -> None:
    if files:
        (world.disk.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    world.job_seen(job, conditions=[{"type": "Complete", "status": "True"}])


def _forged(job: Obj, *, uid: str = "forged-uid", **status: Any) -> Obj:
    forged = copy.deepcopy(job)
    forged["metadata"]["uid"] = uid
    return {**forged, "status": status}


async def test_same_named_job_with_another_uid_is_not_trusted(world: World) -> None:
    """A tenant deletes its download Job and creates one of the same name, labels and
    ownerReference, with a Complete status: it proves nothing, is never promoted or deleted,
    is reported, and a new Job of the agent's own takes over."""
    world.models(_entry("tenant", namespace="team-a", nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    (world.disk.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"evil")
    world.stores["jobs"].upsert(
        _forged(job, conditions=[{"type": "Complete", "status": "True"}], succeeded=1)
    )
    await world.reconcile()
    assert world.status()["modelStatus"] == {"team-a/tenant": "ModelDownloadPending"}
    assert not world.disk.is_complete(KEY)
    assert world.api.deleted == []
    [event] = [e for e in world.api.events() if e["reason"] == "UntrustedDownloadJob"]
    assert f"team-a/{job['metadata']['name']}" in event["message"]
    [_, replacement] = world.api.jobs()
    assert replacement["metadata"]["name"] != job["metadata"]["name"]
    [record] = world.status()["downloadJobs"]
    assert record["uid"] == replacement["metadata"]["uid"]
    await world.reconcile()
    assert len([e for e in world.api.events() if e["reason"] == "UntrustedDownloadJob"]) == 1


@pytest.mark.parametrize(
    "status",
    [
        {"conditions": [{"type": "Failed", "status": "True", "message": "fake"}], "failed": 1},
        {"active": 1, "ready": 1},
    ],
    ids=["failed", "active"],
)
async def test_untrusted_failed_or_active_job_does_not_stall_the_download(
    world: World, status: Obj
) -> None:
    """A same-labelled Job the agent never created (named like one of its next Jobs) is
    neither a failure to back off from nor a download to wait for."""
    world.models(_entry(nodeGroup="gpu"))
    [name] = [
        j["metadata"]["name"]
        for j in (await _would_create(world.disk.root, _entry(nodeGroup="gpu")))
    ]
    squat = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": "tenant-uid",
            "labels": {"node": NODE, "model": "iris", "storageKey": KEY},
        },
    }
    world.stores["jobs"].upsert({**squat, "status": status})
    await world.reconcile()
    [job] = world.api.jobs()
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}
    assert world.status()["modelProgress"]["iris"]["jobName"] == job["metadata"]["name"]
    _complete(world, job)
    await world.reconcile()
    assert world.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    assert world.api.deleted == []


async def _would_create(root: Path, entry: Obj) -> builtins.list[Obj]:
    """The Jobs a fresh agent creates for `entry` (its name is what a squatter can see)."""
    other = World(root / "elsewhere")
    other.models(entry)
    await other.reconcile()
    return other.api.jobs()


async def test_already_exists_is_someone_elses_job_and_another_name_is_used(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, suffixes=["squat001", "mine0002"])
    world.models(_entry(nodeGroup="gpu"))
    tag = downloads.unit_tag(storage_key=KEY, node_name=NODE, scope=None)
    world.api.taken.add(f"{tag}-0-squat001")
    await world.reconcile()
    [job] = world.api.jobs()
    assert job["metadata"]["name"] == f"{tag}-0-mine0002"
    [record] = world.status()["downloadJobs"]
    assert record["name"] == f"{tag}-0-mine0002"
    assert not world.disk.staging_path(KEY, f"{tag}-0-squat001").exists()


async def test_recorded_jobs_are_trusted_after_a_restart(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    _complete(world, job)
    restarted = reconciler.Reconciler(
        node_name=NODE,
        api=world.api,
        disk=world.disk,
        stores=reconciler.Stores(**{k: v.view() for k, v in world.stores.items()}),
        agent_metrics=report.AgentMetrics(metrics.Metrics()),
        config_namespace="kserve",
        clock=world.clock,
        wall_clock=lambda: world.now,
    )
    await restarted.reconcile(rkeys.ObjectKey("", NODE))
    assert world.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    assert len(world.api.jobs()) == 1


async def test_job_created_just_before_a_crash_is_never_trusted(world: World) -> None:
    """The record of a created Job never reached status (crash between create and status
    write): the orphan is reported and ignored, its staging folder is never promoted, and
    the unit runs a Job of its own."""
    world.models(_entry(nodeGroup="gpu"))
    orphan = (await _would_create(world.disk.root, _entry(nodeGroup="gpu")))[0]
    world.disk.prepare_staging(KEY, orphan["metadata"]["name"])
    _complete(world, orphan)
    await world.reconcile()
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}
    assert not world.disk.is_complete(KEY)
    assert not world.disk.staging_path(KEY, orphan["metadata"]["name"]).exists()
    assert [e["reason"] for e in world.api.events()] == ["UntrustedDownloadJob"]
    [job] = world.api.jobs()
    assert job["metadata"]["name"] != orphan["metadata"]["name"]


async def test_recorded_job_in_another_namespace_than_its_entries_is_not_used(
    world: World,
) -> None:
    world.models(_entry("tenant", namespace="team-a", nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    _complete(world, job)
    world.models(_entry("tenant", namespace="team-b", nodeGroup="gpu"))
    await world.reconcile()
    assert world.status()["modelStatus"] == {"team-b/tenant": "ModelDownloadPending"}
    assert not world.disk.is_complete(KEY)


async def test_a_created_job_is_recorded_before_the_pass_goes_on(world: World) -> None:
    """The record reaches status right after the create: a failure later in the same pass
    (here the next unit's create) does not turn the first Job into an untrusted orphan."""
    world.models(_entry(nodeGroup="gpu"), _entry("other", "s3://b/other", nodeGroup="gpu"))
    create = world.api.create

    async def failing_second(res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        if res.plural == "jobs" and world.api.jobs():
            raise errors.ServerError(500, "etcd hiccup")
        return await create(res, obj, namespace=namespace)

    world.api.create = failing_second  # type: ignore[method-assign]
    with pytest.raises(errors.ServerError):
        await world.reconcile()
    [job] = world.api.jobs()
    [record] = world.status()["downloadJobs"]
    assert record["uid"] == job["metadata"]["uid"]


async def test_a_seeds_size_leaves_its_sidecars_record_out(world: World) -> None:
    """The seed's checksum record is no byte of the model: not in its size (`originBytes`,
    `bytesOnDisk`), not in its folder (the e2e run at the fix saw 13 bytes too many)."""
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    job["metadata"]["labels"][peerjob.SUMS_LABEL] = "true"
    record = originpaths.StagedSums(sha256={}).model_dump_json().encode()
    world.job_done(job, {"m.bin": b"12345", originpaths.STAGED_SUMS: record})
    await world.reconcile()
    assert world.status()["modelProgress"]["iris"]["bytesOnDisk"] == 5
    manifest = world.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.bytes == 5
    assert not manifest.origin_unchecked
    assert [p.name for p in world.disk.model_path(KEY).iterdir()] == ["m.bin"]


@pytest.mark.parametrize("peers", [True, False])
async def test_an_origin_copy_without_the_sidecar_is_unchecked(world: World, peers: bool) -> None:
    """An `s3://` origin Job that ran without the checksum sidecar (a fallback, no peer image,
    peer distribution off at its launch): its copy is served to no peer, also once the group
    turns peer distribution on."""
    group = world.stores["node_groups"].get(rkeys.ObjectKey("", "gpu"))
    assert group is not None
    world.stores["node_groups"].upsert(
        {**group, "spec": {**group["spec"], "peerDistribution": {"enabled": peers}}}
    )
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    world.job_done(job, {"m.bin": b"12345"})
    await world.reconcile()
    assert world.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    manifest = world.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.origin_unchecked


@pytest.mark.parametrize(("seed", "stopped"), [(False, True), (True, False)])
async def test_a_seed_whose_sidecar_still_asks_the_origin_is_no_stall(
    world: World, seed: bool, stopped: bool
) -> None:
    """Its bytes are all there, its sidecar holds the pod for the origin's answer (up to
    `peerjob.SEED_GRACE_S`): a short `downloadStallTimeoutInSecs` must not stop it."""
    world.configure(json.dumps({"jobNamespace": NS, "downloadStallTimeoutInSecs": 30}))
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    (world.disk.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    if seed:
        job["metadata"]["labels"][peerjob.SUMS_LABEL] = "true"
    world.job_seen(job, active=1, ready=0)
    await world.reconcile()  # the folder's size seen
    await world.clock.advance(60)
    await world.reconcile()
    assert (job["metadata"]["name"] in world.api.deleted) is stopped
