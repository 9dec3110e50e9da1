"""Pure parts of `localcache run` (localcache/local.py, localcache/localmode.py) and of the local
Job runner (localcache/devenv/jobpods.py): no network, no processes."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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


def _settings(**changes: Any) -> settings_mod.Settings:
    base = settings_mod.from_args(argparse.Namespace(), "run", environ={})
    return dataclasses.replace(base, **changes)


def _shipped(path: str) -> Obj:
    doc: Obj = yaml.safe_load((MANIFESTS / path).read_text())
    return doc


# ------------------------------------------------------------------ which cluster


def test_kubeconfig_flag_wins_over_the_environment(tmp_path: Path) -> None:
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.write_text("x")
    env.write_text("x")
    found = local.kubeconfig_candidate(
        _settings(kubeconfig=str(flag)), {"KUBECONFIG": str(env)}, tmp_path
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
    assert result.kubeconfig == str(tmp_path / "kc")
    assert (result.metrics_port, result.webhook_port) == (41234, 41235)
    assert result.bind_address == "127.0.0.1"
    assert result.webhook_cert_dir == tmp_path / "webhook-certs"
    assert result.models_root == tmp_path / "nodes"
    assert result.host_models_root == Path("/mnt/models")


def test_local_settings_keep_what_the_user_chose(tmp_path: Path) -> None:
    chosen = _settings(
        metrics_port=9090, webhook_port=9444, bind_address="::1", webhook_cert_dir=Path("/c")
    )
    result = localmode.local_settings(
        chosen, run_dir=tmp_path, kubeconfig=tmp_path / "kc", pv_path="/p", pick_port=lambda: 1
    )
    assert (result.metrics_port, result.webhook_port) == (9090, 9444)
    assert result.bind_address == "::1"
    assert result.webhook_cert_dir == Path("/c")


def test_disabled_webhooks_stay_disabled(tmp_path: Path) -> None:
    result = localmode.local_settings(
        _settings(webhook_port=0), run_dir=tmp_path, kubeconfig=tmp_path, pv_path="/p"
    )
    assert result.webhook_port == 0


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


# ------------------------------------------------------------------ the local Job runner


def _pod(**changes: Any) -> Obj:
    pod: Obj = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "ownerReferences": [{"kind": "Job", "name": "j"}],
        },
        "spec": {
            "nodeSelector": {jobpods.HOSTNAME_LABEL: "n1"},
            "containers": [
                {
                    "name": "dl",
                    "image": "img",
                    "args": ["file:///m", "/mnt/models"],
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {}}],
                    "volumeMounts": [
                        {"name": "other", "mountPath": "/mnt"},
                        {"name": "src", "mountPath": "/mnt/models", "subPath": ".staging/k-j"},
                    ],
                }
            ],
            "volumes": [
                {"name": "src", "persistentVolumeClaim": {"claimName": "c"}},
                {"name": "other", "emptyDir": {}},
            ],
        },
        "status": {"phase": "Pending"},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        pod[section][field] = value
    return pod


NODES = {"n1": Path("/host/n1")}


def test_a_pending_job_pod_pinned_to_a_played_node_is_run() -> None:
    assert jobpods.target_node(_pod(), NODES) == "n1"
    assert jobpods.target_node(_pod(spec__nodeName="n1"), NODES) == "n1"


@pytest.mark.parametrize(
    "changes",
    [
        {"spec__nodeSelector": {jobpods.HOSTNAME_LABEL: "n2"}},
        {"spec__nodeSelector": {}},
        {"spec__nodeName": "n2"},
        {"status__phase": "Running"},
        {"status__phase": "Succeeded"},
        {"metadata__deletionTimestamp": "2030-01-01T00:00:00Z"},
        {"metadata__ownerReferences": [{"kind": "ReplicaSet", "name": "r"}]},
    ],
)
def test_other_pods_are_left_alone(changes: dict[str, Any]) -> None:
    assert jobpods.target_node(_pod(**changes), NODES) is None


def test_the_plan_follows_the_mount_that_holds_the_destination() -> None:
    plan = jobpods.plan_download(_pod())
    assert (plan.uri, plan.claim, plan.sub_path, plan.relative) == (
        "file:///m",
        "c",
        ".staging/k-j",
        "",
    )
    assert (plan.container, plan.image, plan.env) == ("dl", "img", (("A", "1"),))


def test_a_destination_below_the_mount_keeps_its_rest() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["args"] = ["s3://b/m", "/mnt/models/sub/dir"]
    assert jobpods.plan_download(pod).relative == "sub/dir"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["only-uri"], "expected args"),
        (["u", "/elsewhere"], "no volume mount holds /elsewhere"),
        (["u", "/mnt/x"], "'other' is not a PersistentVolumeClaim"),
    ],
)
def test_a_pod_that_cannot_be_planned_says_why(args: list[str], error: str) -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["args"] = args
    with pytest.raises(jobpods.PodError, match=error):
        jobpods.plan_download(pod)


def _pv(path: str, kind: str = "local") -> Obj:
    return {"metadata": {"name": "pv"}, "spec": {kind: {"path": path}}}


def test_the_host_destination_is_the_node_folder_plus_subpath() -> None:
    plan = jobpods.plan_download(_pod())
    dest = jobpods.host_destination(
        plan, _pv("/mnt/models"), host_root=Path("/host/n1"), pv_path="/mnt/models/"
    )
    assert dest == Path("/host/n1/.staging/k-j")
    assert jobpods.host_destination(plan, _pv("/any", "hostPath"), host_root=Path("/h")) == Path(
        "/h/.staging/k-j"
    )


def test_a_pv_elsewhere_than_the_node_volume_is_refused() -> None:
    plan = jobpods.plan_download(_pod())
    with pytest.raises(jobpods.PodError, match="not the node's local volume"):
        jobpods.host_destination(plan, _pv("/other"), host_root=Path("/h"), pv_path="/mnt")
    with pytest.raises(jobpods.PodError, match="not a local or hostPath volume"):
        jobpods.host_destination(plan, {"spec": {"nfs": {}}}, host_root=Path("/h"))


@pytest.mark.parametrize("sub_path", ["../escape", "/abs", "a/../../b"])
def test_a_subpath_cannot_leave_the_volume(sub_path: str) -> None:
    plan = dataclasses.replace(jobpods.plan_download(_pod()), sub_path=sub_path)
    with pytest.raises(jobpods.PodError, match="leaves the volume"):
        jobpods.host_destination(plan, _pv("/p"), host_root=Path("/h"))


def test_finished_status_reports_success_and_failure() -> None:
    stamps = {"started_at": "t0", "finished_at": "t1"}
    ok = jobpods.finished_status(container="c", image="i", exit_code=0, message="", **stamps)
    assert ok["status"]["phase"] == "Succeeded"
    terminated = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    bad = jobpods.finished_status(
        container="c", image="i", exit_code=2, message="line one\nno such file\n", **stamps
    )
    assert (bad["status"]["phase"], bad["status"]["message"]) == ("Failed", "no such file")
    terminated = bad["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (2, "Error")
    assert "no such file" in terminated["message"]


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
        _settings(bind_address="127.0.0.1", metrics_port=18080, webhook_port=19443)
    )
    assert lines == [
        "metrics: http://127.0.0.1:18080/metrics",
        "health:  http://127.0.0.1:18080/healthz http://127.0.0.1:18080/readyz",
        "webhooks: https://127.0.0.1:19443",
    ]


def test_service_addresses_of_any_address_use_localhost_and_say_what_is_off() -> None:
    lines = localmode.service_addresses(
        _settings(bind_address="0.0.0.0", metrics_port=0, webhook_port=0)
    )
    assert lines == [
        "metrics and health: on a free port (logged as http_server_started)",
        "webhooks: off (--webhook-port 0)",
    ]
    ipv6 = localmode.service_addresses(_settings(bind_address="::1", metrics_port=1))
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
