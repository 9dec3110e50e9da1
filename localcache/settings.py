"""Process settings: command-line flags with environment-variable defaults, validated once.

Every flag has an environment variable (`LOCALCACHE_*`, or the Kubernetes convention where one
exists: `KUBECONFIG`, `NODE_NAME`, `POD_NAMESPACE`, `POD_NAME`). The table in README.md is
generated from `FLAGS` by `python -m localcache.settings --markdown`, so it cannot drift.
Settings are an immutable value built by the composition root; nothing reads them from
globals.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localcache.agent import roots


@dataclass(frozen=True)
class Flag:
    """One setting: its flag, environment variable, default and help text."""

    dest: str
    flag: str
    env: str
    default: str
    help: str
    kind: Literal["str", "int", "float", "bool"] = "str"
    commands: tuple[str, ...] = ("controller", "agent", "run")


_ALL = ("controller", "agent", "run")
_CONTROLLER = ("controller", "run")
_AGENT = ("agent", "run")

FLAGS: tuple[Flag, ...] = (
    Flag(
        "kubeconfig",
        "--kubeconfig",
        "KUBECONFIG",
        "",
        "kubeconfig file; empty: in-cluster config, else ~/.kube/config",
    ),
    Flag(
        "log_level", "--log-level", "LOCALCACHE_LOG_LEVEL", "info", "debug, info, warning or error"
    ),
    Flag("log_format", "--log-format", "LOCALCACHE_LOG_FORMAT", "json", "json or console"),
    Flag(
        "metrics_port",
        "--metrics-port",
        "LOCALCACHE_METRICS_PORT",
        "8080",
        "port of /metrics, /healthz and /readyz (0: a free port)",
        "int",
    ),
    Flag(
        "bind_address",
        "--bind-address",
        "LOCALCACHE_BIND_ADDRESS",
        "0.0.0.0",
        "address the metrics/health and webhook servers listen on",
    ),
    Flag(
        "config_namespace",
        "--config-namespace",
        "POD_NAMESPACE",
        "kserve",
        "namespace of the inferenceservice-config ConfigMap, the lease and the webhook Secret",
    ),
    Flag(
        "config_map",
        "--config-map",
        "LOCALCACHE_CONFIG_MAP",
        "inferenceservice-config",
        "ConfigMap with the localModel/storageInitializer/credentials sections "
        "(install profiles: localcache-config)",
    ),
    Flag(
        "kserve_config",
        "--kserve-config",
        "LOCALCACHE_KSERVE_CONFIG",
        "",
        "KServe's ConfigMap as namespace/name, read only, under --config-map (whose keys win); "
        "empty: none",
    ),
    Flag(
        "shutdown_timeout",
        "--shutdown-timeout",
        "LOCALCACHE_SHUTDOWN_TIMEOUT",
        "5",
        "seconds allowed for a graceful stop",
        "float",
    ),
    Flag(
        "workers",
        "--workers",
        "LOCALCACHE_WORKERS",
        "2",
        "concurrent reconciles per controller",
        "int",
        _CONTROLLER,
    ),
    Flag(
        "leader_elect",
        "--leader-elect",
        "LOCALCACHE_LEADER_ELECT",
        "true",
        "hold a Lease before reconciling (run several replicas safely)",
        "bool",
        _CONTROLLER,
    ),
    Flag(
        "lease_name",
        "--lease-name",
        "LOCALCACHE_LEASE_NAME",
        "localcache-controller",
        "name of the coordination.k8s.io Lease",
        "str",
        _CONTROLLER,
    ),
    Flag(
        "identity",
        "--identity",
        "POD_NAME",
        "",
        "this replica's identity in the Lease (default: hostname + random suffix)",
        "str",
        _CONTROLLER,
    ),
    Flag(
        "lease_duration",
        "--leader-elect-lease-duration",
        "LOCALCACHE_LEASE_DURATION",
        "15",
        "seconds a follower waits before taking over an unrenewed Lease",
        "float",
        _CONTROLLER,
    ),
    Flag(
        "renew_deadline",
        "--leader-elect-renew-deadline",
        "LOCALCACHE_RENEW_DEADLINE",
        "10",
        "seconds the leader tries to renew before it stops reconciling (< lease duration)",
        "float",
        _CONTROLLER,
    ),
    Flag(
        "retry_period",
        "--leader-elect-retry-period",
        "LOCALCACHE_RETRY_PERIOD",
        "2",
        "seconds between Lease acquire/renew attempts",
        "float",
        _CONTROLLER,
    ),
    Flag(
        "webhook_port",
        "--webhook-port",
        "LOCALCACHE_WEBHOOK_PORT",
        "9443",
        "TLS port of the admission server (0: disabled)",
        "int",
        _CONTROLLER,
    ),
    Flag(
        "webhook_cert_dir",
        "--webhook-cert-dir",
        "LOCALCACHE_WEBHOOK_CERT_DIR",
        "/tmp/localcache-webhook-certs",
        "where the serving certificate files are written",
        "str",
        _CONTROLLER,
    ),
    Flag(
        "webhook_service",
        "--webhook-service",
        "LOCALCACHE_WEBHOOK_SERVICE",
        "localmodel-webhook-server-service",
        "Service the apiserver calls (certificate names)",
        "str",
        _CONTROLLER,
    ),
    Flag(
        "webhook_secret",
        "--webhook-secret",
        "LOCALCACHE_WEBHOOK_SECRET",
        "localmodel-webhook-server-cert",
        "Secret holding the CA and serving certificate",
        "str",
        _CONTROLLER,
    ),
    Flag(
        "webhook_configurations",
        "--webhook-configurations",
        "LOCALCACHE_WEBHOOK_CONFIGURATIONS",
        "localmodel.inferenceservice.serving.kserve.io,localmodelcache.serving.kserve.io",
        "the mutating and the validating webhook configuration given the caBundle",
        "str",
        _CONTROLLER,
    ),
    Flag(
        "allow_file_uris",
        "--allow-file-uris",
        "LOCALCACHE_ALLOW_FILE_URIS",
        "false",
        "admit file:// model URIs (demo nodes only: in a real download pod a file:// URI "
        "copies the pod's own files, such as its token, into a shared model folder)",
        "bool",
        _CONTROLLER,
    ),
    Flag(
        "self_managed_certs",
        "--self-managed-certs",
        "LOCALCACHE_SELF_MANAGED_CERTS",
        "true",
        "create/rotate certificates and patch caBundle (false: cert-manager mounts them)",
        "bool",
        _CONTROLLER,
    ),
    Flag(
        "node_name",
        "--node-name",
        "NODE_NAME",
        "",
        "the node this agent serves (required for `agent`)",
        "str",
        ("agent",),
    ),
    Flag(
        "models_root",
        "--models-root",
        "LOCALCACHE_MODELS_ROOT",
        "/mnt/models",
        "where model folders live inside the agent's container",
        "str",
        _AGENT,
    ),
    Flag(
        "host_models_root",
        "--host-models-root",
        "LOCALCACHE_HOST_MODELS_ROOT",
        "",
        "the node path mounted at --models-root (default: the same path)",
        "str",
        _AGENT,
    ),
    Flag(
        "models_roots",
        "--models-roots",
        "LOCALCACHE_MODELS_ROOTS",
        "",
        "several models roots, `<host path>=<container path>,...`: each node group is served "
        "on the root whose host path is its PV path (replaces --models-root and "
        "--host-models-root when set)",
        "str",
        _AGENT,
    ),
)


@dataclass(frozen=True)
class Settings:
    """Validated settings of one process."""

    command: str
    kubeconfig: str
    log_level: str
    log_format: str
    metrics_port: int
    bind_address: str
    config_namespace: str
    config_map: str
    shutdown_timeout: float
    workers: int
    leader_elect: bool
    lease_name: str
    identity: str
    webhook_port: int
    webhook_cert_dir: Path
    webhook_service: str
    webhook_secret: str
    self_managed_certs: bool
    allow_file_uris: bool
    node_name: str
    models_root: Path
    host_models_root: Path
    models_roots: tuple[roots.Root, ...] = ()
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    kserve_config: str = ""
    mutating_webhook_configuration: str = "localmodel.inferenceservice.serving.kserve.io"
    validating_webhook_configuration: str = "localmodelcache.serving.kserve.io"


class SettingsError(ValueError):
    """A flag or environment variable has an unusable value (the message names it)."""


def _parse_bool(text: str, flag: Flag) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{flag.flag} / {flag.env}: expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the flags that apply to `command`; defaults are read later, from the environment."""
    for flag in FLAGS:
        if command in flag.commands:
            parser.add_argument(
                flag.flag,
                dest=flag.dest,
                default=None,
                help=f"{flag.help} [env {flag.env}, default {flag.default or '(empty)'}]",
            )


def from_args(
    args: argparse.Namespace, command: str, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from parsed flags, falling back to environment variables, then defaults."""
    env = os.environ if environ is None else environ
    raw: dict[str, object] = {}
    for flag in FLAGS:
        given = getattr(args, flag.dest, None)
        text = str(given) if given is not None else env.get(flag.env) or flag.default
        try:
            if flag.kind == "int":
                raw[flag.dest] = int(text)
            elif flag.kind == "float":
                raw[flag.dest] = float(text)
            elif flag.kind == "bool":
                raw[flag.dest] = _parse_bool(text, flag)
            else:
                raw[flag.dest] = text
        except ValueError as exc:
            if isinstance(exc, SettingsError):
                raise
            raise SettingsError(f"{flag.flag} / {flag.env}: not a {flag.kind}: {text!r}") from exc
    if raw["log_level"] not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"--log-level: unknown level {raw['log_level']!r}")
    if raw["log_format"] not in ("json", "console"):
        raise SettingsError(f"--log-format: unknown format {raw['log_format']!r}")
    if command == "agent" and not raw["node_name"]:
        raise SettingsError("--node-name / NODE_NAME is required for `localcache agent`")
    lease, renew, retry = (
        float(str(raw[k])) for k in ("lease_duration", "renew_deadline", "retry_period")
    )
    if not lease > renew > 1.2 * retry > 0:
        raise SettingsError(
            "--leader-elect-*: need lease duration > renew deadline > 1.2 * retry period > 0, "
            f"got {lease:g} / {renew:g} / {retry:g}"
        )
    kserve_config = str(raw["kserve_config"])
    if kserve_config and len(kserve_config.split("/")) != 2:
        raise SettingsError(f"--kserve-config: want namespace/name, got {kserve_config!r}")
    webhook_configurations = str(raw["webhook_configurations"]).split(",")
    if len(webhook_configurations) != 2 or not all(webhook_configurations):
        raise SettingsError(
            "--webhook-configurations: want <mutating>,<validating>, "
            f"got {raw['webhook_configurations']!r}"
        )
    models_root = Path(str(raw["models_root"]))
    try:
        models_roots = tuple(roots.parse_roots(str(raw["models_roots"])))
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc
    return Settings(
        command=command,
        kubeconfig=str(raw["kubeconfig"]),
        log_level=str(raw["log_level"]),
        log_format=str(raw["log_format"]),
        metrics_port=int(str(raw["metrics_port"])),
        bind_address=str(raw["bind_address"]),
        config_namespace=str(raw["config_namespace"]),
        config_map=str(raw["config_map"]),
        shutdown_timeout=float(str(raw["shutdown_timeout"])),
        workers=max(1, int(str(raw["workers"]))),
        leader_elect=bool(raw["leader_elect"]),
        lease_name=str(raw["lease_name"]),
        # Two processes on one host must never share a Lease identity (client-go appends a
        # UUID to the hostname for the same reason); in a pod POD_NAME is already unique.
        identity=str(raw["identity"]) or f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}",
        webhook_port=int(str(raw["webhook_port"])),
        webhook_cert_dir=Path(str(raw["webhook_cert_dir"])),
        webhook_service=str(raw["webhook_service"]),
        webhook_secret=str(raw["webhook_secret"]),
        self_managed_certs=bool(raw["self_managed_certs"]),
        allow_file_uris=bool(raw["allow_file_uris"]),
        node_name=str(raw["node_name"]),
        models_root=models_root,
        host_models_root=(
            Path(str(raw["host_models_root"])) if raw["host_models_root"] else models_root
        ),
        models_roots=models_roots,
        lease_duration=float(str(raw["lease_duration"])),
        renew_deadline=float(str(raw["renew_deadline"])),
        retry_period=float(str(raw["retry_period"])),
        kserve_config=kserve_config,
        mutating_webhook_configuration=webhook_configurations[0],
        validating_webhook_configuration=webhook_configurations[1],
    )


def markdown_table() -> str:
    """The README's configuration table."""
    lines = ["| flag | environment | default | commands | meaning |", "|---|---|---|---|---|"]
    for flag in FLAGS:
        commands = ", ".join(flag.commands)
        default = f"`{flag.default}`" if flag.default else "(empty)"
        lines.append(f"| `{flag.flag}` | `{flag.env}` | {default} | {commands} | {flag.help} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print(markdown_table())
