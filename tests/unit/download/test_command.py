"""`localcache download` as a command: exit codes and one-line messages, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcache.download import program


def test_success_prints_what_was_downloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "model.txt"
    src.write_text("weights")
    code = program.main([src.as_uri(), str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[-1] == f"downloaded {src.as_uri()} to {tmp_path / 'out'} (7 bytes)"
    assert (tmp_path / "out" / "model.txt").read_text() == "weights"


def test_failure_is_one_line_on_stderr_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = program.main(["file:///no/such/model", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 1
    assert "downloaded" not in out
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        "localcache download: error: no such file or directory: /no/such/model"
    )
    assert not (tmp_path / "out").exists()


def test_missing_arguments_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert program.main(["file:///x"]) == 2
    assert "usage: localcache download" in capsys.readouterr().err


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert program.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--timeout" in out
    assert "--attempts" in out
