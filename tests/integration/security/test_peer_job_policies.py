"""The peer-mode download Job at admission (manifests/policies/agent.yaml, design "Peer-mode
Job"): the agent's token may create it — the origin Job run as `localcache fetch` in the image
the agent's ServiceAccount names, with no credentials, plus one projected ServiceAccount token of
audience localcache-peer expiring within the hour, labelled localcache.kserve.io/peer-fetch —
and nothing wider: a token of another audience or a longer life, a projected volume with more
sources, a token in an unlabelled Job, hostPath, another command, another image or a
credential are refused. A tenant gains nothing from the shape: its own Jobs are its own
business, and a copy mounting a localcache download claim is refused."""

from __future__ import annotations

import copy
import datetime
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from localcache.agent.jobs import jobs, peerjob
from localcache.api import modelnode, nodegroup, peer
from localcache.caching import config, credentials, downloadcontainer, keys
from localcache.devenv.clientconfig import Credentials
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime.serving import certgen
from tests.integration.security import harness
from tests.integration.security.conftest import BASE

pytestmark = pytest.mark.usefixtures("policies")
Obj = dict[str, Any]
LMN = "/apis/serving.kserve.io/v1alpha1/localmodelnodes"
PEER_IMAGE_ANNOTATION = "localcache.kserve.io/peer-image"
PEER_LABEL = "localcache.kserve.io/peer-fetch"
TOKEN_VOLUME = "localcache-peer-token"
TOKEN_DIR = "/var/run/secrets/localcache/peer"


def _shipped_agent() -> Obj:
    docs = yaml.safe_load_all((BASE / "agent.yaml").read_text())
    (daemonset,) = [d for d in docs if d and d["kind"] == "DaemonSet"]
    return dict(daemonset)


AGENT_DAEMONSET = _shipped_agent()
(MANAGER,) = [
    c for c in AGENT_DAEMONSET["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"
]
IMAGE = str(MANAGER["image"])


@pytest.fixture(scope="module")
def agent_service_account(control_plane: ControlPlane, policies: None) -> Obj:
    """The agent's ServiceAccount as agent-rbac.yaml ships it (the peer-image policy's
    parameter): its annotation names the DaemonSet's image."""
    path = f"/api/v1/namespaces/{harness.AGENT_NS}/serviceaccounts/{harness.AGENT_SA}"
    found = harness.ok(control_plane.rest("GET", path), "the agent's ServiceAccount")
    assert found["metadata"]["annotations"][PEER_IMAGE_ANNOTATION] == IMAGE
    return dict(found)


@pytest.fixture
def node(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """A LocalModelNode: (name, uid)."""
    name = f"peer-node-{uuid.uuid4().hex[:6]}"
    body = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNode",
            "metadata": {"name": name}, "spec": {"localModels": []}}  # fmt: skip
    created = harness.ok(control_plane.rest("POST", LMN, body), f"LocalModelNode {name}")
    yield name, str(created["metadata"]["uid"])
    control_plane.rest("DELETE", f"{LMN}/{name}")


def _origin_job(node: tuple[str, str], *, namespace: str | None = None) -> Obj:
    """A cluster cache's download Job as agent/jobs/jobs.py builds it, with a credential."""
    uri = "s3://bucket/bert"
    entry = modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": uri, "modelName": "bert", "nodeGroup": "gpu"}
        | ({"namespace": namespace} if namespace else {})
    )
    lmn = modelnode.LocalModelNode.model_validate(
        {"metadata": {"name": node[0], "uid": node[1]}, "spec": {"localModels": []}}
    )
    group = nodegroup.LocalModelNodeGroup.model_validate(
        {"metadata": {"name": "gpu"}, "spec": {
            "storageLimit": "10Gi", "persistentVolumeClaimSpec": {},
            "persistentVolumeSpec": {"hostPath": {"path": "/mnt/models"}}}}
    )  # fmt: skip
    secret = {"name": "AWS_SECRET_ACCESS_KEY",
              "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}}  # fmt: skip
    return jobs.build_job(
        entry=entry, node=lmn, node_group=group, storage_key=keys.storage_key(uri), attempt=0,
        container=downloadcontainer.select_container(uri, [], config.StorageInitializerConfig()),
        injection=credentials.Injection(uri=uri, env=(secret,)),
        local_model=config.LocalModelConfig(), suffix=uuid.uuid4().hex[:8], run_as_user=65532,
    )  # fmt: skip


def _token_volume(audience: str = peer.TOKEN_AUDIENCE, expiration: int = 600) -> Obj:
    token = {"audience": audience, "expirationSeconds": expiration, "path": "token"}
    return {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def _peer_job(origin: Obj, *, image: str = IMAGE) -> Obj:
    """The design's peer-mode Job made from `origin` (what agent/jobs/peerjob.py builds)."""
    job = copy.deepcopy(origin)
    job["metadata"]["labels"][PEER_LABEL] = "true"
    pod = job["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    ca = certgen.issue_bundle(
        [peer.SERVER_NAME], now=datetime.datetime.now(datetime.UTC)
    ).ca_cert_pem.decode()
    main |= {
        "image": image,
        "command": ["localcache", "fetch"],
        "args": ["--storage-key", job["metadata"]["labels"]["storageKey"],
                 "--digest", "sha256:" + "0" * 64,
                 "--source", "node-b=https://10.0.0.2:8476",
                 "--token-file", f"{TOKEN_DIR}/token", "--ca-env", "LOCALCACHE_PEER_CA",
                 "--report", "/dev/termination-log", jobs.MOUNT_PATH],
        "env": [{"name": "LOCALCACHE_PEER_CA", "value": ca}],
        "volumeMounts": [*main["volumeMounts"][:1],
                         {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}],
    }  # fmt: skip
    pod["volumes"] = [*pod["volumes"][:1], _token_volume()]
    return job


def _jobs(namespace: str, dry_run: bool = True) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs" + ("?dryRun=All" if dry_run else "")


def _pod(job: Obj) -> Obj:
    return dict(job["spec"]["template"]["spec"])


def _main(job: Obj) -> Obj:
    return dict(_pod(job)["containers"][0])


async def _policies_enforced(create: Callable[[Obj], Any], good: Obj) -> None:
    """Policies apply some time after their creation (and their parameters after that): wait
    until both peer rules refuse what they must, so that an admission afterwards means it."""
    for what, change, says in (REFUSED[0], REFUSED[7]):  # another audience, another image
        bad = copy.deepcopy(good)
        change(bad)

        def refused(bad: Obj = bad, what: str = what) -> str:
            return harness.denied(create(bad), f"a peer-mode Job with {what}")

        message = await wait_until(refused, timeout=30, what=f"{what} is refused at admission")
        assert says in message, message


async def test_the_agents_peer_mode_job_is_admitted(
    control_plane: ControlPlane, agent_service_account: Obj, node: tuple[str, str]
) -> None:
    token = harness.agent_token(control_plane, node[0])
    job = _peer_job(_origin_job(node))

    def create(body: Obj, dry_run: bool = True) -> Any:
        path = _jobs(harness.JOB_NAMESPACE, dry_run)
        return harness.rest_as_token(control_plane, token, "POST", path, body)

    await _policies_enforced(create, job)
    created = harness.ok(create(job, dry_run=False), "the agent's peer-mode Job")
    control_plane.rest(
        "DELETE", f"{_jobs(harness.JOB_NAMESPACE, False)}/{created['metadata']['name']}"
    )


def _set(path: str, value: Any) -> Callable[[Obj], None]:
    def change(job: Obj) -> None:
        target = job
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = value

    return change


def _volumes(job: Obj) -> list[Obj]:
    return list(_pod(job)["volumes"])


def _add_volume(volume: Obj) -> Callable[[Obj], None]:
    return lambda job: job["spec"]["template"]["spec"]["volumes"].append(volume)


def _replace_token(volume: Obj) -> Callable[[Obj], None]:
    def change(job: Obj) -> None:
        job["spec"]["template"]["spec"]["volumes"][-1] = volume

    return change


POD = "spec.template.spec"
REFUSED: list[tuple[str, Callable[[Obj], None], str]] = [
    ("a token of another audience", _replace_token(_token_volume(audience="vault")),
     "only as the peer token"),
    ("the default (apiserver) audience",
     _replace_token({"name": TOKEN_VOLUME, "projected": {"sources": [
         {"serviceAccountToken": {"expirationSeconds": 600, "path": "token"}}]}}),
     "only as the peer token"),
    ("a token living a day", _replace_token(_token_volume(expiration=86400)),
     "only as the peer token"),
    ("a projected Secret beside the token",
     _replace_token({"name": TOKEN_VOLUME, "projected": {"sources": [
         _token_volume()["projected"]["sources"][0], {"secret": {"name": "s3"}}]}}),
     "only as the peer token"),
    ("hostPath /", _add_volume({"name": "host", "hostPath": {"path": "/"}}), "no hostPath"),
    ("another command", _set(f"{POD}.containers.0.command", ["sh", "-c", "cat /var/run/x"]),
     "command [localcache, fetch]"),
    ("the fetch command through a shell",
     _set(f"{POD}.containers.0.command", ["sh", "-c", "localcache fetch"]),
     "command [localcache, fetch]"),
    ("another image", _set(f"{POD}.containers.0.image", "busybox"), "peer-image of ServiceAccount"),
    ("a credential env",
     _set(f"{POD}.containers.0.env", [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
         "secretKeyRef": {"name": "s3", "key": "secret"}}}]),
     "no credentials"),
    ("a Secret volume", _add_volume({"name": "creds", "secret": {"secretName": "s3"}}),
     "no credentials"),
    ("a second container",
     lambda job: job["spec"]["template"]["spec"]["containers"].append(
         {**_main(job), "name": "side"}),
     "one container"),
    ("the token without the peer-fetch label",
     lambda job: job["metadata"]["labels"].pop(PEER_LABEL), "carry a projected token"),
    ("the peer-fetch label not 'true'",
     lambda job: job["metadata"]["labels"].update({PEER_LABEL: "yes"}),
     "peer-mode download Job"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "says"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_stolen_agent_token_gets_no_wider_peer_job(
    control_plane: ControlPlane,
    agent_service_account: Obj,
    node: tuple[str, str],
    what: str,
    change: Callable[[Obj], None],
    says: str,
) -> None:
    token = harness.agent_token(control_plane, node[0])
    good = _peer_job(_origin_job(node))

    def create(body: Obj) -> Any:
        return harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), body
        )

    await wait_until(
        lambda: create(good)[0] == 201, timeout=30, what="the agent's peer-mode Job is admitted"
    )
    bad = copy.deepcopy(good)
    change(bad)
    # policies apply some time after their creation: wait for the denial, then read it
    message = await wait_until(
        lambda: harness.denied(create(bad), f"a peer-mode Job of the agent's token with {what}"),
        timeout=30,
        what=f"a peer-mode Job of the agent's token with {what} is denied at admission",
    )
    assert says in message, message


async def test_the_origin_job_is_still_admitted_and_gets_no_token(
    control_plane: ControlPlane, agent_service_account: Obj, node: tuple[str, str]
) -> None:
    """Peer distribution off: the download Job is unchanged and admitted; the peer token is
    what turns it into a peer-mode Job, so the origin Job (with its credentials) cannot have
    one."""
    token = harness.agent_token(control_plane, node[0])
    origin = _origin_job(node)
    await wait_until(
        lambda: harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), origin
        )[0] == 201,
        timeout=30,
        what="the agent's origin download Job is admitted",
    )  # fmt: skip
    with_token = copy.deepcopy(origin)
    _pod(with_token)["volumes"].append(_token_volume())
    message = await wait_until(
        lambda: harness.denied(
            harness.rest_as_token(
                control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), with_token
            ),
            "an origin Job of the agent's token with the peer token",
        ),
        timeout=30,
        what="an origin Job of the agent's token with the peer token is denied",
    )
    assert "carry a projected token" in message, message


async def test_a_tenant_gets_nothing_from_the_peer_shape(
    control_plane: ControlPlane,
    agent_service_account: Obj,
    node: tuple[str, str],
    namespace: str,
    tenant: Credentials,
) -> None:
    """A tenant's own peer-shaped Job in its namespace is its own business (the policies
    confine the agent's token; peers serve only Jobs recorded by a node's agent). Made to
    mount a localcache download claim, the same Job is refused."""
    token = harness.agent_token(control_plane, node[0])
    await _policies_enforced(
        lambda body: harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), body
        ),
        _peer_job(_origin_job(node)),
    )
    job = _peer_job(_origin_job(node, namespace=namespace))
    job["metadata"]["namespace"] = namespace
    job["metadata"].pop("ownerReferences")
    key = job["metadata"]["labels"].pop("storageKey")  # the agent's label: not the tenant's
    claim = _volumes(job)[0]["persistentVolumeClaim"]["claimName"]
    pv, _ = harness.volume_pair(namespace=namespace, claim=claim, role="download", key=key)
    harness.ok(control_plane.rest("POST", "/api/v1/persistentvolumes", pv), "download PV")
    try:
        message = await wait_until(
            lambda: harness.denied(
                control_plane.rest("POST", _jobs(namespace), job, creds=tenant),
                "a tenant's peer-shaped Job mounting a download claim",
            ),
            timeout=30,
            what="a tenant's peer-shaped Job mounting a localcache download claim is refused",
        )
        assert "only the localcache agent's download Jobs may mount it" in message, message
        own = copy.deepcopy(job)
        _pod(own)["volumes"][0] = {"name": jobs.VOLUME_NAME, "emptyDir": {}}
        status, body = control_plane.rest("POST", _jobs(namespace), own, creds=tenant)
        assert status == 201, f"a tenant's own peer-shaped Job was refused: {status} {body}"
    finally:
        control_plane.rest("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


@pytest.fixture
def job_namespace_accounts(control_plane: ControlPlane) -> Iterator[str]:
    """`default` (no ServiceAccount controller runs here) and an unlabelled ServiceAccount in
    the job namespace: the ServiceAccount rule's parameters; yields the unlabelled one."""
    path = f"/api/v1/namespaces/{harness.JOB_NAMESPACE}/serviceaccounts"
    other = f"not-a-downloader-{uuid.uuid4().hex[:6]}"
    made = []
    for name in ("default", other):
        if control_plane.rest("GET", f"{path}/{name}")[0] == 404:
            body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
            harness.ok(control_plane.rest("POST", path, body), f"ServiceAccount {name}")
            made.append(name)
    yield other
    for name in made:
        control_plane.rest("DELETE", f"{path}/{name}")


SECRET_ENV = {"name": "AWS_SECRET_ACCESS_KEY",
              "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}}  # fmt: skip


def _built_peer_job(node: tuple[str, str], prove_uri: str | None = None) -> Obj:
    """The peer-mode Job agent/jobs/peerjob.py builds from a cluster cache's origin Job."""
    origin = _origin_job(node)
    return peerjob.peer_job(
        origin, image=IMAGE, storage_key=origin["metadata"]["labels"]["storageKey"],
        digest="sha256:" + "0" * 64, sources=[("node-b", "https://10.0.0.2:8476")],
        ca_pem=certgen.issue_bundle(
            [peer.SERVER_NAME], now=datetime.datetime.now(datetime.UTC)
        ).ca_cert_pem.decode(),
        max_size=1 << 30,
        injection=credentials.Injection(uri="s3://bucket/bert", env=(SECRET_ENV,)),
        prove_uri=prove_uri,
    )  # fmt: skip


async def test_the_peer_mode_job_peerjob_builds_is_admitted_in_the_job_namespace(
    control_plane: ControlPlane,
    agent_service_account: Obj,
    node: tuple[str, str],
    job_namespace_accounts: str,
) -> None:
    """agent/jobs/peerjob.py names ServiceAccount `default` (a projected token needs one);
    the job namespace admits the agent's Jobs as `default` or a ServiceAccount labelled
    localmodel.kserve.io/download=true, also when named (the e2e test found every cluster
    cache's peer-mode Job refused)."""
    token = harness.agent_token(control_plane, node[0])
    job = _built_peer_job(node)
    assert _pod(job)["serviceAccountName"] == "default"

    def create(body: Obj) -> Any:
        return harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), body
        )

    await _policies_enforced(create, job)
    unlabelled = copy.deepcopy(job)
    unlabelled["spec"]["template"]["spec"]["serviceAccountName"] = job_namespace_accounts
    message = await wait_until(
        lambda: harness.denied(create(unlabelled), "a Job as an unlabelled ServiceAccount"),
        timeout=30,
        what="a peer-mode Job as an unlabelled ServiceAccount is refused in the job namespace",
    )
    assert "is not labelled" in message, message
    harness.ok(create(job), "the peer-mode Job peerjob builds, as ServiceAccount default")


async def test_a_peer_mode_job_that_proves_access_keeps_its_credentials(
    control_plane: ControlPlane, agent_service_account: Obj, node: tuple[str, str]
) -> None:
    """A peer-mode Job whose sources hold the model for other scopes signs presigned HEADs
    with its own credentials (`--prove-s3`): the policy admits its Secret env and volumes
    then, and only then."""
    token = harness.agent_token(control_plane, node[0])
    job = _built_peer_job(node, prove_uri="s3://bucket/bert")
    assert SECRET_ENV in _main(job)["env"], "the proving pod keeps its credential env"
    assert "--prove-s3" in _main(job)["args"]
    volumes = job["spec"]["template"]["spec"]["volumes"]
    volumes.insert(len(volumes) - 1, {"name": "creds", "secret": {"secretName": "s3"}})

    def create(body: Obj) -> Any:
        return harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE), body
        )

    await _policies_enforced(create, job)
    harness.ok(create(job), "a proving peer-mode Job with its credential env and Secret volume")
    unproving = copy.deepcopy(job)
    args = _main(unproving)["args"]
    at = args.index("--prove-s3")
    unproving["spec"]["template"]["spec"]["containers"][0]["args"] = args[:at] + args[at + 2 :]
    message = await wait_until(
        lambda: harness.denied(create(unproving), "credentials without --prove-s3"),
        timeout=30,
        what="a peer-mode Job with credentials but no --prove-s3 is refused",
    )
    assert "no credentials" in message, message
