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

from localcache.agent import disk, launcher, plan, reconciler, report
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
        if res.plural == "jobs" and any(
            c["metadata"].get("name") == obj["metadata"]["name"] for c in self.created
        ):
            raise errors.Conflict(409, "already exists", reason="AlreadyExists")
        self.created.append(obj)
        return obj

    async def delete(
        self,
        res: kube.Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Any = None,
    ) -> Obj:
        self.deleted.append(name)
        return {}

    async def get_status(
        self, res: kube.Resource, name: str, *, namespace: str | None = None
    ) -> Obj:
        found = self.nodes.get(rkeys.ObjectKey("", name))
        assert found is not None
        return found

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
    def __init__(self, root: Path) -> None:
        self.stores = {name: store.Store() for name in reconciler.Stores.__dataclass_fields__}
        self.api = FakeApi(self.stores["nodes"])
        self.disk = disk.ModelDisk(root)
        self.now = T0
        self.clock = clock.FakeClock()
        self.rec = reconciler.Reconciler(
            node_name=NODE,
            api=self.api,
            disk=self.disk,
            stores=reconciler.Stores(**{k: v.view() for k, v in self.stores.items()}),
            agent_metrics=report.AgentMetrics(metrics.Metrics()),
            config_namespace="kserve",
            clock=self.clock,
            wall_clock=lambda: self.now,
        )
        self.configure(json.dumps({"jobNamespace": NS}))
        self.group("gpu", str(root))

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

    def group(self, name: str, path: str) -> None:
        term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": [name]}]}
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
    await world.clock.advance(launcher.CREATED_MEMORY_S + 1)
    await world.reconcile()  # memory expired, still unseen: AlreadyExists counts as created
    assert len(world.api.jobs()) == 1
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}


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
    assert [n.rsplit("-", 1)[1] for n in names] == ["0", "1"]
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
