"""The standalone profile on real nodes (issue 12): with no KServe at all (its CRDs and
namespace deleted first), localcache's CRDs and the profile go in with kustomize and a
cluster cache is downloaded on both nodes. Uninstalling keeps the CRDs, the cache and its node
group (and the files on the nodes) and removes every object the profile created; a
reinstall with Helm picks the surviving cache up again (its volumes back and Bound, Ready)
with no new request to the model server and no download Job; a Helm uninstall keeps them too.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from localcache.api import groupversion
from tests.e2e.profiles.conftest import JOBS_NAMESPACE, ProfileBed
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import tree_digests

pytestmark = pytest.mark.timeout(480)
LMC, LMNG = groupversion.LOCAL_MODEL_CACHE, groupversion.LOCAL_MODEL_NODE_GROUP
LOCALCACHE_CRDS = [
    f"{kind.plural}.{groupversion.GROUP}"
    for kind in (
        LMC,
        LMNG,
        groupversion.LOCAL_MODEL_NAMESPACE_CACHE,
        groupversion.LOCAL_MODEL_NODE,
    )
]


@pytest.fixture(scope="module")
def standalone(bed: ProfileBed) -> Iterator[ProfileBed]:
    bed.reset_bare()  # KServe's CRDs and namespace go first
    bed.ensure_profile("standalone", "kustomize")
    yield bed
    bed.clear_objects()


def _claims(bed: ProfileBed) -> dict[str, str]:
    """The PVCs of the job namespace (a cluster cache's, per node group): name -> phase."""
    listed = bed.cluster.items("pvc", namespace=JOBS_NAMESPACE)
    return {p["metadata"]["name"]: (p.get("status") or {}).get("phase", "") for p in listed}


def _survived(bed: ProfileBed, cache: str, group: str) -> None:
    present = bed.crds()
    assert [c for c in LOCALCACHE_CRDS if c not in present] == [], "a CRD was deleted"
    assert bed.cluster.get(LMC.plural, cache) is not None, "the cache was deleted"
    assert bed.cluster.get(LMNG.plural, group) is not None, "the node group was deleted"


def test_standalone_uninstall_keeps_crds_and_caches_and_helm_picks_them_up(
    standalone: ProfileBed,
) -> None:
    bed = standalone
    run = uuid.uuid4().hex[:6]
    cache, group = f"alone-{run}", f"alone-{run}"
    uri = bed.add_model(cache, os.urandom(256 * 1024))
    bed.apply(bed.cluster.node_group(group), objects.cache(cache, uri, group))
    bed.wait_cached(LMC.plural, cache)
    claims = _claims(bed)
    assert claims, "no PVC in the job namespace"
    assert set(claims.values()) == {"Bound"}, claims
    files = {n: tree_digests(bed.cluster.models_root(n) / "models") for n in bed.node_names}
    requests = bed.requests(cache)
    assert requests > 0

    bed.uninstall()  # kustomize; waits until every object the profile created is gone
    _survived(bed, cache, group)

    bed.installer.install("standalone", "helm")
    bed.rollout()

    def picked_up() -> bool:
        assert _claims(bed) == claims, f"claims {_claims(bed)}"
        obj = bed.cluster.get(LMC.plural, cache)
        assert bed.cluster.condition(obj, "Ready") is not None, "no Ready condition"
        assert (bed.cluster.condition(obj, "Ready") or {}).get("status") == "True", obj
        return True

    bed.cluster.wait(picked_up, timeout=120, what=f"the surviving cache {cache} is Ready again")
    bed.wait_cached(LMC.plural, cache, timeout=10)
    assert bed.requests(cache) == requests, "the model was downloaded again"
    assert bed.cluster.items("jobs", namespace=JOBS_NAMESPACE) == [], "a download Job ran"
    assert {n: tree_digests(bed.cluster.models_root(n) / "models") for n in bed.node_names} == (
        files
    )

    bed.uninstall()  # helm uninstall
    _survived(bed, cache, group)
