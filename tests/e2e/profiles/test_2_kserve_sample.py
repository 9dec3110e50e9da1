"""KServe's documented sample, unchanged, in the with-kserve profile on real nodes (issue 12
item 4): the YAML of KServe v0.20.0's docs/samples/localmodelcache README, section "Example:
Complete HuggingFace Model Caching Setup", read from KServe's module, not retyped.

Changed, because it cannot work offline: the cache's `sourceModelUri` (and the sample
InferenceService's `storageUri`), `hf://meta-llama/meta-llama-3-8b-instruct`, points at the
bed's HTTP model server instead. Everything else is applied as written: the namespace step
(`kubectl create namespace kserve-localmodel-jobs`), the Secret and ServiceAccount, the node
group `workers` with PV path `/models`, storage class `local-storage` and node affinity
`node-type In [gpu]` (the bed's nodes are labelled `node-type=gpu`, as the sample expects of
a user's nodes), the cache with its `modelSize` and `serviceAccountName`. The sample's
InferenceService goes into a test namespace (its YAML names none).

Then the cache is downloaded on both nodes, the model is under each node's `/models`
(KServe's models root, which the with-kserve profile serves beside its own), and the sample's
InferenceService is mutated to use it. A tenant's namespace cache of the same URI on a node
group of localcache's own root (/mnt/models) is then downloaded there too, and reported only
once it is there (issue 20: a URI on groups of two roots).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys, names
from localcache.devenv.waiting import wait_until_sync
from tests.e2e.profiles import kserve
from tests.e2e.profiles.conftest import DOWNLOADED, TEST_LABEL, ProfileBed
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import tree_digests

pytestmark = pytest.mark.timeout(300)
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
LMC, LMNG, ISVC = (
    groupversion.LOCAL_MODEL_CACHE,
    groupversion.LOCAL_MODEL_NODE_GROUP,
    groupversion.INFERENCE_SERVICE,
)
SAMPLE_NODE_LABEL = "node-type=gpu"  # what the sample's node affinity selects


@pytest.fixture(scope="module")
def with_kserve(bed: ProfileBed) -> Iterator[ProfileBed]:
    bed.ensure_kserve(crds=True)
    bed.ensure_profile("with-kserve", "kustomize")
    yield bed
    bed.clear_objects()


def test_kserve_sample_unchanged_caches_the_model_under_models_on_every_node(
    with_kserve: ProfileBed,
) -> None:
    bed = with_kserve
    docs = kserve.sample_documents(kserve.COMPLETE_SETUP)
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == sorted(d["kind"] for d in docs), "one object of each kind"
    group, cache, isvc = by_kind[LMNG.kind], by_kind[LMC.kind], by_kind[ISVC.kind]
    assert group["spec"]["persistentVolumeSpec"]["local"]["path"] == "/models"
    data = os.urandom(256 * 1024)
    uri = bed.add_model("sample", data)
    cache["spec"]["sourceModelUri"] = uri  # hf:// is unreachable offline
    isvc["spec"]["predictor"]["model"]["storageUri"] = uri

    bed.cluster.kubectl("label", "nodes", "--all", SAMPLE_NODE_LABEL, f"{TEST_LABEL}=yes")
    for namespace in kserve.sample_namespaces(kserve.COMPLETE_SETUP):
        if bed.cluster.get("namespace", namespace) is None:  # KServe's job namespace may be
            bed.cluster.kubectl("create", "namespace", namespace)
        bed.cluster.kubectl("label", "namespace", namespace, f"{TEST_LABEL}=yes")
    bed.apply(*[d for d in docs if d is not isvc])
    name = cache["metadata"]["name"]
    bed.wait_cached(LMC.plural, name)

    key = keys.storage_key(uri)
    want = {"model.bin": hashlib.sha256(data).hexdigest()}
    for node in bed.node_names:
        folder = bed.bed.node(node).kserve_models_dir / "models" / key
        wait_until_sync(
            functools.partial(_has_files, folder, want),
            timeout=30,
            interval=0.5,
            what=f"the model's files under /models/models/{key} on {node}",
        )

    namespace = bed.namespace("sample")
    bed.cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(isvc))
    meta = (bed.cluster.get(ISVC.plural, isvc["metadata"]["name"], namespace=namespace) or {})[
        "metadata"
    ]
    assert (meta.get("labels") or {}).get(isvc_api.LOCAL_MODEL_LABEL) == name, meta
    annotations = meta.get("annotations") or {}
    pvc = names.serving_pvc(name, group["metadata"]["name"])
    assert annotations.get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION) == pvc, meta

    # Issue 20 (two roots): the same URI, cached by a tenant on a node group of localcache's
    # own root (/mnt/models), must be downloaded there too before it is reported: the copy
    # under /models is no copy for that group's pods.
    tenant = bed.namespace("roots")
    own_group = f"own-{tenant}"
    bed.apply(
        bed.cluster.node_group(own_group),
        objects.cache("same", uri, own_group, namespace=tenant),
    )

    def reported_only_with_its_folder() -> bool:
        status = bed.node_status(LMNC.plural, "same", tenant)
        for node, state in status.items():
            if state == DOWNLOADED:
                folder = bed.bed.node(node).models_dir / "models" / key
                if tree_digests(folder) != want:  # not an AssertionError: stop at once
                    raise RuntimeError(
                        f"{node} reports {tenant}/same downloaded, {folder} lacks it"
                    )
        assert sorted(status.values()) == [DOWNLOADED] * len(bed.node_names), status
        return True

    bed.cluster.wait(
        reported_only_with_its_folder,
        timeout=180,
        what=f"{tenant}/same downloaded onto /mnt/models of every node, reported only then",
    )
    for node in bed.node_names:  # and KServe's root keeps its own copy
        assert tree_digests(bed.bed.node(node).kserve_models_dir / "models" / key) == want


def _has_files(folder: Path, want: dict[str, str]) -> bool:
    got = tree_digests(folder)
    assert got == want, f"{folder}: {got}"
    return True
