"""Start in any order, the localmodel CRDs too: a `localcache controller` started on a cluster
with no serving.kserve.io CRD at all (KServe's chart, which installs them, comes later) waits
for them with its probes answering: /healthz and /readyz pass (an install that waits for
readiness goes on), the log says which CRDs it waits for, and no informer starts. It does not
exit. Once the CRDs are installed it goes on, with no restart: its informers sync and a cache
created then gets the controller's finalizer.

The module runs on a control plane of its own: the session's holds the CRDs already.
"""

from __future__ import annotations

import functools
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.devenv import crds as crd_install
from localcache.devenv import processes
from localcache.devenv.assets import free_port
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until_sync
from tests.integration.anyorder.conftest import KSERVE_CRDS, OWN_CRDS

WAITING_EVENT = "waiting_for_crds"
SYNCED_EVENT = "manager_caches_synced"
FINALIZER = "localmodel.kserve.io/finalizer"


@pytest.fixture(scope="module")
def bare_plane() -> Iterator[ControlPlane]:
    """A control plane for this module only, with no CRD installed."""
    plane = ControlPlane(with_kcm=False).start()
    try:
        yield plane
    finally:
        plane.stop()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _answers_ok(port: int, path: str) -> bool:
    return _status(port, path) == 200


def test_a_controller_started_before_the_crds_waits_for_them_and_goes_on(
    bare_plane: ControlPlane, tmp_path: Path
) -> None:
    metrics_port, webhook_port = free_port(), free_port()
    log = tmp_path / "controller.log"
    proc = processes.ManagedProcess(
        "controller",
        [
            sys.executable, "-m", "localcache", "controller",
            f"--kubeconfig={bare_plane.kubeconfig_path}", "--bind-address=127.0.0.1",
            f"--metrics-port={metrics_port}", f"--webhook-port={webhook_port}",
            f"--webhook-cert-dir={tmp_path / 'certs'}", "--leader-elect=false",
            "--config-namespace=default",
            "--log-format=json", "--shutdown-timeout=5",
        ],
        log,
    )  # fmt: skip
    proc.start()
    try:
        wait_until_sync(
            lambda: bool(processes.log_events(log, WAITING_EVENT)),
            timeout=60,
            what=f"a {WAITING_EVENT} log line",
        )
        (waiting, *_) = processes.log_events(log, WAITING_EVENT)
        assert "localmodelcaches.serving.kserve.io" in str(waiting["missing"]), waiting
        for path in ("/healthz", "/readyz"):  # ready: an install waiting for it goes on
            wait_until_sync(
                functools.partial(_answers_ok, metrics_port, path),
                timeout=30,
                what=f"{path} 200 while waiting for the CRDs",
            )
        assert proc.running(), "the controller exited without its CRDs"
        synced = processes.log_events(log, SYNCED_EVENT)
        assert synced == [], "informers synced without their CRDs"

        crd_install.install_crds(bare_plane, [OWN_CRDS, KSERVE_CRDS])
        wait_until_sync(
            lambda: bool(processes.log_events(log, SYNCED_EVENT)),
            timeout=60,
            what="the informers synced once the CRDs serve",
        )
        assert _status(metrics_port, "/readyz") == 200
        cache = {
            "apiVersion": "serving.kserve.io/v1alpha1",
            "kind": "LocalModelCache",
            "metadata": {"name": "after-the-crds"},
            "spec": {
                "sourceModelUri": "s3://bucket/model",
                "modelSize": "1Gi",
                "nodeGroups": ["workers"],
            },
        }
        bare_plane.kubectl("create", "-f", "-", input_text=json.dumps(cache))

        def finalized() -> bool:
            got = bare_plane.kubectl("get", "localmodelcache", "after-the-crds", "-o", "json")
            return FINALIZER in (json.loads(got.stdout)["metadata"].get("finalizers") or [])

        wait_until_sync(finalized, timeout=60, what="the controller adds its finalizer")
        assert proc.running(), "the controller exited"
    finally:
        proc.stop()
