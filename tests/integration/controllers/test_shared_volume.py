"""Shared-volume namespace caches (`spec.pvcRef`, KServe #6107) on the real control plane: the
claim preflight, the destination owner rule, import Jobs trusted by uid, re-import, retries,
the placed size, deletion, and KServe's sample accepted as is.

No kubelet runs: kube-controller-manager's Job controller creates the import pods, and the
tests play them by patching the pod status (as the agent's tests do); the Job controller then
sets the Job's conditions.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import yaml

from localcache.api import groupversion
from localcache.caching import importjob, keys
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, kube
from tests.integration.controllers.conftest import URI, Env, gone

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]
NS_CACHES = state.LOCAL_MODEL_NAMESPACE_CACHES
KIND = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind
HOLD = "test.localcache.kserve.io/hold"


# ------------------------------------------------------------------------ helpers


async def claim(
    env: Env,
    namespace: str,
    name: str,
    *,
    access: list[str] | None = None,
    mode: str | None = None,
    request: str = "2Gi",
    storage_class: str = "shared-none",
    volume: str | None = None,
) -> Obj:
    spec: Obj = {
        "accessModes": access or ["ReadWriteMany"],
        "resources": {"requests": {"storage": request}},
        "storageClassName": storage_class,
    }
    if mode:
        spec["volumeMode"] = mode
    if volume:
        spec["volumeName"] = volume
    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
    return await env.api.create(kube.PERSISTENT_VOLUME_CLAIMS, body, namespace=namespace)


async def shared_cache(
    env: Env, namespace: str, name: str, ref: str, *, uri: str = URI, size: str = "1Gi"
) -> Obj:
    body = {
        "apiVersion": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"sourceModelUri": uri, "modelSize": size, "pvcRef": ref},
    }
    created = await env.api.create(NS_CACHES, body, namespace=namespace)
    env.track_caches(KIND, namespace, [name])
    return created


async def one_cache(env: Env) -> tuple[str, str]:
    """A tenant namespace with a fitting claim `shared`, the controller started, and a
    shared-volume cache of it: (namespace, cache name)."""
    tenant = await env.namespace_("tenant")
    await claim(env, tenant, "shared")
    await env.start()
    name = env.name("model")
    await shared_cache(env, tenant, name, "shared")
    return tenant, name


IMPORTING = ("ImportPending", "ImportRunning")
"""KServe's reasons while the Job exists: Running once it has an active pod (here a pod no
kubelet starts: active all the same)."""


async def ready_reason(
    env: Env,
    name: str,
    namespace: str,
    reason: str | tuple[str, ...],
    *,
    status: str = "False",
    within: float = 30,
) -> Obj:
    """Waits until the cache's Ready condition has `status` and `reason` (one of them);
    returns its status."""
    reasons = (reason,) if isinstance(reason, str) else reason

    async def check() -> Obj:
        found = await env.cache_status(name, namespace)
        for cond in found.get("conditions") or []:
            if cond["type"] == "Ready" and cond["status"] == status and cond["reason"] in reasons:
                return found
        return {}

    return await wait_until(
        check, timeout=within, what=f"cache {namespace}/{name} is Ready={status} ({reason})"
    )


def ready_of(found: Obj) -> Obj:
    return next(c for c in found["conditions"] if c["type"] == "Ready")


async def job_of(env: Env, namespace: str, cache: str, *, not_uid: str = "") -> Obj:
    """Waits for the import Job of `cache` (one whose uid is not `not_uid`)."""
    name = importjob.import_job_name(cache)

    async def check() -> Obj:
        found = await env.get(kube.JOBS, name, namespace)
        if found is None or found["metadata"]["uid"] == not_uid:
            return {}
        return {} if found["metadata"].get("deletionTimestamp") else found

    return await wait_until(check, timeout=40, what=f"import Job {namespace}/{name} exists")


async def live_pod(env: Env, job: Obj) -> Obj:
    namespace, uid = job["metadata"]["namespace"], job["metadata"]["uid"]

    async def check() -> Obj:
        pods = await env.api.list(
            kube.PODS,
            namespace=namespace,
            label_selector=f"batch.kubernetes.io/controller-uid={uid}",
        )
        live = [
            p
            for p in pods.items
            if p.get("status", {}).get("phase") in (None, "Pending", "Running")
            and not p["metadata"].get("deletionTimestamp")
        ]
        return live[0] if live else {}

    return await wait_until(check, timeout=60, what=f"a live pod of Job {namespace}/{uid}")


def _terminated(name: str, code: int, message: str) -> Obj:
    return {
        "name": name,
        "image": "x",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "message": message,
            }
        },
    }


async def succeed(env: Env, job: Obj, *, placed: int) -> None:
    """Play the import pod to its end: `place` wrote the placed size."""
    pod = await live_pod(env, job)
    message = json.dumps({"bytes": placed, "files": 2})
    placed_status = _terminated(importjob.PLACE_CONTAINER, 0, message)
    body = {"status": {"phase": "Succeeded", "containerStatuses": [placed_status]}}
    await env.api.patch_status(
        kube.PODS, pod["metadata"]["name"], body, namespace=pod["metadata"]["namespace"]
    )


async def fail(env: Env, job: Obj, *, log: str) -> None:
    """Play one import pod failing in its download container (`log`: its log tail)."""
    pod = await live_pod(env, job)
    status = _terminated(importjob.DOWNLOAD_CONTAINER, 1, log)
    body = {"status": {"phase": "Failed", "initContainerStatuses": [status]}}
    await env.api.patch_status(
        kube.PODS, pod["metadata"]["name"], body, namespace=pod["metadata"]["namespace"]
    )


async def events_of(env: Env, namespace: str, name: str) -> list[Obj]:
    listed = await env.api.list(
        kube.EVENTS, namespace=namespace, field_selector=f"involvedObject.name={name}"
    )
    return listed.items


def has_event(env: Env, namespace: str, name: str, reason: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return any(e.get("reason") == reason for e in await events_of(env, namespace, name))

    return check


async def no_job(env: Env, namespace: str, cache: str) -> None:
    assert await env.get(kube.JOBS, importjob.import_job_name(cache), namespace) is None


# ------------------------------------------------------------------------ preflight


async def test_each_preflight_reason_and_no_job_until_the_claim_fits(env: Env) -> None:
    tenant = await env.namespace_("tenant")
    await env.start()
    names = {r: env.name(r.lower()) for r in ("missing", "block", "rwo", "small", "bound")}
    await claim(env, tenant, "block", mode="Block")
    await claim(env, tenant, "rwo", access=["ReadWriteOnce"])
    await claim(env, tenant, "small", request="500Mi")
    pv = env.name("bound-pv")
    bound_class = env.name("bound")
    await env.api.create(kube.PERSISTENT_VOLUMES, {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteMany"],
                 "hostPath": {"path": f"/tmp/{pv}"}, "storageClassName": bound_class,
                 "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": tenant, "name": "bound"}}})  # fmt: skip
    try:
        await claim(env, tenant, "bound", request="2Gi", storage_class=bound_class, volume=pv)

        async def bound() -> bool:
            found = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, "bound", tenant)
            return bool((found or {}).get("status", {}).get("phase") == "Bound")

        await wait_until(bound, timeout=60, what="claim bound is Bound")
        # a volume smaller than its claim asked for (a provisioner's or an admin's doing)
        await env.api.patch_status(
            kube.PERSISTENT_VOLUME_CLAIMS,
            "bound",
            {"status": {"capacity": {"storage": "1Gi"}}},
            namespace=tenant,
        )
        for ref, name in names.items():
            await shared_cache(env, tenant, name, ref, size="2Gi" if ref == "bound" else "1Gi")
        found = await ready_reason(env, names["missing"], tenant, "PVCNotFound")
        assert "'missing'" in ready_of(found)["message"]
        assert found["copies"] == {"total": 1, "available": 0, "failed": 0}
        assert "nodeStatus" not in found
        found = await ready_reason(env, names["block"], tenant, "UnsupportedVolumeMode")
        assert "Filesystem" in ready_of(found)["message"]
        found = await ready_reason(env, names["rwo"], tenant, "UnsupportedAccessMode")
        assert "ReadWriteMany" in ready_of(found)["message"]
        found = await ready_reason(env, names["small"], tenant, "InsufficientCapacity")
        assert ready_of(found)["message"] == (
            "PVC requested storage 500Mi is smaller than model size 1Gi"
        )
        found = await ready_reason(env, names["bound"], tenant, "InsufficientCapacity")
        assert ready_of(found)["message"] == "PVC bound capacity 1Gi is smaller than model size 2Gi"
        assert ready_of(found)["observedGeneration"] == 1
        for name in names.values():
            await no_job(env, tenant, name)
        # the missing claim appears: the cache is looked at again and its import starts
        await claim(env, tenant, "missing")
        await ready_reason(env, names["missing"], tenant, IMPORTING)
        job = await job_of(env, tenant, names["missing"])
        created = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, "missing", tenant)
        assert created is not None
        annotations = job["metadata"]["annotations"]
        assert annotations[importjob.ANNOTATION_PVC_UID] == created["metadata"]["uid"]
        assert annotations[importjob.ANNOTATION_STORAGE_KEY] == keys.storage_key(URI)
    finally:
        await env.api.delete(kube.PERSISTENT_VOLUMES, pv)


# ------------------------------------------------------------------------ destination owner


async def test_the_first_cache_of_a_destination_wins_and_the_next_takes_over(env: Env) -> None:
    tenant = await env.namespace_("tenant")
    await claim(env, tenant, "shared")
    await env.start()
    first, second = env.name("a-first"), env.name("b-second")
    await shared_cache(env, tenant, first, "shared")
    await ready_reason(env, first, tenant, IMPORTING)
    first_job = await job_of(env, tenant, first)
    await shared_cache(env, tenant, second, "shared")
    found = await ready_reason(env, second, tenant, "DestinationConflict")
    assert f"via cache {tenant}/{first}" in ready_of(found)["message"]
    await no_job(env, tenant, second)
    # another model on the same claim is no conflict
    other = env.name("c-other")
    await shared_cache(env, tenant, other, "shared", uri="s3://mybucket/other")
    await ready_reason(env, other, tenant, IMPORTING)

    await env.api.delete(NS_CACHES, first, namespace=tenant)
    await wait_until(gone(env, NS_CACHES, first, tenant), timeout=60, what=f"{first} is deleted")
    assert await env.get(kube.JOBS, first_job["metadata"]["name"], tenant) is None
    await ready_reason(env, second, tenant, IMPORTING)
    await job_of(env, tenant, second)


# ------------------------------------------------------------------------ trust by uid


async def test_a_forged_job_of_a_tenant_is_a_conflict_and_never_touched(env: Env) -> None:
    tenant = await env.namespace_("tenant")
    await claim(env, tenant, "shared")
    name = env.name("model")
    job_name = importjob.import_job_name(name)
    await env.api.create(
        kube.SERVICE_ACCOUNTS,
        {"metadata": {"name": "tenant", "namespace": tenant}},
        namespace=tenant,
    )
    await env.api.create(
        kube.Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        {"metadata": {"name": "tenant-edit", "namespace": tenant},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "edit"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": tenant}]},
        namespace=tenant,
    )  # fmt: skip
    forged = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name, "namespace": tenant,
                     "labels": {"model": name, "modelNamespace": tenant}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                 "containers": [{"name": "x", "image": "busybox", "command": ["true"]}]}}},
    }  # fmt: skip
    creds = env.plane.service_account_credentials(tenant, "tenant")

    async def create_as_tenant() -> bool:
        code, body = await asyncio.to_thread(
            env.plane.rest, "POST", f"/apis/batch/v1/namespaces/{tenant}/jobs", forged, creds=creds
        )
        assert code in (201, 403), body  # 403 until the RoleBinding is seen
        return code == 201

    await wait_until(create_as_tenant, timeout=30, what="the tenant creates its Job")
    before = await env.get(kube.JOBS, job_name, tenant)
    assert before is not None
    await env.start()
    await shared_cache(env, tenant, name, "shared")
    found = await ready_reason(env, name, tenant, "ImportJobConflict")
    assert f"Job {tenant}/{job_name} already exists" in ready_of(found)["message"]
    await wait_until(
        has_event(env, tenant, name, "ImportJobConflict"), timeout=30, what="a conflict Event"
    )
    after = await env.get(kube.JOBS, job_name, tenant)
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert not after["metadata"].get("deletionTimestamp")
    assert "sharedVolume" not in found or not found["sharedVolume"].get("job")
    warnings = [e for e in await events_of(env, tenant, name) if e["reason"] == "ImportJobConflict"]
    assert len(warnings) == 1


async def test_an_unproven_job_claiming_to_be_ours_is_replaced(env: Env) -> None:
    tenant = await env.namespace_("tenant")
    await claim(env, tenant, "shared")
    name = env.name("model")
    cache = await shared_cache(env, tenant, name, "shared")
    owner = {"apiVersion": cache["apiVersion"], "kind": KIND, "name": name,
             "uid": cache["metadata"]["uid"], "controller": True}  # fmt: skip
    forged = await env.api.create(kube.JOBS, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": importjob.import_job_name(name), "namespace": tenant,
                     "labels": {"model": name, "modelNamespace": tenant},
                     "ownerReferences": [owner]},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                 "containers": [{"name": "x", "image": "busybox", "command": ["true"]}]}}},
    }, namespace=tenant)  # fmt: skip
    await env.start()
    job = await job_of(env, tenant, name, not_uid=forged["metadata"]["uid"])
    await ready_reason(env, name, tenant, IMPORTING)
    recorded = {"name": job["metadata"]["name"], "uid": job["metadata"]["uid"]}

    async def records_the_new_job() -> bool:
        # the reconcile that deleted the forged Job reports Importing before the next one
        # creates and records its replacement
        found = await env.cache_status(name, tenant)
        return bool((found.get("sharedVolume") or {}).get("job") == recorded)

    await wait_until(
        records_the_new_job, timeout=30, what=f"the status records the new Job {recorded}"
    )
    assert ready_of(await env.cache_status(name, tenant))["reason"] in IMPORTING
    containers = [c["name"] for c in job["spec"]["template"]["spec"]["initContainers"]]
    assert importjob.DOWNLOAD_CONTAINER in containers


# ------------------------------------------------------------------------ the import


async def test_success_reports_the_placed_size_and_users_by_uri(env: Env) -> None:
    tenant, name = await one_cache(env)
    job = await job_of(env, tenant, name)
    await env.isvc("before", tenant, cache="unrelated", uri=URI)
    await succeed(env, job, placed=4242)
    found = await ready_reason(env, name, tenant, "ImportSucceeded", status="True", within=60)
    assert found["copies"] == {"total": 1, "available": 1, "failed": 0}
    assert found["sharedVolume"]["bytes"] == 4242
    assert found["sharedVolume"]["job"]["uid"] == job["metadata"]["uid"]
    assert found["inferenceServices"] == [{"namespace": tenant, "name": "before"}]
    # created after Ready (routed to the claim by the webhook): counted by its URI alone
    key = keys.storage_key(URI)
    await env.isvc("routed", tenant, cache="unrelated", uri=f"pvc://shared/models/{key}")
    await env.isvc("other", tenant, cache="unrelated", uri="s3://mybucket/not-this")
    await env.wait_status(
        name,
        tenant,
        inferenceServices=[
            {"namespace": tenant, "name": "before"},
            {"namespace": tenant, "name": "routed"},
        ],
        what="the InferenceService reading the claim's copy counts as a user",
    )
    await wait_until(has_event(env, tenant, name, "Ready"), timeout=30, what="a Ready Event")


async def test_a_completed_import_whose_job_is_removed_stays_ready(env: Env) -> None:
    # a TTL policy or the tenant removes the finished Job: importing again would replace the
    # copy that routed readers use
    tenant, name = await one_cache(env)
    job = await job_of(env, tenant, name)
    await succeed(env, job, placed=7)
    await ready_reason(env, name, tenant, "ImportSucceeded", status="True", within=60)
    await env.api.delete(kube.JOBS, job["metadata"]["name"], namespace=tenant)
    await wait_until(
        gone(env, kube.JOBS, job["metadata"]["name"], tenant), timeout=60, what="the Job removed"
    )
    # a new generation: the controller reconciles it (observedGeneration follows) after the
    # Job is gone; an import would have been started in that reconcile
    patched = await env.api.patch(NS_CACHES, name, {"spec": {"modelSize": "1Mi"}}, namespace=tenant)
    generation = patched["metadata"]["generation"]

    async def reconciled() -> Obj:
        conds = (await env.cache_status(name, tenant)).get("conditions") or []
        ready: Obj = next((c for c in conds if c["type"] == "Ready"), {})
        return ready if ready.get("observedGeneration") == generation else {}

    ready = await wait_until(reconciled, timeout=60, what=f"Ready at generation {generation}")
    assert (ready["status"], ready["reason"]) == ("True", "ImportSucceeded"), ready
    await no_job(env, tenant, name)


async def test_a_completed_import_stays_ready_while_its_job_is_being_deleted(env: Env) -> None:
    # The CI failure above, made deterministic: the Job lingers with a deletionTimestamp (a
    # test finalizer) while a new generation is reconciled; that reconcile wrote
    # "previous import Job is terminating" (ImportPending) over ImportSucceeded, and once the
    # Job was gone imported again.
    tenant, name = await one_cache(env)
    job = await job_of(env, tenant, name)
    job_name = job["metadata"]["name"]
    await succeed(env, job, placed=7)
    await ready_reason(env, name, tenant, "ImportSucceeded", status="True", within=60)
    await env.api.patch(kube.JOBS, job_name, {"metadata": {"finalizers": [HOLD]}}, namespace=tenant)
    await env.api.delete(kube.JOBS, job_name, namespace=tenant)

    async def reconciled(generation: int) -> Obj:
        conds = (await env.cache_status(name, tenant)).get("conditions") or []
        ready: Obj = next((c for c in conds if c["type"] == "Ready"), {})
        return ready if ready.get("observedGeneration") == generation else {}

    for size in ("1Mi", "2Mi"):  # while the Job is being deleted, then after it is gone
        found = await env.get(kube.JOBS, job_name, tenant)
        if size == "1Mi":
            assert found is not None, "the Job lingers with the test's finalizer"
            assert found["metadata"].get("deletionTimestamp"), found["metadata"]
        body = {"spec": {"modelSize": size}}
        patched = await env.api.patch(NS_CACHES, name, body, namespace=tenant)
        generation: int = patched["metadata"]["generation"]
        ready = await wait_until(
            functools.partial(reconciled, generation),
            timeout=60,
            what=f"Ready at generation {generation}",
        )
        assert (ready["status"], ready["reason"]) == ("True", "ImportSucceeded"), ready
        if size == "1Mi":
            await _release(env, job_name, tenant)
            await wait_until(gone(env, kube.JOBS, job_name, tenant), timeout=60, what="Job gone")
    await no_job(env, tenant, name)
    final = await env.cache_status(name, tenant)
    assert final["sharedVolume"]["job"]["uid"] == job["metadata"]["uid"], "no second import"


async def test_a_recreated_claim_is_imported_again(env: Env) -> None:
    tenant = await env.namespace_("tenant")
    first_claim = await claim(env, tenant, "shared")
    await env.start()
    name = env.name("model")
    await shared_cache(env, tenant, name, "shared")
    job = await job_of(env, tenant, name)
    await succeed(env, job, placed=1)
    await ready_reason(env, name, tenant, "ImportSucceeded", status="True", within=60)
    await env.api.delete(kube.PERSISTENT_VOLUME_CLAIMS, "shared", namespace=tenant)
    await wait_until(
        gone(env, kube.PERSISTENT_VOLUME_CLAIMS, "shared", tenant), timeout=60, what="claim gone"
    )
    await ready_reason(env, name, tenant, "PVCNotFound")
    second_claim = await claim(env, tenant, "shared")
    assert second_claim["metadata"]["uid"] != first_claim["metadata"]["uid"]
    again = await job_of(env, tenant, name, not_uid=job["metadata"]["uid"])
    annotations = again["metadata"]["annotations"]
    assert annotations[importjob.ANNOTATION_PVC_UID] == second_claim["metadata"]["uid"]
    found = await ready_reason(env, name, tenant, IMPORTING)
    assert found["sharedVolume"]["claimUID"] == second_claim["metadata"]["uid"]
    assert found["sharedVolume"]["job"]["uid"] == again["metadata"]["uid"]


async def test_a_failed_import_says_why_and_is_retried_after_the_backoff(env: Env) -> None:
    tenant = await env.namespace_("tenant")
    await claim(env, tenant, "shared")
    await env.start(downloadRetryBackoffInSecs=3, downloadRetryMaxBackoffInSecs=6)
    name = env.name("model")
    await shared_cache(env, tenant, name, "shared")
    job = await job_of(env, tenant, name)
    log = "Traceback ...\ntoken=hunter2 https://u:pw@host/m?X-Amz-Signature=abc\n404 Not Found"
    for _ in range(importjob.BACKOFF_LIMIT + 1):  # the Job controller's own retries
        await fail(env, job, log=log)

        async def failed_or_live() -> bool:
            current = await env.get(kube.JOBS, job["metadata"]["name"], tenant)
            conds = (current or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "Failed" and c["status"] == "True" for c in conds) or bool(
                (current or {}).get("status", {}).get("active")
            )

        await wait_until(failed_or_live, timeout=60, what="the Job failed or runs a new pod")
    found = await ready_reason(env, name, tenant, "ImportFailed", within=60)
    message = ready_of(found)["message"]
    assert "download failed: 404 Not Found (exit code 1)" in message
    for leaked in ("hunter2", "pw@", "Signature", "Traceback"):
        assert leaked not in message
    assert found["copies"] == {"total": 1, "available": 0, "failed": 1}
    assert found["sharedVolume"]["failedAttempts"] == 1
    assert found["sharedVolume"]["nextAttemptTime"]
    await wait_until(
        has_event(env, tenant, name, "ImportFailed"), timeout=30, what="an ImportFailed Event"
    )
    again = await job_of(env, tenant, name, not_uid=job["metadata"]["uid"])

    async def second_attempt() -> Obj:
        # the "creating Job" status (still attempt 1) may be read after the Job exists:
        # the controller records the attempt once the create returned
        found = await ready_reason(env, name, tenant, IMPORTING)
        return found if found["sharedVolume"].get("attempt") == 2 else {}

    retried = await wait_until(second_attempt, timeout=30, what="the second attempt recorded")
    assert retried["sharedVolume"]["job"]["uid"] == again["metadata"]["uid"]


async def test_missing_credentials_create_no_job_and_a_credential_change_replaces_it(
    env: Env,
) -> None:
    tenant = await env.namespace_("tenant")
    await claim(env, tenant, "shared")
    await env.start(downloadRetryBackoffInSecs=1, downloadRetryMaxBackoffInSecs=2)
    name = env.name("model")
    body = {
        "apiVersion": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version,
        "kind": KIND,
        "metadata": {"name": name, "namespace": tenant},
        "spec": {"sourceModelUri": URI, "modelSize": "1Gi", "pvcRef": "shared",
                 "serviceAccountName": "puller"},
    }  # fmt: skip
    await env.api.create(NS_CACHES, body, namespace=tenant)
    env.track_caches(KIND, tenant, [name])
    found = await ready_reason(env, name, tenant, "ImportCredentialError")
    assert "puller" in ready_of(found)["message"]
    await no_job(env, tenant, name)
    account = {"metadata": {"name": "puller", "namespace": tenant}}
    await env.api.create(kube.SERVICE_ACCOUNTS, account, namespace=tenant)
    job = await job_of(env, tenant, name)  # retried with the backoff
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "puller"
    await env.api.patch(
        NS_CACHES, name, {"spec": {"serviceAccountName": "default"}}, namespace=tenant
    )
    again = await job_of(env, tenant, name, not_uid=job["metadata"]["uid"])
    assert (
        again["metadata"]["annotations"][importjob.ANNOTATION_SPEC_HASH]
        != (job["metadata"]["annotations"][importjob.ANNOTATION_SPEC_HASH])
    )


# ------------------------------------------------------------------------ deletion


async def test_deletion_waits_for_the_job_and_leaves_the_claim(env: Env) -> None:
    tenant, name = await one_cache(env)
    job = await job_of(env, tenant, name)
    await ready_reason(env, name, tenant, IMPORTING)
    job_name = job["metadata"]["name"]
    await env.api.patch(kube.JOBS, job_name, {"metadata": {"finalizers": [HOLD]}}, namespace=tenant)
    before = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, "shared", tenant)
    assert before is not None
    await env.api.delete(NS_CACHES, name, namespace=tenant)

    async def job_deleting() -> bool:
        found = await env.get(kube.JOBS, job_name, tenant)
        return bool((found or {}).get("metadata", {}).get("deletionTimestamp"))

    await wait_until(job_deleting, timeout=30, what="the cache's finalizer deletes its Job")
    cache = await env.get_cache(name, tenant)
    assert cache is not None, "the cache waits for its Job to be gone"
    await _release(env, job_name, tenant)
    await wait_until(gone(env, NS_CACHES, name, tenant), timeout=60, what=f"{name} is deleted")
    assert await env.get(kube.JOBS, job_name, tenant) is None
    after = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, "shared", tenant)
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert not after["metadata"].get("deletionTimestamp")


async def _release(env: Env, job: str, namespace: str) -> None:
    """Remove the test's finalizer from the Job (others, e.g. foregroundDeletion, stay)."""

    async def released() -> bool:
        found = await env.get(kube.JOBS, job, namespace)
        if found is None:
            return True
        meta = found["metadata"]
        kept = [f for f in meta.get("finalizers") or [] if f != HOLD]
        try:
            await env.api.patch(
                kube.JOBS,
                job,
                {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}},
                namespace=namespace,
            )
        except errors.Conflict:
            return False
        return True

    await wait_until(released, timeout=30, what=f"the test's finalizer leaves Job {job}")


# ------------------------------------------------------------------------ KServe's sample

SAMPLE_PVC = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: shared-models
  namespace: my-models
spec:
  accessModes:
    - ReadWriteMany
  volumeMode: Filesystem
  resources:
    requests:
      storage: 20Gi
  storageClassName: nfs-csi
"""
SAMPLE_CACHE = """
apiVersion: serving.kserve.io/v1alpha1
kind: LocalModelNamespaceCache
metadata:
  name: llama3-8b
  namespace: my-models
spec:
  sourceModelUri: "hf://meta-llama/Meta-Llama-3-8B"
  modelSize: 16Gi
  pvcRef: shared-models
"""


async def test_kserves_sample_is_accepted_unchanged(env: Env) -> None:
    """docs/samples/localmodelcache/shared-pvc.md (kserve/kserve), the PVC and the cache as
    given, created through the apiserver with localcache's CRDs (no controller running)."""
    pvc, cache = yaml.safe_load(SAMPLE_PVC), yaml.safe_load(SAMPLE_CACHE)
    await asyncio.to_thread(env.plane.create_namespace, "my-models")
    try:
        await env.api.create(kube.PERSISTENT_VOLUME_CLAIMS, pvc, namespace="my-models")
        created = await env.api.create(NS_CACHES, cache, namespace="my-models")
        assert created["spec"] == {
            "sourceModelUri": "hf://meta-llama/Meta-Llama-3-8B",
            "modelSize": "16Gi",
            "pvcRef": "shared-models",
        }
        await env.api.delete(NS_CACHES, "llama3-8b", namespace="my-models")
    finally:
        await asyncio.to_thread(env.plane.delete_namespace, "my-models")
