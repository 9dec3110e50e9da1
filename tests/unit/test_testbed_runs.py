"""The test bed's clean-up of earlier runs, on the directory layout alone (no bed is started):
a run is removed when its owner process is gone, never while another bed is publishing it
(two pytest-xdist workers start beds at the same time)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localcache.devenv import testbed


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A runs directory of the test's own. Only `clean_stale_run_dirs` is called on it: the
    cgroup sweep of `clean_stale_runs` looks at the machine's real cgroups, where it would
    take a test bed of another worker for an orphan."""
    root = tmp_path / "localcache-testbed"
    root.mkdir()
    return root


def _run(root: Path, name: str, *, owner: int | None, started: str | None = None) -> Path:
    run = root / name
    (run / "logs").mkdir(parents=True)
    if owner is not None:
        state = {"owner_pid": owner, "owner_start": started or testbed._start_time(owner)}
        (run / "state.json").write_text(json.dumps(state))
    return run


def test_a_run_whose_owner_is_gone_is_removed_and_a_live_one_kept(runs: Path) -> None:
    dead = _run(runs, "1-dead", owner=os.getpid(), started="1")  # this pid, another process
    live = _run(runs, f"{os.getpid()}-live", owner=os.getpid())
    assert testbed.clean_stale_run_dirs(runs)[0] == ["1-dead"]
    assert not dead.exists()
    assert live.is_dir()


def test_a_run_being_published_is_left_alone(runs: Path) -> None:
    """What a second bed starting at the same moment saw: the old layout made the run
    directory before its state, and the other bed's clean-up removed it as ownerless."""
    publishing = _run(runs, f".{os.getpid()}-new", owner=None)
    assert testbed.clean_stale_run_dirs(runs) == ([], {f"{os.getpid()}-new"})
    assert publishing.is_dir()


def test_a_run_without_state_outside_publication_is_removed(runs: Path) -> None:
    broken = _run(runs, "2-broken", owner=None)
    assert testbed.clean_stale_run_dirs(runs)[0] == ["2-broken"]
    assert not broken.exists()
