"""The import pod's staging and placement on the claim (issue 22): `models/<key>` is always the
old complete copy, absent, or the new complete copy, whatever step a pod dies after, and the
next `prepare` or `place` finishes what was decided."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from localcache.download import importlayout, importplace, importwalk

KEY = "0123456789abcdef"
OLD = {"config.json": "old", "weights/w.bin": "old-weights"}
NEW = {"config.json": "new", "weights/w.bin": "new-weights", "tokenizer.json": "tok"}
Tree = dict[str, str]


class Crash(Exception):
    """A pod killed right after a durable step."""


def _crash_after(step: str) -> importplace.Hook:
    def hook(done: str) -> None:
        if done == step:
            raise Crash(step)

    return hook


def _write(root: Path, files: Tree) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _read(root: Path) -> Tree | None:
    if not os.path.lexists(root):
        return None
    return {
        str(path.relative_to(root)): path.read_text()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _staged(models: Path, files: Tree, *, previous: Tree | None) -> importplace.Paths:
    """The state `place` starts from: `prepare` ran, the download wrote `files`."""
    if previous is not None:
        _write(models / KEY, previous)
    importplace.prepare(models, KEY)
    p = importplace.paths(models, KEY)
    assert _read(p.data) == {}
    _write(p.data, files)
    return p


def _assert_clean(p: importplace.Paths) -> None:
    assert not os.path.lexists(p.placing)
    assert not os.path.lexists(p.old)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.mark.parametrize("previous", [OLD, None], ids=["replace", "first"])
def test_place_moves_the_download_into_place(models: Path, previous: Tree | None) -> None:
    p = _staged(models, NEW, previous=previous)
    size = importplace.place(models, KEY)
    assert _read(models / KEY) == NEW
    assert size == importwalk.Size(bytes=sum(len(t) for t in NEW.values()), files=3)
    _assert_clean(p)
    assert not os.path.lexists(p.data)
    assert sorted(os.listdir(models)) == [".localcache-import", KEY]


@pytest.mark.parametrize("step", importplace.STEPS)
@pytest.mark.parametrize("previous", [OLD, None], ids=["replace", "first"])
@pytest.mark.parametrize("recover_with", ["prepare", "place"])
def test_a_crash_after_any_step_leaves_a_whole_copy_and_is_finished_next_time(
    models: Path, step: str, previous: Tree | None, recover_with: str
) -> None:
    p = _staged(models, NEW, previous=previous)
    if step == importplace.STEP_MOVED_OLD and previous is None:
        pytest.skip("no previous copy: nothing is moved to old")
    with pytest.raises(Crash):
        importplace.place(models, KEY, hook=_crash_after(step))
    assert _read(models / KEY) in (previous, None, NEW)
    if recover_with == "prepare":
        assert importplace.prepare(models, KEY) is (step != importplace.STEP_UNMARKED)
        assert _read(p.data) == {}
    elif step == importplace.STEP_UNMARKED:  # the placement was complete: nothing to place
        with pytest.raises(importplace.EmptyDownload):
            importplace.place(models, KEY)
    else:
        importplace.place(models, KEY)
    assert _read(models / KEY) == NEW
    _assert_clean(p)


@pytest.mark.parametrize("first", importplace.STEPS)
@pytest.mark.parametrize("second", importplace.STEPS)
def test_a_crash_during_recovery_is_recovered_too(models: Path, first: str, second: str) -> None:
    p = _staged(models, NEW, previous=OLD)
    with pytest.raises(Crash):
        importplace.place(models, KEY, hook=_crash_after(first))
    with contextlib.suppress(Crash):
        importplace.prepare(models, KEY, hook=_crash_after(second))
    assert _read(models / KEY) in (OLD, None, NEW)
    importplace.prepare(models, KEY)
    assert _read(models / KEY) == NEW
    _assert_clean(p)


def test_a_failure_before_the_marker_changes_nothing(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _staged(models, NEW, previous=OLD)

    def dies(*_args: object, **_kwargs: object) -> importwalk.Size:
        raise Crash("measuring")

    monkeypatch.setattr(importwalk, "measure", dies)
    with pytest.raises(Crash):
        importplace.place(models, KEY)
    monkeypatch.undo()
    assert _read(models / KEY) == OLD
    assert _read(p.data) == NEW
    assert not os.path.lexists(p.placing)
    importplace.prepare(models, KEY)  # the next pod starts over: the download is redone
    assert _read(models / KEY) == OLD
    assert _read(p.data) == {}


def test_a_marker_written_but_not_flushed_is_a_decided_placement(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker is written only after the download was checked: if it survives a crash
    before its fsync, finishing the placement is right."""
    p = _staged(models, NEW, previous=OLD)

    def dies(_fd: int) -> None:
        raise Crash("fsync")

    monkeypatch.setattr(os, "fsync", dies)
    with pytest.raises(Crash):
        importplace.place(models, KEY)
    monkeypatch.undo()
    assert os.path.lexists(p.placing)
    assert _read(models / KEY) == OLD
    assert importplace.prepare(models, KEY)
    assert _read(models / KEY) == NEW
    _assert_clean(p)


def test_a_half_removed_old_copy_is_removed_by_recovery(models: Path) -> None:
    """The pod died while removing `old` (some of its files gone): `<key>` is already new."""
    p = _staged(models, NEW, previous=None)
    _write(models / KEY, NEW)
    shutil.rmtree(p.data)
    _write(p.old, {"weights/w.bin": "old-weights"})
    p.placing.touch()
    assert importplace.prepare(models, KEY)
    assert _read(models / KEY) == NEW
    _assert_clean(p)


def test_a_leftover_old_beside_a_pending_placement_is_not_taken_for_the_previous_copy(
    models: Path,
) -> None:
    """`placing` with `data`, `<key>` and an `old`: `<key>` is still the copy being replaced,
    `old` a leftover; the leftover goes, `<key>` becomes `old`, then `data` becomes `<key>`."""
    p = _staged(models, NEW, previous=OLD)
    _write(p.old, {"stale": "x"})
    p.placing.touch()
    importplace.place(models, KEY)
    assert _read(models / KEY) == NEW
    _assert_clean(p)


def test_a_leftover_old_without_a_marker_is_removed_by_prepare(models: Path) -> None:
    _write(models / KEY, OLD)
    importplace.prepare(models, KEY)
    p = importplace.paths(models, KEY)
    _write(p.old, {"stale": "x"})
    importplace.prepare(models, KEY)
    assert _read(models / KEY) == OLD
    _assert_clean(p)


def test_prepare_empties_a_failed_attempts_staging_folder(models: Path) -> None:
    p = _staged(models, {"partial.bin": "half"}, previous=OLD)
    assert importplace.prepare(models, KEY) is False
    assert _read(p.data) == {}
    assert _read(models / KEY) == OLD


@pytest.mark.parametrize(
    "download",
    [{}, {"empty-dir/": ""}],
    ids=["nothing", "only-folders"],
)
def test_an_empty_download_is_refused_and_the_old_copy_stays(
    models: Path, download: dict[str, str]
) -> None:
    p = _staged(models, {}, previous=OLD)
    for rel in download:
        (p.data / rel).mkdir()
    with pytest.raises(importplace.EmptyDownload, match="empty"):
        importplace.place(models, KEY)
    assert _read(models / KEY) == OLD
    assert not os.path.lexists(p.placing)


def test_place_without_a_staging_folder_is_refused(models: Path) -> None:
    with pytest.raises(importplace.EmptyDownload, match="nothing was downloaded"):
        importplace.place(models, KEY)
    assert not os.path.lexists(models / KEY)


def test_a_symlink_in_the_download_is_placed_but_never_followed(
    models: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    _write(outside, {"secret": "s" * 1000})
    p = _staged(models, {"a": "1"}, previous=None)
    (p.data / "link").symlink_to(outside)
    size = importplace.place(models, KEY)
    assert size == importwalk.Size(bytes=1, files=1)
    assert os.path.islink(models / KEY / "link")
    assert _read(outside) == {"secret": "s" * 1000}


@pytest.mark.parametrize("key", ["", ".", "..", "a/b", "../etc", "/abs", "a\x00b", "k" * 129,
                                 ".localcache-import", "a\\b", "new\nline"])  # fmt: skip
def test_a_key_that_could_leave_models_is_refused(models: Path, key: str) -> None:
    for step in (importplace.prepare, importplace.place):
        with pytest.raises(ValueError, match="key"):
            step(models, key)
    assert os.listdir(models) == []


def test_a_missing_or_symlinked_models_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(importplace.BadLayout, match="does not exist"):
        importplace.prepare(tmp_path / "absent", KEY)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(importplace.BadLayout, match="not a folder"):
        importplace.prepare(tmp_path / "link", KEY)
    assert os.listdir(real) == []


def test_a_file_where_the_staging_folder_goes_is_refused(models: Path) -> None:
    (models / importlayout.STAGING).write_text("")
    with pytest.raises(importplace.BadLayout, match="not a folder"):
        importplace.prepare(models, KEY)


def test_created_folders_take_the_claims_permission_bits(models: Path) -> None:
    os.chmod(models, 0o2777)
    importplace.prepare(models, KEY)
    p = importplace.paths(models, KEY)
    for folder in (models / importlayout.STAGING, p.staging, p.data):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o2777
