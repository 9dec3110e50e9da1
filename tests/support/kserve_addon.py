"""KServe's own local model cache add-on, as KServe ships it: the objects a migration test installs.

The documents come from KServe's Go module in the Go module cache (`module_dir`, downloaded
through the Go module proxy when missing), rendered with `kubectl kustomize` the way KServe's
kustomize install renders them, and changed only where the real-node test bed needs it:

- `crd_documents`: `config/crd` (InferenceService, TrainedModel, (Cluster)ServingRuntime,
  InferenceGraph, ClusterStorageContainer) and `config/crd/full/localmodel` (the four local
  model CRDs), unchanged. The LLMInferenceService CRDs are left out: KServe ships them with a
  conversion webhook served by KServe's main controller, which does not run here.
- `inferenceservice_config`: `config/configmap/inferenceservice.yaml` with only the
  `storageInitializer` image and `localModel.enabled` changed, by editing the JSON text of
  those two values; every other key keeps KServe's exact text.
- `addon_documents`: `config/localmodels` (controller Deployment, the node agent DaemonSet of
  `config/localmodelnodes`, RBAC, webhook Service and ValidatingWebhookConfiguration) without
  its CRDs, with the given images and `imagePullPolicy: IfNotPresent` (nothing is pulled on the
  test bed), and cert-manager's Certificate replaced by the Secret cert-manager would have
  made (`certs.TinyCA`, for the Certificate's DNS names) and the CA bundle it would have
  injected into the webhook configuration. The agent's hostPath stays KServe's `/models`.

Documents are plain dicts, in KServe's order; the caller applies them (the CRDs need
server-side apply: the InferenceService CRD is larger than the last-applied annotation allows).
Not promised: the Namespace (`kserve`) or KServe's job namespace; both are the caller's.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from localcache.devenv import certs

VERSION = "v0.20.0"
MODULE = "github.com/kserve/kserve"
CONTROLLER = "kserve-localmodel-controller-manager"
AGENT = "kserve-localmodelnode-agent"
WEBHOOK_SECRET = "localmodel-webhook-server-cert"
CRD_DIRS = ("config/crd", "config/crd/full/localmodel")
GO_TIMEOUT_S = 600
KUSTOMIZE_TIMEOUT_S = 120

Obj = dict[str, Any]


class AddonError(RuntimeError):
    """KServe's module could not be found or rendered; the message says which step failed."""


@functools.cache
def module_dir(version: str = VERSION) -> Path:
    """The directory of github.com/kserve/kserve@`version` in the Go module cache."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # outside any module: no go.mod, no workspace
        env={**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=mod"},
        timeout=GO_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AddonError(f"go mod download {MODULE}@{version}: {done.stderr.strip()}")
    return Path(json.loads(done.stdout)["Dir"])


def kustomize(kubectl: str, directory: Path) -> list[Obj]:
    """`kubectl kustomize directory`, as documents."""
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=KUSTOMIZE_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AddonError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def crd_documents(*, kubectl: str, version: str = VERSION) -> list[Obj]:
    """KServe's CRDs for this add-on, as its kustomize install renders them."""
    root = module_dir(version)
    return [doc for sub in CRD_DIRS for doc in kustomize(kubectl, root / sub)]


def _replace_once(text: str, pattern: str, new: str, what: str) -> str:
    changed, count = re.subn(pattern, new, text, count=1)
    if count != 1:
        raise AddonError(f"inferenceservice-config: no {what} in {text!r}")
    return changed


def inferenceservice_config(storage_initializer_image: str, *, version: str = VERSION) -> Obj:
    """KServe's `inferenceservice-config`, with the storage initializer image replaced and the
    local model cache enabled (`localModel.enabled`: the InferenceService defaulter's switch)."""
    path = module_dir(version) / "config" / "configmap" / "inferenceservice.yaml"
    doc: Obj = yaml.safe_load(path.read_text())
    data = doc["data"]
    data["storageInitializer"] = _replace_once(
        data["storageInitializer"],
        r'("image"\s*:\s*)"[^"]*"',
        rf"\1{json.dumps(storage_initializer_image)}",
        "storageInitializer image",
    )
    data["localModel"] = _replace_once(
        data["localModel"], r'("enabled"\s*:\s*)false', r"\1true", "localModel.enabled false"
    )
    if (
        json.loads(data["storageInitializer"])["image"] != storage_initializer_image
        or not (json.loads(data["localModel"])["enabled"])
    ):
        raise AddonError("inferenceservice-config: the edits did not take")
    return doc


def _webhook_secret(certificate: Obj) -> tuple[Obj, bytes]:
    """The Secret cert-manager would issue for `certificate`, and the CA that signed it."""
    spec = certificate["spec"]
    names = list(dict.fromkeys([spec["commonName"], *spec.get("dnsNames", [])]))
    ca = certs.TinyCA("kserve-localmodel-webhook-ca")
    pair = ca.serving_cert(names)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": spec["secretName"],
            "namespace": certificate["metadata"]["namespace"],
            "labels": certificate["metadata"].get("labels", {}),
        },
        "data": {
            "tls.crt": base64.b64encode(pair.cert_pem).decode(),
            "tls.key": base64.b64encode(pair.key_pem).decode(),
            "ca.crt": base64.b64encode(ca.cert_pem).decode(),
        },
    }
    return secret, ca.cert_pem


def _set_image(doc: Obj, image: str) -> None:
    for container in doc["spec"]["template"]["spec"]["containers"]:
        container["image"] = image
        container["imagePullPolicy"] = "IfNotPresent"


def addon_documents(
    controller_image: str, agent_image: str, *, kubectl: str, version: str = VERSION
) -> list[Obj]:
    """KServe's `config/localmodels` for the test bed: no CRDs, our images, no cert-manager."""
    docs = kustomize(kubectl, module_dir(version) / "config" / "localmodels")
    out: list[Obj] = []
    ca_pem: bytes | None = None
    seen: set[str] = set()
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "CustomResourceDefinition":
            continue
        if kind == "Certificate":
            secret, ca_pem = _webhook_secret(doc)
            if secret["metadata"]["name"] != WEBHOOK_SECRET:
                raise AddonError(f"the Certificate issues {secret['metadata']['name']}")
            doc = secret
        elif (kind, name) in (("Deployment", CONTROLLER), ("DaemonSet", AGENT)):
            _set_image(doc, controller_image if kind == "Deployment" else agent_image)
        seen.add(f"{doc['kind']}/{doc['metadata']['name']}")
        out.append(doc)
    expected = {f"Deployment/{CONTROLLER}", f"DaemonSet/{AGENT}", f"Secret/{WEBHOOK_SECRET}"}
    if not expected <= seen or ca_pem is None:
        raise AddonError(f"config/localmodels lacks {sorted(expected - seen)}")
    bundle = base64.b64encode(ca_pem).decode()
    for doc in out:
        if doc["kind"] == "ValidatingWebhookConfiguration":
            # what cert-manager's CA injector would do; nothing here watches the annotation
            doc["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
            for hook in doc["webhooks"]:
                hook["clientConfig"]["caBundle"] = bundle
    return out
