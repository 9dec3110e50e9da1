"""Issue 12 item 5: hand KServe v0.20.0's own add-on over to localcache on real nodes by the
README's migration steps, run as written, then roll back by the README's steps.

The start (`kserve_addon`, checked by test_kserve_addon.py, which runs first): three caches
(two cluster caches, one namespace cache) downloaded by KServe's add-on on both nodes, a pod
reading one of them through the serving PVC KServe made. After the hand-over:
- no model is downloaded again: the model server saw no new request, no Job was created;
- the folders stay (same inode, same bytes) and are adopted (a manifest marked `adopted`,
  one `ModelFolderAdopted` Event per model and node);
- the serving pod is the same pod, never restarted, and no read of it failed at any time;
- the LocalModelNodes, the serving PV and PVC are the same objects (same uid), the PV and PVC
  now localcache's (its annotations);
- a new cache is downloaded by localcache.
After the rollback, KServe's add-on serves again: nothing is downloaded again (the model
localcache downloaded included) and a new cache is downloaded by KServe.

The install block gets the test bed's image reference (`--set image=...`); every other line
of the README's blocks runs as it is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.migration import readme
from tests.e2e.migration.addon import CacheSpec, KServeAddon, cache_spec
from tests.e2e.migration.conftest import MigrationBed
from tests.support import installs

pytestmark = pytest.mark.timeout(1500)

Obj = dict[str, Any]
HANDOVER_TIMEOUT_S = 300
ADOPTED_EVENT = "ModelFolderAdopted"
OWNER_ANNOTATION = "localmodel.kserve.io/cache"
JOBS_NS = "kserve-localmodel-jobs"  # the with-kserve profile runs its Jobs in KServe's


@dataclass
class Before:
    requests: dict[str, int]
    jobs: set[str]  # uids of the Jobs in all namespaces (README step 2 deletes KServe's)
    inodes: dict[tuple[str, str], int]  # (node, storage key) -> inode of the model folder
    pod_uid: str
    uids: dict[str, str]  # "kind/namespace/name" -> uid


@pytest.fixture(scope="module")
def shell(migration_bed: MigrationBed) -> readme.Shell:
    plane = migration_bed.bed.control_plane
    assert plane.kubectl_path is not None
    return readme.Shell(
        kubeconfig=plane.kubeconfig_path,
        kubectl=Path(plane.kubectl_path),
        helm=installs.helm_or_skip(),
    )


@pytest.fixture(scope="module")
def before(kserve_addon: KServeAddon) -> Before:
    addon = kserve_addon
    return Before(
        requests=addon.request_counts(),
        jobs=_job_uids(addon),
        inodes={
            (node, cache.storage_key): _folder(addon, node, cache).stat().st_ino
            for node in addon.node_names
            for cache in addon.caches
        },
        pod_uid=_pod(addon)["metadata"]["uid"],
        uids=_uids(addon),
    )


def _job_uids(addon: KServeAddon) -> set[str]:
    return {job["metadata"]["uid"] for job in addon.cluster.items("jobs")}


def _folder(addon: KServeAddon, node: str, cache: CacheSpec) -> Path:
    return addon.node_models_dirs[node] / "models" / cache.storage_key


def _pod(addon: KServeAddon) -> Obj:
    pod = addon.cluster.get("pod", addon.serving_pod, namespace=addon.serving_namespace)
    assert pod is not None, "the serving pod is gone"
    return pod


def _serving_pv(addon: KServeAddon) -> str:
    claim = addon.cluster.get("pvc", addon.serving_claim, namespace=addon.serving_namespace)
    assert claim is not None
    return str(claim["spec"]["volumeName"])


def _uids(addon: KServeAddon) -> dict[str, str]:
    objs = {
        f"pvc/{addon.serving_namespace}/{addon.serving_claim}": addon.cluster.get(
            "pvc", addon.serving_claim, namespace=addon.serving_namespace
        ),
        f"pv//{_serving_pv(addon)}": addon.cluster.get("pv", _serving_pv(addon)),
        **{
            f"localmodelnodes//{node}": addon.cluster.get("localmodelnodes", node)
            for node in addon.node_names
        },
    }
    return {key: (obj or {}).get("metadata", {}).get("uid", "") for key, obj in objs.items()}


def _model_states(addon: KServeAddon, cache: CacheSpec) -> dict[str, str | None]:
    out = {}
    for node in addon.node_names:
        lmn = addon.cluster.get("localmodelnodes", node) or {}
        out[node] = ((lmn.get("status") or {}).get("modelStatus") or {}).get(cache.status_key)
    return out


def _adopted_events(addon: KServeAddon) -> dict[str, int]:
    done = addon.cluster.kubectl(
        "get", "events", "-A", "--field-selector", f"reason={ADOPTED_EVENT}", "-o", "json"
    )
    per_node: dict[str, int] = {}
    for event in json.loads(done.stdout)["items"]:
        node = event["involvedObject"]["name"]
        per_node[node] = per_node.get(node, 0) + 1
    return per_node


def _adopted_manifest(addon: KServeAddon, node: str, cache: CacheSpec) -> bool:
    path = addon.node_models_dirs[node] / ".manifests" / f"{cache.storage_key}.json"
    try:
        return bool(json.loads(path.read_text()).get("adopted"))
    except (OSError, ValueError):
        return False


def _handed_over(addon: KServeAddon) -> bool:
    for cache in addon.caches:
        if set(_model_states(addon, cache).values()) != {"ModelDownloaded"}:
            return False
        if not all(_adopted_manifest(addon, node, cache) for node in addon.node_names):
            return False
    return _adopted_events(addon) == {node: len(addon.caches) for node in addon.node_names}


def _downloaded(addon: KServeAddon, cache: CacheSpec) -> bool:
    obj = addon.cluster.get(cache.plural, cache.name, namespace=cache.namespace) or {}
    states = (obj.get("status") or {}).get("nodeStatus") or {}
    return all(states.get(node) == "NodeDownloaded" for node in addon.node_names) and all(
        addon.disk_files(node, cache) == cache.files for node in addon.node_names
    )


def _new_cache(migration_bed: MigrationBed, name: str) -> CacheSpec:
    """One more cluster cache of a model nobody downloaded yet."""
    return cache_spec(migration_bed.files, name, f"kserve/{name}/model.bin", size=32 * 1024)


def _reads_never_failed(addon: KServeAddon) -> None:
    reads = addon.serving_reads()
    failed = [r for r in reads if r["error"] is not None or r["files"] != addon.serving_cache.files]
    assert not failed, f"the serving pod failed {len(failed)} of {len(reads)} reads: {failed[:3]}"


def test_handover_to_localcache_downloads_nothing_again_and_keeps_serving(
    kserve_addon: KServeAddon, migration_bed: MigrationBed, shell: readme.Shell, before: Before
) -> None:
    addon = kserve_addon
    shell.run(readme.block("Before you start"), what="Before you start")
    shell.run(readme.block("Step 1"), what="step 1 (pause KServe's add-on)")
    shell.run(readme.block("Step 2"), what="step 2 (release KServe's download volumes)")
    install = readme.block("Step 3")
    profile = "--set profile=with-kserve"
    assert install.count(profile) == 1, install
    image = migration_bed.images["localcache"]
    shell.run(install.replace(profile, f"{profile} --set image={image}"), what="step 3 (install)")

    addon.cluster.wait(
        lambda: _handed_over(addon),
        timeout=HANDOVER_TIMEOUT_S,
        what="every model ModelDownloaded in the LocalModelNodes, adopted on every node "
        "(a manifest marked adopted, one ModelFolderAdopted Event per model and node)",
    )
    checks = shell.run(readme.block("Step 4"), what="step 4 (check)")
    assert ADOPTED_EVENT in checks, checks
    assert "No resources found" in checks, checks  # no Job in the job namespace

    assert addon.request_counts() == before.requests, "a model was downloaded again"
    assert _job_uids(addon) <= before.jobs, "a download Job was created"
    for (node, key), inode in before.inodes.items():
        cache = next(c for c in addon.caches if c.storage_key == key)
        assert _folder(addon, node, cache).stat().st_ino == inode, f"{node}: {key} replaced"
        assert addon.disk_files(node, cache) == cache.files
    pod = _pod(addon)
    assert pod["metadata"]["uid"] == before.pod_uid, "the serving pod was replaced"
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0, status
    assert "running" in status["state"], status
    addon.wait_fresh_read()
    _reads_never_failed(addon)
    assert _uids(addon) == before.uids, "a LocalModelNode, the serving PV or PVC was replaced"
    for kind, namespace, name in (
        ("pvc", addon.serving_namespace, addon.serving_claim),
        ("pv", None, _serving_pv(addon)),
    ):
        obj = addon.cluster.get(kind, name, namespace=namespace) or {}
        annotations = obj.get("metadata", {}).get("annotations") or {}
        assert OWNER_ANNOTATION in annotations, f"{kind} {name} not adopted: {annotations}"

    fresh = _new_cache(migration_bed, "after-handover")
    addon.cluster.apply(fresh.manifest())
    addon.cluster.wait(
        lambda: _downloaded(addon, fresh),
        timeout=HANDOVER_TIMEOUT_S,
        what=f"the new cache {fresh.name} NodeDownloaded on both nodes, its files on disk",
    )
    assert addon.request_counts().get(fresh.path) == len(addon.node_names)
    jobs = addon.cluster.items("jobs", namespace=JOBS_NS)
    assert len(jobs) == len(addon.node_names), [j["metadata"]["name"] for j in jobs]
    addon.caches.append(fresh)  # the rollback keeps it too


def test_rollback_to_kserve_downloads_nothing_again(
    kserve_addon: KServeAddon, migration_bed: MigrationBed, shell: readme.Shell
) -> None:
    addon = kserve_addon
    assert any(c.name == "after-handover" for c in addon.caches), "the hand-over did not finish"
    requests = addon.request_counts()
    shell.run(readme.block("Rolling back"), what="rolling back")
    returned = _new_cache(migration_bed, "after-rollback")
    addon.cluster.apply(returned.manifest())  # through KServe's webhook, failing closed again
    addon.cluster.wait(
        lambda: _downloaded(addon, returned),
        timeout=HANDOVER_TIMEOUT_S,
        what=f"KServe's add-on downloads the new cache {returned.name} on both nodes",
    )
    # KServe's agent went through every entry of its node to get there (one pass per reconcile)
    for cache in addon.caches:
        assert set(_model_states(addon, cache).values()) == {"ModelDownloaded"}, cache.name
        for node in addon.node_names:
            assert addon.disk_files(node, cache) == cache.files, (node, cache.name)
    now = addon.request_counts()
    assert now.get(returned.path) == len(addon.node_names), now
    assert {p: n for p, n in now.items() if p != returned.path} == requests, "downloaded again"
    addon.wait_fresh_read()
    _reads_never_failed(addon)
