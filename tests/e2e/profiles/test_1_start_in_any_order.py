"""Start in any order (issue 12 item 2) on real nodes: the with-kserve profile (kustomize) goes
in on a cluster with KServe's namespace and inferenceservice-config but no serving.kserve.io
CRD at all; its controller and agents become Ready and stay up, without a restart, for
`CRD_DELAY_S`; then KServe's real CRDs appear, and without a pod restart a node group and a
cluster cache of an http:// model are downloaded on both nodes and an InferenceService is
mutated by localcache's webhook (reference §2.6: the local-model label and the source-URI
and serving-PVC annotations).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import names
from localcache.webhooks import isvc
from tests.e2e.profiles.conftest import ProfileBed
from tests.e2e.realnodes import objects

pytestmark = pytest.mark.timeout(600)
# The scenario, not a synchronisation: KServe's CRDs are installed about a minute after
# localcache (issue 12, "the controller first, KServe's CRDs a minute later").
CRD_DELAY_S = 60.0
# KServe's CRDs on the cluster when localcache starts: none, not even the localmodel ones (the
# processes wait for those, runtime.crds.crdwait); all of them come CRD_DELAY_S later.
AT_START: tuple[str, ...] = ()
WATCH_INTERVAL_S = 5.0
LMC, ISVC = groupversion.LOCAL_MODEL_CACHE, groupversion.INFERENCE_SERVICE


@pytest.fixture(scope="module")
def bare(bed: ProfileBed) -> Iterator[ProfileBed]:
    bed.reset_bare()
    bed.ensure_kserve(crds=False)
    if AT_START:
        bed.apply_kserve_crds(AT_START)
    yield bed
    bed.clear_objects()


def _all_up(bed: ProfileBed, first: dict[str, dict[str, object]]) -> None:
    """The same pods as at first, every one Ready and never restarted."""
    now = bed.operator_pods()
    assert now.keys() == first.keys(), f"pods replaced: {sorted(first)} -> {sorted(now)}"
    for name, pod in now.items():
        assert pod["uid"] == first[name]["uid"], f"pod {name} was recreated"
        assert pod["restarts"] == 0, f"pod {name} restarted {pod['restarts']} times"
        assert pod["ready"], f"pod {name} is not Ready"


def test_with_kserve_starts_without_kserve_crds_and_serves_once_they_appear(
    bare: ProfileBed,
) -> None:
    bed = bare
    assert bed.crds() == set(AT_START), "unexpected serving.kserve.io CRDs at the start"
    started = time.monotonic()
    bed.installer.install("with-kserve", "kustomize")
    first = bed.wait_up()
    while (left := started + CRD_DELAY_S - time.monotonic()) > 0:
        time.sleep(min(WATCH_INTERVAL_S, left))  # the scenario's minute, watched
        _all_up(bed, first)

    bed.apply_kserve_crds()
    run = uuid.uuid4().hex[:6]
    uri = bed.add_model(f"order-{run}", os.urandom(256 * 1024))
    group, cache = f"order-{run}", f"order-{run}"
    bed.apply(bed.cluster.node_group(group), objects.cache(cache, uri, group))
    bed.wait_cached(LMC.plural, cache)

    namespace = bed.namespace("order")
    classifier: dict[str, object] = {
        "apiVersion": ISVC.api_version,
        "kind": ISVC.kind,
        "metadata": {"name": "classifier", "namespace": namespace},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": uri}}},
    }
    want = (
        {isvc_api.LOCAL_MODEL_LABEL: cache},
        {
            isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: uri,
            isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: names.serving_pvc(cache, group),
        },
    )
    # The controller (and its webhook) is not Ready for a moment while it starts watching the
    # kinds that just appeared (a CI run created the InferenceService in that moment): wait
    # until a server-side dry run is mutated, then create it for real.
    bed.cluster.wait(
        lambda: _mutation(_dry_run(bed, classifier)) == want,
        timeout=60,
        what="a dry-run InferenceService is mutated by localcache's webhook",
    )
    bed.cluster.create(classifier)
    meta = (bed.cluster.get(ISVC.plural, "classifier", namespace=namespace) or {})["metadata"]
    assert _mutation(meta) == want, meta
    _all_up(bed, first)


def _dry_run(bed: ProfileBed, obj: dict[str, object]) -> dict[str, object]:
    done = bed.cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-",
        input_text=json.dumps(obj), check=False,
    )  # fmt: skip
    found = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}
    meta: dict[str, object] = found.get("metadata") or {}
    return meta


def _mutation(meta: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """The localcache labels and annotations of an InferenceService's metadata."""
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    assert isinstance(labels, dict)
    assert isinstance(annotations, dict)
    return (
        {k: v for k, v in labels.items() if k in isvc.LABEL_KEYS},
        {k: v for k, v in annotations.items() if k in isvc.ANNOTATION_KEYS},
    )
