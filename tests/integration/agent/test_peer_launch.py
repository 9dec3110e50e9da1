"""Peer distribution at launch (issue 23): with the node group's `peerDistribution` on and a
peer LocalModelNode serving the model in the same credential scope, the agent creates a
peer-mode Job listing it as source; another scope, or a peer Job that exits "use origin",
leads to an origin Job (the latter at once, without the retry backoff); with it off, the Job
is the origin Job and the agent never lists LocalModelNodes."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import downloads, peering
from localcache.agent.jobs import peerjob
from localcache.api import groupversion, modelnode
from localcache.caching import keys
from localcache.runtime import kube
from tests.integration.agent.harness import IMAGE, URI, Agent, Obj, entry, eventually

pytestmark = pytest.mark.kcm

LMN = groupversion.LOCAL_MODEL_NODE
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP
KEY = keys.storage_key(URI)
PEER_IMAGE = "localcache:peer-test"
ENDPOINT = "https://10.1.2.3:8476"
DIGEST = "sha256:" + "7" * 64
CA = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"


@pytest.fixture
def node_lists(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Unfiltered LISTs of LocalModelNodes made through `kube.Kube` (the agent's planner
    LIST; its informer filters its own node by field selector)."""
    seen: list[str] = []
    original = kube.Kube.list

    async def spy(self: kube.Kube, res: kube.Resource, **kw: Any) -> kube.ObjList:
        if res.plural == LMN.plural and not kw.get("field_selector"):
            seen.append(res.plural)
        return await original(self, res, **kw)

    monkeypatch.setattr(kube.Kube, "list", spy)
    return seen


async def _enable_peers(agent: Agent) -> None:
    await agent.patch(
        LMNG.path(name=agent.group), {"spec": {"peerDistribution": {"enabled": True}}}
    )


async def _start(agent: Agent, tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text(CA)
    await agent.start(peer=peering.PeerSettings(image=PEER_IMAGE, ca_path=ca))


def _scope(agent: Agent) -> str:
    [unit] = downloads.units(
        [modelnode.LocalModelInfo.model_validate(entry("iris", group=agent.group))],
        node_name=agent.node,
        job_namespace=agent.namespace,
    )
    return unit.scope_id


async def _peer_node(agent: Agent, *, scope: str) -> str:
    """Another node of the group holding the model, serving it to `scope`."""
    name = f"a-peer-{uuid.uuid4().hex[:8]}"  # sorts before the test's node: a seed candidate
    obj = {
        "apiVersion": LMN.api_version,
        "kind": LMN.kind,
        "metadata": {"name": name},
        "spec": {"localModels": [entry("iris", group=agent.group)]},
    }
    await agent.create(LMN.path(), obj, cleanup=True)
    status = {
        "modelStatus": {"iris": "ModelDownloaded"},
        "peer": {
            "endpoint": ENDPOINT,
            "models": [{"storageKey": KEY, "digest": DIGEST, "scopes": [scope], "bytes": 3}],
        },
    }
    await agent.patch(f"{LMN.path(name=name)}/status", {"status": status})
    return name


def _main(job: Obj) -> Obj:
    container: Obj = job["spec"]["template"]["spec"]["containers"][0]
    return container


def _is_origin(job: Obj) -> bool:
    main = _main(job)
    return (
        not peerjob.is_peer(job)
        and main["args"] == [URI, "/mnt/models"]
        and main["image"] == IMAGE
        and "command" not in main
    )


async def _source(agent: Agent) -> str | None:
    progress = (await agent.node_status()).get("modelProgress") or {}
    value = (progress.get("iris") or {}).get("source")
    return str(value) if value else None


async def test_a_peer_in_the_same_scope_gets_a_peer_mode_job(
    agent: Agent, tmp_path: Path, node_lists: list[str]
) -> None:
    await _enable_peers(agent)
    peer = await _peer_node(agent, scope=_scope(agent))
    await _start(agent, tmp_path)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)

    assert peerjob.is_peer(job)
    main = _main(job)
    assert main["image"] == PEER_IMAGE
    assert main["command"] == ["localcache", "fetch"]
    assert main["args"][main["args"].index("--source") + 1] == f"{peer}={ENDPOINT}"
    assert main["args"][main["args"].index("--digest") + 1] == DIGEST
    assert {"name": "LOCALCACHE_PEER_CA", "value": CA} in main["env"]
    assert node_lists, "the planner listed the group's LocalModelNodes"
    assert await eventually(lambda: _source(agent), what="source in status") == f"peer/{peer}"

    report = json.dumps({"outcome": "complete", "peerBytes": 3, "sources": {peer: 3}})
    await agent.finish(job, succeed=True, files={"m": b"abc"}, report=report)
    status = await agent.wait_status({"iris": "ModelDownloaded"})
    progress = status["modelProgress"]["iris"]
    assert (progress["source"], progress["peerBytes"], progress["originBytes"]) == (
        f"peer/{peer}",
        3,
        0,
    )


async def test_a_peer_of_another_scope_means_an_origin_job(agent: Agent, tmp_path: Path) -> None:
    await _enable_peers(agent)
    await _peer_node(agent, scope="f" * 64)
    await _start(agent, tmp_path)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)

    assert _is_origin(job)
    assert await eventually(lambda: _source(agent), what="source in status") == "origin"
    await agent.finish(job, succeed=True, files={"m": b"abcd"})
    status = await agent.wait_status({"iris": "ModelDownloaded"})
    assert status["modelProgress"]["iris"]["originBytes"] == 4


async def test_a_peer_job_that_says_use_origin_is_followed_by_an_origin_job_at_once(
    agent: Agent, tmp_path: Path
) -> None:
    # A backoff far beyond the test's patience: only the fast fallback can launch in time.
    await agent.configure(
        local_model={"downloadRetryBackoffInSecs": 600, "downloadRetryMaxBackoffInSecs": 600}
    )
    await _enable_peers(agent)
    await _peer_node(agent, scope=_scope(agent))
    await _start(agent, tmp_path)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    assert peerjob.is_peer(job)

    report = json.dumps({"outcome": "use-origin", "reason": "no source could serve"})
    await agent.finish(job, succeed=False, exit_code=3, report=report)
    [_, retry] = await agent.wait_jobs(2)
    assert _is_origin(retry)
    assert retry["metadata"]["name"].split("-")[-2] == "1", "attempt 1"

    async def fell_back() -> bool | None:
        # the fallback is counted before the origin Job's source reaches the status
        counted = agent.metric("localcache_p2p_fallbacks_total", reason="use-origin")
        return True if counted == 1 and await _source(agent) == "origin" else None

    await eventually(fell_back, what="one use-origin fallback counted, and source origin")
    assert agent.metric("localcache_p2p_fallbacks_total", reason="use-origin") == 1


async def test_with_peer_distribution_off_the_job_is_todays_and_nothing_is_listed(
    agent: Agent, tmp_path: Path, node_lists: list[str]
) -> None:
    await agent.patch(
        LMNG.path(name=agent.group), {"spec": {"peerDistribution": {"enabled": False}}}
    )  # on by default
    await _peer_node(agent, scope=_scope(agent))
    await _start(agent, tmp_path)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)

    assert _is_origin(job)
    pod = job["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["kserve-pvc-source"]
    assert "env" not in _main(job) or all(
        e["name"] != "LOCALCACHE_PEER_CA" for e in _main(job)["env"]
    )
    await agent.finish(job, succeed=True, files={"m": b"abcd"})
    status = await agent.wait_status({"iris": "ModelDownloaded"})
    progress = status["modelProgress"]["iris"]
    assert not {"source", "originBytes", "peerBytes"} & set(progress)
    assert node_lists == [], "no LIST of LocalModelNodes with peer distribution off"


async def _refuse_peer_jobs(agent: Agent) -> None:
    """An admission policy refusing peer-mode Jobs in the agent's Job namespace (as a policy
    out of line with the agent's --peer-image does), in force before the agent starts."""
    name, label, ns_label = (
        f"refuse-peer-{uuid.uuid4().hex[:8]}",
        peerjob.PEER_LABEL,
        "kubernetes.io/metadata.name",
    )
    vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    binding = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    rule = {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["jobs"]}  # fmt: skip
    await agent.create(vap, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [rule]},
                 "validations": [{"expression": "false", "message": "no peer-mode Jobs here"}]},
    }, cleanup=True)  # fmt: skip
    await agent.create(binding, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {ns_label: agent.namespace}},
            "objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]},
        }},
    }, cleanup=True)  # fmt: skip
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
    probe = {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"generateName": "probe-", "labels": {label: "true"}},
             "spec": {"template": {"spec": pod}}}  # fmt: skip
    path = f"/apis/batch/v1/namespaces/{agent.namespace}/jobs?dryRun=All"

    async def refused() -> bool | None:
        status, _ = await asyncio.to_thread(agent.plane.rest, "POST", path, probe)
        return True if status in (403, 422) else None

    await eventually(refused, what="the policy refusing peer-mode Jobs is in force")


async def test_a_peer_job_the_api_refuses_is_replaced_by_an_origin_job_at_once(
    agent: Agent, tmp_path: Path
) -> None:
    # An entry whose Job was not created is retried every reconcilation_frequency_in_secs:
    # beyond the test's patience, so only the same-pass fallback can launch in time.
    await agent.configure(local_model={"reconcilationFrequencyInSecs": 600})
    await _refuse_peer_jobs(agent)
    await _enable_peers(agent)
    await _peer_node(agent, scope=_scope(agent))
    await _start(agent, tmp_path)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    assert _is_origin(job)

    async def fell_back() -> bool | None:
        counted = agent.metric("localcache_p2p_fallbacks_total", reason="peer-job-refused")
        return True if counted >= 1 and await _source(agent) == "origin" else None

    await eventually(fell_back, what="a peer-job-refused fallback counted, and source origin")
