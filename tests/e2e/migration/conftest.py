"""The real-node test bed with KServe's own local model cache add-on in use, once per package.

`migration_bed`: the run's shared test bed (`tests.support.e2ebed`: two nodes with the
operator's images and KServe v0.20.0's add-on images, `realnodes.KSERVE_ADDON_IMAGES`, built
locally from KServe's Go module, and an HTTP model server in its hub namespace), reset.
`kserve_addon`: KServe's add-on installed on it and in use (`addon.install`: three caches
downloaded on both nodes, a pod serving one), the starting point of a hand-over to localcache.
The next package's reset removes it.

Where the machine cannot host real nodes, the tests skip with the reason; with
`LOCALCACHE_REQUIRE_REAL_NODES=1` (CI) they fail instead, as in tests/e2e/realnodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from localcache.devenv import modelserver, testbed
from tests.e2e.migration import addon
from tests.e2e.realnodes.cluster import Cluster
from tests.support import e2ebed


@dataclass
class MigrationBed:
    bed: testbed.TestBed
    cluster: Cluster  # kubectl; node_models_dir is each node's /models (KServe's root)
    images: dict[str, str]  # image name (hack/build-images.sh) -> ref
    files: addon.ModelFiles
    model_server: modelserver.ModelServer


@pytest.fixture(scope="package")
def migration_bed(shared_bed: e2ebed.SharedBed) -> MigrationBed:
    """The run's shared bed (`tests/e2e/conftest.py`), reset: nothing deployed yet."""
    shared_bed.reset()
    return MigrationBed(
        bed=shared_bed.bed,
        cluster=Cluster.on_bed(shared_bed, package="migration", kserve_root=True),
        images=shared_bed.images,
        files=addon.ModelFiles(shared_bed.http_dir, shared_bed.http_base),
        model_server=shared_bed.http,
    )


@pytest.fixture(scope="package")
def kserve_addon(migration_bed: MigrationBed) -> addon.KServeAddon:
    """KServe's add-on installed and in use: see `addon.install`."""
    return addon.install(
        migration_bed.bed,
        migration_bed.cluster,
        images=migration_bed.images,
        files=migration_bed.files,
        model_server=migration_bed.model_server,
    )
