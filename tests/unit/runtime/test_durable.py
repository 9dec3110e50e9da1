"""`runtime.durable`: the fsync and atomic-JSON helpers the agent and the download program
share."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from localcache.runtime import durable
from tests.support.trees import deep_tree


def test_an_atomic_json_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("old")
    durable.write_json_atomic(path, {"b": 1, "a": [2]})
    assert path.read_text() == '{"a": [2], "b": 1}'
    assert durable.read_json(path) == {"a": [2], "b": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


@pytest.mark.parametrize("content", [None, "not json", "[1, 2]", '"text"'])
def test_read_json_is_none_unless_the_file_holds_an_object(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    assert durable.read_json(path) is None


def test_fsync_dir_needs_a_directory(tmp_path: Path) -> None:
    durable.fsync_dir(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        durable.fsync_dir(tmp_path / "f")


def test_fsync_tree_never_opens_a_fifo_blocking(tmp_path: Path) -> None:
    """A tree written by someone else may hold a FIFO: a blocking open would hang here."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(b"w")
    os.mkfifo(tmp_path / "sub" / "pipe")
    os.symlink("/nonexistent", tmp_path / "link")
    durable.fsync_tree(tmp_path)
    durable.fsync_tree(tmp_path / "missing")  # best effort: nothing to flush


def test_fsync_tree_flushes_a_tree_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    """Security review finding 4: the agent flushes a download's tree before it promotes it;
    with os.walk that raised RecursionError on a tenant's 1100-level tree, on every pass."""
    with deep_tree(tmp_path / "deep", sys.getrecursionlimit() + 100) as deep:
        durable.fsync_tree(deep)  # returns: nothing to compare, a flush changes no content
