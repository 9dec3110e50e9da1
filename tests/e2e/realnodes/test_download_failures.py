"""Downloads that never hang, and failures that say why (issue 21 item 5), on real nodes with
KServe's own storage code (the storage initializer) in the download Jobs:

- an origin that stops sending mid-transfer: the download is stopped once its staging folder
  has not grown for `downloadStallTimeoutInSecs` (set low here in the deployed ConfigMap),
  reported `DownloadStalled` with the size reached, and succeeds on the retry once the origin
  answers again;
- a download answered 404, an archive refused for a member outside the model folder, and a
  download refused by the S3 store (403) each show their own reason in the cache's status
  (`Degraded`) and Events, not "Error (exit code 1)".
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import uuid

import pytest

from localcache.caching import jobfailures as failures
from localcache.caching import keys
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Obj, Sources
from tests.e2e.realnodes.objects import LMC, LMNC

pytestmark = pytest.mark.timeout(420)

STALL_TIMEOUT_S = 5
LMN_KIND = "LocalModelNode"


def _warnings(cluster: Cluster, *, kind: str, name: str, namespace: str | None) -> list[Obj]:
    return [
        e
        for e in cluster.items("events", namespace=namespace)
        if e.get("type") == "Warning"
        and e["involvedObject"].get("kind") == kind
        and e["involvedObject"].get("name") == name
    ]


def _shows_reason(
    cluster: Cluster, *, kind: str, name: str, namespace: str | None, gist: str
) -> None:
    """Wait until the cache's Degraded condition and one of its Warning Events name `gist`."""

    def shown() -> bool:
        cache = cluster.get(kind, name, namespace=namespace)
        degraded = cluster.condition(cache, "Degraded") or {}
        if degraded.get("status") != "True" or gist not in str(degraded.get("message")):
            return False
        kind_name = LMNC.kind if namespace else LMC.kind
        events = _warnings(cluster, kind=kind_name, name=name, namespace=namespace)
        return any(gist in str(e.get("message")) for e in events)

    where = f"{namespace}/{name}" if namespace else name
    cluster.wait(shown, timeout=240, what=f"{kind} {where} says {gist!r} in Degraded and Events")
    cache = cluster.get(kind, name, namespace=namespace)
    message = str((cluster.condition(cache, "Degraded") or {}).get("message"))
    assert "Error (exit code 1)" not in message, message


def test_a_stalled_download_is_stopped_reported_and_succeeds_on_retry(
    cluster: Cluster, sources: Sources
) -> None:
    name = f"stall-{uuid.uuid4().hex[:6]}"
    data = os.urandom(4 * 1024 * 1024)
    sources.add_file(f"{name}/model.bin", data)
    sources.add_file(f"{name}/model.bin.stall", b"1")  # the first GET stalls after half
    uri = f"{sources.http_base}/{name}/model.bin"
    group = f"g-{uuid.uuid4().hex[:6]}"
    with cluster.local_model(
        downloadStallTimeoutInSecs=STALL_TIMEOUT_S,
        downloadRetryBackoffInSecs=2,
        downloadRetryMaxBackoffInSecs=10,
    ):
        cluster.apply(cluster.node_group(group), objects.cache(name, uri, group))

        def stalled() -> Obj | None:
            for event in cluster.items("events", namespace="default"):
                if (
                    event.get("reason") == "DownloadStalled"
                    and event["involvedObject"].get("kind") == LMN_KIND
                    and f"model {name}:" in str(event.get("message"))
                ):
                    found: Obj = event
                    return found
            return None

        event = cluster.wait(
            stalled, timeout=180, what=f"a DownloadStalled Event for {name} on a LocalModelNode"
        )
        message = str(event.get("message"))
        idle = re.search(r"wrote nothing for (\d+) s", message)
        reached = re.search(r"stopped at (\d+) bytes", message)
        assert idle is not None, message
        assert reached is not None, message
        assert STALL_TIMEOUT_S <= int(idle[1]) <= STALL_TIMEOUT_S + 15, message
        assert 0 < int(reached[1]) < len(data), message

        cluster.wait_ready(LMC.plural, name, timeout=180)
    want = {"model.bin": hashlib.sha256(data).hexdigest()}
    key = keys.storage_key(uri)
    for node in cluster.node_names:
        assert cluster.model_files(node, key) == want, f"model on {node}"
    cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s")


def _escaping_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for member, content in (("model.bin", b"weights"), ("../escaped.txt", b"outside")):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_failed_downloads_show_their_own_reason_in_the_caches_status_and_events(
    cluster: Cluster, sources: Sources
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    cluster.apply(cluster.node_group(group))
    base = f"why-{uuid.uuid4().hex[:6]}"

    # 404: the file is not there.
    missing = f"{base}-404"
    cluster.apply(objects.cache(missing, f"{sources.http_base}/{base}/nope.bin", group))
    # An archive with a member outside its destination: refused by the tar filter.
    archive = f"{base}-tar"
    sources.add_file(f"{base}/model.tar", _escaping_tar())
    cluster.apply(objects.cache(archive, f"{sources.http_base}/{base}/model.tar", group))
    # The S3 store refuses keys it does not know (403).
    _store, endpoint = sources.require_s3()
    bucket = f"refused-{uuid.uuid4().hex[:8]}"
    uri, _files = sources.private_model(bucket)
    tenant = cluster.namespace("refused")
    cluster.apply(
        *objects.s3_credentials(
            tenant,
            name="s3-reader",
            endpoint=endpoint,
            key_id="AKIAUNKNOWNTENANT000",
            secret="not-a-valid-secret",
        ),
        objects.cache("bert", uri, group, namespace=tenant, service_account="s3-reader"),
    )

    _shows_reason(
        cluster, kind=LMC.plural, name=missing, namespace=None, gist=failures.GIST_NOT_FOUND
    )
    # "a member would land outside the model folder" when the log tail still holds the tar
    # filter's error, else "not a valid tar or zip archive" (KServe wraps it in that message)
    _shows_reason(cluster, kind=LMC.plural, name=archive, namespace=None, gist="archive refused")
    _shows_reason(
        cluster, kind=LMNC.plural, name="bert", namespace=tenant, gist=failures.GIST_S3_FORBIDDEN
    )
    for name in (missing, archive):
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s")


def test_a_download_pod_that_cannot_start_says_why_in_the_models_progress(
    cluster: Cluster, sources: Sources
) -> None:
    """A ClusterStorageContainer naming an image no node can pull: the Job runs, its pod waits
    for ever (no stall is counted before a pod starts). The model's progress on each node
    says why, from the kubelet's reason, instead of a Pending without a word."""
    run = uuid.uuid4().hex[:6]
    prefix = f"{sources.http_base}/nostart-{run}/"
    uri = prefix + "weights.bin"
    group, name = f"g-nostart-{run}", f"nostart-{run}"
    csc = objects.localcache_downloader(f"e2e-nostart-{run}", prefix)
    csc["spec"]["container"]["image"] = f"localcache.invalid/no-such-image-{run}:0"
    node_group = cluster.node_group(group)
    node_group["spec"]["peerDistribution"] = {"enabled": False}  # every node runs its own
    cluster.apply(csc, node_group, objects.cache(name, uri, group))
    try:

        def said_everywhere() -> bool:
            for node in cluster.node_names:
                entry = ((cluster.get("localmodelnodes", node) or {}).get("status") or {}).get(
                    "modelProgress"
                ) or {}
                message = str((entry.get(name) or {}).get("message") or "")
                if "cannot start" not in message or not re.search(
                    r"ErrImagePull|ImagePullBackOff", message
                ):
                    return False
                assert cluster.node_status(node).get(name) == "ModelDownloadPending", node
            return True

        cluster.wait(
            said_everywhere,
            timeout=180,
            what=f"every node's progress of {name} says its pod cannot pull its image",
        )
    finally:
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s")
        cluster.kubectl("delete", "clusterstoragecontainer", f"e2e-nostart-{run}")
