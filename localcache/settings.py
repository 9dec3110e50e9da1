"""Process settings: the flag table, parsed once (`from_args`) into per-concern groups.

Every flag has an environment variable (`LOCALCACHE_*`, or the Kubernetes convention where one
exists: `KUBECONFIG`, `NODE_NAME`, `POD_NAMESPACE`, `POD_NAME`, `POD_IP`); a flag wins over its
variable, which wins over the default. README.md's table is generated from `FLAGS` (`python -m
localcache.settings --markdown`). `Settings` is an immutable value built once by the entry
point and handed to the composition root. Its groups: `connection`, `logging`, `serving`
(metrics/health server), `config` (the ConfigMaps; the namespace also holds the Lease and the
webhook Secret), `leadership`, `controller`, `webhook`, `agent`; and `given`, the `dest`s of
the flags the user gave (flag or non-empty variable), so callers tell "left alone" from
"chosen" whatever the value. Imports no domain package (`--models-roots` parses into
`RootMount`, which the composition root converts for the agent).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localcache import flagvalues
from localcache.runtime import keys
from localcache.runtime.serving import tlsoptions

_ALL = ("controller", "agent", "run")
_CONTROLLER = ("controller", "run")
_AGENT = ("agent", "run")


@dataclass(frozen=True)
class Flag:
    """One setting: flag, environment variable, default and help text; `dest` (argparse's
    destination, the name in `Settings.given`) defaults to the flag's name in snake case."""

    flag: str
    env: str
    default: str
    help: str
    kind: Literal["str", "int", "float", "bool"] = "str"
    dest: str = ""
    commands: tuple[str, ...] = _ALL

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.flag.removeprefix("--").replace("-", "_"))


def _for(commands: tuple[str, ...], *flags: Flag) -> tuple[Flag, ...]:
    return tuple(dataclasses.replace(f, commands=commands) for f in flags)


# A table: one flag per entry (flag, variable, default, help[, kind[, dest]]).
# fmt: off
FLAGS: tuple[Flag, ...] = (
    Flag("--kubeconfig", "KUBECONFIG", "",
         "kubeconfig file; empty: in-cluster config, else ~/.kube/config"),
    Flag("--log-level", "LOCALCACHE_LOG_LEVEL", "info", "debug, info, warning or error"),
    Flag("--log-format", "LOCALCACHE_LOG_FORMAT", "json", "json or console"),
    Flag("--metrics-port", "LOCALCACHE_METRICS_PORT", "8080",
         "port of /metrics, /healthz and /readyz (0: a free port)", "int"),
    Flag("--bind-address", "LOCALCACHE_BIND_ADDRESS", "0.0.0.0",
         "address the metrics/health and webhook servers listen on"),
    Flag("--config-namespace", "POD_NAMESPACE", "kserve",
         "namespace of the inferenceservice-config ConfigMap, the lease and the webhook Secret"),
    Flag("--config-map", "LOCALCACHE_CONFIG_MAP", "inferenceservice-config",
         "ConfigMap with the localModel/storageInitializer/credentials sections (install "
         "profiles: localcache-config)"),
    Flag("--kserve-config", "LOCALCACHE_KSERVE_CONFIG", "",
         "KServe's ConfigMap as namespace/name, read only, under --config-map (whose keys win); "
         "empty: none"),
    Flag("--shutdown-timeout", "LOCALCACHE_SHUTDOWN_TIMEOUT", "5",
         "seconds allowed for a graceful stop", "float"),
    *_for(_CONTROLLER,
        Flag("--workers", "LOCALCACHE_WORKERS", "2",
             "concurrent reconciles per controller", "int"),
        Flag("--leader-elect", "LOCALCACHE_LEADER_ELECT", "true",
             "hold a Lease before reconciling (run several replicas safely)", "bool"),
        Flag("--lease-name", "LOCALCACHE_LEASE_NAME", "localcache-controller",
             "name of the coordination.k8s.io Lease"),
        Flag("--identity", "POD_NAME", "",
             "this replica's identity in the Lease (default: hostname + random suffix)"),
        Flag("--leader-elect-lease-duration", "LOCALCACHE_LEASE_DURATION", "15",
             "seconds a follower waits before taking over an unrenewed Lease", "float",
             "lease_duration"),
        Flag("--leader-elect-renew-deadline", "LOCALCACHE_RENEW_DEADLINE", "10",
             "seconds the leader tries to renew before it stops reconciling (< lease "
             "duration)", "float", "renew_deadline"),
        Flag("--leader-elect-retry-period", "LOCALCACHE_RETRY_PERIOD", "2",
             "seconds between Lease acquire/renew attempts", "float", "retry_period"),
        Flag("--webhook-port", "LOCALCACHE_WEBHOOK_PORT", "9443",
             "TLS port of the admission server (0: disabled)", "int"),
        Flag("--webhook-cert-dir", "LOCALCACHE_WEBHOOK_CERT_DIR",
             "/tmp/localcache-webhook-certs",
             "where the serving certificate files are written"),
        Flag("--webhook-service", "LOCALCACHE_WEBHOOK_SERVICE",
             "localmodel-webhook-server-service",
             "Service the apiserver calls (certificate names)"),
        Flag("--webhook-secret", "LOCALCACHE_WEBHOOK_SECRET", "localmodel-webhook-server-cert",
             "Secret holding the CA and serving certificate"),
        Flag("--webhook-configurations", "LOCALCACHE_WEBHOOK_CONFIGURATIONS",
             "localmodel.inferenceservice.serving.kserve.io,localmodelcache.serving.kserve.io",
             "the mutating and the validating webhook configuration given the caBundle"),
        Flag("--allow-file-uris", "LOCALCACHE_ALLOW_FILE_URIS", "false",
             "admit file:// model URIs (demo nodes only: in a real download pod a file:// URI "
             "copies the pod's own files, such as its token, into a shared model folder)",
             "bool"),
        Flag("--self-managed-certs", "LOCALCACHE_SELF_MANAGED_CERTS", "true",
             "create/rotate certificates and patch caBundle (false: cert-manager mounts them)",
             "bool"),
        Flag("--tls-min-version", "LOCALCACHE_TLS_MIN_VERSION", "VersionTLS12",
             "lowest TLS version of the admission server: VersionTLS12 or VersionTLS13"),
        Flag("--tls-cipher-suites", "LOCALCACHE_TLS_CIPHER_SUITES", "",
             "its TLS 1.2 cipher suites, Go's names, comma-separated (empty: ECDHE with AEAD)"),
        Flag("--agent-daemonset", "LOCALCACHE_AGENT_DAEMONSET", "kserve-localmodelnode-agent",
             "agent DaemonSet (in --config-namespace) given the node groups' tolerations, or ''"),
        Flag("--import-image", "LOCALCACHE_IMPORT_IMAGE", "",
             "localcache image of shared-volume import Jobs (empty: the controller's own)"),
    ),
    *_for(("agent",),
        Flag("--node-name", "NODE_NAME", "",
             "the node this agent serves (required for `agent`)"),
    ),
    *_for(_AGENT,
        Flag("--models-root", "LOCALCACHE_MODELS_ROOT", "/mnt/models",
             "where model folders live inside the agent's container"),
        Flag("--host-models-root", "LOCALCACHE_HOST_MODELS_ROOT", "",
             "the node path mounted at --models-root (default: the same path)"),
        Flag("--models-roots", "LOCALCACHE_MODELS_ROOTS", "",
             "several models roots, `<host path>=<container path>,...`: each node group is "
             "served on the root whose host path is its PV path (replaces --models-root and "
             "--host-models-root when set)"),
        Flag("--peer-port", "LOCALCACHE_PEER_PORT", "0",
             "TLS port of the peer server, published as status.peer.endpoint with --pod-ip "
             "(0: not serving)", "int"),
        Flag("--pod-ip", "POD_IP", "", "the agent pod's IP, in status.peer.endpoint"),
        Flag("--peer-image", "LOCALCACHE_PEER_IMAGE", "",
             "localcache image of peer-mode download Jobs (empty: this agent's downloads all "
             "come from the origin; it still hashes and serves its folders to peers)"),
        Flag("--peer-ca", "LOCALCACHE_PEER_CA", "/var/run/localcache/peer-tls/ca.crt",
             "the peer CA certificate (PEM) peer-mode download pods verify peers against"),
    ),
)
# fmt: on
BY_DEST: Mapping[str, Flag] = {f.dest: f for f in FLAGS}


@dataclass(frozen=True)
class Connection:
    kubeconfig: str  # empty: in-cluster config, else the current one


@dataclass(frozen=True)
class Logging:
    level: str
    format: Literal["json", "console"]


@dataclass(frozen=True)
class Serving:
    """The metrics/health server (and the address the webhook server binds too)."""

    bind_address: str
    metrics_port: int


@dataclass(frozen=True)
class ConfigMaps:
    """Where the configuration lives; `namespace` also holds the Lease and webhook Secret."""

    namespace: str
    name: str
    kserve: keys.ObjectKey | None  # KServe's, read only, under `name` (--kserve-config)


@dataclass(frozen=True)
class Leadership:
    elect: bool
    lease_name: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


@dataclass(frozen=True)
class Controller:
    workers: int
    agent_daemonset: str = ""  # its tolerations follow the node groups' (empty: left alone)
    import_image: str = ""  # of shared-volume import Jobs (empty: the controller's own)


@dataclass(frozen=True)
class Webhook:
    port: int  # 0: no admission server
    cert_dir: Path
    service: str
    secret: str
    mutating_configuration: str
    validating_configuration: str
    self_managed_certs: bool
    allow_file_uris: bool
    tls: tlsoptions.TLSOptions


RootMount = flagvalues.RootMount
SettingsError = flagvalues.SettingsError
parse_root_mounts = flagvalues.parse_root_mounts


@dataclass(frozen=True)
class Agent:
    node_name: str
    models_root: Path
    host_models_root: Path  # the node path mounted at `models_root`
    models_roots: tuple[RootMount, ...] = ()
    peer_port: int = 0  # of the peer server (0: not serving)
    pod_ip: str = ""  # the agent pod's IP (POD_IP), in status.peer.endpoint
    peer_image: str = ""  # of peer-mode download Jobs (empty: downloads from the origin only)
    peer_ca: Path = Path("/var/run/localcache/peer-tls/ca.crt")


@dataclass(frozen=True)
class Settings:
    """Validated settings of one process, by concern (module docstring)."""

    command: str
    connection: Connection
    logging: Logging
    serving: Serving
    config: ConfigMaps
    leadership: Leadership
    controller: Controller
    webhook: Webhook
    agent: Agent
    shutdown_timeout: float = 5.0
    given: frozenset[str] = frozenset()
    """`dest`s of the flags given by flag or environment variable (`BY_DEST` names them)."""


def _parse_bool(text: str, flag: Flag) -> bool:
    if (lowered := text.strip().lower()) in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return lowered in ("1", "true", "yes", "on")
    raise SettingsError(f"{flag.flag} / {flag.env}: expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the flags that apply to `command`; defaults are read later, from the environment."""
    for flag in FLAGS:
        if command in flag.commands:
            text = f"{flag.help} [env {flag.env}, default {flag.default or '(empty)'}]"
            parser.add_argument(flag.flag, dest=flag.dest, default=None, help=text)


def _typed(flag: Flag, text: str) -> str | int | float | bool:
    try:
        if flag.kind == "int":
            return int(text)
        if flag.kind == "float":
            return float(text)
    except ValueError as exc:
        raise SettingsError(f"{flag.flag} / {flag.env}: not a {flag.kind}: {text!r}") from exc
    return _parse_bool(text, flag) if flag.kind == "bool" else text


def from_args(
    args: argparse.Namespace, command: str, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from parsed flags, falling back to environment variables, then defaults."""
    env = os.environ if environ is None else environ
    raw: dict[str, str | int | float | bool] = {}
    given: set[str] = set()
    for flag in FLAGS:
        value = getattr(args, flag.dest, None)
        text = str(value) if value is not None else env.get(flag.env) or ""
        if text or value is not None:
            given.add(flag.dest)
        raw[flag.dest] = _typed(flag, text if flag.dest in given else flag.default)

    def s(dest: str) -> str:
        return str(raw[dest])

    def n(dest: str) -> float:
        value = raw[dest]
        assert isinstance(value, int | float)
        return value

    if s("log_level") not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"--log-level: unknown level {raw['log_level']!r}")
    log_format = s("log_format")
    if log_format not in ("json", "console"):
        raise SettingsError(f"--log-format: unknown format {log_format!r}")
    if command == "agent" and not raw["node_name"]:
        raise SettingsError("--node-name / NODE_NAME is required for `localcache agent`")
    lease, renew, retry = n("lease_duration"), n("renew_deadline"), n("retry_period")
    if not lease > renew > 1.2 * retry > 0:
        raise SettingsError(
            "--leader-elect-*: need lease duration > renew deadline > 1.2 * retry period > 0, "
            f"got {lease:g} / {renew:g} / {retry:g}"
        )
    kserve = s("kserve_config").split("/") if raw["kserve_config"] else None
    if kserve is not None and len(kserve) != 2:
        raise SettingsError(f"--kserve-config: want namespace/name, got {s('kserve_config')!r}")
    try:
        tls = tlsoptions.resolve(s("tls_min_version"), s("tls_cipher_suites"))
    except ValueError as exc:
        raise SettingsError(f"--tls-min-version / --tls-cipher-suites: {exc}") from exc
    hooks = (hooks_text := s("webhook_configurations")).split(",")
    if len(hooks) != 2 or not all(hooks):
        raise SettingsError(
            f"--webhook-configurations: want <mutating>,<validating>, got {hooks_text!r}"
        )
    models_root = Path(s("models_root"))
    return Settings(
        command=command,
        connection=Connection(kubeconfig=s("kubeconfig")),
        logging=Logging(
            level=s("log_level"), format="console" if log_format == "console" else "json"
        ),
        serving=Serving(bind_address=s("bind_address"), metrics_port=int(n("metrics_port"))),
        config=ConfigMaps(
            namespace=s("config_namespace"),
            name=s("config_map"),
            kserve=keys.ObjectKey(kserve[0], kserve[1]) if kserve is not None else None,
        ),
        leadership=Leadership(
            elect=bool(raw["leader_elect"]),
            lease_name=s("lease_name"),
            # Two processes on one host must never share a Lease identity (client-go appends a
            # UUID to the hostname for the same reason); in a pod POD_NAME is already unique.
            identity=s("identity") or f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}",
            lease_duration=lease,
            renew_deadline=renew,
            retry_period=retry,
        ),
        controller=Controller(max(1, int(n("workers"))), s("agent_daemonset"), s("import_image")),
        webhook=Webhook(
            port=int(n("webhook_port")),
            cert_dir=Path(s("webhook_cert_dir")),
            service=s("webhook_service"),
            secret=s("webhook_secret"),
            mutating_configuration=hooks[0],
            validating_configuration=hooks[1],
            self_managed_certs=bool(raw["self_managed_certs"]),
            allow_file_uris=bool(raw["allow_file_uris"]),
            tls=tls,
        ),
        agent=Agent(
            node_name=s("node_name"),
            models_root=models_root,
            host_models_root=Path(s("host_models_root")) if s("host_models_root") else models_root,
            models_roots=parse_root_mounts(s("models_roots")),
            peer_port=int(n("peer_port")),
            pod_ip=s("pod_ip"),
            peer_image=s("peer_image"),
            peer_ca=Path(s("peer_ca")),
        ),
        shutdown_timeout=n("shutdown_timeout"),
        given=frozenset(given),
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
