"""The end-to-end packages share one real-node test bed per test run (`shared_bed`).

It starts when the first package that needs it asks for it and stops at the end of the run;
each package calls `SharedBed.reset()` before it deploys what it needs, so it sees the bed as
it started whatever ran before it. Where the machine cannot host real nodes the tests skip
with the reason (`LOCALCACHE_REQUIRE_REAL_NODES=1`: they fail instead).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.realnodes import cluster as cluster_mod
from tests.support import e2ebed


@pytest.fixture(scope="session")
def shared_bed() -> Iterator[e2ebed.SharedBed]:
    cluster_mod.require_real_nodes()
    bed = e2ebed.SharedBed().start()
    try:
        yield bed
    finally:
        bed.stop()
