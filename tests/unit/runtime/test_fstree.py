"""`runtime.fstree`: trees walked and removed without recursion, at any depth (security review
finding 4: `os.walk` and `shutil.rmtree` raise RecursionError on a tenant's deep tree)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from localcache.runtime import fstree
from tests.support.trees import deep_tree

DEPTH = sys.getrecursionlimit() + 100


def test_the_standard_library_recurses_on_such_a_tree(tmp_path: Path) -> None:
    """What the module exists for (Python 3.11): a check that the test's tree is deep enough."""
    with deep_tree(tmp_path / "deep", DEPTH) as deep:
        with pytest.raises(RecursionError):
            list(os.walk(deep))
        with pytest.raises(RecursionError):
            shutil.rmtree(deep)


def test_below_yields_every_entry_children_first(tmp_path: Path) -> None:
    with deep_tree(tmp_path / "deep", DEPTH) as deep:
        found = list(fstree.below(deep))
    assert len(found) == DEPTH + 1  # every directory and the file
    assert found[0][0].endswith("model.bin")
    assert found[0][1] is False
    assert found[-1] == (str(deep / "d"), True)


def test_below_never_follows_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    top = tmp_path / "top"
    top.mkdir()
    (top / "link").symlink_to(outside)
    assert list(fstree.below(top)) == [(str(top / "link"), False)]
    fstree.remove_tree(top)
    assert not top.exists()
    assert (outside / "secret").read_text() == "s"


def test_an_unlistable_directory_raises_or_is_passed_over(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError):
        list(fstree.below(missing))
    assert list(fstree.below(missing, skip_unlistable=True)) == []


def test_remove_tree_removes_a_deep_tree_a_file_and_a_dangling_link(tmp_path: Path) -> None:
    with deep_tree(tmp_path / "deep", DEPTH) as deep:
        fstree.remove_tree(deep)
        assert not deep.exists()
    single = tmp_path / "file"
    single.write_text("x")
    fstree.remove_tree(single)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    fstree.remove_tree(dangling)
    assert list(tmp_path.iterdir()) == []
