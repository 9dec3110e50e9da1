"""One namespace cannot fill a node's LocalModelNode (security review finding 5, the budget
half): a tenant holding only the right to create namespace caches floods a node with caches
of the longest URI the CRDs allow; its newest caches are left out of the node and report why,
while another tenant's cache and a cluster cache created after the flood still reach it.
Real apiserver and kube-controller-manager."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from localcache.api import groupversion, modelcache
from localcache.caching import conditions, entries
from localcache.devenv.waiting import wait_until
from tests.integration.controllers.conftest import URI, Env

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]


async def _tenant_creates_caches(env: Env, namespace: str, names: list[str], uri: str) -> None:
    """Create namespace caches of `uri` as user `flood-<namespace>`, who may create
    LocalModelNamespaceCaches in `namespace` and nothing else."""
    user = f"flood-{namespace}"
    await asyncio.to_thread(
        env.plane.kubectl, "create", "role", "cache-maker", "-n", namespace, "--verb=create",
        "--resource=localmodelnamespacecaches.serving.kserve.io",
    )  # fmt: skip
    await asyncio.to_thread(
        env.plane.kubectl, "create", "rolebinding", user, "--role=cache-maker",
        f"--user={user}", "-n", namespace,
    )  # fmt: skip
    info = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
    docs = [
        {
            "apiVersion": info.api_version,
            "kind": info.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"sourceModelUri": f"{uri}/{name}", "modelSize": "1", "nodeGroups": [group]},
        }
        for name, group in ((n, env.name("gpu1")) for n in names)
    ]
    await asyncio.to_thread(
        env.plane.kubectl, "create", f"--as={user}", "-n", namespace, "-f", "-",
        input_text=yaml.safe_dump_all(docs),
    )  # fmt: skip
    env.track_caches(info.kind, namespace, names)


async def test_a_namespace_flooding_a_node_loses_only_its_own_newest_entries(env: Env) -> None:
    group = env.name("gpu1")
    await env.group(group, group)
    node = await env.node(env.name("node-1"), group)
    attacker = await env.namespace_("flood")
    victim = await env.namespace_("victim")
    await env.start()
    wide = "https://models.example/" + "a" * (modelcache.MAX_SOURCE_URI_LENGTH - 40)
    cost = len(json.dumps({"sourceModelUri": wide, "modelName": "wide-00"})) + 200
    count = entries.NAMESPACE_BUDGET // (cost + entries.STATUS_ALLOWANCE) + 3
    flood = [f"wide-{i:02}" for i in range(count)]
    await _tenant_creates_caches(env, attacker, flood, wide)
    await env.cache(env.name("private"), [group], namespace=victim)
    await env.cache(env.name("shared"), [group], uri=URI + "-shared")

    def listed(found: dict[tuple[str, str], Obj]) -> bool:
        return (victim, env.name("private")) in found and ("", env.name("shared")) in found

    async def others_listed() -> dict[tuple[str, str], Obj]:
        found = await env.entries(node)
        return found if listed(found) else {}

    found = await wait_until(
        others_listed,
        timeout=60,
        what=f"LocalModelNode {node} lists the victim's cache and the cluster cache",
    )
    kept = sorted(name for ns, name in found if ns == attacker)
    assert 0 < len(kept) < count, f"the flood took {len(kept)} of {count} entries"
    lmn_bytes = sum(entries.entry_cost(e) for e in (await env.entries(node)).values())
    assert lmn_bytes <= entries.NODE_BUDGET
    left_out = sorted(set(flood) - set(kept))

    async def degraded_by_budget() -> dict[str, str]:
        status = await env.cache_status(left_out[-1], attacker)
        found = [c for c in status.get("conditions") or [] if c["type"] == "Degraded"]
        return found[0] if found and found[0]["reason"] == conditions.REASON_OVER_BUDGET else {}

    degraded = await wait_until(
        degraded_by_budget,
        timeout=60,
        what=f"the attacker's cache {left_out[-1]} is Degraded: left out of {node}",
    )
    assert degraded["status"] == "True"
    assert node in degraded["message"]
    assert f"namespace {attacker}" in degraded["message"]
    victim_status = await env.wait_status(
        env.name("private"),
        victim,
        nodeStatus={node: "NodeDownloadPending"},
        what="the victim's cache counts the node as a member",
        within=60,
    )
    victim_degraded = [c for c in victim_status["conditions"] if c["type"] == "Degraded"]
    assert victim_degraded[0]["status"] == "False", victim_degraded
