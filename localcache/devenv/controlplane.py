"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager).

The binaries come from `hack/build-control-plane.sh` or `KUBEBUILDER_ASSETS` (`assets`).
Nothing here is faked: the apiserver serves TLS on a free loopback port, authenticates with
client certificates and authorises with RBAC.

Contract:
- `ControlPlane.start()` returns only when `/readyz` answers 200 to the admin user and the
  `default` namespace exists (and, with KCM, when KCM's `/healthz` answers); it raises
  `ControlPlaneError` with the tail of the failing process's log otherwise.
- `stop()` terminates every process it started and removes its temporary directory.
- `restart_apiserver()` stops and starts kube-apiserver on the same port and etcd data, so
  clients see a real outage; extra flags may be added for the new process.
- The harness talks to the apiserver with the standard library only (`rest()`), so it does not
  depend on the code under test.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcache.devenv import certs, clientconfig, processes
from localcache.devenv.assets import ControlPlaneError, find_binaries, free_port, release_port
from localcache.devenv.clientconfig import Credentials

START_TIMEOUT_S = 90.0

KCM_CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "job-controller",
    "ttl-after-finished-controller",
    "serviceaccount-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "pod-garbage-collector-controller",
    "clusterrole-aggregation-controller",  # tenant roles aggregate into edit/view
)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ optional kube-controller-manager) on free loopback ports."""

    with_kcm: bool = True
    bin_dir: Path = field(default_factory=find_binaries)
    apiserver_flags: Mapping[str, str] = field(default_factory=dict)
    kcm_flags: Mapping[str, str] = field(default_factory=dict)
    # Where the processes run: an argv prefix (e.g. nsenter into a network namespace), a hook
    # run in each child before exec (e.g. joining a cgroup), extra serving-certificate names.
    launch_prefix: Sequence[str] = ()
    preexec: Callable[[], None] | None = None
    serving_names: Sequence[str] = ()
    work_root: Path | None = None  # where the temporary directory goes (default: $TMPDIR)

    def __post_init__(self) -> None:
        self.work_dir = Path(tempfile.mkdtemp(prefix="localcache-cp-", dir=self.work_root))
        self.cert_dir = self.work_dir / "pki"
        self.cert_dir.mkdir()
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.api_port = free_port()
        self.kcm_port = free_port()
        self._procs: dict[str, processes.ManagedProcess] = {}
        self._write_pki()
        self.admin = self.add_user("admin", ["system:masters"])
        self.kubeconfig_path = self.write_kubeconfig(self.admin, self.work_dir / "admin.kubeconfig")

    # ----------------------------------------------------------------------------- pki

    def _write_pki(self) -> None:
        self.server_ca = certs.TinyCA("localcache-test-serving-ca")
        self.client_ca = certs.TinyCA("localcache-test-client-ca")
        serving = self.server_ca.serving_cert(["localhost", "127.0.0.1", *self.serving_names])
        self._write("apiserver.crt", serving.cert_pem)
        self._write("apiserver.key", serving.key_pem)
        self._write("serving-ca.crt", self.server_ca.cert_pem)
        self._write("client-ca.crt", self.client_ca.cert_pem)
        signing = certs.signing_key_pair()
        self._write("sa.key", signing.key_pem)
        self._write("sa.pub", signing.cert_pem)

    def _write(self, name: str, data: bytes) -> Path:
        path = self.cert_dir / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    @property
    def ca_path(self) -> Path:
        return self.cert_dir / "serving-ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def add_user(self, user: str, groups: list[str]) -> Credentials:
        """Issue a client certificate; the apiserver authenticates it as `user` in `groups`."""
        pair = self.client_ca.client_cert(user, groups)
        slug = user.replace(":", "_").replace("/", "_")
        return Credentials(
            user,
            self._write(f"user-{slug}.crt", pair.cert_pem),
            self._write(f"user-{slug}.key", pair.key_pem),
        )

    def service_account_credentials(self, namespace: str, name: str) -> Credentials:
        """Credentials that authenticate exactly as ServiceAccount `namespace/name` would."""
        return self.add_user(
            f"system:serviceaccount:{namespace}:{name}",
            ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
        )

    def kubeconfig(self, creds: Credentials) -> dict[str, Any]:
        return clientconfig.kubeconfig(self.server, self.ca_path, creds)

    def write_kubeconfig(self, creds: Credentials, path: Path) -> Path:
        path.write_text(yaml.safe_dump(self.kubeconfig(creds)))
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------------------ processes

    def _etcd_args(self) -> list[str]:
        return [
            str(self.bin_dir / "etcd"),
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_args(self, extra: Mapping[str, str]) -> list[str]:
        flags = {
            "etcd-servers": self.etcd_url,
            "secure-port": str(self.api_port),
            "bind-address": "127.0.0.1",
            "advertise-address": "127.0.0.1",
            "endpoint-reconciler-type": "none",
            "cert-dir": str(self.cert_dir),
            "tls-cert-file": str(self.cert_dir / "apiserver.crt"),
            "tls-private-key-file": str(self.cert_dir / "apiserver.key"),
            "client-ca-file": str(self.cert_dir / "client-ca.crt"),
            "service-account-issuer": f"https://127.0.0.1:{self.api_port}/",
            "service-account-key-file": str(self.cert_dir / "sa.pub"),
            "service-account-signing-key-file": str(self.cert_dir / "sa.key"),
            "authorization-mode": "RBAC",
            "disable-admission-plugins": "ServiceAccount",
            "service-cluster-ip-range": "10.0.0.0/24",
            "allow-privileged": "true",
            "enable-priority-and-fairness": "false",
            "profiling": "false",
        }
        flags.update(self.apiserver_flags)
        flags.update(extra)
        return [str(self.bin_dir / "kube-apiserver")] + [f"--{k}={v}" for k, v in flags.items()]

    def _kcm_args(self) -> list[str]:
        flags = {
            "kubeconfig": str(self.kubeconfig_path),
            "authentication-kubeconfig": str(self.kubeconfig_path),
            "authorization-kubeconfig": str(self.kubeconfig_path),
            "controllers": ",".join(KCM_CONTROLLERS),
            "leader-elect": "false",
            "bind-address": "127.0.0.1",
            "secure-port": str(self.kcm_port),
            "kube-api-qps": "200",
            "kube-api-burst": "400",
            "concurrent-gc-syncs": "10",
            "concurrent-namespace-syncs": "5",
        }
        flags.update(self.kcm_flags)
        return [str(self.bin_dir / "kube-controller-manager")] + [
            f"--{k}={v}" for k, v in flags.items()
        ]

    @property
    def kcm_available(self) -> bool:
        return os.access(self.bin_dir / "kube-controller-manager", os.X_OK)

    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver({})
            if self.with_kcm:
                if not self.kcm_available:
                    raise ControlPlaneError(f"kube-controller-manager not in {self.bin_dir}")
                self._start_kcm()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, name: str, args: list[str]) -> processes.ManagedProcess:
        proc = processes.ManagedProcess(
            name, [*self.launch_prefix, *args], self.work_dir / f"{name}.log", preexec=self.preexec
        )
        self._procs[name] = proc
        proc.start()
        return proc

    def _start_etcd(self) -> None:
        proc = self._launch("etcd", self._etcd_args())
        self._wait(proc, lambda: self._http_ok(f"{self.etcd_url}/health"), "etcd /health")

    def _start_apiserver(self, extra: Mapping[str, str]) -> None:
        proc = self._launch("kube-apiserver", self._apiserver_args(extra))
        self._wait(proc, self._apiserver_ready, "kube-apiserver /readyz and namespace default")

    def _start_kcm(self) -> None:
        proc = self._launch("kube-controller-manager", self._kcm_args())
        url = f"https://127.0.0.1:{self.kcm_port}/healthz"
        self._wait(
            proc, lambda: self._http_ok(url, verify=False), "kube-controller-manager /healthz"
        )

    def _wait(self, proc: processes.ManagedProcess, ready: Any, what: str) -> None:
        proc.wait_ready(ready, what=what, timeout=START_TIMEOUT_S, error=ControlPlaneError)

    def _http_ok(self, url: str, *, verify: bool = True) -> bool:
        parsed = urllib.parse.urlsplit(url)
        conn: http.client.HTTPConnection
        if parsed.scheme == "https":
            ctx = ssl.create_default_context()
            if not verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(parsed.netloc, timeout=2, context=ctx)
        else:
            conn = http.client.HTTPConnection(parsed.netloc, timeout=2)
        try:
            conn.request("GET", parsed.path)
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _apiserver_ready(self) -> bool:
        try:
            status, _ = self.rest("GET", "/readyz")
            if status != 200:
                return False
            status, _ = self.rest("GET", "/api/v1/namespaces/default")
            return status == 200
        except OSError:
            return False

    def restart_apiserver(self, extra_flags: Mapping[str, str] | None = None) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd data."""
        old = self._procs.get("kube-apiserver")
        if old is not None:
            old.stop()
        self._start_apiserver(extra_flags or {})

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (for outage tests); `restart_apiserver()` brings it back."""
        proc = self._procs.get("kube-apiserver")
        if proc is not None:
            proc.stop()

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                proc.stop()
        for proc in self._procs.values():  # others added by whoever built on this plane
            proc.stop()
        self._procs.clear()
        for port in (self.etcd_port, self.etcd_peer_port, self.api_port, self.kcm_port):
            release_port(port)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def logs(self, name: str, lines: int = 50) -> str:
        proc = self._procs.get(name)
        return proc.log_tail(lines) if proc else "(not running)"

    # ---------------------------------------------------------------------------- REST

    def ssl_context(self, creds: Credentials | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        creds = creds or self.admin
        ctx.load_cert_chain(str(creds.cert_path), str(creds.key_path))
        return ctx

    def rest(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        creds: Credentials | None = None,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        """One request to the apiserver as `creds` (default admin) or, with `token`, as that
        bearer token alone (no client certificate); returns (status, decoded JSON or text)."""
        context = (
            ssl.create_default_context(cafile=str(self.ca_path))
            if token is not None
            else self.ssl_context(creds)
        )
        conn = http.client.HTTPSConnection(
            f"127.0.0.1:{self.api_port}", timeout=timeout, context=context
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": content_type, "Accept": "application/json"}
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read().decode(errors="replace")
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except json.JSONDecodeError:
            return resp.status, raw

    def create_namespace(self, name: str) -> None:
        status, body = self.rest(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if status not in (201, 409):
            raise ControlPlaneError(f"creating namespace {name}: {status} {body}")

    def delete_namespace(self, name: str) -> None:
        self.rest("DELETE", f"/api/v1/namespaces/{name}")

    @property
    def kubectl_path(self) -> str | None:
        """The kubectl built beside the apiserver (same version), else the one on PATH."""
        own = self.bin_dir / "kubectl"
        return str(own) if os.access(own, os.X_OK) else shutil.which("kubectl")

    def kubectl(
        self, *args: str, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane as the admin user."""
        kubectl = self.kubectl_path
        if kubectl is None:
            raise ControlPlaneError("kubectl not found on PATH")
        return subprocess.run(
            [kubectl, f"--kubeconfig={self.kubeconfig_path}", *args],
            capture_output=True,
            text=True,
            check=check,
            input=input_text,
            timeout=60,
        )
