"""KServe's own serving controllers as KServe installs them: the documents a real-node test applies.

KServe v0.20.0's InferenceService controller with its webhooks (`cmd/manager`, in Standard
mode, the RawDeployment of older releases) and its LLMInferenceService controller with its
defaulter, validators and conversion webhook (`cmd/llmisvc`), built locally
(hack/build-images.sh `kserve-manager`, `kserve-llmisvc`). Every document comes from KServe's
Go module (`kserve_addon.module_dir`), rendered with `kubectl kustomize` the way KServe's
kustomize install renders it, changed only where the test bed needs it:

- `crd_documents`: `config/crd/full` (InferenceService, ServingRuntime, ClusterServingRuntime,
  TrainedModel, InferenceGraph), `config/crd/full/clusterstoragecontainer` and the CRDs of
  `config/llmisvc` (LLMInferenceService(Config) with their conversion webhook, served by
  `cmd/llmisvc`; InferencePool and llm-d's CRDs). They replace the bed's stand-ins
  (manifests/test), server-side applied. KServe's local model CRDs are not among them:
  localcache's own (manifests/crds) stay.
- `manager_documents`: `config/default` without its CRDs, the image set, `imagePullPolicy:
  IfNotPresent`, and without the `kube-rbac-proxy` sidecar (quay.io/brancz/kube-rbac-proxy, only
  a TLS front for the metrics port; no image of it can be had here, and nothing here reads
  metrics). `llmisvc_documents`: `config/llmisvc` the same way, and `config/llmisvcconfig` (the
  well-known LLMInferenceServiceConfig presets the controller merges, applied once it runs:
  their validating webhook is its own).
- cert-manager is replaced by what it would have made: one test CA (`certs.TinyCA`) signs each
  Certificate's DNS names into the Certificate's Secret, and its bundle goes into every webhook
  configuration and CRD conversion webhook that KServe annotates with `inject-ca-from`.
- `inferenceservice_config(deployed, ...)`: KServe's whole `inferenceservice-config`, merged into
  the ConfigMap localcache's manifests deployed: localcache's `localModel`, `storageInitializer`
  and `credentials` stay (KServe reads the same keys), KServe's other sections are added, with
  `deploy.defaultDeploymentMode` Standard and `localModel.enabled` true.
- `serving_runtime`: a ServingRuntime of the stand-in model server (hack/runtime-standin) for
  `modelFormat` onnx, which reads the files at /mnt/models and prints their digests.

Documents are plain dicts; the caller applies them, CRDs first (server-side: the
InferenceService CRD is larger than the last-applied annotation allows), then waits for the
Deployments to roll out. Not promised: the `kserve` namespace (localcache's manifests make it).
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from dataclasses import dataclass
from typing import Any

from localcache.devenv import certs, realnodes, waiting
from tests.support import e2ebed, kserve_addon

Obj = dict[str, Any]

NAMESPACE = "kserve"
MANAGER = "kserve-controller-manager"
LLMISVC = "llmisvc-controller-manager"
CONFIG_MAP = "inferenceservice-config"
MANAGER_CRD_DIRS = ("config/crd/full", "config/crd/full/clusterstoragecontainer")
INJECT_CA = "cert-manager.io/inject-ca-from"
DROPPED_SIDECAR = "kube-rbac-proxy"
RUNTIME_NAME = "standin-onnx"
ROLLOUT_TIMEOUT_S = 240
UNINSTALL_TIMEOUT_S = 180
SERVING_KINDS = "llminferenceservices.serving.kserve.io,inferenceservices.serving.kserve.io"
PRESETS = "llminferenceserviceconfigs.serving.kserve.io"
PRESETS_VALIDATOR = "llminferenceserviceconfig.serving.kserve.io"
CONVERTED_CRDS = (PRESETS, "llminferenceservices.serving.kserve.io")
# localcache's sections of the ConfigMap, which its manifests set and both read
LOCALCACHE_SECTIONS = ("localModel", "storageInitializer", "credentials")


class WebhookCA:
    """The test CA that stands in for cert-manager: a Secret per Certificate, one bundle."""

    def __init__(self) -> None:
        self.ca = certs.TinyCA("kserve-webhook-test-ca")

    @property
    def bundle(self) -> str:
        return base64.b64encode(self.ca.cert_pem).decode()

    def secret_for(self, certificate: Obj) -> Obj:
        spec = certificate["spec"]
        names = list(dict.fromkeys([spec["commonName"], *spec.get("dnsNames", [])]))
        pair = self.ca.serving_cert(names)
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": spec["secretName"],
                "namespace": certificate["metadata"].get("namespace", NAMESPACE),
            },
            "data": {
                "tls.crt": base64.b64encode(pair.cert_pem).decode(),
                "tls.key": base64.b64encode(pair.key_pem).decode(),
                "ca.crt": self.bundle,
            },
        }

    def inject(self, doc: Obj) -> Obj:
        """`doc` with the CA bundle where cert-manager's CA injector would put it."""
        annotations = doc["metadata"].get("annotations") or {}
        if INJECT_CA not in annotations:
            return doc
        doc = copy.deepcopy(doc)
        doc["metadata"]["annotations"].pop(INJECT_CA)
        if doc["kind"] == "CustomResourceDefinition":
            conversion = doc["spec"].get("conversion") or {}
            webhook = conversion.get("webhook")
            if webhook:
                webhook["clientConfig"]["caBundle"] = self.bundle
        else:
            for hook in doc.get("webhooks") or []:
                hook["clientConfig"]["caBundle"] = self.bundle
        return doc


def _render(kubectl: str, sub: str) -> list[Obj]:
    return kserve_addon.kustomize(kubectl, kserve_addon.module_dir() / sub)


def _set_image(doc: Obj, image: str) -> None:
    spec = doc["spec"]["template"]["spec"]
    spec["containers"] = [c for c in spec["containers"] if c["name"] != DROPPED_SIDECAR]
    for container in spec["containers"]:
        container["image"] = image
        container["imagePullPolicy"] = "IfNotPresent"


def _workload(docs: list[Obj], *, name: str, image: str, ca: WebhookCA) -> list[Obj]:
    """`docs` without CRDs, Certificates made Secrets, the CA injected, `name`'s image set."""
    out: list[Obj] = []
    found = False
    for doc in docs:
        kind = doc["kind"]
        if kind in ("CustomResourceDefinition", "Issuer"):
            continue
        if kind == "Certificate":
            doc = ca.secret_for(doc)
        elif kind == "Deployment" and doc["metadata"]["name"] == name:
            doc = copy.deepcopy(doc)
            _set_image(doc, image)
            found = True
        elif kind == "Secret" and not doc.get("data"):
            continue  # an empty placeholder Secret (kserve-webhook-server-secret)
        out.append(ca.inject(doc))
    if not found:
        raise kserve_addon.AddonError(f"KServe's kustomization renders no Deployment {name}")
    return out


def crd_documents(*, kubectl: str, ca: WebhookCA) -> list[Obj]:
    """KServe's CRDs for both controllers (see the module docstring)."""
    docs: list[Obj] = []
    for sub in (*MANAGER_CRD_DIRS, "config/llmisvc"):
        docs += [d for d in _render(kubectl, sub) if d["kind"] == "CustomResourceDefinition"]
    unique = {d["metadata"]["name"]: d for d in docs}  # config/crd/full repeats one
    return [ca.inject(d) for d in unique.values() if not d["metadata"]["name"].startswith("local")]


def manager_documents(image: str, *, kubectl: str, ca: WebhookCA) -> list[Obj]:
    """`config/default`: the InferenceService controller, its RBAC, Services and webhooks."""
    return _workload(_render(kubectl, "config/default"), name=MANAGER, image=image, ca=ca)


def llmisvc_documents(image: str, *, kubectl: str, ca: WebhookCA) -> list[Obj]:
    """`config/llmisvc`: the LLMInferenceService controller, its RBAC, Service, webhooks."""
    return _workload(_render(kubectl, "config/llmisvc"), name=LLMISVC, image=image, ca=ca)


def llmisvc_presets(*, kubectl: str) -> list[Obj]:
    """`config/llmisvcconfig`: the well-known LLMInferenceServiceConfigs (their validating
    webhook is the controller's: apply them once it runs)."""
    return _render(kubectl, "config/llmisvcconfig")


def inferenceservice_config(deployed: Obj, *, storage_initializer_image: str) -> Obj:
    """KServe's `inferenceservice-config` merged into the `deployed` one (module docstring)."""
    kserve = kserve_addon.inferenceservice_config(storage_initializer_image)
    data = dict(kserve["data"])
    data.pop("_example", None)
    data.update({k: v for k, v in (deployed.get("data") or {}).items() if k in LOCALCACHE_SECTIONS})
    data["deploy"] = json.dumps({"defaultDeploymentMode": "Standard"})
    local_model = json.loads(data["localModel"])
    local_model["enabled"] = True
    data["localModel"] = json.dumps(local_model, indent=2)
    meta = deployed["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                     "labels": meta.get("labels") or {}},
        "data": data,
    }  # fmt: skip


def serving_runtime(namespace: str, image: str) -> Obj:
    """A ServingRuntime of the stand-in model server for onnx models, auto-selected."""
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": RUNTIME_NAME, "namespace": namespace},
        "spec": {
            "supportedModelFormats": [{"name": "onnx", "version": "1", "autoSelect": True}],
            "protocolVersions": ["v1"],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["standin"],
                    "args": ["--model_dir=/mnt/models", "--http_port=8080"],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "32Mi"},
                        "limits": {"cpu": "500m", "memory": "128Mi"},
                    },
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                }
            ],
        },
    }


# ---------------------------------------------------------------------- on the shared bed


@dataclass
class KServeControllers:
    """KServe's serving controllers running on the shared bed, beside the deployed localcache."""

    shared: e2ebed.SharedBed
    ca: WebhookCA
    runtime_image: str  # the stand-in model server (and vLLM) image

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.shared.kubectl(*args, **kw)

    def apply(self, docs: list[Obj], *, server_side: bool = False) -> None:
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        extra = ["--server-side", "--force-conflicts"] if server_side else []
        self.kubectl("apply", *extra, "-f", "-", input_text=listed, timeout=300)

    def config_map(self) -> Obj:
        done = self.kubectl("get", "configmap", CONFIG_MAP, "-n", NAMESPACE, "-o", "json")
        found: Obj = json.loads(done.stdout)
        return found

    def logs(self, tail: int = 60) -> str:
        """Both controllers' recent logs, for a failure report."""
        parts = []
        for name in (MANAGER, LLMISVC):
            done = self.kubectl("logs", "-n", NAMESPACE, f"deployment/{name}", "-c", "manager",
                                f"--tail={tail}", check=False)  # fmt: skip
            parts.append(f"--- {name}\n{done.stdout}{done.stderr}")
        return "\n".join(parts)


def install(shared: e2ebed.SharedBed) -> KServeControllers:
    """The bed reset, KServe's CRDs, localcache deployed as the bed deploys it (without the
    stand-in CRDs), KServe's `inferenceservice-config` merged in, and both KServe controllers
    rolled out with their webhooks answering."""
    shared.reset()
    plane = shared.bed.control_plane
    assert plane.kubectl_path is not None
    kubectl = plane.kubectl_path
    found = KServeControllers(
        shared=shared, ca=WebhookCA(), runtime_image=shared.images["runtime-standin"]
    )
    crds = crd_documents(kubectl=kubectl, ca=found.ca)
    found.apply(crds, server_side=True)
    found.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                  *(f"crd/{d['metadata']['name']}" for d in crds))  # fmt: skip
    realnodes.deploy(shared.kubectl, stand_ins=False)
    found.apply([
        inferenceservice_config(
            found.config_map(),
            storage_initializer_image=realnodes.STORAGE_INITIALIZER_IMAGE,
        )
    ])  # fmt: skip
    found.apply(
        manager_documents(shared.images["kserve-manager"], kubectl=kubectl, ca=found.ca)
        + llmisvc_documents(shared.images["kserve-llmisvc"], kubectl=kubectl, ca=found.ca),
        server_side=True,
    )
    for name in (MANAGER, LLMISVC):
        done = found.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{name}",
                             f"--timeout={ROLLOUT_TIMEOUT_S}s", timeout=ROLLOUT_TIMEOUT_S + 30,
                             check=False)  # fmt: skip
        if done.returncode != 0:
            raise kserve_addon.AddonError(
                f"{name} did not roll out: {done.stderr.strip()}\n{found.logs()}"
            )
    presets = json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": llmisvc_presets(kubectl=kubectl)}
    )
    realnodes.apply_once_admitted(shared.kubectl, presets, timeout=120)
    return found


def uninstall(found: KServeControllers) -> None:
    """Take KServe's controllers away cleanly, before the next package's `reset()`: the
    serving objects and the presets while the controllers still remove their finalizers (the
    presets' validating webhook, which refuses deleting well-known ones, first), then every
    KServe webhook configuration and the CRDs whose conversion webhook the LLMInferenceService
    controller serves; otherwise the `kserve` namespace never finishes terminating."""
    kubectl = found.kubectl
    ca = found.ca
    binary = found.shared.bed.control_plane.kubectl_path
    assert binary is not None

    def gone(kinds: str) -> None:
        def empty() -> bool:
            done = kubectl("get", kinds, "-A", "-o", "name", check=False)
            assert done.returncode == 0, done.stderr
            assert not done.stdout.strip(), f"still there: {done.stdout.split()[:5]}"
            return True

        waiting.wait_until_sync(empty, timeout=UNINSTALL_TIMEOUT_S, interval=1.0,
                                what=f"every {kinds} is deleted")  # fmt: skip

    kubectl("delete", SERVING_KINDS, "--all", "-A", "--wait=false")
    gone(SERVING_KINDS)
    kubectl("delete", "validatingwebhookconfiguration", PRESETS_VALIDATOR, "--ignore-not-found")
    kubectl("delete", PRESETS, "--all", "-A", "--wait=false")
    gone(PRESETS)
    docs = manager_documents("-", kubectl=binary, ca=ca) + llmisvc_documents(
        "-", kubectl=binary, ca=ca
    )
    for doc in docs:
        if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")
    kubectl("delete", "crd", *CONVERTED_CRDS, "--ignore-not-found", timeout=UNINSTALL_TIMEOUT_S)
