"""The node agent's integration-test harness: a per-test node, models root, config and node
group on the real control plane, and an in-process agent run by the runtime Manager.

No kubelet runs: tests play the download pod themselves. They write the model files into
the Job's staging folder, then set the pod's phase through the pod status subresource; the
real Job controller (kube-controller-manager) then sets the Job's conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from localcache.agent import setup as agent_setup
from localcache.agent.disk import folders
from localcache.agent.jobs import jobs
from localcache.api import groupversion
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube, manager, metrics

Obj = dict[str, Any]
LMN = groupversion.LOCAL_MODEL_NODE
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP
MERGE = "application/merge-patch+json"
URI = "s3://mybucket/mymodel"
IMAGE = "kserve/storage-initializer:latest"
_LIVE = (None, "Pending", "Running")


def entry(
    name: str, uri: str = URI, *, group: str, namespace: str | None = None, **extra: Any
) -> Obj:
    """A LocalModelNode spec entry."""
    out: Obj = {"sourceModelUri": uri, "modelName": name, "nodeGroup": group, **extra}
    if namespace:
        out["namespace"] = namespace
    return out


T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T | None]], *, what: str, within: float = 30
) -> T:
    """The first non-None value of `check()`, polled with `wait_until` (which fails naming
    `what` when none comes within `within` seconds)."""
    found: list[T] = []

    async def probe() -> bool:
        value = await check()
        if value is not None:
            found.append(value)
        return value is not None

    await wait_until(probe, timeout=within, what=what)
    return found[-1]


class Agent:
    """One test's node: its LocalModelNode, models root, config and node group, and the
    agent process (started and stopped at will, always on the same root)."""

    def __init__(self, plane: ControlPlane, *, namespace: str, root: Path) -> None:
        self.plane = plane
        self.namespace = namespace
        self.node = f"node-{uuid.uuid4().hex[:8]}"
        self.group = f"gpu-{self.node}"
        self.root = root
        self.disk = folders.ModelDisk(root)
        self.metrics: metrics.Metrics | None = None
        self._manager: manager.Manager | None = None
        self._task: asyncio.Task[int] | None = None
        self._kube: kube.Kube | None = None
        self.cleanup_paths: list[str] = []

    # ---- REST through the harness (off the event loop) ----------------------------------
    async def rest(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
    ) -> Any:
        status, answer = await asyncio.to_thread(
            self.plane.rest, method, path, body, content_type=content_type
        )
        if status not in ok:
            raise AssertionError(f"{method} {path}: {status} {answer}")
        return answer

    async def create(self, path: str, obj: Obj, *, cleanup: bool = False) -> Obj:
        created: Obj = await self.rest("POST", path, obj)
        if cleanup:
            self.cleanup_paths.append(f"{path}/{created['metadata']['name']}")
        return created

    async def patch(self, path: str, body: Obj) -> Obj:
        patched: Obj = await self.rest("PATCH", path, body, content_type=MERGE)
        return patched

    # ---- objects -------------------------------------------------------------------------
    async def configure(
        self, *, local_model: Mapping[str, Any] | None = None, raw_local_model: str | None = None
    ) -> None:
        """Create or replace the inferenceservice-config ConfigMap in the test namespace."""
        section = {
            "jobNamespace": self.namespace,
            "downloadRetryBackoffInSecs": 1,
            "downloadRetryMaxBackoffInSecs": 2,
            **(local_model or {}),
        }
        data = {
            "localModel": raw_local_model if raw_local_model is not None else json.dumps(section),
            "storageInitializer": json.dumps(
                {
                    "image": IMAGE,
                    "cpuRequest": "100m",
                    "cpuLimit": "1",
                    "memoryRequest": "200Mi",
                    "memoryLimit": "1Gi",
                }
            ),
        }
        base = f"/api/v1/namespaces/{self.namespace}/configmaps"
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "inferenceservice-config"},
            "data": data,
        }
        status, _ = await asyncio.to_thread(self.plane.rest, "POST", base, cm)
        if status == 409:
            await self.patch(f"{base}/inferenceservice-config", {"data": data})
        elif status != 201:
            raise AssertionError(f"creating the config: {status}")

    async def node_group(
        self,
        name: str | None = None,
        *,
        path: str | None = None,
        tolerations: list[Obj] | None = None,
    ) -> str:
        name = name or self.group
        spec: Obj = {
            "storageLimit": "10Gi",
            "persistentVolumeSpec": {
                "hostPath": {"path": path or str(self.root)},
                "capacity": {"storage": "10Gi"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "instance-type", "operator": "In", "values": ["gpu"]}
                                ]
                            }
                        ]
                    }
                },
            },
            "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "10Gi"}}},
        }
        if tolerations:
            spec["tolerations"] = tolerations
        obj = {
            "apiVersion": LMNG.api_version,
            "kind": LMNG.kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.create(LMNG.path(), obj, cleanup=True)
        return name

    async def set_models(self, entries: list[Obj]) -> None:
        """Create the LocalModelNode, or replace its entries."""
        status, _ = await asyncio.to_thread(self.plane.rest, "GET", LMN.path(name=self.node))
        if status == 404:
            obj = {
                "apiVersion": LMN.api_version,
                "kind": LMN.kind,
                "metadata": {"name": self.node},
                "spec": {"localModels": entries},
            }
            await self.create(LMN.path(), obj, cleanup=True)
        else:
            await self.patch(LMN.path(name=self.node), {"spec": {"localModels": entries}})

    async def poke(self) -> None:
        """Make the agent reconcile now (an annotation change passes its predicate)."""
        await self.patch(
            LMN.path(name=self.node), {"metadata": {"annotations": {"poke": uuid.uuid4().hex}}}
        )

    async def node_status(self) -> Obj:
        obj = await self.rest("GET", LMN.path(name=self.node))
        return dict(obj.get("status") or {})

    async def model_status(self) -> dict[str, str]:
        return dict((await self.node_status()).get("modelStatus") or {})

    async def wait_status(self, expected: Mapping[str, str], *, within: float = 30) -> Obj:
        """Wait until `modelStatus` is exactly `expected`; returns the whole status."""

        async def check() -> Obj | None:
            current = await self.node_status()
            return current if (current.get("modelStatus") or {}) == dict(expected) else None

        what = f"LocalModelNode {self.node} modelStatus == {expected}"
        return await eventually(check, within=within, what=what)

    async def jobs(self, namespace: str | None = None) -> list[Obj]:
        """This node's Jobs (all namespaces unless one is given), oldest attempt first."""
        base = f"/apis/batch/v1/namespaces/{namespace}/jobs" if namespace else "/apis/batch/v1/jobs"
        found = await self.rest("GET", f"{base}?labelSelector=node%3D{jobs.label_value(self.node)}")
        items: list[Obj] = found.get("items") or []
        return sorted(items, key=lambda j: str(j["metadata"]["name"]))

    async def wait_jobs(self, count: int, namespace: str | None = None) -> list[Obj]:
        async def check() -> list[Obj] | None:
            found = await self.jobs(namespace)
            return found if len(found) == count else None

        return await eventually(check, what=f"{count} Job(s) of {self.node}")

    def staging(self, job: Obj) -> Path:
        key = job["metadata"]["labels"][jobs.LABEL_STORAGE_KEY]  # origin and peer-mode Jobs
        return self.disk.staging_path(key, job["metadata"]["name"])

    async def finish(
        self,
        job: Obj,
        *,
        succeed: bool,
        files: Mapping[str, bytes] | None = None,
        message: str = "download failed",
        exit_code: int | None = None,
        report: str | None = None,
    ) -> None:
        """Play the download pod: write `files` into the staging folder, then end the Job's
        running pod with phase Succeeded or Failed (`exit_code` 0 or 1 unless given; `report`:
        the termination message, whatever the outcome)."""
        for name, data in (files or {}).items():
            (self.staging(job) / name).write_bytes(data)
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        selector = f"batch.kubernetes.io%2Fjob-name%3D{name}"

        async def running_pod() -> Obj | None:
            pods = await self.rest("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")
            live = [p for p in pods["items"] if p.get("status", {}).get("phase") in _LIVE]
            return live[0] if live else None

        pod = await eventually(running_pod, within=40, what=f"a running pod of Job {ns}/{name}")
        container = pod["spec"]["containers"][0]["name"]
        terminated: Obj = {
            "exitCode": exit_code if exit_code is not None else 0 if succeed else 1,
            "reason": "Completed" if succeed else "Error",
        }
        if not succeed:
            terminated["message"] = message
        if report is not None:
            terminated["message"] = report
        body = {
            "status": {
                "phase": "Succeeded" if succeed else "Failed",
                "containerStatuses": [
                    {
                        "name": container,
                        "image": IMAGE,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        }
        await self.patch(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status", body)

    async def wait_job_condition(self, job: Obj, condition: str) -> None:
        meta = job["metadata"]
        path = f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}"

        async def check() -> bool:
            conds = (await self.rest("GET", path)).get("status", {}).get("conditions") or []
            return any(c["type"] == condition and c["status"] == "True" for c in conds)

        await wait_until(check, timeout=40, what=f"Job {path} has condition {condition}")

    # ---- the agent -------------------------------------------------------------------------
    async def start(self, **settings: Any) -> None:
        """Run an agent for this node in-process until `stop()`."""
        assert self._task is None, "agent already running"
        options: Obj = {"job_backoff_limit": 0, "progress_interval": 0.3, **settings}
        self._kube = await kube.Kube.from_kubeconfig(self.plane.kubeconfig_path)
        self.metrics = metrics.Metrics()
        self._manager = manager.Manager(handle_signals=False, cache_sync_timeout=30)
        agent_setup.setup(
            self._manager,
            kube=self._kube,
            settings=agent_setup.AgentSettings(
                node_name=self.node,
                models_root=self.root,
                config_namespace=self.namespace,
                **options,
            ),
            metrics=self.metrics,
        )
        self._task = asyncio.create_task(self._manager.run(), name=f"agent {self.node}")
        started = self._manager.started
        await wait_until(
            lambda: started.is_set() or self._task_done(),
            timeout=40,
            what=f"agent of {self.node} started",
        )
        assert started.is_set(), "agent manager exited during start-up"

    def _task_done(self) -> bool:
        return self._task is not None and self._task.done()

    def metric(self, sample: str, **labels: str) -> float:
        assert self.metrics is not None
        return self.metrics.value(sample, **labels) or 0.0

    def reconciles(self) -> float:
        """Reconciles the running agent has finished, whatever their outcome."""
        name = agent_setup.CONTROLLER_NAME
        results = ("success", "requeue_after", "error")
        return sum(
            self.metric("controller_runtime_reconcile_total", controller=name, result=r)
            for r in results
        )

    async def reconciled(self, count: float) -> None:
        """Wait until the running agent has finished `count` reconciles in all."""
        await wait_until(
            lambda: self.reconciles() >= count,
            timeout=30,
            what=f"{count} reconcile(s) of {self.node}",
        )

    async def stop(self) -> None:
        if self._task is None:
            return
        assert self._manager is not None
        assert self._kube is not None
        self._manager.stop()
        code = await asyncio.wait_for(self._task, timeout=30)
        await self._kube.close()
        self._task = self._manager = self._kube = None
        assert code == 0, f"agent manager exited with {code}"

    async def close(self) -> None:
        with contextlib.suppress(AssertionError):
            await self.stop()
        for path in reversed(self.cleanup_paths):
            await asyncio.to_thread(self.plane.rest, "DELETE", path)
