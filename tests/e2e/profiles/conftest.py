"""The real-node test bed for the package, with nothing deployed, and the helpers that bring it
to the state a module needs and back.

The bed is the run's shared one (`tests.support.e2ebed`: two nodes with kubelet, containerd
and runc, the operator's images and an HTTP model server in its hub namespace), reset before
the package. Profiles are installed with the bed's local image references
(`installs.Images`), KServe's objects are KServe v0.20.0's own (`kserve.py`).

`ProfileBed` keeps no record of its own: every `ensure_*` reads the cluster (which profile
and tool run, which of KServe's objects exist) and changes only what differs, so a module
run alone (`-k`) reaches the same state as after the modules before it, and the modules
share installs instead of repeating rollouts. Each module deletes what its tests create
(`clear_objects()`: caches, node groups, test namespaces, node labels); `reset_bare()` goes
all the way back: no profile, no serving.kserve.io CRD, no namespace `kserve`.

Where the machine cannot host real nodes the package skips with the reason
(`LOCALCACHE_REQUIRE_REAL_NODES=1`: fails). It never runs against a cluster named by
`LOCALCACHE_E2E_KUBECONFIG`: it deletes CRDs.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Collection, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.api import groupversion
from localcache.devenv import modelserver, testbed
from tests.e2e.profiles import kserve
from tests.e2e.realnodes import cluster as cluster_mod
from tests.e2e.realnodes.cluster import Cluster
from tests.support import e2ebed, installs

Obj = dict[str, Any]
NAMESPACE, JOBS_NAMESPACE = "localcache", "localcache-jobs"  # standalone's job namespace
# with-kserve runs download Jobs in KServe's job namespace, which KServe's docs have users create
KSERVE_JOBS_NAMESPACE = "kserve-localmodel-jobs"
POLICY_NOT_CONFIGURED = "failed to configure policy"
CONTROLLER, AGENT = "localcache-controller", "localcache-agent"
HTTP_PORT = e2ebed.HTTP_PORT
ROLLOUT_TIMEOUT_S = 180
STARTUP_TIMEOUT_S = 90.0  # the controller gives up waiting for its caches after 120 s
CONTROLLER_REPLICAS = 2
GONE_TIMEOUT_S = 120.0
TEST_LABEL = "localcache-e2e/profiles"  # on namespaces and node labels the tests add
GROUP = groupversion.GROUP  # serving.kserve.io: KServe's CRDs and localcache's share it
DOWNLOADED, DOWNLOAD_ERROR = "NodeDownloaded", "NodeDownloadError"
CACHE_KINDS = (
    groupversion.LOCAL_MODEL_CACHE.plural,
    groupversion.LOCAL_MODEL_NAMESPACE_CACHE.plural,
)


class Restarted(Exception):
    """A controller or agent container restarted."""


class Refused(Exception):
    """The apiserver or an admission webhook refused an object for good."""


class DownloadFailed(Exception):
    """A node reported the cache's download failed: waiting longer would not help."""


@dataclass
class ProfileBed:
    """The bed, kubectl on it, the installer with the bed's images, and the model server."""

    bed: testbed.TestBed
    cluster: Cluster
    installer: installs.Installer
    http: modelserver.ModelServer
    http_dir: Path

    # ------------------------------------------------------------------ sources, disks

    def add_model(self, name: str, data: bytes) -> str:
        """Serve `data` as `<name>/model.bin`; its URI as pods see it."""
        (self.http_dir / name).mkdir(parents=True, exist_ok=True)
        (self.http_dir / name / "model.bin").write_bytes(data)
        return f"http://{testbed.HUB_IP}:{HTTP_PORT}/{name}/model.bin"

    def requests(self, name: str) -> int:
        """GETs and HEADs the model server counted for `<name>/model.bin`."""
        return self.http.stats().requests.get(f"/{name}/model.bin", 0)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.bed.node_list]

    # ------------------------------------------------------------------ KServe's objects

    def crds(self) -> set[str]:
        """The serving.kserve.io CRDs on the cluster (KServe's or localcache's)."""
        listed = self.cluster.items("crd")
        return {c["metadata"]["name"] for c in listed if c["spec"]["group"] == GROUP}

    def ensure_kserve(self, *, crds: bool) -> None:
        """Namespaces `kserve` and `kserve-localmodel-jobs` (as KServe's docs have users make
        it), KServe's inferenceservice-config (storage initializer: the bed's image), created
        as KServe's kustomize config ships them; KServe's CRDs too
        with `crds` (where localcache's own CRDs are installed, the bed is reset first)."""
        if crds and self._localcache_crds():
            self.reset_bare()
        for namespace in (kserve.NAMESPACE, KSERVE_JOBS_NAMESPACE):
            if self.cluster.get("namespace", namespace) is None:
                self.cluster.kubectl("create", "namespace", namespace)
        if self.cluster.get("configmap", kserve.CONFIG_MAP, namespace=kserve.NAMESPACE) is None:
            config = kserve.inferenceservice_config(cluster_mod.STORAGE_INITIALIZER_IMAGE)
            self.cluster.create(config)
        if crds:
            self.apply_kserve_crds()

    def _localcache_crds(self) -> list[str]:
        listed = self.cluster.items("crd", selector="app.kubernetes.io/part-of=localcache")
        return [c["metadata"]["name"] for c in listed]

    def apply_kserve_crds(self, only: Collection[str] | None = None) -> None:
        """KServe's CRDs (or those named in `only`), created as its charts create them
        (absent ones only); returns once they are Established."""
        wanted = kserve.crd_documents()
        wanted = [d for d in wanted if only is None or d["metadata"]["name"] in only]
        present = self.crds()
        missing = [d for d in wanted if d["metadata"]["name"] not in present]
        if missing:
            # client-side apply would not fit the InferenceService CRD in its annotation
            self.cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump_all(missing))
        names = {d["metadata"]["name"] for d in wanted}

        def established() -> bool:
            ready = {
                c["metadata"]["name"]
                for c in self.cluster.items("crd")
                for cond in (c.get("status") or {}).get("conditions") or []
                if cond["type"] == "Established" and cond["status"] == "True"
            }
            assert names <= ready, f"not Established: {sorted(names - ready)}"
            return True

        self.cluster.wait(established, timeout=60, what="KServe's CRDs are Established")

    # ------------------------------------------------------------------ localcache

    def ensure_profile(self, profile: str, tool: installs.Tool) -> None:
        """`profile` installed with `tool` and rolled out (whatever ran before uninstalled)."""
        current = self.installer.installed()
        if current == (profile, tool):
            if not all(p["ready"] for p in self.operator_pods().values()):
                # e.g. left crash-looping by a failed test: start its pods afresh
                self.cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=false")
                self.wait_up(timeout=ROLLOUT_TIMEOUT_S)
            return
        if current is not None:
            self.uninstall()
        if profile == "standalone" and tool == "kustomize":
            self.installer.install_crds()  # the separate step; Helm's crds/ does it itself
        self.installer.install(profile, tool)
        self.rollout()

    def uninstall(self) -> None:
        """Uninstall what runs, with the tool that installed it; wait until its objects are
        gone (namespaces included)."""
        current = self.installer.installed()
        if current is None:
            return
        profile, tool = current
        self.installer.uninstall(profile, tool)
        self.installer.wait_gone(self.rendered(profile), timeout=GONE_TIMEOUT_S)

    def rendered(self, profile: str) -> list[installs.Identity]:
        """The identities `profile` creates (what an uninstall deletes)."""
        base = installs.REPO_ROOT / "manifests" / "profiles" / profile
        return [installs.identity(d) for d in installs.kustomize(self.installer.kubectl, base)]

    def rollout(self) -> None:
        for workload in (f"deployment/{CONTROLLER}", f"daemonset/{AGENT}"):
            self.cluster.kubectl(
                "-n", NAMESPACE, "rollout", "status", workload,
                f"--timeout={ROLLOUT_TIMEOUT_S}s", timeout=ROLLOUT_TIMEOUT_S + 30,
            )  # fmt: skip

    def wait_up(self, *, timeout: float = STARTUP_TIMEOUT_S) -> dict[str, Obj]:
        """Until the controller's replicas and an agent per node run Ready (the pods, as
        `operator_pods`); stops at once when a container restarts."""
        want = CONTROLLER_REPLICAS + len(self.node_names)

        def up() -> dict[str, Obj]:
            pods = self.operator_pods()
            restarted = {name: p["restarts"] for name, p in pods.items() if p["restarts"]}
            if restarted:  # not an AssertionError: the wait stops here
                raise Restarted(f"operator containers restarted: {restarted}")
            assert len(pods) == want, f"{len(pods)} pods, not {want}: {sorted(pods)}"
            not_ready = sorted(name for name, p in pods.items() if not p["ready"])
            assert not not_ready, f"not Ready: {not_ready}"
            return pods

        return self.cluster.wait(up, timeout=timeout, what="the controller and agents are Ready")

    def operator_pods(self) -> dict[str, Obj]:
        """The controller and agent pods: name -> {uid, restarts, ready}."""
        found = {}
        for pod in self.cluster.items("pods", namespace=NAMESPACE):
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            found[pod["metadata"]["name"]] = {
                "uid": pod["metadata"]["uid"],
                "restarts": sum(int(s.get("restartCount", 0)) for s in statuses),
                "ready": bool(statuses) and all(s.get("ready") for s in statuses),
            }
        return found

    # ------------------------------------------------------------------ caches

    def namespace(self, prefix: str) -> str:
        name = self.cluster.namespace(prefix)
        self.cluster.kubectl("label", "namespace", name, f"{TEST_LABEL}=yes")
        return name

    def node_status(self, kind: str, name: str, namespace: str | None = None) -> dict[str, str]:
        """The cache's `status.nodeStatus` (in KServe's schema and localcache's alike)."""
        obj = self.cluster.get(kind, name, namespace=namespace) or {}
        status: dict[str, str] = (obj.get("status") or {}).get("nodeStatus") or {}
        return status

    def wait_cached(
        self, kind: str, name: str, *, namespace: str | None = None, timeout: float = 180
    ) -> None:
        """Until the cache reports the model downloaded on every node of the bed."""
        want = dict.fromkeys(self.node_names, DOWNLOADED)

        def cached() -> bool:
            got = self.node_status(kind, name, namespace)
            failed = sorted(node for node, state in got.items() if state == DOWNLOAD_ERROR)
            if failed and not self._policy_not_yet_configured():
                # not an AssertionError: the wait stops here, saying why
                raise DownloadFailed(f"{kind} {name}: {DOWNLOAD_ERROR} on {failed}: "
                                     + self._node_messages(failed)
                                     + "; the agents said: " + self._agent_errors())  # fmt: skip
            assert got == want, f"nodeStatus {got}"
            return True

        where = f" in {namespace}" if namespace else ""
        self.cluster.wait(cached, timeout=timeout, what=f"{kind} {name}{where} on every node")

    def _policy_not_yet_configured(self) -> bool:
        """Whether the agents' last refusal is the apiserver's `failed to configure policy`:
        a ValidatingAdmissionPolicy whose paramKind is a CRD created after the policy (KServe's
        CRDs after localcache) refuses requests until the apiserver's admission RESTMapper
        learns the kind; the agent retries its Job, so that refusal is waited out."""
        errors = self._agent_errors().splitlines()
        return bool(errors) and POLICY_NOT_CONFIGURED in errors[-1]

    def _node_messages(self, nodes: list[str]) -> str:
        """What the LocalModelNodes of `nodes` say about their models (reasons, messages)."""
        found = []
        for node in nodes:
            status = (self.cluster.get("localmodelnodes", node) or {}).get("status") or {}
            found.append(f"{node}: {json.dumps(status.get('modelStatus') or status)[:1500]}")
        return "; ".join(found)

    def _agent_errors(self) -> str:
        """The agents' recent log lines that carry an error (why a download failed)."""
        done = self.cluster.kubectl(
            "logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent",
            "--tail=200", "--prefix", check=False,
        )  # fmt: skip
        lines = [x for x in done.stdout.splitlines() if '"error"' in x and "download" in x]
        return "\n".join(lines[-4:]) or "(nothing)"

    # ------------------------------------------------------------------ resets

    def clear_objects(self) -> None:
        """Delete the test namespaces (their InferenceServices first, which keep caches in
        use), the caches, node groups and the node labels tests added: through the
        operator's finalizers while it runs, else by dropping them."""
        self.cluster.kubectl("delete", "namespace", "-l", TEST_LABEL, "--wait=false")
        self.cluster.kubectl("label", "nodes", "--all", f"{TEST_LABEL}-", "node-type-")
        self.cluster.wait(
            lambda: not self._test_namespaces(),
            timeout=GONE_TIMEOUT_S,
            what="the test namespaces were deleted",
        )
        present = self.crds()
        kinds = [k for k in (*CACHE_KINDS, "localmodelnodegroups") if f"{k}.{GROUP}" in present]
        if self.installer.installed() is None:
            self._drop_finalizers([k for k in kinds if k in CACHE_KINDS])
        for kind in kinds:
            # admission refuses while a cache's status still lists a deleted InferenceService
            self.cluster.wait(
                functools.partial(self._delete_all, kind),
                timeout=GONE_TIMEOUT_S,
                what=f"admission let every {kind} be deleted",
            )

        def gone() -> bool:
            left = [o["metadata"]["name"] for k in kinds for o in self.cluster.items(k)]
            assert not left, f"still there: {left}"
            return True

        self.cluster.wait(gone, timeout=GONE_TIMEOUT_S, what="the tests' caches were deleted")

    def _delete_all(self, kind: str) -> bool:
        done = self.cluster.kubectl("delete", kind, "--all", "-A", "--wait=false", check=False)
        assert done.returncode == 0, done.stderr.strip()
        return True

    def apply(self, *objs: Obj) -> None:
        """`kubectl apply`, again while localcache's admission says its caches are still
        syncing (it asks to retry: right after a start, or after KServe's CRDs appear)."""

        def accepted() -> bool:
            done = self.cluster.kubectl(
                "apply", "-f", "-", input_text=yaml.safe_dump_all(objs), check=False
            )
            if done.returncode == 0:
                return True
            if "not synced yet" not in done.stderr:  # refused for good: stop waiting
                raise Refused(done.stderr.strip())
            raise AssertionError(done.stderr.strip())

        self.cluster.wait(accepted, timeout=60, what="the objects were admitted")

    def _test_namespaces(self) -> list[Obj]:
        return self.cluster.items("namespace", selector=TEST_LABEL)

    def _drop_finalizers(self, kinds: list[str]) -> None:
        for kind in kinds:
            for obj in self.cluster.items(kind):
                meta = obj["metadata"]
                where = ["-n", meta["namespace"]] if meta.get("namespace") else []
                self.cluster.kubectl(
                    "patch", kind, meta["name"], *where, "--type=merge",
                    "-p", json.dumps({"metadata": {"finalizers": None}}),
                )  # fmt: skip
        # the PVs the controller would have released with the finalizers
        self.cluster.kubectl("delete", "pv", "-l", "app.kubernetes.io/managed-by=localcache")

    def reset_bare(self) -> None:
        """No profile, no serving.kserve.io CRD, no namespace `kserve`: the bed as it started.
        The caches go first, while the operator still releases them."""
        self.clear_objects()
        self.uninstall()
        crds = sorted(self.crds())
        if crds:
            self.cluster.kubectl("delete", "crd", *crds, "--wait=false")
        spaces = sorted({kserve.NAMESPACE, KSERVE_JOBS_NAMESPACE, *kserve.sample_namespaces()})
        self.cluster.kubectl("delete", "namespace", *spaces, "--ignore-not-found", "--wait=false")
        gone = [("CustomResourceDefinition", "", name) for name in crds]
        gone += [("Namespace", "", name) for name in spaces]
        self.installer.wait_gone(gone, timeout=GONE_TIMEOUT_S)


@pytest.fixture(scope="package")
def bed(request: pytest.FixtureRequest) -> ProfileBed:
    """The run's shared test bed (`tests/e2e/conftest.py`), reset: nothing deployed."""
    if os.environ.get("LOCALCACHE_E2E_KUBECONFIG"):
        pytest.skip("the profile tests install, uninstall and delete CRDs: test bed only")
    helm = installs.helm_or_skip()
    kserve.module_dir()
    shared: e2ebed.SharedBed = request.getfixturevalue("shared_bed")
    shared.reset()
    cluster = Cluster.on_bed(shared, package="profiles")
    plane = shared.bed.control_plane
    assert plane.kubectl_path is not None
    images = installs.Images(
        localcache=cluster_mod.LOCALCACHE_IMAGE,
        storage_initializer=cluster_mod.STORAGE_INITIALIZER_IMAGE,
    )
    installer = installs.Installer(plane.kubectl_path, plane.kubeconfig_path, helm, images=images)
    return ProfileBed(shared.bed, cluster, installer, shared.http, shared.http_dir)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failure, attach the caches, node status, workloads, warnings and the operator's
    recent logs."""
    report = yield
    found = getattr(item, "funcargs", {}).get("bed")
    if report.failed and isinstance(found, ProfileBed):
        report.sections.append(("cluster state", diagnostics(found.cluster)))
    return report


def diagnostics(cluster: Cluster) -> str:
    commands = [
        ("get", "crd", "-o", "name"),
        # full names: KServe's CRDs have no short names
        ("get", ",".join([*CACHE_KINDS, "localmodelnodegroups"]), "-A", "-o", "yaml"),
        ("get", "localmodelnodes", "-o", "yaml"),
        ("get", "deploy,ds,jobs,pods,pvc", "-A", "-o", "wide"),
        ("get", "events", "-A", "--field-selector", "type=Warning"),
        ("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent", "--tail=40",
         "--prefix"),
        ("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=controller", "--tail=60",
         "--prefix"),
    ]  # fmt: skip
    return cluster.report(commands, tail=6000)
