"""The peer-image policy after an uninstall and a reinstall with another image (CI failure of
the real-node peer tests: every peer-mode Job refused). The apiserver stops its informer for
a paramKind it does not otherwise watch once no binding uses that kind (kubernetes/kubernetes
#130887), and never restarts it: with the agent DaemonSet as the parameter, the policy went on
judging by the DaemonSet of the previous install. Its parameter is the agent's ServiceAccount,
which the apiserver always watches: the reinstalled policy judges by the new annotation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests.integration.security import harness
from tests.integration.security.conftest import POLICIES
from tests.integration.security.test_peer_job_policies import (
    IMAGE,
    PEER_IMAGE_ANNOTATION,
    _jobs,
    _origin_job,
    _peer_job,
    node,
)

pytestmark = pytest.mark.usefixtures("policies")
__all__ = ["node"]  # the LocalModelNode fixture
Obj = dict[str, Any]
OTHER_IMAGE = "registry.example/localcache:0.2.0"
POLICY = "localcache-agent-peer-jobs"
SA_PATH = f"/api/v1/namespaces/{harness.AGENT_NS}/serviceaccounts/{harness.AGENT_SA}"


def _annotate(control_plane: ControlPlane, image: str) -> None:
    body = {"metadata": {"annotations": {PEER_IMAGE_ANNOTATION: image}}}
    harness.ok(
        control_plane.rest("PATCH", SA_PATH, body, content_type="application/merge-patch+json"),
        "the agent ServiceAccount's peer-image annotation",
    )


@pytest.fixture
def shipped_image(control_plane: ControlPlane) -> Iterator[None]:
    yield
    _annotate(control_plane, IMAGE)
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(POLICIES))


async def test_a_reinstall_with_another_image_is_judged_by_the_new_image(
    control_plane: ControlPlane, node: tuple[str, str], shipped_image: None
) -> None:
    token = harness.agent_token(control_plane, node[0])
    origin = _origin_job(node)
    shipped, other = _peer_job(origin), _peer_job(origin, image=OTHER_IMAGE)

    def admitted(job: Obj) -> bool:
        path = _jobs(harness.JOB_NAMESPACE)
        status, _ = harness.rest_as_token(control_plane, token, "POST", path, job)
        return status in (200, 201)

    def judged(good: Obj, bad: Obj) -> bool:
        return admitted(good) and not admitted(bad)

    await wait_until(lambda: judged(shipped, other), timeout=30, what=f"only {IMAGE} admitted")
    # uninstall: the policy and its binding go (only these: the other policies' parameter
    # kinds keep their bindings, so this run's control plane keeps enforcing them)
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        control_plane.kubectl("delete", kind, POLICY, "--wait=true")
    await wait_until(
        lambda: admitted(other), timeout=30, what="the peer-image policy no longer in force"
    )
    # reinstall with another image
    _annotate(control_plane, OTHER_IMAGE)
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(POLICIES))
    await wait_until(
        lambda: judged(other, shipped),
        timeout=60,
        what=f"the reinstalled policy admits {OTHER_IMAGE} and refuses {IMAGE}",
    )
