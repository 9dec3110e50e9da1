"""Install, uninstall and reinstall localcache's profiles (kustomize and Helm) on a cluster,
and what KServe owns there. Shared by the deploy integration tests and the real-node e2e
tests: everything goes through a kubeconfig and the kubectl / helm binaries.

- `KSERVE_OBJECTS`: KServe's objects (v0.20, core and localmodel add-on) as kind, namespace,
  name. The with-kserve profile must create, change and delete none of them, and no object of
  either profile may carry one of these identities.
- `find_helm()`: the helm of hack/build-helm.sh, or None (`helm_or_skip` skips with a reason,
  or fails under LOCALCACHE_REQUIRE_HELM=1).
- `Installer(kubectl, kubeconfig, helm, images=...)`: `install(profile, tool)`, `uninstall(...)`,
  `installed()` (which profile and tool run now, read from the cluster) and `wait_gone(...)`
  polling (with a deadline) until what an uninstall deletes is gone. With `Images`, the
  profiles go in with those image references instead of the registry names (kustomize: a
  temporary overlay with `images:`, the `replacements` README asks of such an overlay (the
  agent's --peer-image follows its image) and, standalone, a patch of localcache-config's
  storageInitializer; Helm: `--set`); with-kserve's storage initializer is KServe's setting.
- `snapshot(...)`: the full objects (resourceVersion, managedFields and all) of a list of
  identities, for byte-for-byte comparisons before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from localcache.devenv import waiting

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES: tuple[str, ...] = ("standalone", "with-kserve")
Tool = Literal["kustomize", "helm"]
Identity = tuple[str, str, str]  # kind, namespace ("" if cluster-scoped), name
RELEASE = "localcache"
RELEASE_NAMESPACE = "default"  # the chart creates its own namespace; Helm's record lives here
CHART = REPO_ROOT / "charts" / "localcache"
PROFILE_IMAGE = "localcache"  # the image name the profiles use (the tag is the version)
CONFIG_MAP = "localcache-config"

_LOCALMODEL_CRDS = (
    "localmodelcaches",
    "localmodelnamespacecaches",
    "localmodelnodes",
    "localmodelnodegroups",
)
KSERVE_CRDS: tuple[str, ...] = tuple(
    f"{plural}.serving.kserve.io"
    for plural in (
        *_LOCALMODEL_CRDS,
        "inferenceservices",
        "clusterstoragecontainers",
        "servingruntimes",
        "clusterservingruntimes",
        "trainedmodels",
        "inferencegraphs",
        "llminferenceservices",
        "llminferenceserviceconfigs",
    )
)
KSERVE_OBJECTS: tuple[Identity, ...] = (
    ("Namespace", "", "kserve"),
    ("ConfigMap", "kserve", "inferenceservice-config"),
    *(("CustomResourceDefinition", "", name) for name in KSERVE_CRDS),
    # KServe's core controller
    ("Deployment", "kserve", "kserve-controller-manager"),
    ("ServiceAccount", "kserve", "kserve-controller-manager"),
    ("Service", "kserve", "kserve-webhook-server-service"),
    ("Service", "kserve", "kserve-controller-manager-service"),
    ("Secret", "kserve", "kserve-webhook-server-cert"),
    ("ClusterRole", "", "kserve-manager-role"),
    ("ClusterRoleBinding", "", "kserve-manager-rolebinding"),
    ("MutatingWebhookConfiguration", "", "inferenceservice.serving.kserve.io"),
    ("ValidatingWebhookConfiguration", "", "inferenceservice.serving.kserve.io"),
    ("ValidatingWebhookConfiguration", "", "trainedmodel.serving.kserve.io"),
    ("ValidatingWebhookConfiguration", "", "inferencegraph.serving.kserve.io"),
    ("ValidatingWebhookConfiguration", "", "servingruntime.serving.kserve.io"),
    # the localmodel add-on (reference §3, §4, §6)
    ("Deployment", "kserve", "kserve-localmodel-controller-manager"),
    ("DaemonSet", "kserve", "kserve-localmodelnode-agent"),
    ("ServiceAccount", "kserve", "kserve-localmodel-controller-manager"),
    ("ServiceAccount", "kserve", "kserve-localmodelnode-agent"),
    ("ClusterRole", "", "kserve-localmodel-manager-role"),
    ("ClusterRole", "", "kserve-localmodelnode-agent-role"),
    ("ClusterRoleBinding", "", "kserve-localmodel-manager-rolebinding"),
    ("ClusterRoleBinding", "", "kserve-localmodelnode-agent-rolebinding"),
    ("Service", "kserve", "localmodel-webhook-server-service"),
    ("Secret", "kserve", "localmodel-webhook-server-cert"),
    ("Certificate", "kserve", "localmodel-serving-cert"),
    ("ValidatingWebhookConfiguration", "", "localmodelcache.serving.kserve.io"),
    ("Lease", "kserve", "kserve-local-model-manager-leader-lock"),
    ("Lease", "kserve", "kserve-local-model-node-manager-leader-lock"),
    ("Namespace", "", "kserve-localmodel-jobs"),
)
# Kinds whose names KServe's localmodel objects use, whatever the namespace: a localcache
# object of one of these kinds must not reuse the name even in another namespace, so the two
# stay apart in `kubectl get -A`, logs and RBAC subjects.
NAME_CLASH_KINDS = frozenset(
    {"Deployment", "DaemonSet", "ServiceAccount", "Service", "Lease", "Secret"}
)


def identity(doc: dict[str, Any]) -> Identity:
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace") or "", meta["name"]


def kserve_clashes(docs: list[dict[str, Any]]) -> list[Identity]:
    """The identities in `docs` that are KServe's (or reuse a KServe name, NAME_CLASH_KINDS)."""
    owned = set(KSERVE_OBJECTS)
    names = {(kind, name) for kind, _ns, name in KSERVE_OBJECTS if kind in NAME_CLASH_KINDS}
    clashes = []
    for doc in docs:
        kind, ns, name = identity(doc)
        if (kind, ns, name) in owned or (kind, name) in names:
            clashes.append((kind, ns, name))
    return clashes


def find_helm() -> Path | None:
    """The helm binary hack/build-helm.sh caches (LOCALCACHE_HELM overrides), or None."""
    if os.environ.get("LOCALCACHE_HELM"):
        return Path(os.environ["LOCALCACHE_HELM"])
    version = os.environ.get("LOCALCACHE_HELM_VERSION", "v3.22.0")
    root = os.environ.get("LOCALCACHE_TOOLS_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localcache" / "tools"
    )
    helm = Path(root) / f"helm-{version}" / "helm"
    return helm if os.access(helm, os.X_OK) else None


def helm_or_skip() -> Path:
    """helm, or a skip saying how to get it (a failure under LOCALCACHE_REQUIRE_HELM=1)."""
    helm = find_helm()
    if helm is not None:
        return helm
    reason = "helm not built: run `bash hack/build-helm.sh` (Go module proxy)"
    if os.environ.get("LOCALCACHE_REQUIRE_HELM") == "1":
        pytest.fail(reason + "; LOCALCACHE_REQUIRE_HELM=1")
    pytest.skip(reason)


def _run(argv: list[str], *, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize(kubectl: str, path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize path`, as documents."""
    return docs_of(_run([kubectl, "kustomize", str(path)]))


def helm_template(helm: Path, profile: str, *extra: str) -> list[dict[str, Any]]:
    """`helm template` of the chart for `profile`, as documents (CRDs not included)."""
    return docs_of(
        _run(
            [
                str(helm),
                "template",
                RELEASE,
                str(CHART),
                "--namespace",
                RELEASE_NAMESPACE,
                "--set",
                f"profile={profile}",
                *extra,
            ]
        )
    )


@dataclass(frozen=True)
class Images:
    """Image references to install with instead of the profiles' registry names."""

    localcache: str
    storage_initializer: str  # standalone's localcache-config; with-kserve reads KServe's


def _split_ref(ref: str) -> tuple[str, str]:
    """`name[:tag]` -> (name, tag); a registry port is not a tag."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


_PEER_IMAGE_FOLLOWS: dict[str, Any] = {
    # as README "What the install adds" tells an overlay that changes the image to do: the
    # agent's --peer-image and its ServiceAccount's annotation follow the agent's image
    "source": {
        "kind": "DaemonSet",
        "name": "localcache-agent",
        "fieldPath": "spec.template.spec.containers.[name=manager].image",
    },
    "targets": [
        {
            "select": {"kind": "DaemonSet", "name": "localcache-agent"},
            "fieldPaths": ["spec.template.spec.containers.[name=manager].args.3"],
            "options": {"delimiter": "=", "index": 1},
        },
        {
            "select": {"kind": "ServiceAccount", "name": "localcache-agent"},
            "fieldPaths": ["metadata.annotations.[localcache.kserve.io/peer-image]"],
        },
    ],
}


def _overlay(kubectl: str, profile: str, images: Images, root: Path) -> Path:
    """A kustomization in `root` over `profile` that changes only image references."""
    base = REPO_ROOT / "manifests" / "profiles" / profile
    name, tag = _split_ref(images.localcache)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, root)],  # kustomize refuses absolute bases
        "images": [{"name": PROFILE_IMAGE, "newName": name, "newTag": tag}],
        "replacements": [_PEER_IMAGE_FOLLOWS],
    }
    (config,) = [
        d
        for d in kustomize(kubectl, base)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP
    ]
    if "storageInitializer" in config.get("data", {}):
        initializer = json.loads(config["data"]["storageInitializer"])
        initializer["image"] = images.storage_initializer
        patch = [
            {
                "op": "replace",
                "path": "/data/storageInitializer",
                "value": json.dumps(initializer, indent=2),
            }
        ]
        kustomization["patches"] = [
            {"target": {"kind": "ConfigMap", "name": CONFIG_MAP}, "patch": json.dumps(patch)}
        ]
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return root


@dataclass(frozen=True)
class Installer:
    """Installs and uninstalls profiles on the cluster of `kubeconfig`."""

    kubectl: str
    kubeconfig: Path
    helm: Path | None = None
    images: Images | None = None

    def k(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """kubectl's stdout; with `check`, a non-zero exit fails with its stderr."""
        return _run(
            [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout, check=check
        )

    def _helm(self, *args: str) -> str:
        assert self.helm is not None, "this Installer has no helm"
        return _run(
            [str(self.helm), f"--kubeconfig={self.kubeconfig}", "-n", RELEASE_NAMESPACE, *args],
            timeout=300,
        )

    def install_crds(self) -> None:
        """localcache's CRDs (a separate step: no profile deletes them)."""
        self.k("apply", "--server-side", "-k", str(REPO_ROOT / "manifests" / "crds"))

    def install(self, profile: str, tool: Tool) -> None:
        if tool == "kustomize" and self.images is None:
            self.k("apply", "-k", str(REPO_ROOT / "manifests" / "profiles" / profile))
        elif tool == "kustomize":
            assert self.images is not None
            with tempfile.TemporaryDirectory(prefix="localcache-overlay-") as root:
                overlay = _overlay(self.kubectl, profile, self.images, Path(root))
                self.k("apply", "-k", str(overlay))
        else:
            # with-kserve: KServe's chart owns the CRDs; --skip-crds leaves them alone even
            # where they are missing (crds/ objects are never updated by Helm anyway)
            extra = ["--skip-crds"] if profile == "with-kserve" else []
            if self.images is not None:
                extra += ["--set", f"image={self.images.localcache}"]
                extra += ["--set", f"storageInitializerImage={self.images.storage_initializer}"]
            self._helm("install", RELEASE, str(CHART), "--set", f"profile={profile}", *extra)

    def uninstall(self, profile: str, tool: Tool) -> None:
        if tool == "kustomize":
            self.k(
                "delete",
                "--wait=false",
                "-k",
                str(REPO_ROOT / "manifests" / "profiles" / profile),
            )
        else:
            self._helm("uninstall", RELEASE)

    def installed(self) -> tuple[str, Tool] | None:
        """The profile and tool of what runs now (read from the controller Deployment), or
        None when no profile is installed."""
        text = self.k(
            "get", "deployment", "localcache-controller", "-n", "localcache",
            "--ignore-not-found", "-o", "json",
        ).strip()  # fmt: skip
        if not text:
            return None
        deployment = json.loads(text)
        annotations = deployment["metadata"].get("annotations") or {}
        tool: Tool = "helm" if "meta.helm.sh/release-name" in annotations else "kustomize"
        (container, *_) = deployment["spec"]["template"]["spec"]["containers"]
        args = " ".join(container.get("args") or [])
        return ("with-kserve" if "--kserve-config" in args else "standalone"), tool

    def exists(self, ident: Identity) -> bool:
        kind, ns, name = ident
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        if ns:
            args += ["-n", ns]
        return bool(self.k(*args).strip())

    def wait_gone(self, idents: list[Identity], *, timeout: float = 120) -> None:
        """Poll until none of `idents` exists (namespaces finish terminating). Each poll
        stops at the first one still there, namespaces first: they take longest."""
        ordered = sorted(idents, key=lambda i: i[0] != "Namespace")

        def gone() -> bool:
            present = next((i for i in ordered if self.exists(i)), None)
            if present is not None:
                raise AssertionError("still present: " + "/".join(present))
            return True

        waiting.wait_until_sync(
            gone, timeout=timeout, interval=0.5, what="the uninstalled objects were deleted"
        )

    def snapshot(self, idents: list[Identity]) -> dict[Identity, dict[str, Any] | None]:
        """The full objects of `idents` (None where absent), as the apiserver returns them."""
        out: dict[Identity, dict[str, Any] | None] = {}
        for kind, ns, name in idents:
            args = ["get", kind, name, "--ignore-not-found", "-o", "json"]
            if ns:
                args += ["-n", ns]
            text = self.k(*args).strip()
            out[(kind, ns, name)] = json.loads(text) if text else None
        return out
