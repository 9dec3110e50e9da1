"""The peer data plane's install on real nodes: every agent pod holds the peer TLS bundle the
controller issued, without the CA key, also when the controller issues it after the agents
started (the optional Secret mount is filled by the kubelet, no agent restart)."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography import x509

from localcache.api import peer
from localcache.controllers import peertls
from tests.e2e.realnodes.cluster import Cluster

pytestmark = pytest.mark.timeout(600)
NS = "kserve"
CONTROLLER = "deployment/kserve-localmodel-controller-manager"
MOUNT = "/var/run/localcache/peer-tls"
READ = (
    "import json, os; d = '" + MOUNT + "'; print(json.dumps({'names': sorted(n for n in "
    "os.listdir(d) if not n.startswith('..')), 'files': {n: open(os.path.join(d, n)).read() "
    "for n in ('ca.crt', 'tls.crt', 'tls.key') if os.path.exists(os.path.join(d, n))}}))"
)


def _secret_data(cluster: Cluster) -> dict[str, str] | None:
    secret = cluster.get("secret", peertls.SECRET_NAME, namespace=NS)
    if not secret:
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def _mounted(cluster: Cluster, pod: str) -> dict[str, object]:
    done = cluster.kubectl(
        "exec", "-n", NS, pod, "-c", "manager", "--", "python3", "-c", READ, check=False
    )
    if done.returncode != 0:
        return {}
    loaded = json.loads(done.stdout)
    assert isinstance(loaded, dict)
    return loaded


def _agents(cluster: Cluster) -> list[str]:
    pods = cluster.items("pods", namespace=NS, selector="app.kubernetes.io/component=agent")
    return [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("podIP")]


def _all_hold(cluster: Cluster, data: dict[str, str]) -> list[str] | None:
    agents = _agents(cluster)
    want = {k: data[k] for k in ("ca.crt", "tls.crt", "tls.key")}
    if agents and all(_mounted(cluster, pod).get("files") == want for pod in agents):
        return agents
    return None


def test_agents_mount_the_peer_bundle_the_controller_issues_before_or_after_them(
    cluster: Cluster,
) -> None:
    data = cluster.wait(
        lambda: _secret_data(cluster),
        timeout=120,
        what=f"the controller issued Secret {NS}/{peertls.SECRET_NAME}",
    )
    cert = x509.load_pem_x509_certificate(data["tls.crt"].encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [peer.SERVER_NAME]
    agents = cluster.wait(
        lambda: _all_hold(cluster, data),
        timeout=180,
        what="every agent pod holds the issued bundle at " + MOUNT,
    )
    names = _mounted(cluster, agents[0])["names"]
    assert names == ["ca.crt", "tls.crt", "tls.key"], f"the agent's mount holds {names}"
    # The controller issues it after the agents started: the Secret goes, the controller
    # restarts (it settles the Secret on start), the running agents' mounts follow.
    uids = {p: (cluster.get("pod", p, namespace=NS) or {})["metadata"]["uid"] for p in agents}
    cluster.kubectl("delete", "secret", "-n", NS, peertls.SECRET_NAME)
    cluster.kubectl("rollout", "restart", "-n", NS, CONTROLLER)
    cluster.kubectl("rollout", "status", "-n", NS, CONTROLLER, "--timeout=240s", timeout=260)

    def reissued() -> dict[str, str] | None:
        found = _secret_data(cluster)
        return found if found and found["tls.crt"] != data["tls.crt"] else None

    fresh = cluster.wait(
        reissued, timeout=120, what="the restarted controller issued a new peer bundle"
    )
    cluster.wait(
        lambda: _all_hold(cluster, fresh),
        timeout=240,
        what="the running agents' mounts hold the new bundle without a restart",
    )
    after = {p: (cluster.get("pod", p, namespace=NS) or {}).get("metadata", {}).get("uid")
             for p in agents}  # fmt: skip
    assert after == uids, "an agent pod was replaced"
