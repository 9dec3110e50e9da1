"""The real-node test bed with KServe v0.20.0's own serving controllers and localcache, once
per package.

`kserve`: the run's shared bed (`tests/e2e/conftest.py`), reset, with KServe's CRDs, localcache
deployed as the bed deploys it, KServe's `inferenceservice-config` (Standard deployment mode,
the local model cache enabled), and KServe's InferenceService controller (`cmd/manager`, with
its pod mutator) and LLMInferenceService controller (`cmd/llmisvc`, with its defaulter) running
(`tests.support.kserve_controllers`), and taken away cleanly afterwards (`uninstall`: the
next package's reset could not delete the `kserve` namespace otherwise). `cluster`: kubectl
and waits on it, as in tests/e2e/realnodes. On a failure the report gets the caches, the
serving objects, pods and both KServe controllers' and localcache's logs.

Where the machine cannot host real nodes, the tests skip with the reason; with
`LOCALCACHE_REQUIRE_REAL_NODES=1` (CI) they fail instead.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

import pytest

from tests.e2e.realnodes import conftest as realnodes_conftest
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.support import e2ebed, kserve_controllers


@pytest.fixture(scope="package")
def kserve(shared_bed: e2ebed.SharedBed) -> Iterator[kserve_controllers.KServeControllers]:
    found = kserve_controllers.install(shared_bed)
    yield found
    kserve_controllers.uninstall(found)


@pytest.fixture(scope="package")
def cluster(shared_bed: e2ebed.SharedBed, kserve: kserve_controllers.KServeControllers) -> Cluster:
    sources = Sources(
        http_base=shared_bed.http_base,
        add_file=_add_file(shared_bed),
        s3_endpoint_for_pods=shared_bed.s3_endpoint_for_pods,
        s3=shared_bed.store,
        slow_base=shared_bed.slow_base,
    )
    return Cluster.on_bed(shared_bed, package="kservectl", sources=sources)


@pytest.fixture(scope="package")
def sources(cluster: Cluster) -> Sources:
    assert cluster.sources is not None
    return cluster.sources


def _add_file(shared: e2ebed.SharedBed) -> Callable[[str, bytes], None]:
    def add(path: str, data: bytes) -> None:
        shared.add_file(path, data)

    return add


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    args = getattr(item, "funcargs", {})
    found, kserve = args.get("cluster"), args.get("kserve")
    if report.failed and isinstance(found, Cluster):
        serving = found.report([
            ("get", "inferenceservices,llminferenceservices,deployments,pods", "-A", "-o", "wide"),
        ])  # fmt: skip
        report.sections.append(("cluster state", realnodes_conftest.diagnostics(found)))
        report.sections.append(("serving objects", serving))
    if report.failed and isinstance(kserve, kserve_controllers.KServeControllers):
        report.sections.append(("KServe's controllers", kserve.logs()))
    return report
