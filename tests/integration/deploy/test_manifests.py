"""The shipped manifests on the real apiserver (RBAC on): dry runs, a real apply, least privilege.

- `kubectl apply --dry-run=server -k` accepts manifests/default, manifests/kind and the samples.
- A real `kubectl apply -k manifests/default` creates every object of the build (each read
  back); the webhook configurations are then shown to intercept cache creation and are deleted
  at once (their Service has no endpoints: with failurePolicy Fail they would block every
  later test), and the module removes everything else it created afterwards, except the two
  namespaces and the CRDs, which the session shares.
- RBAC: for each component's ServiceAccount, SubjectAccessReviews allow every access in
  ACCESS (the one table of what the code does) and deny everything in DENIED; no rule grants
  anything the table does not list, and no rule uses `*`. Real requests with the
  ServiceAccounts' credentials confirm the bindings.
(test_wiring.py checks what the builds say: selectors, ports, security, the ConfigMap.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.devenv import waiting
from localcache.devenv.controlplane import ControlPlane
from tests.integration.deploy.builds import (
    AGENT,
    CONFIGMAP,
    CONTROLLER,
    JOBS_NS,
    MANIFESTS,
    NS,
    Doc,
    build,
)

TENANT = "team-a"  # any namespace: access reviews do not need it to exist
MUTATING = "localmodel.inferenceservice.serving.kserve.io"
VALIDATING = "localmodelcache.serving.kserve.io"
CERT_SECRET = "localmodel-webhook-server-cert"
PEER_SECRET = "localcache-peer-tls"
AGENT_DAEMONSET = "kserve-localmodelnode-agent"
KEPT_KINDS = {"Namespace", "CustomResourceDefinition"}  # shared with the rest of the session
LMC = "/apis/serving.kserve.io/v1alpha1/localmodelcaches"


@dataclass(frozen=True)
class A:
    """Verbs on `resource[.group][/subresource]` (kubectl auth can-i syntax) in `ns`, `name`."""

    verbs: str
    resource: str
    ns: str = ""
    name: str = ""

    def parts(self) -> tuple[str, str, str]:
        resource, _, sub = self.resource.partition("/")
        plural, _, group = resource.partition(".")
        return group, plural, sub


SERVING = "serving.kserve.io"
REG = "admissionregistration.k8s.io"
CRDS = "customresourcedefinitions.apiextensions.k8s.io"
ACCESS: dict[str, list[A]] = {
    CONTROLLER: [
        A("get list watch update patch", f"localmodelcaches.{SERVING}"),
        A("get list watch update patch", f"localmodelnamespacecaches.{SERVING}", TENANT),
        A("get update patch", f"localmodelcaches.{SERVING}/status"),
        A("get update patch", f"localmodelnamespacecaches.{SERVING}/status", TENANT),
        A("update", f"localmodelcaches.{SERVING}/finalizers"),
        A("update", f"localmodelnamespacecaches.{SERVING}/finalizers", TENANT),
        A("get list watch create update patch delete", f"localmodelnodes.{SERVING}"),
        A("get list watch update patch", f"localmodelnodegroups.{SERVING}"),
        A("get update patch", f"localmodelnodegroups.{SERVING}/status"),
        A("get list watch", f"inferenceservices.{SERVING}", TENANT),
        A("get list watch", f"llminferenceservices.{SERVING}", TENANT),
        A("get list watch", f"clusterstoragecontainers.{SERVING}"),
        # spec.baseRefs of LLMInferenceServices, resolved by the webhook
        A("get list watch", f"llminferenceserviceconfigs.{SERVING}", TENANT),
        A("get list watch", CRDS, name=f"inferenceservices.{SERVING}"),
        A("get list watch", CRDS, name=f"llminferenceservices.{SERVING}"),
        A("get list watch", CRDS, name=f"clusterstoragecontainers.{SERVING}"),
        A("get list watch", CRDS, name=f"llminferenceserviceconfigs.{SERVING}"),
        A("get list watch", CRDS, name=f"localmodelcaches.{SERVING}"),
        A("get list watch", CRDS, name=f"localmodelnamespacecaches.{SERVING}"),
        A("get list watch", CRDS, name=f"localmodelnodes.{SERVING}"),
        A("get list watch", CRDS, name=f"localmodelnodegroups.{SERVING}"),
        # patch: the copy readiness labels (controllers/readiness.py)
        A("get list watch patch", "nodes"),
        A("get list watch create update patch delete", "persistentvolumes"),
        A("get list watch create update patch delete", "persistentvolumeclaims", TENANT),
        A("get create patch", "events", TENANT),
        A("get create patch", "events.events.k8s.io", TENANT),
        # CRDSchemaDegraded, repeated: the Event's count is read, then bumped (crdcheck.py)
        A("get create patch", "events", "default"),
        A("get patch", f"mutatingwebhookconfigurations.{REG}", name=MUTATING),
        A("get patch", f"validatingwebhookconfigurations.{REG}", name=VALIDATING),
        A("get list watch", "configmaps", NS, CONFIGMAP),
        A("get create update patch", "leases.coordination.k8s.io", NS),
        A("get update patch", "secrets", NS, CERT_SECRET),
        # the peer data plane's TLS bundle, issued and renewed (controllers/peertls.py)
        A("get update", "secrets", NS, PEER_SECRET),
        A("create", "secrets", NS),
        # the agent DaemonSet's tolerations follow the node groups' (agenttolerations.py)
        A("get list watch patch", "daemonsets.apps", NS, AGENT_DAEMONSET),
        # legacy (hostPath) pairs are replaced only once no pod mounts their claim; watch:
        # Events on serving pods that wait for their copy (controllers/readiness.py)
        A("list watch", "pods", TENANT),
        # shared-volume caches: import Jobs in the cache's namespace, their credentials, the
        # progress sidecar's last line, and its own pod's image (controllers/importjobs.py)
        A("get list watch create delete", "jobs.batch", TENANT),
        A("get", "serviceaccounts", TENANT),
        A("get", "secrets", TENANT),
        A("get", "pods/log", TENANT),
        A("get", "pods", NS),
    ],
    AGENT: [
        A("get list watch", f"localmodelnodes.{SERVING}"),
        A("get update patch", f"localmodelnodes.{SERVING}/status"),
        A("update", f"localmodelnodes.{SERVING}/finalizers"),
        A("get list watch", f"localmodelnodegroups.{SERVING}"),
        A("get list watch", f"clusterstoragecontainers.{SERVING}"),
        A("get list watch", CRDS, name=f"clusterstoragecontainers.{SERVING}"),
        # started before them, it waits until they serve (runtime.crds.crdwait)
        A("get", CRDS, name=f"localmodelcaches.{SERVING}"),
        A("get", CRDS, name=f"localmodelnamespacecaches.{SERVING}"),
        A("get", CRDS, name=f"localmodelnodes.{SERVING}"),
        A("get", CRDS, name=f"localmodelnodegroups.{SERVING}"),
        A("get list watch", f"localmodelcaches.{SERVING}"),
        A("get list watch", f"localmodelnamespacecaches.{SERVING}", TENANT),
        A("get list watch create delete", "jobs.batch", JOBS_NS),
        A("get list watch create delete", "jobs.batch", TENANT),
        A("list", "pods", TENANT),
        A("get", "serviceaccounts", TENANT),
        A("get", "secrets", TENANT),
        A("get", "nodes"),
        # the peer server authenticates peer-mode download pods' tokens (agent/peer/)
        A("create", "tokenreviews.authentication.k8s.io"),
        A("get list watch", "configmaps", NS, CONFIGMAP),
        A("create", "events", "default"),
        A("create", "events.events.k8s.io", "default"),
    ],
}
EVERYTHING = A("* get list create delete", "*.*")
DENIED: dict[str, list[A]] = {
    CONTROLLER: [
        A("list watch", "secrets", NS),
        A("list watch", "secrets", TENANT),
        A("create delete", f"localmodelcaches.{SERVING}"),
        A("create delete", f"localmodelnamespacecaches.{SERVING}", TENANT),
        A("update patch", f"inferenceservices.{SERVING}", TENANT),
        A("list", CRDS),
        A("patch", f"mutatingwebhookconfigurations.{REG}", name="someone-elses"),
        A("list create delete", f"mutatingwebhookconfigurations.{REG}"),
        A("patch delete", f"validatingwebhookconfigurations.{REG}", name="someone-elses"),
        A("get", "configmaps", NS, "other-config"),
        A("get", "configmaps", TENANT, CONFIGMAP),
        A("get create", "leases.coordination.k8s.io", TENANT),
        A("update patch", "jobs.batch", TENANT),
        A("create delete get update patch", "pods", TENANT),
        A("delete create update", "nodes"),
        A("get patch update delete", "daemonsets.apps", NS, "someone-elses"),
        A("list create", "daemonsets.apps", NS),
        A("get patch", "daemonsets.apps", TENANT, AGENT_DAEMONSET),
        A("escalate bind", "clusterroles.rbac.authorization.k8s.io"),
        EVERYTHING,
    ],
    AGENT: [
        A("delete create update patch", f"localmodelcaches.{SERVING}"),
        A("delete create update patch", f"localmodelnamespacecaches.{SERVING}", TENANT),
        A("create update patch delete", f"localmodelnodes.{SERVING}"),
        A("update patch", f"localmodelnodegroups.{SERVING}"),
        A("get", CRDS, name=f"inferenceservices.{SERVING}"),
        A("list watch create update", "secrets", TENANT),
        A("create delete get watch", "pods", TENANT),
        A("list watch", "nodes"),
        A("create patch", "events", TENANT),
        A("patch", "events", "default"),
        A("create delete", "persistentvolumes"),
        A("create delete", "persistentvolumeclaims", TENANT),
        A("get", "configmaps", NS, "other-config"),
        A("get update", "leases.coordination.k8s.io", NS),
        A("get patch", f"mutatingwebhookconfigurations.{REG}", name=MUTATING),
        A("escalate bind", "clusterroles.rbac.authorization.k8s.io"),
        # the peer bundle is mounted, never read through the API by name with write rights
        A("update patch delete", "secrets", NS, PEER_SECRET),
        A("create", "subjectaccessreviews.authorization.k8s.io"),
        EVERYTHING,
    ],
}


def _reviews(sa: str, access: A) -> Iterator[tuple[str, Doc]]:
    group, plural, sub = access.parts()
    for verb in access.verbs.split():
        attributes = {"verb": verb, "group": group, "resource": plural, "subresource": sub}
        attributes |= {"namespace": access.ns, "name": access.name}
        yield (
            f"{verb} {access.resource} ns={access.ns} name={access.name}",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": f"system:serviceaccount:{NS}:{sa}",
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}"],
                    "resourceAttributes": attributes,
                },
            },
        )


def _allowed(control_plane: ControlPlane, review: Doc) -> bool:
    status, body = control_plane.rest(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    assert status == 201, body
    return bool(body["status"].get("allowed"))


def _ident(doc: Doc) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def _existing(control_plane: ControlPlane, path: Path) -> set[tuple[str, str, str]]:
    out = control_plane.kubectl("get", "-f", str(path), "-o", "json", "--ignore-not-found")
    if not out.stdout.strip():
        return set()
    loaded = json.loads(out.stdout)
    return {_ident(d) for d in loaded.get("items", [loaded])}


def _cache(name: str) -> Doc:
    spec = {"sourceModelUri": f"s3://m/{name}", "modelSize": "1Mi", "nodeGroups": ["g"]}
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def _cache_dry_run(control_plane: ControlPlane) -> tuple[int, Any]:
    return control_plane.rest("POST", f"{LMC}?dryRun=All", _cache("webhook-probe"))


@pytest.fixture(scope="module")
def namespaces(control_plane: ControlPlane, crds: list[str]) -> list[str]:
    """kserve and kserve-localmodel-jobs exist (a server-side dry run does not create them)."""
    for name in (NS, JOBS_NS):
        control_plane.create_namespace(name)
    return [NS, JOBS_NS]


@dataclass
class Deployed:
    docs: list[Doc]
    found: set[tuple[str, str, str]]
    webhook_rejection: str


@pytest.fixture(scope="module")
def deployed(
    control_plane: ControlPlane, namespaces: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    docs = build(control_plane, "default")
    built = tmp_path_factory.mktemp("deploy") / "default.yaml"
    built.write_text(yaml.safe_dump_all(docs))
    before = _existing(control_plane, built)
    created = [d for d in docs if _ident(d) not in before and d["kind"] not in KEPT_KINDS]
    applied = control_plane.kubectl("apply", "-k", str(MANIFESTS / "default"), check=False)
    try:
        assert applied.returncode == 0, applied.stderr
        found = _existing(control_plane, built)

        # The validating webhook is live: cache creation now calls the (absent) server.
        def rejected() -> str | None:
            status, body = _cache_dry_run(control_plane)
            message = body.get("message", "") if isinstance(body, dict) else str(body)
            return None if status == 201 else f"{status} {message}"

        rejection = waiting.wait_until_sync(
            rejected,
            timeout=30,
            what="the shipped validating webhook intercepts LocalModelCache creation",
        )
    finally:
        for kind, plural in (("mutating", MUTATING), ("validating", VALIDATING)):
            control_plane.kubectl(
                "delete", f"{kind}webhookconfiguration", plural, "--ignore-not-found"
            )
        waiting.wait_until_sync(
            lambda: _cache_dry_run(control_plane)[0] == 201,
            timeout=30,
            what="LocalModelCache creation works again once the webhook configurations are gone",
        )
    try:
        yield Deployed(docs, found, rejection or "")
    finally:
        leftovers = [d for d in created if "WebhookConfiguration" not in d["kind"]]
        cleanup = built.with_name("created.yaml")
        cleanup.write_text(yaml.safe_dump_all(leftovers))
        control_plane.kubectl("delete", "-f", str(cleanup), "--ignore-not-found", "--wait=false")


# ------------------------------------------------------------------------ on the apiserver


@pytest.mark.parametrize("overlay", ["default", "kind"])
def test_server_side_dry_run_accepts_the_overlay(
    control_plane: ControlPlane, namespaces: list[str], overlay: str
) -> None:
    result = control_plane.kubectl(
        "apply", "--dry-run=server", "-k", str(MANIFESTS / overlay), check=False
    )
    assert result.returncode == 0, result.stderr
    names = {line.split()[0].split("/", 1)[1] for line in result.stdout.splitlines()}
    assert {d["metadata"]["name"] for d in build(control_plane, overlay)} <= names


def test_server_side_dry_run_accepts_the_samples(
    control_plane: ControlPlane, crds: list[str]
) -> None:
    files = ("clustercache.yaml", "clusterstoragecontainer.yaml")
    for args in (("-k", "samples"), *(("-f", f"samples/{f}") for f in files)):
        path = str(MANIFESTS / args[1])
        result = control_plane.kubectl("apply", "--dry-run=server", args[0], path, check=False)
        assert result.returncode == 0, result.stderr
        assert "(server dry run)" in result.stdout


def test_a_real_apply_creates_every_object(deployed: Deployed) -> None:
    assert {_ident(d) for d in deployed.docs} <= deployed.found
    assert "failed calling webhook" in deployed.webhook_rejection


def _decided(
    control_plane: ControlPlane, sa: str, table: dict[str, list[A]], *, allowed: bool
) -> list[str]:
    """The accesses of `table[sa]` that the apiserver decides as `allowed`."""
    return [
        what
        for access in table[sa]
        for what, review in _reviews(sa, access)
        if _allowed(control_plane, review) is allowed
    ]


@pytest.mark.parametrize("sa", [CONTROLLER, AGENT])
def test_the_service_account_may_do_everything_its_code_does(
    control_plane: ControlPlane, deployed: Deployed, sa: str
) -> None:
    denied = _decided(control_plane, sa, ACCESS, allowed=False)
    assert denied == []


@pytest.mark.parametrize("sa", [CONTROLLER, AGENT])
def test_the_service_account_may_not_do_anything_else(
    control_plane: ControlPlane, deployed: Deployed, sa: str
) -> None:
    allowed = _decided(control_plane, sa, DENIED, allowed=True)
    assert allowed == []


def test_real_requests_with_the_service_accounts_credentials(
    control_plane: ControlPlane, deployed: Deployed
) -> None:
    controller = control_plane.service_account_credentials(NS, CONTROLLER)
    agent = control_plane.service_account_credentials(NS, AGENT)
    configmap = f"/api/v1/namespaces/{NS}/configmaps/{CONFIGMAP}"
    secrets = f"/api/v1/namespaces/{NS}/secrets"
    assert control_plane.rest("GET", configmap, creds=controller)[0] == 200
    assert control_plane.rest("GET", configmap, creds=agent)[0] == 200
    assert control_plane.rest("GET", secrets, creds=controller)[0] == 403
    assert control_plane.rest("DELETE", f"{LMC}/any-cache", creds=agent)[0] == 403
    assert control_plane.rest("GET", LMC, creds=agent)[0] == 200  # modelSize, for progress %
    assert control_plane.rest("GET", LMC, creds=controller)[0] == 200


def _rules(docs: list[Doc], sa: str) -> list[Doc]:
    bound = {
        (d["roleRef"]["kind"], d["roleRef"]["name"], d["metadata"].get("namespace", ""))
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s["name"] == sa and s["namespace"] == NS for s in d["subjects"])
    }
    return [
        rule
        for d in docs
        if (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) in bound
        for rule in d["rules"]
    ]


@pytest.mark.parametrize("sa", [CONTROLLER, AGENT])
def test_no_rule_grants_more_than_the_table(control_plane: ControlPlane, sa: str) -> None:
    docs = build(control_plane, "default")
    table = {(*a.parts(), verb, a.name) for a in ACCESS[sa] for verb in a.verbs.split()}
    rules = _rules(docs, sa)
    assert rules, f"no role is bound to {sa}"
    extra = []
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                plural, _, sub = resource.partition("/")
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames", [""]):
                        if (group, plural, sub, verb, name) not in table:
                            extra.append(f"{verb} {resource}.{group} {name}")
    assert extra == []
