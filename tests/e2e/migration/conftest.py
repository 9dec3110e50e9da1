"""The real-node test bed with KServe's own local model cache add-on in use, once per package.

`migration_bed`: a test bed of two nodes with the operator's images and KServe v0.20.0's
add-on images (`realnodes.KSERVE_ADDON_IMAGES`, built locally from KServe's Go module), and an
HTTP model server in the test bed's hub namespace. `kserve_addon`: KServe's add-on installed
on it and in use (`addon.install`: three caches downloaded on both nodes, a pod serving one),
the starting point of a hand-over to localcache. Both are torn down when the package is done.

Where the machine cannot host real nodes, the tests skip with the reason; with
`LOCALCACHE_REQUIRE_REAL_NODES=1` (CI) they fail instead, as in tests/e2e/realnodes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcache.devenv import modelserver, realnodes, testbed
from tests.e2e.migration import addon
from tests.e2e.realnodes import cluster as cluster_mod
from tests.e2e.realnodes.cluster import Cluster

HTTP_PORT = 8000


@dataclass
class MigrationBed:
    bed: testbed.TestBed
    cluster: Cluster  # kubectl; node_models_dir is each node's /models (KServe's root)
    images: dict[str, str]  # image name (hack/build-images.sh) -> ref
    files: addon.ModelFiles
    model_server: modelserver.ModelServer


@pytest.fixture(scope="package")
def migration_bed() -> Iterator[MigrationBed]:
    cluster_mod.require_real_nodes()
    names = [*realnodes.OPERATOR_IMAGES, *realnodes.KSERVE_ADDON_IMAGES]
    images = realnodes.prepare_images(names)
    bed = testbed.TestBed(nodes=2, images=images)
    work = Path(tempfile.mkdtemp(prefix="localcache-migration-"))
    server: modelserver.ModelServer | None = None
    try:
        bed.start()
        (reach,) = (f"http://127.0.0.1:{p}" for p in bed.forward([HTTP_PORT]))
        (work / "http").mkdir()
        server = modelserver.ModelServer(work / "http", log_path=work / "http.log")
        server.start(bed.hub.prefix(), testbed.HUB_IP, HTTP_PORT, reach=reach)
        plane = bed.control_plane
        assert plane.kubectl_path is not None
        yield MigrationBed(
            bed=bed,
            cluster=Cluster(
                kubeconfig=plane.kubeconfig_path,
                kubectl_bin=plane.kubectl_path,
                node_names=[n.name for n in bed.node_list],
                node_models_dir=lambda name: bed.node(name).kserve_models_dir,
                cache_dir=work,
            ),
            images={name: image.ref for name, image in zip(names, images, strict=True)},
            files=addon.ModelFiles(work / "http", f"http://{testbed.HUB_IP}:{HTTP_PORT}"),
            model_server=server,
        )
    finally:
        if server is not None:
            server.stop()
        bed.stop()
        shutil.rmtree(work, ignore_errors=True)


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
