"""`localcache run --local` on real nodes, and the deployment the real-node e2e tests share.

When this machine can host the real-node test bed (`devenv.testbed`: root, network
and mount namespaces, cgroups) and the repository's build recipes are at hand (`hack/`),
`localcache run --local` builds or reuses the node binaries and images, starts a control plane
and two real nodes (kubelet, containerd, runc), deploys the shipped manifests through
`manifests/testbed` (which changes only image references), serves a demo model over HTTP
inside the test bed, applies a sample namespace cache of it and prints how to watch it. The
operator then runs as real pods: the controller Deployment, the agent DaemonSet, download Jobs.
Otherwise `unavailable_reason()` says why, and `localcache run` falls back to demo nodes and
the demo Job runner (`local.LocalRun`), saying so.

The operator's settings configure the operator in this process, which real-node mode does not
run: `refuse_unhonoured` refuses those the user gave (by flag or environment variable),
naming them, rather than ignore them; only `HONOURED` ones are accepted.

Messages for the user go to stdout; the test bed's own logs stay in its run directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from localcache import settings as settings_mod
from localcache.devenv import localmode, modelserver, nodeassets, testbed, waiting
from localcache.runtime import errors

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
HACK = REPO / "hack"
SYSTEM_NS = "kserve"
CONTROLLER = "kserve-localmodel-controller-manager"
AGENT = "kserve-localmodelnode-agent"
LOCALCACHE_IMAGE = "localhost/localcache/localcache:testbed"
STORAGE_INITIALIZER_IMAGE = "localhost/localcache/storage-initializer:testbed"
IMAGE_ALIASES = {
    "localcache": (LOCALCACHE_IMAGE,),
    "storage-initializer": (STORAGE_INITIALIZER_IMAGE,),
}
OPERATOR_IMAGES = ("pause", "localcache", "storage-initializer")
KSERVE_ADDON_IMAGES = ("kserve-localmodel", "kserve-localmodelnode")
KSERVE_CONTROLLER_IMAGES = ("kserve-manager", "kserve-llmisvc", "runtime-standin")
DEMO_PORT = 8000
DEMO_FILE = "model.bin"
ROLLOUT_TIMEOUT_S = 240
READY_TIMEOUT_S = 300.0
HONOURED = frozenset({"kubeconfig", "log_level", "log_format"})
"""What real-node mode honours: the kubeconfig (probed before falling back to local mode) and
this process's own logging."""

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


class RealNodesError(RuntimeError):
    """A build step or the deployment on real nodes failed; the message says which."""


def unavailable_reason() -> str | None:
    """Why real nodes cannot be used here, in one line; None when they can (what
    `hack/build-node.sh` builds may still be missing: `prepare_images` builds it)."""
    if os.environ.get("LOCALCACHE_REAL_NODES") == "0":
        return "disabled by LOCALCACHE_REAL_NODES=0"
    if not (HACK / "build-images.sh").is_file() or not (MANIFESTS / "testbed").is_dir():
        return f"the build recipes are not here ({HACK}): run from a clone of the repository"
    return nodeassets.host_unsupported_reason()


def refuse_unhonoured(settings: settings_mod.Settings) -> None:
    """`errors.ConfigError` naming the settings the user gave that real nodes cannot honour:
    their operator is the shipped manifests' pods, not this process."""
    refused = [f for f in settings_mod.FLAGS if f.dest in settings.given - HONOURED]
    if refused:
        names = ", ".join(f"{f.flag} / {f.env}" if "run" in f.commands else f.env for f in refused)
        raise errors.ConfigError(
            f"on real nodes the operator runs as pods from the shipped manifests, so {names} "
            "cannot be honoured: leave them out, or use demo nodes (LOCALCACHE_REAL_NODES=0), "
            "whose operator runs in this process"
        )


def hack(script: str, *args: str) -> str:
    """Run a `hack/` build script (quick when cached); its last line of output."""
    done = subprocess.run(
        ["bash", str(HACK / script), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RealNodesError(f"hack/{script} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def prepare_images(names: Sequence[str] = OPERATOR_IMAGES) -> list[testbed.Image]:
    """Build (or reuse) the node binaries and the images `names`, for a test bed."""
    if nodeassets.missing_assets() is not None:
        hack("build-node.sh")
    built = json.loads(Path(hack("build-images.sh")).read_text())
    return [
        testbed.Image(
            ref=built[name]["ref"],
            tarball=Path(built[name]["tar"]),
            aliases=IMAGE_ALIASES.get(name, ()),
        )
        for name in names
    ]


def deploy(kubectl: Kubectl, *, stand_ins: bool = True) -> None:
    """KServe's CRDs (the stand-ins of manifests/test; `stand_ins=False`: the caller installed
    KServe's own), then the shipped manifests through `manifests/testbed`; returns once the
    controller and every agent are rolled out."""
    if stand_ins:
        kubectl("apply", "-f", str(MANIFESTS / "test"))
    kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/inferenceservices.serving.kserve.io", "crd/clusterstoragecontainers.serving.kserve.io",
    )  # fmt: skip
    kubectl("apply", "-k", str(MANIFESTS / "testbed"))
    for workload in (f"deployment/{CONTROLLER}", f"daemonset/{AGENT}"):
        kubectl(
            "-n", SYSTEM_NS, "rollout", "status", workload, f"--timeout={ROLLOUT_TIMEOUT_S}s",
            timeout=ROLLOUT_TIMEOUT_S + 30,
        )  # fmt: skip


def apply_once_admitted(kubectl: Kubectl, text: str, timeout: float = 60.0) -> None:
    """`kubectl apply` of `text`, again while the webhook cannot be called yet: the
    controllers roll out before the CA bundle of the webhook configurations matches the
    serving certificate they made (a few seconds), and the apiserver refuses meanwhile."""

    def applied() -> bool:
        done = kubectl("apply", "-f", "-", input_text=text, check=False)
        if done.returncode == 0:
            return True
        if "failed calling webhook" in done.stderr:
            raise LookupError(done.stderr.strip())  # not yet: try again
        raise RealNodesError(f"kubectl apply -f -: {done.stderr.strip()}")

    try:
        waiting.wait_until_sync(applied, timeout=timeout, interval=1.0, what="the webhook admits")
    except waiting.WaitTimeout as exc:
        raise RealNodesError(str(exc)) from exc


def kubectl_runner(binary: str, kubeconfig: Path, cache_dir: Path) -> Kubectl:
    """A kubectl for `kubeconfig` that raises `RealNodesError` with stderr when it fails."""

    def run(
        *args: str, check: bool = True, input_text: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [binary, f"--kubeconfig={kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input_text,
            timeout=timeout,
            env={"PATH": "/usr/bin:/bin", "KUBECACHEDIR": str(cache_dir / "kube-cache")},
            check=False,
        )
        if check and done.returncode != 0:
            raise RealNodesError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done

    return run


def _sample_objects(model_uri: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shipped sample node group, and the shipped sample cache pointed at `model_uri`."""
    group = yaml.safe_load((MANIFESTS / "samples" / "nodegroup.yaml").read_text())
    cache = yaml.safe_load((MANIFESTS / "samples" / "namespacecache.yaml").read_text())
    cache["spec"]["sourceModelUri"] = model_uri
    return group, cache


class RealNodesRun:
    """`start()` builds, starts and deploys; `wait_ready()` waits for the sample cache;
    `close()` stops everything (always call it)."""

    def __init__(self, *, kubeconfig_path: Path, out: TextIO | None = None) -> None:
        self.kubeconfig_path = kubeconfig_path
        self.out = out or sys.stdout
        self.work = Path(tempfile.mkdtemp(prefix="localcache-realnodes-"))
        self.bed: testbed.TestBed | None = None
        self.server: modelserver.ModelServer | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def start(self) -> None:
        self.say("localcache: this machine can host real nodes: building (or reusing) node "
                 "binaries and images (the first time takes several minutes) ...")  # fmt: skip
        images = prepare_images()
        self.say("localcache: starting a control plane and 2 real nodes "
                 "(kubelet, containerd, runc) ...")  # fmt: skip
        bed = self.bed = testbed.TestBed(nodes=2, images=images).start()
        plane = bed.control_plane
        self.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plane.kubeconfig_path, self.kubeconfig_path)
        self.kubectl_bin = shutil.which("kubectl") or plane.kubectl_path or "kubectl"
        kubectl = kubectl_runner(plane.kubectl_path or "kubectl", plane.kubeconfig_path, self.work)
        self.kubectl = kubectl
        models = self.work / "models"
        (models / "demo").mkdir(parents=True)
        (models / "demo" / DEMO_FILE).write_bytes(b"A tiny demo model for `localcache run`.\n")
        self.server = modelserver.ModelServer(models, log_path=self.work / "models.log")
        (reach,) = (f"http://127.0.0.1:{p}" for p in bed.forward([DEMO_PORT]))
        self.server.start(bed.hub.prefix(), testbed.HUB_IP, DEMO_PORT, reach=reach)
        self.say("localcache: deploying the shipped manifests (manifests/testbed) ...")
        deploy(kubectl)
        group, cache = _sample_objects(f"http://{testbed.HUB_IP}:{DEMO_PORT}/demo/{DEMO_FILE}")
        apply_once_admitted(kubectl, yaml.safe_dump_all([group, cache]))
        self.sample = cache
        meta = cache["metadata"]
        self.say(
            f"localcache: real nodes {', '.join(n.name for n in bed.node_list)} "
            f"(control plane at {plane.server}, started in {bed.startup_seconds:.0f}s)\n"
            f"  operator deployed as pods: deployment/{CONTROLLER}, daemonset/{AGENT} "
            f"in {SYSTEM_NS}\n"
            f"  applied LocalModelNamespaceCache {meta['namespace']}/{meta['name']} "
            f"({cache['spec']['sourceModelUri']})\n"
            f"  kubeconfig: {self.kubeconfig_path}\nwatch it with:"
        )
        for line in localmode.watch_commands(
            self.kubectl_bin, self.kubeconfig_path, name=meta["name"], namespace=meta["namespace"]
        ):
            self.say(f"  {line}")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        meta = self.sample["metadata"]
        done = self.kubectl(
            "wait", "--for=condition=Ready", f"lmnc/{meta['name']}", "-n", meta["namespace"],
            f"--timeout={timeout:.0f}s", check=False, timeout=timeout + 30,
        )  # fmt: skip
        if done.returncode != 0:
            self.say(f"localcache: the sample cache is not Ready after {timeout:.0f}s")
            return False
        got = self.kubectl("get", f"lmnc/{meta['name']}", "-n", meta["namespace"], "-o", "json")
        obj = json.loads(got.stdout)
        self.say(localmode.ready_line(obj))
        return True

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.bed is not None:
            self.bed.stop()
            self.say("localcache: real nodes and control plane stopped")
        self.kubeconfig_path.unlink(missing_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)


async def run(*, kubeconfig_path: Path, exit_when_ready: bool) -> int:
    """Real-node local mode until Ctrl-C (or Ready, with `exit_when_ready`); the exit code."""
    real = RealNodesRun(kubeconfig_path=kubeconfig_path)
    try:
        await asyncio.to_thread(real.start)
        ready = await asyncio.to_thread(real.wait_ready)
        if exit_when_ready:
            real.say("localcache: --exit-when-ready: stopping")
            return 0 if ready else 1
        real.say("localcache: running until Ctrl-C")
        await asyncio.Event().wait()
        return 0
    except (RealNodesError, testbed.TestBedError, OSError) as exc:
        print(f"localcache: cannot run on real nodes: {exc}", file=sys.stderr)
        return 1
    finally:
        await asyncio.shield(asyncio.to_thread(real.close))
