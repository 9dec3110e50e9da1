"""Several models roots (`agent.roots`): a node group is served on the root of its PV path,
an unmounted path is a clear error, and editing a group's path never deletes the models at
the old path (they are kept and reported once), while a node leaving a group whose path is
unchanged still loses its models (spec §4)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache import cli, settings
from localcache.agent.disk import folders, layout, roots
from localcache.csi import command as csi_command
from tests.unit.agent.test_reconciler import KEY, World, _entry

Obj = dict[str, Any]


# ---- pure rules ---------------------------------------------------------------------------
def test_models_roots_flag_parses_host_and_container_paths() -> None:
    parsed = settings.parse_root_mounts("/mnt/models=/mnt/models, /models/=/mnt/kserve-models")
    assert parsed == (
        settings.RootMount("/mnt/models", Path("/mnt/models")),
        settings.RootMount("/models", Path("/mnt/kserve-models")),
    )
    assert settings.parse_root_mounts("/data") == (settings.RootMount("/data", Path("/data")),)


@pytest.mark.parametrize(
    "text", ["models=/mnt/models", "/a=/x,/a=/y", "/a=/x,/b=/x/", "/a=relative"]
)
def test_models_roots_flag_refuses_relative_or_repeated_paths(text: str) -> None:
    with pytest.raises(settings.SettingsError, match="--models-roots"):
        settings.parse_root_mounts(text)


def test_group_is_served_on_the_root_whose_host_path_is_its_pv_path(tmp_path: Path) -> None:
    a = folders.ModelDisk(tmp_path / "a", host_path="/mnt/models")
    b = folders.ModelDisk(tmp_path / "b", host_path="/models")
    disks = roots.Disks([a, b])
    assert disks.for_path("/models/") is b
    assert disks.for_path("/mnt/models") is a
    assert disks.for_path(None) is a


def test_unmounted_pv_path_names_the_mounted_roots_and_how_to_add_one(tmp_path: Path) -> None:
    disks = roots.Disks([folders.ModelDisk(tmp_path / "a", host_path="/mnt/models")])
    with pytest.raises(layout.RootMismatch) as info:
        disks.for_path("/models")
    message = str(info.value)
    assert "node group PV path /models differs from the agent's models root" in message
    assert f"/mnt/models (mounted at {tmp_path / 'a'})" in message
    assert "--models-roots" in message
    assert "modelsRoots" in message


def test_retention_deletes_only_keys_no_entry_has_on_a_declared_root() -> None:
    keep = roots.retention(
        path="/a", folders={"k1", "k2", "k3"}, here={"k1"}, anywhere={"k1", "k2"}, declared={"/a"}
    )
    assert keep.referenced == {"k1", "k2"}  # k3 goes: no entry has it
    assert keep.kept == {"k2"}  # k2's entry is served on another root now


def test_retention_keeps_everything_on_a_root_no_group_declares() -> None:
    keep = roots.retention(
        path="/a/", folders={"k1", "k3"}, here=set(), anywhere=set(), declared={"/b"}
    )
    assert keep.referenced == {"k1", "k3"}
    assert keep.kept == {"k1", "k3"}


# ---- the reconciler on two roots ----------------------------------------------------------
A, B = "/mnt/models", "/models"


@pytest.fixture
def two(tmp_path: Path) -> World:
    disks = roots.Disks(
        [
            folders.ModelDisk(tmp_path / "a", host_path=A),
            folders.ModelDisk(tmp_path / "b", host_path=B),
        ]
    )
    return World(tmp_path, disks=disks)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _finish(world: World, job: Obj, on: folders.ModelDisk) -> None:
    (on.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    world.job_seen(job, conditions=[{"type": "Complete", "status": "True"}])


async def _downloaded_on_a(world: World) -> folders.ModelDisk:
    a = world.disks.for_path(A)
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    _finish(world, job, a)
    await world.reconcile()
    assert world.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    assert a.is_complete(KEY)
    return a


def _events(world: World, reason: str) -> list[Obj]:
    return [e for e in world.api.events() if e["reason"] == reason]


async def test_group_with_the_second_roots_path_downloads_there(two: World) -> None:
    two.group("kserve-sample", B)
    two.models(_entry(nodeGroup="kserve-sample"))
    await two.reconcile()
    [job] = two.api.jobs()
    b = two.disks.for_path(B)
    assert b.staging_path(KEY, job["metadata"]["name"]).is_dir()
    _finish(two, job, b)
    await two.reconcile()
    assert two.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    assert b.is_complete(KEY)
    assert two.disks.for_path(A).list_model_folders() == []


async def test_path_edit_keeps_the_old_folder_reports_it_once_and_downloads_at_the_new(
    two: World,
) -> None:
    a = await _downloaded_on_a(two)
    two.group("gpu", B)  # the node group's PV path is edited from A to B
    await two.reconcile()
    [_, job] = two.api.jobs()
    assert two.status()["modelStatus"] == {"iris": "ModelDownloadPending"}
    b = two.disks.for_path(B)
    _finish(two, job, b)
    await two.reconcile()
    await two.reconcile()
    assert two.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    assert b.is_complete(KEY)
    assert a.is_complete(KEY), "the folder at the old path is kept"
    [kept] = _events(two, "ModelFoldersKept")
    assert kept["type"] == "Warning"
    assert A in kept["message"]
    assert KEY in kept["message"]
    assert "by hand" in kept["message"]


async def test_path_edit_to_an_unmounted_path_is_an_error_and_deletes_nothing(
    world: World,
) -> None:
    root = world.disk
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    (root.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    world.job_seen(job, conditions=[{"type": "Complete", "status": "True"}])
    await world.reconcile()
    assert root.is_complete(KEY)
    world.group("gpu", "/models")
    await world.reconcile()
    await world.reconcile()
    status = world.status()
    assert status["modelStatus"] == {"iris": "ModelDownloadError"}
    message = status["modelProgress"]["iris"]["message"]
    assert "PV path /models differs" in message
    assert "--models-roots" in message
    assert root.is_complete(KEY)
    assert len(world.api.jobs()) == 1
    assert len(_events(world, "ModelFoldersKept")) == 1


async def test_kserve_sample_over_the_demo_group_deletes_no_model(world: World) -> None:
    """KServe's sample `workers` group (PV path /models, nodes `node-type=gpu`) applied
    over the demo group: the nodes leave the group, the controller drops their entries, and
    the agent used to delete every folder (`delete_unreferenced` with nothing referenced).
    The old root is no group's path any more: everything on it is kept and reported."""
    root = world.disk
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    (root.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    world.job_seen(job, conditions=[{"type": "Complete", "status": "True"}])
    await world.reconcile()
    world.group("gpu", "/models", pool="gpu-sample")
    world.models()  # the controller removed the entries: the node left the group
    await world.reconcile()
    assert root.is_complete(KEY)
    assert root.list_model_folders() == [KEY]
    [kept] = _events(world, "ModelFoldersKept")
    assert KEY in kept["message"]


async def test_node_leaving_a_group_whose_path_is_unchanged_loses_its_models(
    world: World,
) -> None:
    root = world.disk
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    (root.staging_path(KEY, job["metadata"]["name"]) / "m.bin").write_bytes(b"12345")
    world.job_seen(job, conditions=[{"type": "Complete", "status": "True"}])
    await world.reconcile()
    world.models()  # the node's labels changed: it left the group (spec §4)
    await world.reconcile()
    assert root.list_model_folders() == []
    assert _events(world, "ModelFoldersKept") == []


# ---- the shipped profiles -----------------------------------------------------------------
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("profile", "served"),
    [("standalone", ["/mnt/models"]), ("with-kserve", ["/mnt/models", "/models"])],
)
def test_each_profile_mounts_and_prepares_every_root_it_serves(
    profile: str, served: list[str]
) -> None:
    """with-kserve also serves KServe's /models (its agent's hostPath, the PV path of its
    sample node group): every root the agent's flags name is a hostPath of the same node
    path, mounted writable in the agent and prepared by the init container."""
    text = (REPO / "manifests" / "profiles" / profile / "localcache.yaml").read_text()
    (ds,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "manager"]
    (csi_node,) = [c for c in pod["containers"] if c["name"] == "csi-node"]
    (init,) = pod["initContainers"]
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, "agent")
    parsed = settings.from_args(parser.parse_args(agent["args"]), "agent", {"NODE_NAME": "n"})
    served_by = parsed.agent
    agent_settings = settings.RootMount(str(served_by.host_models_root), served_by.models_root)
    mounted = list(parsed.agent.models_roots) or [agent_settings]
    assert [r.host_path for r in mounted] == served
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in (agent, init):
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        for root in mounted:
            mount = mounts[str(root.container_path)]
            assert not mount.get("readOnly")
            assert volumes[mount["name"]]["hostPath"]["path"] == root.host_path
    prepared = [a.removeprefix("--models-root=") for a in init["args"] if "--models-root=" in a]
    assert prepared == [str(r.container_path) for r in mounted]
    # the CSI node plugin publishes views of every served root, under the same host paths
    csi_mounts = {m["mountPath"]: m for m in csi_node["volumeMounts"]}
    csi_roots = csi_command.parse_roots(
        [a.removeprefix("--models-root=") for a in csi_node["args"] if "--models-root=" in a]
    )
    assert sorted(csi_roots) == sorted(r.host_path for r in mounted)
    for host, inside in csi_roots.items():
        assert volumes[csi_mounts[str(inside)]["name"]]["hostPath"]["path"] == host


def test_prepare_models_root_prepares_every_root_given(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    owner = f"{os.getuid()}:{os.getgid()}"
    args = ["prepare-models-root", f"--models-root={first}", f"--models-root={second}"]
    assert cli.main([*args, f"--owner={owner}"]) == 0
    assert first.is_dir()
    assert second.is_dir()


def _agent_settings(args: list[str], env: dict[str, str]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, "agent")
    return settings.from_args(parser.parse_args(args), "agent", {"NODE_NAME": "n", **env})


def test_models_roots_come_from_the_flag_or_the_environment() -> None:
    env = {"LOCALCACHE_MODELS_ROOTS": "/mnt/models=/mnt/models,/models=/mnt/kserve-models"}
    parsed = _agent_settings([], env)
    assert [r.host_path for r in parsed.agent.models_roots] == ["/mnt/models", "/models"]
    assert _agent_settings(["--models-roots", "/data=/mnt/data"], env).agent.models_roots == (
        settings.RootMount("/data", Path("/mnt/data")),
    )
    assert _agent_settings([], {}).agent.models_roots == ()  # the single-root flags apply


def test_a_bad_models_roots_value_is_a_settings_error() -> None:
    with pytest.raises(settings.SettingsError, match="--models-roots"):
        _agent_settings(["--models-roots", "/a=/x,/a=/y"], {})
