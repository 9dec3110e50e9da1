"""The command line lists every subcommand of spec §8."""

from __future__ import annotations

import pytest

from localcache import cli


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("controller", "agent", "run", "download", "fetch", "import"):
        assert command in out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == "localcache 0.1.0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["http://[::1", "d"], "localcache download: error: invalid URI 'http://[::1'"),
        (["http://example.invalid/m", ""], "localcache download: error: DEST must name"),
    ],
)
def test_download_refuses_bad_input_in_one_line_without_a_traceback(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["download", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
