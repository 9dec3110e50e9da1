"""Settings: flags win over environment variables, which win over defaults; bad values are
reported naming the flag and its variable."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from localcache import settings


def _parse(command: str, argv: list[str], env: dict[str, str]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, command)
    return settings.from_args(parser.parse_args(argv), command, env)


def test_defaults_apply_without_flags_or_environment() -> None:
    s = _parse("controller", [], {})
    assert s.serving.metrics_port == 8080
    assert s.webhook.port == 9443
    assert s.leadership.elect is True
    assert s.config.namespace == "kserve"
    assert s.config.kserve is None
    assert s.agent.models_root == Path("/mnt/models")
    assert s.leadership.identity  # the hostname
    assert s.given == frozenset()


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    env = {"POD_NAMESPACE": "ops", "LOCALCACHE_WORKERS": "4", "NODE_NAME": "n1"}
    s = _parse("agent", ["--models-root", "/data"], env)
    assert s.config.namespace == "ops"
    assert s.controller.workers == 4
    assert s.agent.node_name == "n1"
    assert s.agent.models_root == Path("/data")
    assert s.agent.host_models_root == Path("/data")
    s = _parse("controller", ["--config-namespace", "mine"], env)
    assert s.config.namespace == "mine"


def test_given_lists_what_the_user_set_by_flag_or_environment_even_at_the_default() -> None:
    s = _parse(
        "run",
        ["--metrics-port", "8080", "--bind-address", "0.0.0.0"],
        {"LOCALCACHE_WEBHOOK_PORT": "9443", "LOCALCACHE_WORKERS": ""},
    )
    assert s.given == {"metrics_port", "bind_address", "webhook_port"}  # empty: not given
    assert (s.serving.metrics_port, s.webhook.port) == (8080, 9443)


def test_kserve_config_is_parsed_once_into_an_object_key() -> None:
    s = _parse("controller", ["--kserve-config", "kserve/inferenceservice-config"], {})
    assert s.config.kserve == ("kserve", "inferenceservice-config")
    with pytest.raises(settings.SettingsError, match="--kserve-config: want namespace/name"):
        _parse("controller", ["--kserve-config", "a/b/c"], {})


def test_models_roots_parse_into_settings_own_mounts() -> None:
    s = _parse("agent", ["--models-roots", "/mnt/models=/roots/a,/models/"], {"NODE_NAME": "n"})
    assert s.agent.models_roots == (
        settings.RootMount("/mnt/models", Path("/roots/a")),
        settings.RootMount("/models", Path("/models/")),
    )


@pytest.mark.parametrize(
    ("roots", "message"),
    [
        ("models=/roots/a", "want <host path>=<container path>, both absolute, got 'models=/r"),
        ("/a=/r,/a/=/s", "host path given twice: /a"),
        ("/a=/r,/b=/r/", "container path given twice: /r"),
    ],
)
def test_bad_models_roots_are_refused_naming_the_part(roots: str, message: str) -> None:
    with pytest.raises(settings.SettingsError, match=f"--models-roots: {re.escape(message)}"):
        _parse("agent", ["--models-roots", roots], {"NODE_NAME": "n"})


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
    first = _parse("controller", [], {}).leadership.identity
    second = _parse("controller", [], {}).leadership.identity
    assert first != second
    assert _parse("controller", [], {"POD_NAME": "ctl-0"}).leadership.identity == "ctl-0"
