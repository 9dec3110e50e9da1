"""Wiring of the shipped manifests that only shows at run time, checked on the kustomize builds.

The Services select the right pods and ports (webhook: controller only; metrics: both, with
the Prometheus annotations), the ServiceMonitor selects the metrics Service, the workloads
run non-root on a read-only root with /tmp writable, their command lines parse with
localcache's own settings parser (ports, probes, leader election, cert dir, models root agree
with the manifests), and the ConfigMap parses to KServe's defaults with
`localModel.enabled: true`, every key written out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pydantic
import pytest

from localcache import csi, settings
from localcache.api import peer
from localcache.caching import config
from localcache.controllers import peertls
from localcache.csi import command as csi_command
from localcache.devenv.controlplane import ControlPlane
from tests.integration.deploy.builds import AGENT, CONFIGMAP, CONTROLLER, NS, Doc, build, one

PEER_TLS_DIR = "/var/run/localcache/peer-tls"


def test_the_services_select_the_pods_and_their_ports(control_plane: ControlPlane) -> None:
    docs = build(control_plane, "default")
    pods = {
        name: one(docs, kind, name)["spec"]["template"]
        for kind, name in (("Deployment", CONTROLLER), ("DaemonSet", AGENT))
    }

    def ports(template: Doc) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}

    webhook = one(docs, "Service", "localmodel-webhook-server-service")
    assert webhook["spec"]["selector"].items() <= pods[CONTROLLER]["metadata"]["labels"].items()
    assert not webhook["spec"]["selector"].items() <= pods[AGENT]["metadata"]["labels"].items()
    assert ports(pods[CONTROLLER])["webhook-server"] == webhook["spec"]["ports"][0]["targetPort"]
    metrics = one(docs, "Service", "localcache-metrics")
    annotations = metrics["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    for template in pods.values():
        assert metrics["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        assert ports(template)["http-metrics"] == int(annotations["prometheus.io/port"])
    monitor = build(control_plane, "servicemonitor")[0]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == metrics["spec"]["ports"][0]["name"]


@pytest.mark.parametrize("name", [CONTROLLER, AGENT])
def test_the_pods_run_non_root_on_a_read_only_root(control_plane: ControlPlane, name: str) -> None:
    docs = build(control_plane, "kind")
    workload = next(d for d in docs if d["kind"] in ("Deployment", "DaemonSet")
                    and d["metadata"]["name"] == name)  # fmt: skip
    pod = workload["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "manager"]
    assert pod["serviceAccountName"] == name
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert {"requests", "limits"} <= container["resources"].keys()
    assert container["image"] == "localcache:dev"
    assert container["imagePullPolicy"] == "IfNotPresent"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    if name == AGENT:
        assert env["NODE_NAME"] == "spec.nodeName"
        assert pod["nodeSelector"] == {"kserve/localmodel": "worker"}
        assert volumes[mounts["/mnt/models"]]["hostPath"]["path"] == "/mnt/models"
    else:
        assert env["POD_NAMESPACE"] == "metadata.namespace"


@pytest.mark.parametrize("name", [CONTROLLER, AGENT])
def test_the_container_command_is_what_localcache_accepts(
    control_plane: ControlPlane, name: str
) -> None:
    docs = build(control_plane, "default")
    workload = next(d for d in docs if d["kind"] in ("Deployment", "DaemonSet")
                    and d["metadata"]["name"] == name)  # fmt: skip
    pod = workload["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "manager"]
    program, command = container["command"]
    assert program == "localcache"
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, command)
    downward = {"metadata.namespace": workload["metadata"]["namespace"],
                "metadata.name": "pod-1", "spec.nodeName": "node-1",
                "status.podIP": "10.0.0.1"}  # fmt: skip
    environ = {
        e["name"]: downward[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"]
    }
    parsed = settings.from_args(parser.parse_args(container["args"]), command, environ)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert parsed.serving.metrics_port == ports["http-metrics"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http-metrics"}
    assert parsed.config.namespace == NS
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    if command == "controller":
        assert (parsed.leadership.elect, parsed.leadership.identity) == (True, "pod-1")
        (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
        assert parsed.controller.agent_daemonset == agent["metadata"]["name"]
        assert parsed.webhook.port == ports["webhook-server"]
        assert any(parsed.webhook.cert_dir.is_relative_to(m) for m in writable)
    else:
        assert parsed.agent.node_name == "node-1"
        assert str(parsed.agent.models_root) in writable
        # the peer data plane: port, image of peer-mode Jobs, pod IP, the mounted TLS bundle
        assert parsed.agent.peer_port == ports["peer"] == peer.DEFAULT_PORT
        assert parsed.agent.peer_image == container["image"]
        assert parsed.agent.pod_ip == "10.0.0.1"  # POD_IP from status.podIP
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "peer-tls"]
        assert mount == {"name": "peer-tls", "mountPath": PEER_TLS_DIR, "readOnly": True}
        (volume,) = [v for v in pod["volumes"] if v["name"] == "peer-tls"]
        secret = volume["secret"]
        assert (secret["secretName"], secret["optional"]) == (peertls.SECRET_NAME, True)
        # the CA key stays out of the agents' mount
        assert [i["key"] for i in secret["items"]] == ["ca.crt", "tls.crt", "tls.key"]
        assert all(i["key"] == i["path"] for i in secret["items"])


@pytest.mark.parametrize("overlay", ["default", "kind", "testbed"])
def test_peer_mode_jobs_run_the_agents_own_image_in_every_overlay(
    control_plane: ControlPlane, overlay: str
) -> None:
    """--peer-image and the agent ServiceAccount's annotation follow `images:` (the overlays'
    replacements), so peer-mode Jobs run the image the admission policy admits: the agent's own."""
    agent = one(build(control_plane, overlay), "DaemonSet", AGENT)
    (manager,) = [c for c in agent["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "manager"]  # fmt: skip
    assert f"--peer-image={manager['image']}" in manager["args"], manager["args"]
    account = one(build(control_plane, overlay), "ServiceAccount", AGENT)
    annotations = account["metadata"]["annotations"]
    assert annotations["localcache.kserve.io/peer-image"] == manager["image"], annotations


def test_the_configmap_holds_kserve_defaults_with_local_models_enabled(
    control_plane: ControlPlane,
) -> None:
    data = one(build(control_plane, "default"), "ConfigMap", CONFIGMAP)["data"]
    shipped = config.parse_config(data)
    defaults = config.parse_config({})
    assert shipped.local_model.enabled is True
    assert (
        shipped.model_copy(
            update={"local_model": shipped.local_model.model_copy(update={"enabled": False})}
        )
        == defaults
    )

    # Every key is written out (not left to the code's defaults), as in KServe's ConfigMap.
    def aliases(model: type[pydantic.BaseModel]) -> set[str]:
        return {f.alias or n for n, f in model.model_fields.items()}

    credentials = json.loads(data[config.CREDENTIALS])
    assert json.loads(data[config.LOCAL_MODEL]).keys() == aliases(config.LocalModelConfig)
    assert credentials.keys() == aliases(config.CredentialsConfig)
    assert credentials["s3"].keys() == aliases(config.S3Config)
    assert json.loads(data[config.STORAGE_INITIALIZER]).keys() == {
        "image",
        "cpuRequest",
        "cpuLimit",
        "memoryRequest",
        "memoryLimit",
        "caBundleConfigMapName",
        "caBundleVolumeMountPath",
    }  # fmt: skip  (the keys download Jobs use; the rest concern KServe's pod mutator)


def test_the_test_bed_overlay_changes_only_image_references(control_plane: ControlPlane) -> None:
    """The real-node e2e tests deploy the shipped manifests: manifests/testbed may change the
    project image and the storage initializer's image, nothing else."""
    shipped, testbed = build(control_plane, "default"), build(control_plane, "testbed")
    images: list[str] = []

    def strip_images(node: object) -> object:
        if isinstance(node, dict):
            out: dict[str, object] = {}
            for key, value in node.items():
                if key in ("image", "localcache.kserve.io/peer-image") and isinstance(
                    value, str
                ):  # not a CRD schema property
                    images.append(value)
                    out[key] = "<image>"
                elif key == "args" and isinstance(value, list):
                    out[key] = [
                        "--peer-image=<image>" if str(a).startswith("--peer-image=") else a
                        for a in value
                    ]
                else:
                    out[key] = strip_images(value)
            return out
        if isinstance(node, list):
            return [strip_images(v) for v in node]
        return node

    def normalise(doc: Doc) -> object:
        doc = json.loads(json.dumps(doc))
        if doc["kind"] == "ConfigMap" and "storageInitializer" in doc.get("data", {}):
            init = json.loads(doc["data"]["storageInitializer"])
            images.append(init.pop("image"))
            doc["data"]["storageInitializer"] = init
        return strip_images(doc)

    assert [normalise(d) for d in testbed] == [normalise(d) for d in shipped]
    changed = {i for i in images if i.startswith("localhost/localcache/")}
    assert changed == {
        "localhost/localcache/localcache:testbed",
        "localhost/localcache/storage-initializer:testbed",
    }


def test_the_csi_node_plugin_is_the_one_privileged_container_and_publishes_to_the_kubelet(
    control_plane: ControlPlane,
) -> None:
    docs = build(control_plane, "default")
    (driver,) = [d for d in docs if d["kind"] == "CSIDriver"]
    assert driver["metadata"]["name"] == csi.DRIVER_NAME
    assert driver["spec"]["podInfoOnMount"] is True
    assert driver["spec"]["attachRequired"] is False
    assert driver["spec"]["fsGroupPolicy"] == "None"
    workload = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == AGENT)
    pod = workload["spec"]["template"]["spec"]
    privileged = [c["name"] for c in pod["containers"] if c["securityContext"].get("privileged")]
    assert privileged == ["csi-node"]
    (plugin,) = [c for c in pod["containers"] if c["name"] == "csi-node"]
    assert plugin["command"] == ["localcache", "csi-node"]
    parser = argparse.ArgumentParser()
    csi_command.add_arguments(parser)
    args = parser.parse_args(plugin["args"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in plugin["volumeMounts"]}
    pods = mounts["/var/lib/kubelet/pods"]
    assert pods["mountPropagation"] == "Bidirectional"
    assert volumes[pods["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pods"
    endpoint_dir = mounts[str(Path(args.endpoint).parent)]
    assert volumes[endpoint_dir["name"]]["hostPath"]["path"] == str(
        Path(args.kubelet_endpoint).parent
    )
    registration = mounts[str(Path(args.registration_socket).parent)]
    assert volumes[registration["name"]]["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"
    for host, inside in csi_command.parse_roots(args.models_root).items():
        assert volumes[mounts[str(inside)]["name"]]["hostPath"]["path"] == host
