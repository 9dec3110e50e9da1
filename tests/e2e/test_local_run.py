"""End to end: `localcache run` in local mode, with the shipped manifests' configuration.

- In process (`local.LocalRun`, the code path of `localcache run --local`): its own local
  control plane with kube-controller-manager, two demo nodes, controller, webhooks, two agents
  and the local Job runner in one Manager. The sample namespace cache of a `file://` model
  becomes Ready with two copies, an InferenceService of its namespace gets the local-model
  labels, and deleting the cache removes the model folder from both demo nodes.
- As a new user would: `python -m localcache run --local --exit-when-ready` in a fresh
  process, which must reach Ready, print how to watch it, stop its control plane and exit 0.
- The local Job runner alone, on the session control plane: it completes the Job of a
  download that works and fails the Job of one that does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache import settings as settings_mod
from localcache.agent.disk import layout
from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys
from localcache.devenv import assets, jobpods, jobrunner, local, localmode, nodeassets
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.e2e.realnodes import cluster as realnodes_cluster

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
ISVC = groupversion.INFERENCE_SERVICE


def _settings(**changes: Any) -> settings_mod.Settings:
    base = settings_mod.from_args(argparse.Namespace(), "run", environ={})
    return dataclasses.replace(base, **changes)


async def _rest(plane: ControlPlane, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.to_thread(plane.rest, method, path, body)


async def _ok(plane: ControlPlane, method: str, path: str, body: Any = None) -> Obj:
    status, answer = await _rest(plane, method, path, body)
    assert status in (200, 201, 202), f"{method} {path}: {status} {answer}"
    result: Obj = answer
    return result


# ------------------------------------------------------------------ in process


@pytest.mark.timeout(240)
async def test_local_run_caches_the_sample_on_both_demo_nodes_labels_isvcs_and_cleans_up(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    run = local.LocalRun(
        _settings(), run_dir=tmp_path / "run", kubeconfig_path=tmp_path / "kubeconfig", out=out
    )
    try:
        await run.start()
        serving = asyncio.create_task(run.serve(exit_when_ready=False), name="local run")
        try:
            await wait_until(
                lambda: run.ready.is_set() or serving.done(),
                timeout=120,
                what="the sample LocalModelNamespaceCache becomes Ready",
            )
            if serving.done():  # failed during start-up: show why
                pytest.fail(f"localcache run stopped with {serving.result()} before Ready")
            await _check_the_demo(run, out)
        finally:
            run.stop()
            code = await asyncio.wait_for(serving, timeout=60)
        assert code == 0
    finally:
        await run.close()
    assert not (tmp_path / "kubeconfig").exists()
    assert not (tmp_path / "run").exists()


async def _check_the_demo(run: local.LocalRun, out: io.StringIO) -> None:
    assert run.plane is not None
    plane = run.plane
    name, namespace = run.sample["metadata"]["name"], run.sample["metadata"]["namespace"]
    uri = run.sample["spec"]["sourceModelUri"]

    # Ready with a copy on each demo node, and the user was told how to watch it.
    cache = await _ok(plane, "GET", LMNC.path(namespace=namespace, name=name))
    assert cache["status"]["copies"]["available"] == 2, cache["status"]
    assert sorted(cache["status"]["nodeStatus"]) == sorted(localmode.DEMO_NODES)
    folder = layout.model_subpath(keys.storage_key(uri))
    for node, root in run.node_roots.items():
        model = root / folder / local.DEMO_FILE
        assert model.is_file(), f"no model file on {node}: {model}"
    text = out.getvalue()
    assert f"--kubeconfig {run.kubeconfig_path} get lmnc -A -w" in text
    assert f"wait --for=condition=Ready lmnc/{name} -n {namespace}" in text
    assert "Ready: copies available 2/2" in text
    assert plane.kubectl("get", "lmn", "--no-headers").stdout.count("demo-node-") == 2

    # An InferenceService of that namespace serving the model gets the local-model labels.
    isvc = {
        "apiVersion": ISVC.api_version,
        "kind": ISVC.kind,
        "metadata": {"name": "demo-isvc"},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "sklearn"}, "storageUri": uri}}},
    }
    created = await _ok(plane, "POST", ISVC.path(namespace=namespace), isvc)
    labels = created["metadata"].get("labels") or {}
    assert labels.get(isvc_api.LOCAL_MODEL_LABEL) == name, created["metadata"]
    assert labels.get(isvc_api.LOCAL_MODEL_NAMESPACE_LABEL) == namespace
    await _ok(plane, "DELETE", ISVC.path(namespace=namespace, name="demo-isvc"))

    # Deleting the cache (accepted once the webhook no longer sees the ISVC) removes the
    # model folder from both demo nodes.
    async def deleted() -> bool:
        status, _ = await _rest(plane, "DELETE", LMNC.path(namespace=namespace, name=name))
        return status in (200, 202, 404)

    await wait_until(deleted, timeout=30, interval=0.5, what=f"the deletion of {name} accepted")

    def folders_gone() -> bool:
        return not any((root / folder).exists() for root in run.node_roots.values())

    await wait_until(folders_gone, timeout=60, what=f"{folder} removed from both demo nodes")

    async def cache_gone() -> bool:
        status, _ = await _rest(plane, "GET", LMNC.path(namespace=namespace, name=name))
        return status == 404

    await wait_until(cache_gone, timeout=30, what=f"LocalModelNamespaceCache {name} is gone")


# ------------------------------------------------------------------ as a new user would


def _run_local(tmp_path: Path, **extra_env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["LOCALCACHE_NODE_BIN"] = str(nodeassets.node_binaries())  # built caches, not tmp_path's
    env["LOCALCACHE_IMAGE_CACHE"] = str(realnodes_cache())
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["KUBEBUILDER_ASSETS"] = str(assets.find_binaries())
    env.update(extra_env)
    done = subprocess.run(
        [sys.executable, "-m", "localcache", "run", "--local", "--exit-when-ready"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=270,
        check=False,
    )
    tail = "\n".join(done.stderr.splitlines()[-30:])
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{tail}"
    printed = re.search(r"^  kubeconfig: (\S+)$", done.stdout, re.MULTILINE)
    assert printed is not None, done.stdout
    kubeconfig = Path(printed[1])  # private to the run (issue 14 item 7)
    assert kubeconfig.parent.parent == tmp_path / "cache" / "localcache" / "run", kubeconfig
    for command in (
        "get lmnc -A -w",
        "get lmn",
        "wait --for=condition=Ready lmnc/demo-model -n default",
        "describe lmnc demo-model -n default",
    ):
        assert f"--kubeconfig {kubeconfig} {command}" in done.stdout, done.stdout
    assert "default/demo-model is Ready: copies available 2/2" in done.stdout
    assert not kubeconfig.parent.exists(), "the run left its private directory behind"
    server = re.search(r"control plane at https://127\.0\.0\.1:(\d+)", done.stdout)
    assert server is not None, done.stdout
    with pytest.raises(ConnectionRefusedError):  # the control plane was stopped
        socket.create_connection(("127.0.0.1", int(server[1])), 2).close()
    return done, kubeconfig


def realnodes_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("LOCALCACHE_IMAGE_CACHE") or Path(base) / "localcache" / "images")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_localcache_run_local_on_demo_nodes_says_so_reaches_ready_and_stops(
    tmp_path: Path,
) -> None:
    done, _ = _run_local(tmp_path, LOCALCACHE_REAL_NODES="0")
    assert "real nodes are not available here (disabled by LOCALCACHE_REAL_NODES=0)" in (
        done.stdout
    )
    assert "using two demo nodes and the demo Job runner" in done.stdout
    for served in (r"metrics: http://127\.0\.0\.1:\d+/", r"webhooks: https://127\.0\.0\.1:\d+"):
        assert re.search(served, done.stdout), done.stdout
    assert done.stdout.rstrip().endswith("localcache: local control plane stopped")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_localcache_run_local_on_real_nodes_says_so_reaches_ready_and_stops(
    tmp_path: Path,
) -> None:
    realnodes_cluster.require_real_nodes()
    done, _ = _run_local(tmp_path)
    assert "this machine can host real nodes" in done.stdout
    assert "real nodes node-1, node-2" in done.stdout
    assert "operator deployed as pods" in done.stdout
    assert done.stdout.rstrip().endswith("localcache: real nodes and control plane stopped")


# ------------------------------------------------------------------ pieces on the session plane


async def test_run_uses_a_cluster_only_when_it_answers(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    reachable = _settings(connection=settings_mod.Connection(str(control_plane.kubeconfig_path)))
    assert await local.reachable_kubeconfig(reachable) == control_plane.kubeconfig_path
    config = control_plane.kubeconfig(control_plane.admin)
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{assets.free_port()}"
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    assert (
        await local.reachable_kubeconfig(_settings(connection=settings_mod.Connection(str(dead))))
        is None
    )


def _download_job(name: str, *, uri: str, node: str, claim: str) -> Obj:
    container = {
        "name": "download",
        "image": "kserve/storage-initializer:latest",
        "args": [uri, "/mnt/models"],
        "volumeMounts": [{"name": "models", "mountPath": "/mnt/models", "subPath": f"s/{name}"}],
    }
    pod_spec = {
        "nodeSelector": {jobpods.HOSTNAME_LABEL: node},
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}},
    }


async def _job_condition(plane: ControlPlane, namespace: str, name: str, condition: str) -> None:
    async def has() -> bool:
        job = await _ok(plane, "GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == condition and c["status"] == "True" for c in conditions)

    await wait_until(has, timeout=60, what=f"Job {namespace}/{name} has condition {condition}")


async def test_job_runner_completes_working_downloads_and_fails_broken_ones(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    node, pv = f"node-{uuid.uuid4().hex[:8]}", f"{namespace}-models"
    affinity = {"key": jobpods.HOSTNAME_LABEL, "operator": "In", "values": [node]}
    await _ok(
        control_plane,
        "POST",
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "local": {"path": "/mnt/models"},
                "nodeAffinity": {
                    "required": {"nodeSelectorTerms": [{"matchExpressions": [affinity]}]}
                },
            },
        },
    )
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    source = tmp_path / "model"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"\x00weights")
    host = tmp_path / "node"
    client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    runner = jobrunner.LocalJobRunner(client, {node: host}, pv_path="/mnt/models", timeout=60)
    task = asyncio.create_task(runner.run(), name="test local job runner")
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    try:
        await _ok(
            control_plane, "POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", claim
        )
        good = _download_job("good", uri=f"file://{source}", node=node, claim="models")
        bad = _download_job("bad", uri=f"file://{tmp_path / 'missing'}", node=node, claim="models")
        await _ok(control_plane, "POST", jobs, good)
        await _ok(control_plane, "POST", jobs, bad)
        await _job_condition(control_plane, namespace, "good", "Complete")
        await _job_condition(control_plane, namespace, "bad", "Failed")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        await _rest(control_plane, "DELETE", f"/api/v1/persistentvolumes/{pv}")
    assert (host / "s" / "good" / "weights.bin").read_bytes() == b"\x00weights"
    assert not (host / "s" / "bad").exists() or not any((host / "s" / "bad").iterdir())
    pods = await _ok(
        control_plane,
        "GET",
        f"/api/v1/namespaces/{namespace}/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3Dbad",
    )
    status = pods["items"][0]["status"]
    assert status["phase"] == "Failed"
    assert status["message"], status
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] != 0
    stats = runner.stats()
    assert (stats.succeeded, stats.failed, stats.running) == (1, 1, 0)
