"""The command line lists every subcommand of spec §8."""

from __future__ import annotations

import pytest

from localcache import cli


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("controller", "agent", "run", "download"):
        assert command in out
