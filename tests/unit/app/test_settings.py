"""Settings: flags win over environment variables, which win over defaults; bad values are
reported naming the flag and its variable."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from localcache import settings


def _parse(command: str, argv: list[str], env: dict[str, str]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, command)
    return settings.from_args(parser.parse_args(argv), command, env)


def test_defaults_apply_without_flags_or_environment() -> None:
    s = _parse("controller", [], {})
    assert s.metrics_port == 8080
    assert s.webhook_port == 9443
    assert s.leader_elect is True
    assert s.config_namespace == "kserve"
    assert s.models_root == Path("/mnt/models")
    assert s.identity  # the hostname


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    env = {"POD_NAMESPACE": "ops", "LOCALCACHE_WORKERS": "4", "NODE_NAME": "n1"}
    s = _parse("agent", ["--models-root", "/data"], env)
    assert s.config_namespace == "ops"
    assert s.workers == 4
    assert s.node_name == "n1"
    assert s.models_root == Path("/data")
    assert s.host_models_root == Path("/data")
    s = _parse("controller", ["--config-namespace", "mine"], env)
    assert s.config_namespace == "mine"


def test_agent_requires_a_node_name() -> None:
    with pytest.raises(settings.SettingsError, match="NODE_NAME"):
        _parse("agent", [], {})


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--metrics-port", "eighty"], "--metrics-port / LOCALCACHE_METRICS_PORT"),
        (["--leader-elect", "maybe"], "--leader-elect / LOCALCACHE_LEADER_ELECT"),
        (["--log-level", "loud"], "--log-level"),
        (["--log-format", "xml"], "--log-format"),
    ],
)
def test_bad_values_name_the_flag_and_variable(argv: list[str], needle: str) -> None:
    with pytest.raises(settings.SettingsError, match=needle):
        _parse("controller", argv, {})


def test_only_relevant_flags_are_offered_per_command() -> None:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, "agent")
    options = {a.dest for a in parser._actions}
    assert "node_name" in options
    assert "webhook_port" not in options


def test_readme_table_lists_every_flag() -> None:
    table = settings.markdown_table()
    for flag in settings.FLAGS:
        assert f"`{flag.flag}`" in table
        assert f"`{flag.env}`" in table


def test_readme_carries_the_generated_flag_table() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert settings.markdown_table() in readme, (
        "README.md's flag table is stale: paste `python -m localcache.settings --markdown`"
    )


def test_default_lease_identities_differ_between_processes_on_one_host() -> None:
    first = _parse("controller", [], {}).identity
    second = _parse("controller", [], {}).identity
    assert first != second
    assert _parse("controller", [], {"POD_NAME": "ctl-0"}).identity == "ctl-0"
