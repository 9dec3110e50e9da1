"""`download` of file:// URIs: a file lands under its name, a directory as its contents.

Matrix: file copy (bytes, mode); directory tree with nested folders and a symlink; an entry
of the same name is replaced (stale files go); missing source, destination inside the source,
destination that is a file; a failure mid-copy or mid-commit leaves nothing of the run in dest
(a replaced entry is restored, a dest this run created is removed again).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localcache.download import program


def _tree(root: Path) -> dict[str, bytes | str]:
    """Relative path → file bytes, or "->target" for symlinks, or "dir/" for folders."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = f"->{os.readlink(path)}"
        elif path.is_dir():
            found[rel + "/"] = "dir"
        else:
            found[rel] = path.read_bytes()
    return found


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "model"
    (src / "weights").mkdir(parents=True)
    (src / "config.json").write_bytes(b'{"layers": 2}')
    (src / "weights" / "part-0.bin").write_bytes(os.urandom(70_000))
    (src / "weights" / "part-1.bin").write_bytes(b"")
    (src / "latest").symlink_to("weights/part-0.bin")
    return src


async def test_a_file_lands_in_dest_under_its_name(tmp_path: Path) -> None:
    src = tmp_path / "model.joblib"
    src.write_bytes(b"x" * 1234)
    src.chmod(0o640)
    dest = tmp_path / "out" / "models"

    written = await program.download(src.as_uri(), dest)

    assert written == 1234
    assert _tree(dest) == {"model.joblib": b"x" * 1234}
    assert (dest / "model.joblib").stat().st_mode & 0o777 == 0o640


async def test_a_directory_lands_as_its_contents(tmp_path: Path, model_dir: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()

    written = await program.download(model_dir.as_uri(), dest)

    assert written == 13 + 70_000
    assert _tree(dest) == _tree(model_dir)
    assert (dest / "latest").is_symlink()


async def test_entries_of_the_same_name_are_replaced(tmp_path: Path, model_dir: Path) -> None:
    dest = tmp_path / "dest"
    (dest / "weights").mkdir(parents=True)
    (dest / "weights" / "stale.bin").write_bytes(b"old")
    (dest / "config.json").write_bytes(b"old")
    (dest / "unrelated.txt").write_bytes(b"kept")

    await program.download(model_dir.as_uri(), dest)

    assert _tree(dest) == {**_tree(model_dir), "unrelated.txt": b"kept"}


async def test_a_missing_source_fails_and_creates_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(program.DownloadError, match="no such file or directory"):
        await program.download((tmp_path / "nope").as_uri(), dest)
    assert not dest.exists()


async def test_dest_inside_the_source_is_refused(model_dir: Path) -> None:
    dest = model_dir / "weights" / "copy"
    with pytest.raises(program.DownloadError, match="inside the source"):
        await program.download(model_dir.as_uri(), dest)
    assert not dest.exists()


async def test_dest_that_is_a_file_is_refused(tmp_path: Path, model_dir: Path) -> None:
    dest = tmp_path / "file"
    dest.write_bytes(b"mine")
    with pytest.raises(program.DownloadError, match="not a directory"):
        await program.download(model_dir.as_uri(), dest)
    assert dest.read_bytes() == b"mine"


async def test_a_file_uri_with_a_host_is_refused(tmp_path: Path) -> None:
    with pytest.raises(program.DownloadError, match="absolute path"):
        await program.download("file://models/x", tmp_path / "dest")


async def test_a_failure_mid_copy_leaves_nothing_in_dest(tmp_path: Path, model_dir: Path) -> None:
    os.mkfifo(model_dir / "weights" / "zz-fifo")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json").write_bytes(b"previous")

    with pytest.raises(program.DownloadError, match="special file"):
        await program.download(model_dir.as_uri(), dest)

    assert _tree(dest) == {"config.json": b"previous"}


async def test_a_failure_mid_copy_removes_a_dest_it_created(
    tmp_path: Path, model_dir: Path
) -> None:
    os.mkfifo(model_dir / "zz-fifo")
    dest = tmp_path / "new" / "dest"

    with pytest.raises(program.DownloadError):
        await program.download(model_dir.as_uri(), dest)

    assert not dest.exists()


async def test_a_failure_mid_commit_rolls_back_and_restores(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "dest"
    (dest / "weights").mkdir(parents=True)
    (dest / "weights" / "old.bin").write_bytes(b"old weights")
    before = _tree(dest)
    real_rename = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        # Entries commit in sorted order: config.json, latest, weights. Fail on "weights".
        staged = ".localcache-partial-" in str(src) and "old-" not in str(src)
        if Path(dst) == dest / "weights" and staged:
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(program.DownloadError, match="No space left on device"):
        await program.download(model_dir.as_uri(), dest)
    monkeypatch.undo()

    assert _tree(dest) == before
