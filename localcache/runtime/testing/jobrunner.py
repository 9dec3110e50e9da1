"""A local Job runner: a TEST AND DEMO HARNESS that plays the kubelet for download Jobs only.

No kubelet runs under the local control plane (tests, `localcache run --local`), so nothing
would ever run the pods that kube-controller-manager's Job controller creates. This runner
stands in for the nodes: it never runs in a cluster and no production path (controller, agent)
imports it. It knows nothing about LocalModel kinds; it understands the storage-initializer
interface of a download container: `args: [<uri>, <dest>]` with `<dest>` inside a volume
mount backed by a PersistentVolumeClaim.

Given a Kube client and a mapping node name -> host folder (the folder that stands for that
node's local PV path), it:

1. watches Pods owned by Jobs (label `batch.kubernetes.io/job-name`) and picks those that are
   `Pending`, not being deleted, and pinned by `nodeSelector` `kubernetes.io/hostname` to one
   of its nodes (and not bound by `spec.nodeName` to another one);
2. resolves the destination the way the kubelet mounts it: the container's volume mount that
   holds `<dest>` -> its PVC -> the PV named by `spec.volumeName` -> `local.path` (or
   `hostPath.path`) -> the node's host folder, plus the mount's `subPath` and the rest of
   `<dest>`; a PVC or PV that is not there yet is waited for (`resolve_timeout`), as a kubelet
   waits for its volumes;
3. sets the pod `Running`, runs `python -m localcache download <uri> <host dest>` (the
   `command`) as a subprocess with a timeout, with the container's literal env values;
4. patches the pod status (phase `Succeeded`, or `Failed` with a message; one container status
   `terminated` with the exit code and, on failure, the tail of the output) through the status
   subresource, so the Job controller completes or fails the Job.

Contract: at most `concurrency` pods run at once; each pod is played once per runner (by UID);
a pod deleted or marked for deletion while running has its process killed and gets no status
(the Job controller and the pod GC account for it). Every task is named and owned by `run()`'s
TaskGroup, and cancelling `run()` kills the subprocesses and awaits them. Not promised: image,
command, probes, resources, securityContext, init containers, other volume types (a pod using
them is played as if they did not matter, or failed when its destination cannot be resolved).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import os
import posixpath
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, informer, kube, reflector
from localcache.runtime.keys import ObjectKey

log = structlog.get_logger(__name__)

Obj = dict[str, Any]

HOSTNAME_LABEL = "kubernetes.io/hostname"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "localcache", "download")
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RESOLVE_TIMEOUT_S = 60.0
DEFAULT_CONCURRENCY = 2
MESSAGE_TAIL = 1024


class PodError(Exception):
    """The pod cannot be played (bad args, no such volume, path outside the volume...)."""


@dataclass(frozen=True, slots=True)
class DownloadPlan:
    """What one download pod asks for: `uri` into `relative` below the `sub_path` of claim
    `claim` (all taken from the pod's first container and volumes)."""

    uri: str
    container: str
    image: str
    claim: str
    sub_path: str
    relative: str
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RunnerStats:
    """Pods played so far, by outcome (`running` is the number in progress)."""

    started: int
    succeeded: int
    failed: int
    running: int


# ---------------------------------------------------------------------------- pure logic


def _meta(obj: Obj) -> Obj:
    return dict(obj.get("metadata") or {})


def target_node(pod: Obj, nodes: Mapping[str, Path]) -> str | None:
    """The node among `nodes` that should run this pod now, or None (not a Job's pod, not
    Pending, being deleted, pinned elsewhere or to no node)."""
    meta = _meta(pod)
    if meta.get("deletionTimestamp"):
        return None
    if not any(ref.get("kind") == "Job" for ref in meta.get("ownerReferences") or []):
        return None
    if ((pod.get("status") or {}).get("phase") or "Pending") != "Pending":
        return None
    spec = pod.get("spec") or {}
    node = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    if node not in nodes:
        return None
    bound = spec.get("nodeName")
    return str(node) if not bound or bound == node else None


def plan_download(pod: Obj) -> DownloadPlan:
    """The download the pod's first container asks for; `PodError` says why there is none."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise PodError("the pod has no container")
    container = containers[0]
    args = [str(a) for a in container.get("args") or []]
    if len(args) != 2:
        raise PodError(f"expected args [<uri>, <dest>], got {args}")
    uri, dest = args
    dest = posixpath.normpath(dest)
    best: Obj | None = None
    for mount in container.get("volumeMounts") or []:
        path = posixpath.normpath(str(mount.get("mountPath") or "/"))
        if (dest == path or dest.startswith(path.rstrip("/") + "/")) and (
            best is None or len(path) > len(posixpath.normpath(best["mountPath"]))
        ):
            best = mount
    if best is None:
        raise PodError(f"no volume mount holds {dest}")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    volume = volumes.get(best.get("name"))
    claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
    if not claim:
        raise PodError(f"volume {best.get('name')!r} is not a PersistentVolumeClaim")
    relative = posixpath.relpath(dest, posixpath.normpath(str(best["mountPath"])))
    env = tuple(
        (str(e["name"]), str(e["value"]))
        for e in container.get("env") or []
        if "name" in e and isinstance(e.get("value"), str)
    )
    return DownloadPlan(
        uri=uri,
        container=str(container.get("name") or "main"),
        image=str(container.get("image") or ""),
        claim=str(claim),
        sub_path=str(best.get("subPath") or ""),
        relative="" if relative == "." else relative,
        env=env,
    )


def _inside(path: str, what: str) -> str:
    """`path` as a relative path that cannot leave its base (no `..`, not absolute)."""
    norm = posixpath.normpath(path) if path else "."
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../"):
        raise PodError(f"{what} {path!r} leaves the volume")
    return "" if norm == "." else norm


def host_destination(
    plan: DownloadPlan, pv: Obj, *, host_root: Path, pv_path: str | None = None
) -> Path:
    """Where `plan` writes on the node whose local PV path is the folder `host_root`.
    With `pv_path`, a PV whose path differs is refused (it is not the node's local volume)."""
    source = pv.get("spec") or {}
    path = (source.get("local") or {}).get("path") or (source.get("hostPath") or {}).get("path")
    if not path:
        raise PodError(f"PV {_meta(pv).get('name')} is not a local or hostPath volume")
    if pv_path is not None and posixpath.normpath(path) != posixpath.normpath(pv_path):
        raise PodError(f"PV path {path} is not the node's local volume {pv_path}")
    dest = host_root
    for part in (_inside(plan.sub_path, "subPath"), _inside(plan.relative, "destination")):
        if part:
            dest = dest / part
    return dest


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_status(plan: DownloadPlan, *, started_at: str) -> Obj:
    """The pod status patch of a started download."""
    return {
        "status": {
            "phase": "Running",
            "startTime": started_at,
            "containerStatuses": [
                {
                    "name": plan.container,
                    "image": plan.image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started_at}},
                }
            ],
        }
    }


def finished_status(
    *, container: str, image: str, exit_code: int, message: str, started_at: str, finished_at: str
) -> Obj:
    """The pod status patch of a finished download: Succeeded for exit code 0, else Failed
    with `message` on the pod and the container."""
    terminated: Obj = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": started_at,
        "finishedAt": finished_at,
    }
    status: Obj = {"phase": "Succeeded" if exit_code == 0 else "Failed"}
    if exit_code != 0:
        terminated["message"] = message[-MESSAGE_TAIL:]
        status["message"] = message.strip().splitlines()[-1][:MESSAGE_TAIL] if message else ""
        status["reason"] = "DownloadFailed"
    status["containerStatuses"] = [
        {
            "name": container,
            "image": image,
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }
    ]
    return {"status": status}


# ---------------------------------------------------------------------------- the runner


class LocalJobRunner:
    """Plays the nodes in `nodes` (name -> host folder of the node's local PV path) for
    download Job pods; see the module docstring. Run with `await runner.run()`."""

    def __init__(
        self,
        client: kube.Kube,
        nodes: Mapping[str, Path],
        *,
        pv_path: str | None = None,
        command: Sequence[str] = DEFAULT_COMMAND,
        timeout: float = DEFAULT_TIMEOUT_S,
        resolve_timeout: float = DEFAULT_RESOLVE_TIMEOUT_S,
        concurrency: int = DEFAULT_CONCURRENCY,
        clock: clock_mod.Clock | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._kube = client
        self._nodes = dict(nodes)
        self._pv_path = pv_path
        self._command = tuple(command)
        self._timeout = timeout
        self._resolve_timeout = resolve_timeout
        self._clock = clock or clock_mod.SystemClock()
        self._slots = asyncio.Semaphore(concurrency)
        self._queue: asyncio.Queue[Obj] = asyncio.Queue()
        self._accepted: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._counts = {"started": 0, "succeeded": 0, "failed": 0}
        self.informer = informer.Informer(
            reflector.ListWatch(client, kube.PODS, label_selector=JOB_NAME_LABEL),
            clock=self._clock,
        )
        self.informer.add_handler(self._on_event)

    def stats(self) -> RunnerStats:
        return RunnerStats(running=len(self._tasks), **self._counts)

    def _on_event(self, event: informer.Event) -> None:
        pod = event.obj
        uid = str(_meta(pod).get("uid") or "")
        gone = isinstance(event, informer.Deleted) or bool(_meta(pod).get("deletionTimestamp"))
        if gone:
            task = self._tasks.get(uid)
            if task is not None:
                task.cancel()
            if isinstance(event, informer.Deleted):
                self._accepted.discard(uid)
            return
        if uid and uid not in self._accepted and target_node(pod, self._nodes) is not None:
            self._accepted.add(uid)
            self._queue.put_nowait(pod)

    async def run(self) -> None:
        """Watch pods and play them until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.informer.run(), name="jobrunner informer pods")
            while True:
                pod = await self._queue.get()
                await self._slots.acquire()
                meta = _meta(pod)
                uid = str(meta.get("uid"))
                if uid not in self._accepted:  # deleted while queued
                    self._slots.release()
                    continue
                name = f"jobrunner pod {meta.get('namespace')}/{meta.get('name')}"
                task = tg.create_task(self._guarded(pod), name=name)
                self._tasks[uid] = task
                task.add_done_callback(functools.partial(self._done, uid))

    def _done(self, uid: str, _task: asyncio.Task[None]) -> None:
        self._tasks.pop(uid, None)
        self._slots.release()

    async def _guarded(self, pod: Obj) -> None:
        """`_play`, where a bug in this harness fails the pod, never the whole runner."""
        try:
            await self._play(pod)
        except Exception:
            log.exception(
                "jobrunner_pod_error", pod=f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}"
            )

    async def _play(self, queued: Obj) -> None:
        meta = _meta(queued)
        key = ObjectKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        pod = self.informer.store.get(key) or {}  # the latest version: it may have changed
        node = target_node(pod, self._nodes)
        if node is None or _meta(pod).get("uid") != meta.get("uid"):
            return
        self._counts["started"] += 1
        started_at = _now()
        try:
            plan = plan_download(pod)
        except PodError as exc:
            await self._finish(key, None, exit_code=1, message=str(exc), started_at=started_at)
            return
        try:
            dest = await self._resolve(key, plan, node)
            await self._patch(key, running_status(plan, started_at=started_at))
            log.info("jobrunner_pod_started", pod=str(key), node=node, uri=plan.uri)
            code, output = await self._execute(plan, dest)
        except PodError as exc:
            code, output = 1, str(exc)
        except errors.NotFound:
            log.info("jobrunner_pod_gone", pod=str(key))
            return
        except (errors.LocalcacheError, OSError) as exc:
            code, output = 1, f"local job runner: {exc}"
        await self._finish(key, plan, exit_code=code, message=output, started_at=started_at)

    async def _resolve(self, key: ObjectKey, plan: DownloadPlan, node: str) -> Path:
        """The host folder of the pod's destination, waiting for its PVC and PV to exist."""
        deadline = self._clock.now() + self._resolve_timeout
        delay = 0.2
        while True:
            try:
                pvc = await self._kube.get(
                    kube.PERSISTENT_VOLUME_CLAIMS, plan.claim, namespace=key.namespace
                )
                volume = str((pvc.get("spec") or {}).get("volumeName") or "")
                if volume:
                    pv = await self._kube.get(kube.PERSISTENT_VOLUMES, volume)
                    dest = host_destination(
                        plan, pv, host_root=self._nodes[node], pv_path=self._pv_path
                    )
                    await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
                    return dest
                waiting_for = f"PVC {key.namespace}/{plan.claim} to name its volume"
            except errors.NotFound as exc:
                waiting_for = str(exc)
            if self._clock.now() >= deadline:
                raise PodError(
                    f"volume not ready after {self._resolve_timeout:.0f}s: {waiting_for}"
                )
            await self._clock.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _execute(self, plan: DownloadPlan, dest: Path) -> tuple[int, str]:
        env = {**os.environ, **dict(plan.env)}
        proc = await asyncio.create_subprocess_exec(
            *self._command,
            plan.uri,
            str(dest),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=self._timeout)
        except TimeoutError:
            await _kill(proc)
            return 1, f"local job runner: download timed out after {self._timeout:.0f}s"
        except asyncio.CancelledError:
            await _kill(proc)
            raise
        return int(proc.returncode or 0), out.decode(errors="replace")

    async def _finish(
        self,
        key: ObjectKey,
        plan: DownloadPlan | None,
        *,
        exit_code: int,
        message: str,
        started_at: str,
    ) -> None:
        body = finished_status(
            container=plan.container if plan else "main",
            image=plan.image if plan else "",
            exit_code=exit_code,
            message=message,
            started_at=started_at,
            finished_at=_now(),
        )
        outcome = "succeeded" if exit_code == 0 else "failed"
        self._counts[outcome] += 1
        try:
            await self._patch(key, body)
        except errors.NotFound:
            log.info("jobrunner_pod_gone", pod=str(key))
            return
        except errors.LocalcacheError as exc:
            log.error("jobrunner_status_failed", pod=str(key), error=str(exc))
            return
        log.info("jobrunner_pod_finished", pod=str(key), outcome=outcome, exit_code=exit_code)

    async def _patch(self, key: ObjectKey, body: Obj) -> None:
        await self._kube.patch_status(kube.PODS, key.name, body, namespace=key.namespace)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the download's process group and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
