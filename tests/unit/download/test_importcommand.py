"""`localcache import prepare|progress|place` (issue 22): the import pod's program, run as the
pod runs it, and its bounded progress walk."""

from __future__ import annotations

import io
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localcache import cli
from localcache.caching import importjob
from localcache.download import importcommand, importplace, importwalk

KEY = "0123456789abcdef"
REPO = Path(__file__).resolve().parents[3]


def _localcache(*args: str) -> list[str]:
    return [sys.executable, "-m", "localcache", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_measure_counts_regular_files_and_never_follows_symlinks(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(b"x" * 10)
    (tmp_path / "d" / "e" / "b").write_bytes(b"y" * 5)
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")
    (tmp_path / "d" / "far").symlink_to("/")
    os.mkfifo(tmp_path / "d" / "fifo")
    size = importwalk.measure(tmp_path / "d", max_files=100, max_depth=10)
    assert size == importwalk.Size(bytes=15, files=2)
    assert importwalk.measure(tmp_path / "absent", max_files=1, max_depth=1).files == 0


def test_measure_stops_at_its_caps_and_when_told(tmp_path: Path) -> None:
    deep = tmp_path
    for i in range(10):
        deep = deep / str(i)
    deep.mkdir(parents=True)
    (deep / "f").write_text("z")
    assert importwalk.measure(tmp_path, max_files=9, max_depth=5) == importwalk.Size(
        0, 0, truncated=True
    )
    assert importwalk.measure(tmp_path, max_files=9, max_depth=50).files == 1
    for i in range(600):
        (tmp_path / f"f{i}").write_text("1")
    capped = importwalk.measure(tmp_path, max_files=100, max_depth=50)
    assert (capped.files, capped.truncated) == (100, True)
    stopped = importwalk.measure(tmp_path, max_files=10_000, max_depth=50, stop=lambda: True)
    assert stopped.truncated
    assert stopped.files < 600


def test_progress_prints_one_json_line_per_interval_until_stopped(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"x" * 42)
    out = io.StringIO()
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return len(waits) == 3

    importcommand.report_progress(
        tmp_path, interval=2.5, out=out, wait=wait, stopping=lambda: False
    )
    lines = out.getvalue().splitlines()
    assert lines == ['{"bytes": 42, "files": 1}'] * 3
    assert waits == [2.5] * 3
    assert importjob.progress_from_log(out.getvalue()) == importjob.Progress(42, 1)


def test_progress_stopped_before_a_line_prints_nothing(tmp_path: Path) -> None:
    out = io.StringIO()
    importcommand.report_progress(
        tmp_path, interval=1, out=out, wait=lambda _s: False, stopping=lambda: True
    )
    assert out.getvalue() == ""


def test_place_errors_are_one_line_and_the_termination_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    log = tmp_path / "termination-log"
    args = ["import", "prepare", "--models", str(models), "--key", KEY]
    assert cli.main([*args, "--termination-log", str(log)]) == 0
    args[1] = "place"
    assert cli.main([*args, "--termination-log", str(log)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localcache import place: error: the download left no file")
    assert len(err.strip().splitlines()) == 1
    assert log.read_text().startswith("the download left no file")
    assert importjob.placed_from_message(log.read_text()) is None
    assert cli.main(["import", "place", "--models", str(models), "--key", "..",
                     "--termination-log", str(log)]) == 1  # fmt: skip
    assert "not a storage key" in log.read_text()


def test_the_real_cli_prepares_and_places_a_model(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / KEY).mkdir()
    (models / KEY / "old.bin").write_text("old")
    log = tmp_path / "termination-log"
    common = ["--models", str(models), "--key", KEY, "--termination-log", str(log)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _localcache("import", *args),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=_env(),
            cwd=tmp_path,
        )

    prepared = run("prepare", *common)
    assert prepared.returncode == 0, prepared.stderr
    data = models / ".localcache-import" / KEY / "data"
    assert list(data.iterdir()) == []
    (data / "model.bin").write_bytes(b"m" * 1000)
    placed = run("place", *common)
    assert placed.returncode == 0, placed.stderr
    assert json.loads(placed.stdout) == {"bytes": 1000, "files": 1}
    assert importjob.placed_from_message(log.read_text()) == importjob.Progress(1000, 1)
    assert sorted(p.name for p in (models / KEY).iterdir()) == ["model.bin"]
    assert sorted(p.name for p in (models / ".localcache-import" / KEY).iterdir()) == []


def test_the_progress_sidecar_exits_0_promptly_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"x" * 7)
    proc = subprocess.Popen(
        _localcache("import", "progress", "--dir", str(tmp_path), "--interval", "3600"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "the sidecar printed no line within 60 s"
        assert json.loads(proc.stdout.readline()) == {"bytes": 7, "files": 1}
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 10  # not the hour-long interval
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


def test_a_permission_error_names_the_uid_and_what_the_claim_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*_args: object, **_kwargs: object) -> bool:
        raise PermissionError(13, "Permission denied", "/mnt/claim/.localcache-import")

    monkeypatch.setattr(importplace, "prepare", refused)
    log = tmp_path / "termination-log"
    args = ["--models", str(tmp_path), "--key", KEY, "--termination-log", str(log)]
    assert cli.main(["import", "prepare", *args]) == 1
    err = capsys.readouterr().err
    assert f"uid {os.getuid()}" in err
    assert "sharedPVCImportFSGroup" in log.read_text()
