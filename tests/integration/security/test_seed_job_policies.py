"""The origin Job of an `s3://` seed at admission (manifests/policies/agent.yaml): the agent's
token may create it with one init container, `localcache origin-sums` in the image the
agent's ServiceAccount names (it holds the download's credentials to HEAD the objects), in a
Job labelled localcache.kserve.io/origin-sums — and nothing wider: an init container of
another image or command, in an unlabelled Job or a peer-mode one, a second one, or one
running as root is refused."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from localcache.agent.jobs import peerjob
from localcache.api import nodegroup
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests.integration.security import harness
from tests.integration.security.test_peer_job_policies import (
    IMAGE,
    PEER_LABEL,
    _jobs,
    _origin_job,
    agent_service_account,
    node,
)

pytestmark = pytest.mark.usefixtures("policies")
__all__ = ["agent_service_account", "node"]  # fixtures
Obj = dict[str, Any]
URI = "s3://bucket/bert"
GROUP = nodegroup.LocalModelNodeGroup.model_validate(
    {"metadata": {"name": "gpu"}, "spec": {
        "storageLimit": "10Gi", "persistentVolumeClaimSpec": {},
        "persistentVolumeSpec": {"hostPath": {"path": "/mnt/models"}},
        "peerDistribution": {"enabled": True}}}
)  # fmt: skip


def _seed(node: tuple[str, str]) -> Obj:
    """The seed's origin Job as agent/jobs/peerjob.py `seed_job` builds it."""
    job = peerjob.seed_job(_origin_job(node), GROUP, URI, image=IMAGE)
    assert job["spec"]["template"]["spec"]["initContainers"], "the checksum step"
    return job


def _init(change: Callable[[Obj], None]) -> Callable[[Obj], None]:
    return lambda job: change(job["spec"]["template"]["spec"]["initContainers"][0])


# (what, change, what the denial says: any of these; several policies may refuse one Job,
# and the apiserver names the first that does)
REFUSED: list[tuple[str, Callable[[Obj], None], tuple[str, ...]]] = [
    ("another image", _init(lambda c: c.update(image="busybox")),
     ("peer-image of ServiceAccount",)),
    ("another command", _init(lambda c: c.update(command=["sh", "-c", "env"])),
     ("no init container but one",)),
    ("no origin-sums label",
     lambda job: job["metadata"]["labels"].pop(peerjob.SUMS_LABEL),
     ("no init container but one",)),
    ("a peer-fetch label too",
     lambda job: job["metadata"]["labels"].update({PEER_LABEL: "true"}),
     ("no init container but one", "peer-image of ServiceAccount", "peer-mode download Job")),
    ("a second init container",
     lambda job: job["spec"]["template"]["spec"]["initContainers"].append(
         {**job["spec"]["template"]["spec"]["initContainers"][0], "name": "again"}),
     ("no init container but one",)),
    ("an init container as root",
     _init(lambda c: c["securityContext"].update(runAsUser=0)), ("run as non-root",)),
]  # fmt: skip


async def test_the_seed_job_is_admitted_and_nothing_wider(
    control_plane: ControlPlane, agent_service_account: Obj, node: tuple[str, str]
) -> None:
    token = harness.agent_token(control_plane, node[0])
    good = _seed(node)

    def create(body: Obj) -> Any:
        return harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), body
        )

    # policies apply some time after their creation: wait for the image rule to refuse
    wrong_image = copy.deepcopy(good)
    REFUSED[0][1](wrong_image)
    await wait_until(
        lambda: harness.denied(create(wrong_image), "a seed's init container of another image"),
        timeout=30,
        what="a seed Job whose init container runs another image is refused at admission",
    )
    harness.ok(create(good), "the seed's origin Job with its origin-sums init container")
    for what, change, says in REFUSED:
        bad = copy.deepcopy(good)
        change(bad)
        message = harness.denied(create(bad), f"a seed Job with {what}")
        assert any(said in message for said in says), f"{what}: {message}"
