"""`localcache prepare-models-root`: the agent's init container makes a root-owned models root
usable without `chmod 0777` (found on real nodes: the agent could not create `models/`)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from localcache import cli
from localcache.agent.disk import rootdir, tree
from tests.support.trees import deep_tree


def _owner_and_mode(path: Path) -> tuple[int, int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_root_owned_0755_root_becomes_the_agents_with_the_download_group(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir(mode=0o755)
    os.chown(root, 0, 0)
    (root / "existing").mkdir(mode=0o700)

    changes = rootdir.prepare(root, uid=65532, gid=1000)

    assert _owner_and_mode(root) == (65532, 1000, 0o2775)
    assert _owner_and_mode(root / "existing") == (0, 0, 0o700), "below the root is untouched"
    assert len(changes) == 2
    assert rootdir.prepare(root, uid=65532, gid=1000) == [], "a second run changes nothing"


def test_a_missing_root_is_created(tmp_path: Path) -> None:
    root = tmp_path / "a" / "models"
    uid, gid = os.getuid(), os.getgid()
    assert rootdir.prepare(root, uid=uid, gid=gid)[0] == f"created {root}"
    assert _owner_and_mode(root) == (uid, gid, 0o2775)


def test_a_symlinked_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "models").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(rootdir.RootError, match="symlink"):
        rootdir.prepare(tmp_path / "models", uid=os.getuid(), gid=os.getgid())


def test_the_command_reports_a_bad_owner_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["prepare-models-root", "--owner", "agent"]) == 1
    assert "--owner must be UID:GID" in capsys.readouterr().err


def test_the_shipped_agent_runs_the_init_container_with_two_capabilities() -> None:
    import yaml

    manifest = Path(__file__).resolve().parents[3] / "manifests" / "base" / "agent.yaml"
    spec = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"] == ["localcache", "prepare-models-root"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_folders_left_in_trash_by_another_uid_are_given_to_the_agent(tmp_path: Path) -> None:
    """Issue 13 bug 4: what the agent could not delete (written under uid 1000) becomes the
    agent's at its next start, so that deletion then succeeds; symlinks are not followed."""
    root = tmp_path / "models"
    stuck = root / ".trash" / "0123456789abcdef.1234" / "sub"
    stuck.mkdir(parents=True)
    (stuck / "model.bin").write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (stuck / "link").symlink_to(outside)
    served = root / "models" / "fedcba9876543210"
    served.mkdir(parents=True)
    for path in (stuck.parent, stuck, stuck / "model.bin", served):
        os.chown(path, 1000, 1000)
    os.lchown(stuck / "link", 1000, 1000)

    changes = rootdir.prepare(root, uid=65532, gid=1000)

    for path in (stuck.parent, stuck, stuck / "model.bin"):
        assert os.lstat(path).st_uid == 65532
    assert os.lstat(stuck / "link").st_uid == 65532
    assert os.lstat(outside).st_uid == 0, "a symlink in .trash is not followed"
    assert os.lstat(served).st_uid == 1000, "nothing outside .trash changes"
    assert any("4 entries" in c for c in changes)
    assert not any("entries" in c for c in rootdir.prepare(root, uid=65532, gid=1000))


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    """Security review finding 4: a tenant's 1100-level tree in `.trash` made os.walk and
    shutil.rmtree raise RecursionError on every pass."""
    with deep_tree(tmp_path / "deep", sys.getrecursionlimit() + 100) as deep:
        tree.remove(deep)
        assert not deep.exists()
