"""`localcache run`: the whole operator in one process, for a laptop.

- With a reachable cluster (the kubeconfig of `--kubeconfig`, `$KUBECONFIG` or
  `~/.kube/config`, whose apiserver answers `/version` within `PROBE_TIMEOUT_S`) and without
  `--local`: controller and webhooks run against it, plus an agent when `NODE_NAME` is set.
- Otherwise, on a machine that can host real nodes: `realnodes.run` (a control plane and two
  real nodes; the operator deployed as pods from the shipped manifests, so the settings of
  this process's operator are refused there, naming them). It says so, and so does the
  fallback when it cannot:
- local mode with demo nodes (`LocalRun`): a local control plane (`make control-plane`) with
  the shipped configuration (manifests/: CRDs, namespaces, `inferenceservice-config`, webhook
  configurations calling https://127.0.0.1:<port>, the sample node group), two demo Nodes
  labelled `kserve/localmodel=worker`, and in one Manager: controller, webhooks, one agent per
  demo node (each with its own models root standing for the node group's PV path) and the
  demo Job runner (`devenv.jobrunner`, which plays the nodes for download Jobs). Then the
  sample namespace cache is applied, the kubectl commands to watch it are printed, and so is
  its Ready state; `--exit-when-ready` stops there (exit 0, or 1 when it is not Ready within
  `READY_TIMEOUT_S`). The control plane is always stopped on the way out.

Each local run writes its kubeconfig into a directory of its own,
`$XDG_CACHE_HOME/localcache/run/<pid>-<random>/` (`run_directory`), removed by that run only
when it ends, so runs side by side never share or delete each other's kubeconfig. Attaching
to a cluster is announced by a banner naming its context, server and kubeconfig; every mode
that runs the operator in this process prints its metrics, health and webhook addresses.
The pure parts are `localmode`; this module does the I/O. Messages for the user go to
stdout; logs go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import structlog
import yaml

from localcache import app
from localcache import settings as settings_mod
from localcache.api import groupversion
from localcache.devenv import assets, controlplane, crds, jobrunner, localmode, realnodes
from localcache.runtime import errors, informer, kube, listwatch, manager

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
DEMO_FILE = "model.txt"
PROBE_TIMEOUT_S = 3.0
READY_TIMEOUT_S = 300.0
APPLY_TIMEOUT_S = 60.0
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP.api


async def run(settings: settings_mod.Settings, *, force_local: bool, exit_when_ready: bool) -> int:
    """`localcache run`; returns the exit code (see the module docstring)."""
    if not force_local:
        path, problem = await probe_kubeconfig(settings)
        if path is not None:
            return await _run_against(settings, path)
        if problem is not None:
            print(f"localcache: not attaching to a cluster: {problem}", flush=True)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    private = run_directory(cache)
    kubeconfig = private / "kubeconfig"
    try:
        return await _run_locally(settings, kubeconfig, exit_when_ready=exit_when_ready)
    finally:
        await asyncio.to_thread(shutil.rmtree, private, True)


def run_directory(cache_home: Path) -> Path:
    """A new directory for one run's kubeconfig, `<cache_home>/localcache/run/<pid>-<random>`,
    private to that run: it alone writes and removes it."""
    base = cache_home / "localcache" / "run"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))


async def _run_locally(
    settings: settings_mod.Settings, kubeconfig: Path, *, exit_when_ready: bool
) -> int:
    reason = realnodes.unavailable_reason()
    if reason is None:
        realnodes.refuse_unhonoured(settings)
        return await realnodes.run(kubeconfig_path=kubeconfig, exit_when_ready=exit_when_ready)
    print(
        f"localcache: real nodes are not available here ({reason}): using two demo nodes "
        "and the demo Job runner instead",
        flush=True,
    )
    run_dir = Path(tempfile.mkdtemp(prefix="localcache-run-"))
    local: LocalRun | None = None
    try:
        local = LocalRun(settings, run_dir=run_dir, kubeconfig_path=kubeconfig)
        await local.start()
        return await local.serve(exit_when_ready=exit_when_ready)
    except (assets.ControlPlaneError, OSError) as exc:
        hint = "" if "make control-plane" in str(exc) else " (binaries: `make control-plane`)"
        print(f"localcache: cannot run locally: {exc}{hint}", file=sys.stderr)
        return 1
    finally:
        if local is not None:
            await local.close()  # also removes run_dir
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


# ------------------------------------------------------------------ an existing cluster


def kubeconfig_candidate(
    settings: settings_mod.Settings, environ: Mapping[str, str], home: Path
) -> Path | None:
    """The kubeconfig `localcache run` would use: `--kubeconfig`, else the first file of
    `$KUBECONFIG`, else `~/.kube/config`; None when that file does not exist."""
    first = next((p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p), "")
    path = Path(settings.connection.kubeconfig or first or home / ".kube" / "config").expanduser()
    return path if path.is_file() else None


async def reachable_kubeconfig(settings: settings_mod.Settings) -> Path | None:
    """The kubeconfig of a cluster that answers `/version` within `PROBE_TIMEOUT_S`, or None."""
    path, _ = await probe_kubeconfig(settings)
    return path


async def probe_kubeconfig(settings: settings_mod.Settings) -> tuple[Path | None, str | None]:
    """(the kubeconfig of a cluster that answers `/version` within `PROBE_TIMEOUT_S`, None),
    or (None, why the kubeconfig found cannot be used), or (None, None) when there is none."""
    path = kubeconfig_candidate(settings, os.environ, Path.home())
    if path is None:
        return None, None
    try:
        await app.check_apiserver(settings_mod.Connection(str(path)), wait_s=PROBE_TIMEOUT_S)
    except errors.ConfigError as exc:
        _log.info("local_kubeconfig_unusable", kubeconfig=str(path), error=str(exc))
        return None, str(exc)
    except (errors.LocalcacheError, OSError) as exc:
        _log.info("local_cluster_unreachable", kubeconfig=str(path), error=str(exc))
        return None, str(exc)
    return path, None


async def _run_against(settings: settings_mod.Settings, path: Path) -> int:
    what = "controller" + (" and webhooks" if settings.webhook.port else "")
    what += f", agent of {settings.agent.node_name}" if settings.agent.node_name else ""
    try:
        doc = yaml.safe_load(await asyncio.to_thread(path.read_text))
    except (OSError, yaml.YAMLError):  # it was just loaded: unlikely, and only the banner loses
        doc = None
    context, server = localmode.kubeconfig_target(doc)
    banner = localmode.attach_banner(
        kubeconfig=path,
        context=context,
        server=server,
        running=what,
        addresses=localmode.service_addresses(settings),
    )
    print("\n".join(banner), flush=True)
    return await app.run_attached(settings, path)


def _load(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


# ------------------------------------------------------------------ local mode


class LocalRun:
    """One local-mode run: `start()` (control plane and objects), `serve()` (the Manager,
    until stopped), `stop()` (ask `serve()` to return), `close()` (stop the control plane,
    remove `run_dir` and the kubeconfig). `ready` is set once the sample cache is Ready."""

    def __init__(
        self,
        settings: settings_mod.Settings,
        *,
        run_dir: Path,
        kubeconfig_path: Path,
        manifests: Path = MANIFESTS,
        out: TextIO | None = None,
    ) -> None:
        if not (manifests / "crds").is_dir():
            raise assets.ControlPlaneError(f"no manifests in {manifests}: run from a clone")
        self.run_dir = run_dir
        self.kubeconfig_path = kubeconfig_path
        self.manifests = manifests
        self.out = out or sys.stdout
        self.node_group = _load(manifests / "samples" / "nodegroup.yaml")[0]
        self.sample = _load(manifests / "samples" / "namespacecache.yaml")[0]
        pv_spec = self.node_group["spec"]["persistentVolumeSpec"]
        self.pv_path = str((pv_spec.get("local") or pv_spec.get("hostPath"))["path"])
        self.settings = localmode.local_settings(
            settings, run_dir=run_dir, kubeconfig=kubeconfig_path, pv_path=self.pv_path
        )
        self.node_roots = {node: run_dir / "nodes" / node for node in localmode.DEMO_NODES}
        self.plane: controlplane.ControlPlane | None = None
        self.ready = asyncio.Event()
        self.ready_object: Obj | None = None
        self.exit_code = 0
        self._client: kube.Kube | None = None
        self._manager: manager.Manager | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    async def start(self) -> None:
        """Start the control plane and create everything the operator expects to find."""
        self.say("localcache: starting a local control plane (etcd, kube-apiserver, KCM) ...")
        plane = self.plane = controlplane.ControlPlane(with_kcm=True)
        starting = asyncio.ensure_future(asyncio.to_thread(plane.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await starting  # let it finish, so that close() stops every process
            raise
        self.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plane.kubeconfig_path, self.kubeconfig_path)  # names files of the run
        await asyncio.to_thread(
            crds.install_crds, plane, [self.manifests / "crds", self.manifests / "test"]
        )
        client = self._client = await kube.Kube.from_kubeconfig(self.kubeconfig_path)
        for info in groupversion.ALL_KINDS:  # until the new CRDs' storage has initialised
            await _retrying(functools.partial(client.list, info.api, limit=1))
        await self._apply_configuration(client)
        for root in self.node_roots.values():
            root.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._write_demo_model)

    async def _apply_configuration(self, client: kube.Kube) -> None:
        s = self.settings
        for ns in _load(self.manifests / "base" / "namespaces.yaml"):
            await _create(client, kube.NAMESPACES, ns)
        cfg = s.config
        await _create(client, kube.NAMESPACES, {"metadata": {"name": cfg.namespace}})
        shipped = _load(self.manifests / "base" / "config.yaml")[0]
        config = localmode.local_config_map(shipped, namespace=cfg.namespace, name=cfg.name)
        await _create(client, kube.CONFIG_MAPS, config)
        for node in localmode.DEMO_NODES:
            await _create(client, kube.NODES, localmode.demo_node(node))
            status = localmode.node_ready_status(datetime.datetime.now(datetime.UTC))
            await client.patch_status(kube.NODES, node, status)
        await _create(client, LMNG, self.node_group)
        hooks = {"mutating": kube.MUTATING_WEBHOOK_CONFIGURATIONS,
                 "validating": kube.VALIDATING_WEBHOOK_CONFIGURATIONS}  # fmt: skip
        for name, res in hooks.items() if s.webhook.port else ():
            shipped = _load(self.manifests / "webhook" / f"{name}.yaml")[0]
            await _create(
                client, res, localmode.local_webhook_configuration(shipped, port=s.webhook.port)
            )

    def _write_demo_model(self) -> None:
        uri = str(self.sample["spec"]["sourceModelUri"])
        if uri.startswith("file://"):
            path = Path(uri.removeprefix("file://")) / DEMO_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            text = "A tiny demo model for `localcache run`.\n"
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)

    async def serve(self, *, exit_when_ready: bool) -> int:
        """Run controller, webhooks, the demo nodes' agents and the Job runner until
        stopped (Ctrl-C, `stop()`, or Ready with `exit_when_ready`); the exit code."""
        assert self._client is not None, "start() first"
        client = self._client
        components = app.Components(
            controller=True,
            webhooks=bool(self.settings.webhook.port),
            agent_nodes=tuple(self.node_roots.items()),
            extra_cert_names=("127.0.0.1", "localhost"),
        )
        runner = jobrunner.LocalJobRunner(client, self.node_roots, pv_path=self.pv_path)
        meta = self.sample["metadata"]
        selector = f"metadata.name={meta['name']}"
        lw = listwatch.ListWatch(client, LMNC, namespace=meta["namespace"], field_selector=selector)
        watched = informer.Informer(lw)
        watched.add_handler(self._on_cache_event)
        demo = _Call(functools.partial(self._demo, exit_when_ready=exit_when_ready))

        def on_manager(mgr: manager.Manager) -> None:
            self._manager = mgr
            mgr.add_informer(watched)
            mgr.add_runnable("local-job-runner", runner, needs_leader=False)
            mgr.add_runnable("local-demo", demo, needs_leader=False)

        code = await app.run_components(
            self.settings, components, client=client, on_manager=on_manager
        )
        return self.exit_code if code == 0 else code

    async def _demo(self, *, exit_when_ready: bool) -> None:
        """Apply the sample cache, print how to watch it, then print its Ready state."""
        assert self._client is not None
        sample, meta = self.sample, self.sample["metadata"]
        await _create(self._client, LMNC, sample, retry=True)
        kubectl = "kubectl"
        if shutil.which(kubectl) is None and self.plane and self.plane.kubectl_path:
            kubectl = self.plane.kubectl_path
        self.say(
            f"localcache: local control plane at {self._client.server}\n"
            f"  demo nodes {', '.join(localmode.DEMO_NODES)} in node group "
            f"{self.node_group['metadata']['name']} (models under {self.run_dir / 'nodes'})\n"
            f"  applied LocalModelNamespaceCache {meta['namespace']}/{meta['name']} "
            f"({sample['spec']['sourceModelUri']})\n"
            f"  kubeconfig: {self.kubeconfig_path}"
        )
        for line in localmode.service_addresses(self.settings):
            self.say(f"  {line}")
        self.say("watch it with:")
        for line in localmode.watch_commands(
            kubectl, self.kubeconfig_path, name=meta["name"], namespace=meta["namespace"]
        ):
            self.say(f"  {line}")
        try:
            await asyncio.wait_for(self.ready.wait(), timeout=READY_TIMEOUT_S)
        except TimeoutError:
            self.say(f"localcache: the sample cache is not Ready after {READY_TIMEOUT_S:.0f}s")
            self.exit_code = 1 if exit_when_ready else 0
        else:
            self.say(localmode.ready_line(self.ready_object or {}))
        if exit_when_ready:
            self.say("localcache: --exit-when-ready: stopping")
            self.stop()
        else:
            self.say("localcache: running until Ctrl-C")

    def _on_cache_event(self, event: informer.Event) -> None:
        if not isinstance(event, informer.Deleted) and localmode.cache_ready(event.obj):
            self.ready_object = event.obj
            self.ready.set()

    def stop(self) -> None:
        if self._manager is not None:
            self._manager.stop()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self.plane is not None:
            await asyncio.shield(asyncio.to_thread(self.plane.stop))
            self.plane = None
            self.say("localcache: local control plane stopped")
        with contextlib.suppress(FileNotFoundError):
            self.kubeconfig_path.unlink()
        await asyncio.to_thread(shutil.rmtree, self.run_dir, True)


@dataclasses.dataclass
class _Call:
    """A coroutine function as a Manager runnable."""

    function: Callable[[], Awaitable[None]]

    async def run(self) -> None:
        await self.function()


async def _retrying(call: Callable[[], Awaitable[Any]]) -> None:
    """Await `call()`, retrying server-side and transport errors (an apiserver that is still
    initialising, a webhook it cannot call yet) for `APPLY_TIMEOUT_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + APPLY_TIMEOUT_S
    while True:
        try:
            await call()
            return
        except (errors.ServerError, errors.TooManyRequests, errors.TransportError) as exc:
            if loop.time() >= deadline:
                raise
            _log.info("local_retry", error=str(exc))
            await asyncio.sleep(0.5)


async def _create(client: kube.Kube, res: kube.Resource, obj: Obj, *, retry: bool = False) -> None:
    """Create `obj`, leaving an existing one alone (with `retry`: see `_retrying`)."""
    body = {"apiVersion": res.api_version, "kind": res.kind, **obj}

    async def create() -> None:
        try:
            await client.create(res, body)
        except errors.Conflict as exc:
            if not exc.already_exists:
                raise

    await (_retrying(create) if retry else create())
