"""The deployed operator on real nodes, once per package.

By default: the run's shared real-node test bed (`tests.support.e2ebed`: a control plane
bound for pods, kube-scheduler, two nodes with kubelet + containerd + runc, the images built
locally, test servers in its hub namespace: an HTTP model server, a throttled one, and an S3
store that enforces credentials), reset, then KServe's CRDs (stand-ins from manifests/test)
and the shipped manifests through `manifests/testbed`, which changes only image references.
With `LOCALCACHE_E2E_KUBECONFIG` set, the tests run against that cluster instead, where the
operator is already deployed (`make e2e-kind`).

Where the machine cannot host real nodes (not root, no namespaces), the tests skip with the
reason; with `LOCALCACHE_REQUIRE_REAL_NODES=1` (CI) they fail instead.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from localcache.devenv import realnodes
from tests.e2e.realnodes import cluster as cluster_mod
from tests.e2e.realnodes import incluster
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.support import e2ebed

SLOW_RATE = e2ebed.SLOW_RATE  # bytes per second of the throttled server (in-cluster too)
ROLLOUT_TIMEOUT = "240s"


@pytest.fixture(scope="package")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The deployed operator on real nodes, for this package's tests: the run's shared bed
    (`tests/e2e/conftest.py`), reset, with the shipped manifests deployed on it."""
    external = os.environ.get("LOCALCACHE_E2E_KUBECONFIG")
    if external:
        yield from _external(Path(external))
    else:
        yield from _deployed(request.getfixturevalue("shared_bed"))


def _deployed(shared: e2ebed.SharedBed) -> Iterator[Cluster]:
    shared.reset()
    sources = Sources(
        http_base=shared.http_base,
        add_file=_add_file(shared),
        s3_endpoint_for_pods=shared.s3_endpoint_for_pods,
        s3=shared.store,
        slow_base=shared.slow_base,
        http_stats=shared.http.stats,
    )
    found = Cluster.on_bed(shared, package="realnodes", sources=sources)
    realnodes.deploy(found.kubectl)
    yield found


def _add_file(shared: e2ebed.SharedBed) -> Callable[[str, bytes], None]:
    def add(path: str, data: bytes) -> None:
        shared.add_file(path, data)

    return add


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
