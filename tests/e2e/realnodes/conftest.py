"""The deployed operator on real nodes, once per session.

By default: the real-node test bed (`devenv.testbed`: a control plane bound for pods,
kube-scheduler, two nodes with kubelet + containerd + runc), the images built locally
(`hack/build-images.sh`), test servers in the test bed's hub namespace (an HTTP model server, a
throttled one, and an S3 store that enforces credentials), KServe's CRDs (stand-ins from
manifests/test) and then the shipped manifests through `manifests/testbed`, which changes only
image references. With `LOCALCACHE_E2E_KUBECONFIG` set, the tests run against that cluster
instead, where the operator is already deployed (`make e2e-kind`).

Where the machine cannot host real nodes (not root, no namespaces), the tests skip with the
reason; with `LOCALCACHE_REQUIRE_REAL_NODES=1` (CI) they fail instead.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from localcache.devenv import modelserver, realnodes, testbed
from tests.e2e.realnodes import cluster as cluster_mod
from tests.e2e.realnodes import incluster
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.support import objectstore

HTTP_PORT, SLOW_PORT, S3_PORT = 8000, 8001, 9000
SLOW_RATE = 2 * 1024 * 1024  # bytes per second of the throttled server
ROLLOUT_TIMEOUT = "240s"


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    """The deployed operator on real nodes, for this package's tests: torn down when they
    are done, so the rest of the suite does not share the machine with it."""
    external = os.environ.get("LOCALCACHE_E2E_KUBECONFIG")
    if external:
        yield from _external(Path(external))
        return
    cluster_mod.require_real_nodes()
    bed = testbed.TestBed(nodes=2, images=realnodes.prepare_images())
    work = Path(tempfile.mkdtemp(prefix="localcache-e2e-"))
    servers: list[modelserver.ModelServer | objectstore.ObjectStore] = []
    try:
        bed.start()
        http_dir = work / "http"
        http_dir.mkdir()
        prefix = bed.hub.prefix()
        host_s3, host_http, host_slow = (
            f"http://127.0.0.1:{p}" for p in bed.forward([S3_PORT, HTTP_PORT, SLOW_PORT])
        )
        http = modelserver.ModelServer(http_dir, log_path=work / "http.log")
        servers.append(http.start(prefix, testbed.HUB_IP, HTTP_PORT, reach=host_http))
        slow = modelserver.ModelServer(http_dir, rate=SLOW_RATE, log_path=work / "slow.log")
        servers.append(slow.start(prefix, testbed.HUB_IP, SLOW_PORT, reach=host_slow))
        store = objectstore.ObjectStore(log_path=work / "s3.log")
        servers.append(store.start(prefix, testbed.HUB_IP, S3_PORT, reach=host_s3))
        plane = bed.control_plane
        assert plane.kubectl_path is not None
        found = Cluster(
            kubeconfig=plane.kubeconfig_path,
            kubectl_bin=plane.kubectl_path,
            node_names=[n.name for n in bed.node_list],
            node_models_dir=lambda name: bed.node(name).models_dir,
            cache_dir=work,
            sources=Sources(
                http_base=f"http://{testbed.HUB_IP}:{HTTP_PORT}",
                add_file=functools.partial(_write_file, http_dir),
                s3_endpoint_for_pods=f"{testbed.HUB_IP}:{S3_PORT}",
                s3=store,
                slow_base=f"http://{testbed.HUB_IP}:{SLOW_PORT}",
            ),
        )
        realnodes.deploy(found.kubectl)
        yield found
    finally:
        for server in reversed(servers):
            server.stop()
        bed.stop()


def _write_file(root: Path, path: str, data: bytes) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _external(kubeconfig: Path) -> Iterator[Cluster]:
    """A cluster where the operator is deployed already (`make e2e-kind`): the model servers
    run as a pod there, node disks are read by pods."""
    work = Path(tempfile.mkdtemp(prefix="localcache-e2e-"))
    found = Cluster(kubeconfig=kubeconfig, kubectl_bin="kubectl", node_names=[], cache_dir=work)
    nodes = found.items("nodes", selector="kserve/localmodel=worker")
    found.node_names = [n["metadata"]["name"] for n in nodes]
    http = incluster.InClusterHttp(found, slow_rate=SLOW_RATE)
    try:
        found.read_disk = incluster.PodDisk(found).digests
        found.sources = Sources(
            http_base=http.http_base, slow_base=http.slow_base, add_file=http.add_file
        )
        yield found
    finally:
        http.close()


@pytest.fixture(scope="package")
def sources(cluster: Cluster) -> Sources:
    if cluster.sources is None:
        pytest.skip("the model sources (HTTP, S3) are served by the real-node test bed")
    return cluster.sources


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failure, attach what an operator would look at: caches, node status, Jobs, pods,
    warnings and the operator's recent logs."""
    report = yield
    found = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(found, Cluster):
        report.sections.append(("cluster state", diagnostics(found)))
    return report


def diagnostics(found: Cluster) -> str:
    commands = [
        ("get", "lmc,lmnc,lmng", "-A", "-o", "wide"),
        ("get", "lmn", "-o", "yaml"),
        ("get", "jobs,pods,pvc", "-A", "-o", "wide"),
        ("get", "events", "-A", "--field-selector", "type=Warning"),
        (
            "logs",
            "-n",
            cluster_mod.SYSTEM_NS,
            "-l",
            "app.kubernetes.io/component=agent",
            "--tail=40",
            "--prefix",
        ),
        (
            "logs",
            "-n",
            cluster_mod.SYSTEM_NS,
            "-l",
            "app.kubernetes.io/component=controller",
            "--tail=40",
            "--prefix",
        ),
    ]
    return found.report(commands)
