"""Issue 13 bug 4 and risk 2: who owns a download, the modes it is served with, and deletions
that fail out loud.

The deletion tests act as the agent does in its DaemonSet (uid 65532, supplementary group
1000) by switching this process's effective uid, which needs root; they skip otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.agent.disk import folders, layout, trash

KEY = "0123456789abcdef"
OTHER = "fedcba9876543210"
JOB = "lmd-0123456789abcdef-0"
AGENT_UID, DOWNLOAD_GROUP, STORAGE_INITIALIZER_UID = 65532, 1000, 1000

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as the agent's and another uid needs root"
)


def _manifest(key: str = KEY) -> layout.Manifest:
    return layout.Manifest(
        storage_key=key, uri=f"s3://b/{key}", bytes=1, completed_at="2026-01-02T03:04:05Z", job=JOB
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def _as_agent() -> Iterator[None]:
    """Run the block with the agent's effective uid/gid and group 1000, as in its pod."""
    groups = os.getgroups()
    os.setgroups([DOWNLOAD_GROUP])
    os.setegid(AGENT_UID)
    os.seteuid(AGENT_UID)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


@pytest.fixture
def node_root() -> Iterator[Path]:
    """A models root prepared as `prepare-models-root` does (65532:1000, 2775), in a folder the
    agent's uid can reach (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="localcache-owner-", dir="/tmp"))
    base.chmod(0o755)
    root = base / "models-root"
    root.mkdir()
    os.chown(root, AGENT_UID, DOWNLOAD_GROUP)
    root.chmod(0o2775)
    try:
        yield root
    finally:
        shutil.rmtree(base)


def _write_download(staging: Path, *, uid: int) -> None:
    """What a download pod running as `uid` (umask 022) leaves: nested 0755 folders, 0644
    files, and a read-only folder as an archive may unpack it."""
    (staging / "weights" / "shard").mkdir(parents=True)
    (staging / "weights" / "shard" / "model.bin").write_bytes(b"x" * 5)
    (staging / "config.json").write_bytes(b"{}")
    (staging / "readonly").mkdir()
    (staging / "readonly" / "vocab.txt").write_bytes(b"a")
    (staging / "readonly").chmod(0o555)
    for dirpath, dirnames, filenames in os.walk(staging):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, DOWNLOAD_GROUP)


def _promoted_by_a_pod(d: folders.ModelDisk, key: str, *, uid: int) -> None:
    """The agent prepares the staging folder, a pod running as `uid` downloads, the agent
    promotes (call as root)."""
    with _as_agent():
        staging = d.prepare_staging(key, JOB, group=DOWNLOAD_GROUP)
    _write_download(staging, uid=uid)
    with _as_agent():
        d.promote(staging, key, _manifest(key))


# ---- risk 2: modes ------------------------------------------------------------------------


def test_staging_folder_is_writable_by_owner_and_group_only(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    path = d.prepare_staging(KEY, JOB, group=DOWNLOAD_GROUP)
    assert _mode(path) & 0o777 == 0o770
    assert os.lstat(path).st_gid == DOWNLOAD_GROUP or os.geteuid() != 0
    assert d.prepare_staging(KEY, JOB) == path  # idempotent


def test_promoted_folders_are_0755_and_files_0644(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    staging = d.prepare_staging(KEY, JOB)
    (staging / "sub" / "deeper").mkdir(parents=True, mode=0o777)
    (staging / "sub").chmod(0o2777)
    (staging / "sub" / "deeper").chmod(0o1777)
    for name, mode in [("open.bin", 0o777), ("setuid.bin", 0o4755), ("private.bin", 0o600)]:
        (staging / "sub" / name).write_bytes(b"x")
        (staging / "sub" / name).chmod(mode)
    d.promote(staging, KEY, _manifest())
    folder = d.model_path(KEY)
    seen = {}
    for dirpath, _dirnames, filenames in os.walk(folder):
        seen[dirpath] = _mode(Path(dirpath))
        for name in filenames:
            seen[os.path.join(dirpath, name)] = _mode(Path(dirpath) / name)
    dirs = {p: m for p, m in seen.items() if Path(p).is_dir()}
    files = {p: m for p, m in seen.items() if not Path(p).is_dir()}
    assert set(dirs.values()) == {0o755}, dirs
    assert set(files.values()) == {0o644}, files
    assert len(files) == 3


def test_promotion_drops_special_files_and_symlinks_leading_out(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    staging = d.prepare_staging(KEY, JOB)
    (staging / "weights").mkdir()
    (staging / "weights" / "model.bin").write_bytes(b"x")
    os.mkfifo(staging / "weights" / "pipe")
    (staging / "inside").symlink_to("weights/model.bin")
    (staging / "absolute").symlink_to("/etc/passwd")
    (staging / "weights" / "escape").symlink_to("../../../../etc")
    (staging / "here").symlink_to(".")
    (staging / "weights" / "sneaky").symlink_to("../here/../..")  # lexically inside, really not
    if os.geteuid() == 0:
        os.mknod(staging / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    d.promote(staging, KEY, _manifest())
    folder = d.model_path(KEY)
    assert d.is_complete(KEY)
    assert (folder / "inside").is_symlink()
    assert (folder / "inside").read_bytes() == b"x"
    assert (folder / "here").is_symlink()
    for gone in ["weights/pipe", "absolute", "weights/escape", "weights/sneaky", "null"]:
        assert not os.path.lexists(folder / gone), gone


def test_download_pods_run_as_the_agents_uid_unless_the_agent_is_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: AGENT_UID)
    assert folders.ModelDisk(tmp_path).download_uid == AGENT_UID
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert folders.ModelDisk(tmp_path).download_uid is None


# ---- bug 4: deletion ----------------------------------------------------------------------


@needs_root
def test_the_agent_deletes_a_folder_its_download_pod_wrote(node_root: Path) -> None:
    """The download pod runs as the agent's uid (jobs.build_job's runAsUser): even a read-only
    folder inside the download is removed, and the key is reported deleted."""
    d = folders.ModelDisk(node_root)
    d.download_uid = AGENT_UID
    _promoted_by_a_pod(d, KEY, uid=AGENT_UID)
    _promoted_by_a_pod(d, OTHER, uid=AGENT_UID)
    with _as_agent():
        assert d.delete_unreferenced({OTHER}) == [KEY]
        assert d.deletion_failures() == []
        assert d.take_new_deletion_failures() == []
    assert os.listdir(d.trash) == []
    assert not d.model_path(KEY).exists()
    assert d.is_complete(OTHER)


@needs_root
def test_a_folder_the_agent_cannot_delete_is_reported_not_hidden(node_root: Path) -> None:
    """A folder written under another uid (KServe's storage initializer runs as 1000) cannot be
    emptied by uid 65532: it is not reported deleted, the failure names the folder and the
    error once, and it is retried with backoff until it succeeds."""
    clock = FakeMonotonic()
    d = folders.ModelDisk(node_root, monotonic=clock)
    _promoted_by_a_pod(d, KEY, uid=STORAGE_INITIALIZER_UID)
    with _as_agent():
        assert d.delete_unreferenced(set()) == []
        (failure,) = d.take_new_deletion_failures()
    assert failure.folder == f"models/{KEY}"
    assert failure.storage_key == KEY
    assert "Permission denied" in failure.error
    assert failure.attempts == 1
    assert failure.retry_in == trash.DELETE_RETRY_S
    assert "could not delete models/" in failure.message
    assert not d.model_path(KEY).exists()  # no longer served
    (left,) = os.listdir(d.trash)
    assert left.startswith(KEY)

    with _as_agent():
        clock.now += 1  # within the backoff: not retried
        d.delete_unreferenced(set())
        assert [f.attempts for f in d.deletion_failures()] == [1]
        clock.now += trash.DELETE_RETRY_S
        d.delete_unreferenced(set())
        (again,) = d.deletion_failures()
        assert again.attempts == 2
        assert again.retry_in == 2 * trash.DELETE_RETRY_S
        assert d.take_new_deletion_failures() == []  # same error: reported once
    for dirpath, dirnames, filenames in os.walk(d.trash):  # e.g. re-owned by the init container
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), AGENT_UID, DOWNLOAD_GROUP)
    with _as_agent():
        clock.now += 2 * trash.DELETE_RETRY_S
        d.delete_unreferenced(set())
        assert d.deletion_failures() == []
    assert os.listdir(d.trash) == []


@needs_root
def test_a_folder_the_agent_cannot_even_move_is_reported(node_root: Path) -> None:
    """A legacy folder owned by another uid cannot be moved into `.trash` (moving a directory
    needs write access to it): the rest of the pass goes on and the failure is reported."""
    d = folders.ModelDisk(node_root)
    _promoted_by_a_pod(d, OTHER, uid=AGENT_UID)
    legacy = d.model_path(KEY)
    legacy.mkdir()
    os.chown(legacy, STORAGE_INITIALIZER_UID, STORAGE_INITIALIZER_UID)
    with _as_agent():
        assert d.delete_unreferenced(set()) == [OTHER]
        (failure,) = d.take_new_deletion_failures()
    assert failure.folder == f"models/{KEY}"
    assert "Permission denied" in failure.error
    assert legacy.is_dir()


@needs_root
def test_a_stuck_folder_wanted_again_is_no_longer_reported(node_root: Path) -> None:
    d = folders.ModelDisk(node_root)
    legacy = d.model_path(KEY)
    with _as_agent():
        d.ensure_layout()
    legacy.mkdir()
    os.chown(legacy, STORAGE_INITIALIZER_UID, STORAGE_INITIALIZER_UID)
    with _as_agent():
        d.delete_unreferenced(set())
        assert len(d.deletion_failures()) == 1
        d.delete_unreferenced({KEY})
        assert d.deletion_failures() == []
