"""Pure parts of `localcache run`'s local mode: its settings, objects and messages. No I/O.

- `local_settings`: the user's settings adjusted for a local control plane (free ports,
  loopback binding and certificates under the run directory where the user gave none;
  models roots under the run directory).
- `local_config_map`, `local_webhook_configuration`, `demo_node`, `node_ready_status`: the
  shipped objects as a local run creates them (`LOCAL_MODEL_OVERRIDES`, URL webhooks on
  127.0.0.1, demo Nodes `DEMO_NODES` labelled `WORKER_LABEL`).
- `cache_ready`, `watch_commands`, `ready_line`: when the sample cache is Ready, and what the
  user is told; `service_addresses`: where the process serves metrics, health and webhooks;
  `kubeconfig_target` and `attach_banner`: which cluster `localcache run` attaches to, told
  so that it cannot be missed. `localcache.local` does the I/O with them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from localcache import settings as settings_mod
from localcache.devenv import assets, jobpods

Obj = dict[str, Any]
DEMO_NODES = ("demo-node-1", "demo-node-2")
WORKER_LABEL = ("kserve/localmodel", "worker")
LOCAL_MODEL_OVERRIDES: Mapping[str, Any] = {
    "enabled": True,
    "reconcilationFrequencyInSecs": 5,
    "downloadRetryBackoffInSecs": 2,
    "downloadRetryMaxBackoffInSecs": 30,
}
"""`localModel` keys set over the shipped ConfigMap, so the demo is snappy."""


def local_settings(
    settings: settings_mod.Settings,
    *,
    run_dir: Path,
    kubeconfig: Path,
    pv_path: str,
    pick_port: Callable[[], int] = assets.free_port,
) -> settings_mod.Settings:
    """`settings` for local mode: the local kubeconfig; a free metrics port and a free
    webhook port (picked here, so they can be printed), loopback binding and certificates
    under `run_dir` for each of those the user did not give (`settings.given`: by flag or
    environment variable, whatever the value); models roots under `run_dir` standing for
    the node group's PV path `pv_path`."""
    given, serving, webhook = settings.given, settings.serving, settings.webhook
    if "metrics_port" not in given:  # not 0: the address is printed for the user
        serving = dataclasses.replace(serving, metrics_port=pick_port())
    if "bind_address" not in given:
        serving = dataclasses.replace(serving, bind_address="127.0.0.1")
    if "webhook_port" not in given:
        webhook = dataclasses.replace(webhook, port=pick_port())
    if "webhook_cert_dir" not in given:
        webhook = dataclasses.replace(webhook, cert_dir=run_dir / "webhook-certs")
    return dataclasses.replace(
        settings,
        connection=settings_mod.Connection(kubeconfig=str(kubeconfig)),
        serving=serving,
        # the demo sample is a file:// model that the demo Job runner copies on this host
        webhook=dataclasses.replace(webhook, allow_file_uris=True),
        agent=dataclasses.replace(
            settings.agent, models_root=run_dir / "nodes", host_models_root=Path(pv_path)
        ),
    )


def local_config_map(shipped: Obj, *, namespace: str, name: str) -> Obj:
    """The shipped `inferenceservice-config` with `LOCAL_MODEL_OVERRIDES`, renamed."""
    data = dict(shipped.get("data") or {})
    data["localModel"] = json.dumps(
        {**json.loads(data.get("localModel") or "{}"), **LOCAL_MODEL_OVERRIDES}
    )
    meta = {**(shipped.get("metadata") or {}), "namespace": namespace, "name": name}
    return {**shipped, "metadata": meta, "data": data}


def local_webhook_configuration(shipped: Obj, *, port: int) -> Obj:
    """A shipped webhook configuration calling https://127.0.0.1:`port` by URL, without a
    caBundle (the certificate manager patches it in, by the configuration's name)."""
    out: Obj = json.loads(json.dumps(shipped))
    for hook in out.get("webhooks") or []:
        path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or "/"
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    return out


def demo_node(name: str) -> Obj:
    key, value = WORKER_LABEL
    labels = {key: value, jobpods.HOSTNAME_LABEL: name}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def node_ready_status(now: datetime.datetime) -> Obj:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "played by localcache run (no kubelet)",
                 "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}  # fmt: skip
    return {"status": {"conditions": [condition]}}


def cache_ready(obj: Obj | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def watch_commands(kubectl: str, kubeconfig: Path, *, name: str, namespace: str) -> list[str]:
    k = f"{kubectl} --kubeconfig {kubeconfig}"
    return [
        f"{k} get lmnc -A -w",
        f"{k} get lmn",
        f"{k} wait --for=condition=Ready lmnc/{name} -n {namespace} --timeout=120s",
        f"{k} describe lmnc {name} -n {namespace}",
        f"{k} get jobs,pods -A",
    ]


def ready_line(obj: Obj) -> str:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    copies = status.get("copies") or {}
    nodes = ", ".join(f"{n}: {s}" for n, s in sorted((status.get("nodeStatus") or {}).items()))
    return (
        f"localcache: LocalModelNamespaceCache {meta.get('namespace')}/{meta.get('name')} is "
        f"Ready: copies available {copies.get('available', 0)}/{copies.get('total', 0)} ({nodes})"
    )


def _url_host(bind_address: str) -> str:
    """A host for URLs to a server bound to `bind_address` (any address: localhost)."""
    if bind_address in ("", "0.0.0.0", "::"):
        return "localhost"
    return f"[{bind_address}]" if ":" in bind_address else bind_address


def service_addresses(settings: settings_mod.Settings) -> list[str]:
    """Where a process with `settings` serves /metrics, the probes and the webhooks."""
    host = _url_host(settings.serving.bind_address)
    if settings.serving.metrics_port:
        base = f"http://{host}:{settings.serving.metrics_port}"
        lines = [f"metrics: {base}/metrics", f"health:  {base}/healthz {base}/readyz"]
    else:
        lines = ["metrics and health: on a free port (logged as http_server_started)"]
    if settings.webhook.port:
        lines.append(f"webhooks: https://{host}:{settings.webhook.port}")
    else:
        lines.append("webhooks: off (--webhook-port 0)")
    return lines


def kubeconfig_target(doc: object, *, context: str | None = None) -> tuple[str, str]:
    """(context name, server URL) that a kubeconfig document selects: `context`, else its
    current-context; "?" for what it does not say."""
    config = doc if isinstance(doc, dict) else {}
    name = context or str(config.get("current-context") or "")

    def named(section: str, wanted: str) -> Obj:
        for item in config.get(section) or []:
            if isinstance(item, dict) and item.get("name") == wanted:
                inner = item.get(section.removesuffix("s"))
                return inner if isinstance(inner, dict) else {}
        return {}

    cluster = str(named("contexts", name).get("cluster") or "")
    server = str(named("clusters", cluster).get("server") or "") if cluster else ""
    return name or "?", server or "?"


def attach_banner(
    *, kubeconfig: Path, context: str, server: str, running: str, addresses: list[str]
) -> list[str]:
    """What `localcache run` prints when it attaches to an existing cluster."""
    rule = "=" * 78
    return [
        rule,
        "localcache run: ATTACHING TO AN EXISTING CLUSTER (no local control plane is started)",
        f"  context:    {context}",
        f"  server:     {server}",
        f"  kubeconfig: {kubeconfig}",
        f"  running:    {running}",
        *(f"  {line}" for line in addresses),
        "  (`localcache run --local` starts a local control plane instead)",
        rule,
    ]
