"""The with-kserve profile beside KServe's real objects on real nodes, byte for byte (issue
12): KServe v0.20.0's namespace `kserve`, its inferenceservice-config and its CRDs, as the
apiserver returns them (resourceVersion and managedFields included), are unchanged by
uninstalling the profile (kustomize), installing it with Helm, uninstalling that and
reinstalling with kustomize; each uninstall removes every object the profile created, and
each install works: a new cluster cache is downloaded on both nodes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from localcache.api import groupversion
from tests.e2e.profiles import kserve
from tests.e2e.profiles.conftest import ProfileBed
from tests.e2e.realnodes import objects
from tests.support import installs

pytestmark = pytest.mark.timeout(480)
LMC = groupversion.LOCAL_MODEL_CACHE


@pytest.fixture(scope="module")
def with_kserve(bed: ProfileBed) -> Iterator[ProfileBed]:
    bed.ensure_kserve(crds=True)
    bed.ensure_profile("with-kserve", "kustomize")
    yield bed
    bed.clear_objects()


def _watched() -> list[installs.Identity]:
    return [
        ("Namespace", "", kserve.NAMESPACE),
        ("ConfigMap", kserve.NAMESPACE, kserve.CONFIG_MAP),
        *(("CustomResourceDefinition", "", name) for name in kserve.crd_names()),
    ]


def _cache_works(bed: ProfileBed, group: str, label: str) -> None:
    name = f"{label}-{uuid.uuid4().hex[:6]}"
    uri = bed.add_model(name, os.urandom(128 * 1024))
    bed.apply(objects.cache(name, uri, group))
    bed.wait_cached(LMC.plural, name)


def test_with_kserve_leaves_kserve_objects_unchanged_through_kustomize_and_helm(
    with_kserve: ProfileBed,
) -> None:
    bed = with_kserve
    group = f"beside-{uuid.uuid4().hex[:6]}"
    bed.apply(bed.cluster.node_group(group))
    watched = _watched()
    before = bed.installer.snapshot(watched)
    assert all(before.values()), f"KServe's objects missing: {before.keys()}"

    def unchanged(step: str) -> None:
        after = bed.installer.snapshot(watched)
        changed = ["/".join(i) for i in watched if after[i] != before[i]]
        assert changed == [], f"changed by {step}"

    bed.uninstall()  # kustomize; waits until every object the profile created is gone
    unchanged("kubectl delete -k (with-kserve)")

    bed.installer.install("with-kserve", "helm")
    bed.rollout()
    unchanged("helm install (with-kserve)")
    _cache_works(bed, group, "helm")
    unchanged("serving a cache (Helm install)")

    bed.uninstall()  # helm uninstall
    unchanged("helm uninstall (with-kserve)")

    bed.installer.install("with-kserve", "kustomize")
    bed.rollout()
    _cache_works(bed, group, "kustomize")
    unchanged("kubectl apply -k and serving a cache (with-kserve)")
