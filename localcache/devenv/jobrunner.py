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

The pure rules of steps 1, 2 and 4 (which pod, which destination, which status) are
`jobpods`; this module does the watching, the subprocesses and the API calls.

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
import functools
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from localcache.devenv import jobpods
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, informer, kube, listwatch
from localcache.runtime.keys import ObjectKey

log = structlog.get_logger(__name__)

Obj = jobpods.Obj

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "localcache", "download")
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RESOLVE_TIMEOUT_S = 60.0
DEFAULT_CONCURRENCY = 2


@dataclass(frozen=True, slots=True)
class RunnerStats:
    """Pods played so far, by outcome (`running` is the number in progress)."""

    started: int
    succeeded: int
    failed: int
    running: int


def _now() -> str:
    return clock_mod.now_rfc3339()


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
            listwatch.ListWatch(client, kube.PODS, label_selector=JOB_NAME_LABEL),
            clock=self._clock,
        )
        self.informer.add_handler(self._on_event)

    def stats(self) -> RunnerStats:
        return RunnerStats(running=len(self._tasks), **self._counts)

    def _on_event(self, event: informer.Event) -> None:
        pod = event.obj
        uid = str(jobpods.metadata(pod).get("uid") or "")
        gone = isinstance(event, informer.Deleted) or bool(
            jobpods.metadata(pod).get("deletionTimestamp")
        )
        if gone:
            task = self._tasks.get(uid)
            if task is not None:
                task.cancel()
            if isinstance(event, informer.Deleted):
                self._accepted.discard(uid)
            return
        if uid and uid not in self._accepted and jobpods.target_node(pod, self._nodes) is not None:
            self._accepted.add(uid)
            self._queue.put_nowait(pod)

    async def run(self) -> None:
        """Watch pods and play them until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.informer.run(), name="jobrunner informer pods")
            while True:
                pod = await self._queue.get()
                await self._slots.acquire()
                meta = jobpods.metadata(pod)
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
                "jobrunner_pod_error",
                pod=f"{jobpods.metadata(pod).get('namespace')}/{jobpods.metadata(pod).get('name')}",
            )

    async def _play(self, queued: Obj) -> None:
        meta = jobpods.metadata(queued)
        key = ObjectKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        pod = self.informer.store.get(key) or {}  # the latest version: it may have changed
        node = jobpods.target_node(pod, self._nodes)
        if node is None or jobpods.metadata(pod).get("uid") != meta.get("uid"):
            return
        self._counts["started"] += 1
        started_at = _now()
        try:
            plan = jobpods.plan_download(pod)
        except jobpods.PodError as exc:
            await self._finish(key, None, exit_code=1, message=str(exc), started_at=started_at)
            return
        try:
            dest = await self._resolve(key, plan, node)
            await self._patch(key, jobpods.running_status(plan, started_at=started_at))
            log.info("jobrunner_pod_started", pod=str(key), node=node, uri=plan.uri)
            code, output = await self._execute(plan, dest)
        except jobpods.PodError as exc:
            code, output = 1, str(exc)
        except errors.NotFound:
            log.info("jobrunner_pod_gone", pod=str(key))
            return
        except (errors.LocalcacheError, OSError) as exc:
            code, output = 1, f"local job runner: {exc}"
        await self._finish(key, plan, exit_code=code, message=output, started_at=started_at)

    async def _resolve(self, key: ObjectKey, plan: jobpods.DownloadPlan, node: str) -> Path:
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
                    dest = jobpods.host_destination(
                        plan, pv, host_root=self._nodes[node], pv_path=self._pv_path
                    )
                    await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
                    return dest
                waiting_for = f"PVC {key.namespace}/{plan.claim} to name its volume"
            except errors.NotFound as exc:
                waiting_for = str(exc)
            if self._clock.now() >= deadline:
                raise jobpods.PodError(
                    f"volume not ready after {self._resolve_timeout:.0f}s: {waiting_for}"
                )
            await self._clock.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _execute(self, plan: jobpods.DownloadPlan, dest: Path) -> tuple[int, str]:
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
        plan: jobpods.DownloadPlan | None,
        *,
        exit_code: int,
        message: str,
        started_at: str,
    ) -> None:
        body = jobpods.finished_status(
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
