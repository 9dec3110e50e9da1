"""Range parsing and the safe open beneath a served folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localcache.agent.peer import files


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-", 10, (0, 9)),
        ("bytes=4-", 10, (4, 9)),
        ("bytes=9-", 10, (9, 9)),
        ("bytes=2-5", 10, (2, 5)),
        ("bytes=2-500", 10, (2, 9)),
        ("bytes=3-3", 10, (3, 3)),
    ],
)
def test_single_ranges_are_satisfied(
    header: str | None, size: int, expected: tuple[int, int] | None
) -> None:
    assert files.byte_range(header, size) == expected


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=10-", 10),  # starts at the end
        ("bytes=0-", 0),  # an empty file has no byte 0
        ("bytes=5-2", 10),  # backwards
        ("bytes=-5", 10),  # suffix ranges are not served
        ("bytes=0-1,3-4", 10),  # several ranges
        ("items=0-1", 10),
        ("bytes=a-", 10),
        ("bytes=" + "9" * 30 + "-", 10),
        ("bytes=0-" + " " * 100, 10),
    ],
)
def test_other_ranges_are_refused(header: str, size: int) -> None:
    with pytest.raises(files.BadRange):
        files.byte_range(header, size)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / "k"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.bin").write_bytes(b"abcdef")
    (tmp_path / "secret").write_bytes(b"secret")
    return folder


def test_a_listed_regular_file_opens(tmp_path: Path) -> None:
    fd = files.open_beneath(_folder(tmp_path), "sub/a.bin", 6)
    try:
        assert files.read_at(fd, 2, 3) == b"cde"
    finally:
        os.close(fd)


def test_a_file_of_another_size_is_stale(tmp_path: Path) -> None:
    with pytest.raises(files.Stale, match="size"):
        files.open_beneath(_folder(tmp_path), "sub/a.bin", 7)


def test_a_symlinked_file_is_not_followed(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(files.Stale):
        files.open_beneath(folder, "link", 6)


def test_a_symlinked_parent_is_not_followed(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "a.bin").write_bytes(b"abcdef")
    (folder / "dir").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(files.Stale):
        files.open_beneath(folder, "dir/a.bin", 6)


def test_a_symlinked_folder_is_not_followed(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (tmp_path / "alias").symlink_to(folder)
    with pytest.raises(files.Stale):
        files.open_beneath(tmp_path / "alias", "sub/a.bin", 6)


@pytest.mark.parametrize("path", ["../secret", "sub/../../secret", "/etc/passwd", "", "a//b"])
def test_unsafe_paths_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(files.Stale):
        files.open_beneath(_folder(tmp_path), path, 6)


def test_a_fifo_in_place_of_a_file_neither_blocks_nor_opens(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    os.mkfifo(folder / "fifo")
    with pytest.raises(files.Stale, match="regular"):
        files.open_beneath(folder, "fifo", 0)


def test_a_directory_in_place_of_a_file_is_stale(tmp_path: Path) -> None:
    with pytest.raises(files.Stale):
        files.open_beneath(_folder(tmp_path), "sub", 0)
