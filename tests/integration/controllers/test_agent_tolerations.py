"""The agent DaemonSet follows the node groups' tolerations on the real apiserver.

A copy of the shipped agent DaemonSet (manifests/base/agent.yaml, in the test's namespace, with
a node selector no node has, so no pod is ever made) is applied by `kubectl apply` as an
installer would, with a toleration of its own; the `agent-tolerations` controller runs
in-process. Node groups are cluster-scoped and other tests' may exist, so assertions name this
test's own (unique) toleration keys.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.api import groupversion
from localcache.caching import agenttolerations as rules
from localcache.controllers import agenttolerations, state
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, factory, keys, kube, manager, metrics

Obj = dict[str, Any]
AGENT_YAML = Path(__file__).resolve().parents[3] / "manifests" / "base" / "agent.yaml"


def _tol(key: str, **fields: Any) -> Obj:
    return rules.canonical({"key": key, "operator": "Exists", "effect": "NoSchedule", **fields})


class World:
    def __init__(self, plane: ControlPlane, api: kube.Kube, namespace: str) -> None:
        self.plane, self.api, self.namespace = plane, api, namespace
        self.suffix = uuid.uuid4().hex[:6]
        self.groups: list[str] = []
        self.shipped: Obj = yaml.safe_load(AGENT_YAML.read_text())
        self.name = self.shipped["metadata"]["name"]

    def key(self, base: str) -> str:
        return f"example.com/{base}-{self.suffix}"

    def installer_apply(self, tolerations: list[Obj] | None, *, name: str | None = None) -> str:
        """`kubectl apply` (client-side) of the shipped DaemonSet with `tolerations` (None:
        the shipped one's, none at all); returns kubectl's output."""
        doc = copy.deepcopy(self.shipped)
        doc["metadata"]["namespace"] = self.namespace
        doc["metadata"]["name"] = name or self.name
        pod = doc["spec"]["template"]["spec"]
        pod["nodeSelector"] = {f"example.com/no-such-node-{self.suffix}": "true"}
        if tolerations is not None:
            pod["tolerations"] = tolerations
        return self.plane.kubectl("apply", "-f", "-", input_text=json.dumps(doc)).stdout

    async def tolerations(self, name: str | None = None) -> list[Obj]:
        ds = await self.api.get(kube.DAEMON_SETS, name or self.name, namespace=self.namespace)
        return list(ds["spec"]["template"]["spec"].get("tolerations") or [])

    async def group(self, base: str, tolerations: list[Any]) -> str:
        name = f"{base}-{self.suffix}"
        spec = {
            "storageLimit": "1Gi",
            "persistentVolumeSpec": {
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "1Gi"},
                "local": {"path": "/mnt/models"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "none", "operator": "Exists"}]}
                        ]
                    }
                },
            },
            "persistentVolumeClaimSpec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
            "tolerations": tolerations,
        }
        body = {
            "apiVersion": groupversion.LOCAL_MODEL_NODE_GROUP.api_version,
            "kind": groupversion.LOCAL_MODEL_NODE_GROUP.kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.api.create(state.LOCAL_MODEL_NODE_GROUPS, body)
        self.groups.append(name)
        return name

    async def set_group_tolerations(self, name: str, tolerations: list[Any]) -> None:
        patch = {"spec": {"tolerations": tolerations}}
        await self.api.patch(state.LOCAL_MODEL_NODE_GROUPS, name, patch)

    async def cleanup(self) -> None:
        for name in self.groups:
            with _absent():
                await self.api.delete(state.LOCAL_MODEL_NODE_GROUPS, name)


class _absent:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, errors.NotFound)


@pytest.fixture
async def world(
    control_plane: ControlPlane, api: kube.Kube, namespace: str
) -> AsyncIterator[World]:
    w = World(control_plane, api, namespace)
    try:
        yield w
    finally:
        await w.cleanup()


@pytest.fixture
async def controller(world: World) -> AsyncIterator[None]:
    client = await kube.Kube.from_kubeconfig(world.plane.kubeconfig_path)
    mgr = manager.Manager(handle_signals=False, shutdown_timeout=10.0)
    agenttolerations.setup(
        mgr,
        kube=client,
        factory=factory.InformerFactory(client, mgr),
        daemonset=keys.ObjectKey(world.namespace, world.name),
        registry=metrics.Metrics(),
    )
    task = asyncio.create_task(mgr.run(), name=f"agent-tolerations-{world.suffix}")
    try:
        await wait_until(
            lambda: mgr.started.is_set() or task.done(), timeout=60, what="the manager started"
        )
        assert not task.done(), f"manager exited with {task.result()}"
        yield
    finally:
        mgr.stop()
        await asyncio.wait_for(task, timeout=30)
        await client.close()


async def _wait_for(world: World, want: list[Obj], what: str, *, absent: list[Obj]) -> None:
    """Until the DaemonSet's tolerations hold `want` in this order (others between are other
    tests' groups') and none of `absent`."""

    async def holds() -> bool:
        live = await world.tolerations()
        ours = [t for t in live if t in want]
        return ours == want and not [t for t in absent if t in live]

    await wait_until(holds, timeout=30, what=what)


async def test_node_group_tolerations_reach_the_agent_and_the_installers_stay(
    world: World, controller: None
) -> None:
    installer, gpu, tpu = _tol(world.key("infra")), _tol(world.key("gpu")), _tol(world.key("tpu"))
    world.installer_apply([installer])
    other = f"someone-elses-{world.suffix}"
    world.installer_apply([], name=other)  # same namespace, another name: never touched

    bad = {"key": world.key("bad") + "/x", "operator": "Exists"}
    group = await world.group("gpus", [gpu, bad])
    await _wait_for(world, [installer, gpu], "the group's toleration added", absent=[bad])
    ds = await world.api.get(kube.DAEMON_SETS, world.name, namespace=world.namespace)
    record = json.loads(ds["metadata"]["annotations"][rules.RECORD_ANNOTATION])
    assert gpu in record
    assert installer not in record

    async def rejected_event() -> bool:
        found = await world.api.list(
            kube.EVENTS,
            namespace="default",
            field_selector=f"involvedObject.name={group},reason={agenttolerations.REJECTED_REASON}",
        )
        return any(bad["key"] in e.get("message", "") for e in found.items)

    await wait_until(rejected_event, timeout=30, what="a Warning Event naming the rejected key")

    await world.set_group_tolerations(group, [tpu])
    await _wait_for(world, [installer, tpu], "the group's changed toleration", absent=[gpu])

    # the installer re-applies with another toleration of its own: theirs replaces theirs,
    # the group's comes back
    infra2 = _tol(world.key("infra2"))
    world.installer_apply([infra2])
    await _wait_for(world, [infra2, tpu], "installer re-apply kept working", absent=[installer])
    world.installer_apply([infra2])  # unchanged re-apply
    await _wait_for(world, [infra2, tpu], "an unchanged re-apply", absent=[installer])

    await world.api.delete(state.LOCAL_MODEL_NODE_GROUPS, group)
    await _wait_for(world, [infra2], "the deleted group's toleration removed", absent=[tpu])
    assert await world.tolerations(other) == []


async def test_a_toleration_both_installer_and_group_have_is_the_installers(
    world: World, controller: None
) -> None:
    gpu, tpu = _tol(world.key("gpu")), _tol(world.key("tpu"))
    world.installer_apply([gpu])
    group = await world.group("gpus", [gpu, tpu])
    await _wait_for(world, [gpu, tpu], "the group's other toleration added", absent=[])
    ds = await world.api.get(kube.DAEMON_SETS, world.name, namespace=world.namespace)
    record = json.loads(ds["metadata"]["annotations"][rules.RECORD_ANNOTATION])
    assert tpu in record
    assert gpu not in record
    await world.api.delete(state.LOCAL_MODEL_NODE_GROUPS, group)
    # only what the controller added goes: the installer's stays
    await _wait_for(world, [gpu], "the group's own toleration removed", absent=[tpu])
    assert (await world.tolerations()).count(gpu) == 1


async def test_a_reapply_without_installer_tolerations_leaves_the_groups_alone(
    world: World, controller: None
) -> None:
    gpu = _tol(world.key("gpu"))
    world.installer_apply(None)  # as shipped: no tolerations at all
    await world.group("gpus", [gpu])
    await _wait_for(world, [gpu], "the group's toleration added", absent=[])
    before = await world.api.get(kube.DAEMON_SETS, world.name, namespace=world.namespace)
    out = world.installer_apply(None)
    assert "unchanged" in out, out
    after = await world.api.get(kube.DAEMON_SETS, world.name, namespace=world.namespace)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert gpu in await world.tolerations()
