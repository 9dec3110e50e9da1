"""Pure parts of `localcache run` (localcache/devenv/local.py, localcache/devenv/localmode.py):
no network, no processes (the local Job runner: test_local_jobrunner.py)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache import settings as settings_mod
from localcache.devenv import jobpods, local, localmode

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
Obj = dict[str, Any]


def _settings(*argv: str, env: dict[str, str] | None = None) -> settings_mod.Settings:
    """The settings of `localcache run ARGV` in the environment `env`."""
    parser = argparse.ArgumentParser()
    settings_mod.add_arguments(parser, "run")
    return settings_mod.from_args(parser.parse_args(argv), "run", environ=env or {})


def _shipped(path: str) -> Obj:
    doc: Obj = yaml.safe_load((MANIFESTS / path).read_text())
    return doc


# ------------------------------------------------------------------ which cluster


def test_kubeconfig_flag_wins_over_the_environment(tmp_path: Path) -> None:
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.write_text("x")
    env.write_text("x")
    found = local.kubeconfig_candidate(
        _settings("--kubeconfig", str(flag)), {"KUBECONFIG": str(env)}, tmp_path
    )
    assert found == flag


def test_first_kubeconfig_of_the_environment_is_used(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.write_text("x")
    environ = {"KUBECONFIG": f":{first}:{tmp_path / 'second'}"}
    assert local.kubeconfig_candidate(_settings(), environ, tmp_path) == first


def test_home_kubeconfig_is_the_fallback(tmp_path: Path) -> None:
    home_config = tmp_path / ".kube" / "config"
    home_config.parent.mkdir()
    home_config.write_text("x")
    assert local.kubeconfig_candidate(_settings(), {}, tmp_path) == home_config


def test_missing_kubeconfig_means_local_mode(tmp_path: Path) -> None:
    environ = {"KUBECONFIG": str(tmp_path / "absent")}
    assert local.kubeconfig_candidate(_settings(), environ, tmp_path) is None
    assert local.kubeconfig_candidate(_settings(), {}, tmp_path) is None


# ------------------------------------------------------------------ local settings


def test_local_settings_use_free_ports_loopback_and_the_run_dir(tmp_path: Path) -> None:
    result = localmode.local_settings(
        _settings(),
        run_dir=tmp_path,
        kubeconfig=tmp_path / "kc",
        pv_path="/mnt/models",
        pick_port=iter([41234, 41235]).__next__,
    )
    assert result.connection.kubeconfig == str(tmp_path / "kc")
    assert (result.serving.metrics_port, result.webhook.port) == (41234, 41235)
    assert result.serving.bind_address == "127.0.0.1"
    assert result.webhook.cert_dir == tmp_path / "webhook-certs"
    assert result.webhook.allow_file_uris is True
    assert result.agent.models_root == tmp_path / "nodes"
    assert result.agent.host_models_root == Path("/mnt/models")


def test_local_settings_keep_what_the_user_chose(tmp_path: Path) -> None:
    chosen = _settings(
        *("--metrics-port", "9090", "--webhook-port", "9444", "--bind-address", "::1"),
        env={"LOCALCACHE_WEBHOOK_CERT_DIR": "/c"},
    )
    result = localmode.local_settings(
        chosen, run_dir=tmp_path, kubeconfig=tmp_path / "kc", pv_path="/p", pick_port=lambda: 1
    )
    assert (result.serving.metrics_port, result.webhook.port) == (9090, 9444)
    assert result.serving.bind_address == "::1"
    assert result.webhook.cert_dir == Path("/c")


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (
            ["--metrics-port", "8080", "--webhook-port", "9443", "--bind-address", "0.0.0.0"],
            {"LOCALCACHE_WEBHOOK_CERT_DIR": "/tmp/localcache-webhook-certs"},
        ),
        (
            [],
            {
                "LOCALCACHE_METRICS_PORT": "8080",
                "LOCALCACHE_WEBHOOK_PORT": "9443",
                "LOCALCACHE_BIND_ADDRESS": "0.0.0.0",
                "LOCALCACHE_WEBHOOK_CERT_DIR": "/tmp/localcache-webhook-certs",
            },
        ),
    ],
    ids=["flags", "environment"],
)
def test_local_settings_keep_what_the_user_gave_even_when_it_is_the_default(
    tmp_path: Path, argv: list[str], env: dict[str, str]
) -> None:
    """Issue 19: an explicit `--metrics-port 8080` was taken for "not given" because it equals
    the default, and replaced by a free port."""
    result = localmode.local_settings(
        _settings(*argv, env=env),
        run_dir=tmp_path,
        kubeconfig=tmp_path / "kc",
        pv_path="/p",
        pick_port=lambda: 1,
    )
    assert (result.serving.metrics_port, result.webhook.port) == (8080, 9443)
    assert result.serving.bind_address == "0.0.0.0"
    assert result.webhook.cert_dir == Path("/tmp/localcache-webhook-certs")


def test_disabled_webhooks_stay_disabled(tmp_path: Path) -> None:
    result = localmode.local_settings(
        _settings("--webhook-port", "0"), run_dir=tmp_path, kubeconfig=tmp_path, pv_path="/p"
    )
    assert result.webhook.port == 0


# ------------------------------------------------------------------ shipped objects


def test_local_config_map_enables_local_models_and_keeps_the_other_sections() -> None:
    shipped = _shipped("base/config.yaml")
    result = localmode.local_config_map(shipped, namespace="ns", name="cm")
    assert (result["metadata"]["namespace"], result["metadata"]["name"]) == ("ns", "cm")
    section = json.loads(result["data"]["localModel"])
    assert section["enabled"] is True
    assert section["reconcilationFrequencyInSecs"] <= 10
    assert section["jobNamespace"] == json.loads(shipped["data"]["localModel"])["jobNamespace"]
    assert result["data"]["storageInitializer"] == shipped["data"]["storageInitializer"]
    assert json.loads(shipped["data"]["localModel"])["reconcilationFrequencyInSecs"] == 60


@pytest.mark.parametrize("name", ["mutating.yaml", "validating.yaml"])
def test_webhook_configurations_call_the_local_server_by_url(name: str) -> None:
    shipped = _shipped(f"webhook/{name}")
    result = localmode.local_webhook_configuration(shipped, port=8443)
    assert result["metadata"]["name"] == shipped["metadata"]["name"]  # caBundle patched by name
    for before, after in zip(shipped["webhooks"], result["webhooks"], strict=True):
        path = before["clientConfig"]["service"]["path"]
        assert after["clientConfig"] == {"url": f"https://127.0.0.1:8443{path}"}
        assert after["rules"] == before["rules"]
    assert "url" not in shipped["webhooks"][0]["clientConfig"]


def test_demo_nodes_join_the_sample_node_group() -> None:
    group = _shipped("samples/nodegroup.yaml")
    terms = group["spec"]["persistentVolumeSpec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    node = localmode.demo_node("demo-node-1")
    labels = node["metadata"]["labels"]
    assert labels[jobpods.HOSTNAME_LABEL] == "demo-node-1"
    assert any(
        all(labels.get(e["key"]) in e["values"] for e in term["matchExpressions"]) for term in terms
    )
    status = localmode.node_ready_status(datetime.datetime(2030, 1, 2, tzinfo=datetime.UTC))
    assert status["status"]["conditions"][0]["status"] == "True"
    assert status["status"]["conditions"][0]["lastHeartbeatTime"] == "2030-01-02T00:00:00Z"


def test_watch_commands_name_the_kubeconfig_and_the_cache() -> None:
    lines = localmode.watch_commands("kubectl", Path("/k"), name="m", namespace="ns")
    assert "kubectl --kubeconfig /k get lmnc -A -w" in lines
    assert "kubectl --kubeconfig /k get lmn" in lines
    assert any("wait --for=condition=Ready lmnc/m -n ns" in line for line in lines)
    assert "kubectl --kubeconfig /k describe lmnc m -n ns" in lines


def test_ready_line_reports_copies_and_nodes() -> None:
    obj = {
        "metadata": {"name": "m", "namespace": "ns"},
        "status": {
            "copies": {"available": 2, "total": 2},
            "nodeStatus": {"b": "NodeDownloaded", "a": "NodeDownloaded"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    assert localmode.cache_ready(obj)
    line = localmode.ready_line(obj)
    assert "ns/m is Ready: copies available 2/2" in line
    assert line.endswith("(a: NodeDownloaded, b: NodeDownloaded)")


def test_a_cache_without_a_true_ready_condition_is_not_ready() -> None:
    assert not localmode.cache_ready(None)
    assert not localmode.cache_ready(
        {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )


# ------------------------------------------------------------------ one run's own files


def test_each_run_gets_a_kubeconfig_directory_of_its_own(tmp_path: Path) -> None:
    first, second = local.run_directory(tmp_path), local.run_directory(tmp_path)
    assert first != second
    assert first.parent == second.parent == tmp_path / "localcache" / "run"
    assert first.name.startswith(f"{os.getpid()}-")


async def test_a_run_removes_its_own_kubeconfig_and_leaves_another_runs_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    other = local.run_directory(tmp_path) / "kubeconfig"  # a run side by side
    other.write_text("the other run's")
    used: list[Path] = []

    async def run_locally(settings: Any, kubeconfig: Path, *, exit_when_ready: bool) -> int:
        await asyncio.to_thread(kubeconfig.write_text, "this run's")
        used.append(kubeconfig)
        return 0

    monkeypatch.setattr(local, "_run_locally", run_locally)
    assert await local.run(_settings(), force_local=True, exit_when_ready=True) == 0
    assert await local.run(_settings(), force_local=True, exit_when_ready=True) == 0
    assert len(set(used)) == 2, "two runs shared a kubeconfig"
    assert other.parent not in {u.parent for u in used}
    for kubeconfig in used:
        assert kubeconfig.parent.parent == tmp_path / "localcache" / "run"
        assert not kubeconfig.parent.exists(), "a run left its directory behind"
    assert other.read_text() == "the other run's"


# ------------------------------------------------------------------ what the user is told


def test_service_addresses_name_metrics_health_and_webhooks() -> None:
    lines = localmode.service_addresses(
        _settings(
            "--bind-address", "127.0.0.1", "--metrics-port", "18080", "--webhook-port", "19443"
        )
    )
    assert lines == [
        "metrics: http://127.0.0.1:18080/metrics",
        "health:  http://127.0.0.1:18080/healthz http://127.0.0.1:18080/readyz",
        "webhooks: https://127.0.0.1:19443",
    ]


def test_service_addresses_of_any_address_use_localhost_and_say_what_is_off() -> None:
    lines = localmode.service_addresses(
        _settings("--bind-address", "0.0.0.0", "--metrics-port", "0", "--webhook-port", "0")
    )
    assert lines == [
        "metrics and health: on a free port (logged as http_server_started)",
        "webhooks: off (--webhook-port 0)",
    ]
    ipv6 = localmode.service_addresses(_settings("--bind-address", "::1", "--metrics-port", "1"))
    assert ipv6[0] == "metrics: http://[::1]:1/metrics"


def test_kubeconfig_target_is_the_current_context_and_its_server() -> None:
    doc = {
        "current-context": "prod",
        "contexts": [
            {"name": "dev", "context": {"cluster": "dev-cluster"}},
            {"name": "prod", "context": {"cluster": "prod-cluster"}},
        ],
        "clusters": [
            {"name": "dev-cluster", "cluster": {"server": "https://dev:6443"}},
            {"name": "prod-cluster", "cluster": {"server": "https://prod:6443"}},
        ],
    }
    assert localmode.kubeconfig_target(doc) == ("prod", "https://prod:6443")
    assert localmode.kubeconfig_target(doc, context="dev") == ("dev", "https://dev:6443")
    assert localmode.kubeconfig_target({"clusters": 5}) == ("?", "?")
    assert localmode.kubeconfig_target(None) == ("?", "?")


def test_attach_banner_names_context_server_kubeconfig_and_addresses() -> None:
    banner = localmode.attach_banner(
        kubeconfig=Path("/home/u/.kube/config"),
        context="prod",
        server="https://prod:6443",
        running="controller and webhooks",
        addresses=["metrics: http://localhost:8080/metrics"],
    )
    text = "\n".join(banner)
    assert banner[0] == banner[-1]
    assert set(banner[0]) == {"="}
    assert "ATTACHING TO AN EXISTING CLUSTER" in text
    assert "context:    prod" in text
    assert "server:     https://prod:6443" in text
    assert "kubeconfig: /home/u/.kube/config" in text
    assert "  metrics: http://localhost:8080/metrics" in text
    assert "--local" in text
