"""The peer data plane's TLS bundle: the controller issues and renews it in one Secret.

Every agent's peer server serves one certificate whose DNS SAN is `peer.SERVER_NAME`
(`localcache-peer`), signed by a CA localcache makes itself; peer-mode download pods verify
the chain against `ca.crt` and that name, never the pod IP. The bundle lives in Secret
`SECRET_NAME` (`localcache-peer-tls`, keys `ca.crt`, `tls.crt`, `tls.key`, and `ca.key` for
renewals) in the operator namespace, which the agent DaemonSet mounts read-only (optional, so
agents start before it exists; the kubelet fills and refreshes the mount).

`setup` registers a `runtime.serving.secretbundle.SecretBundleManager` on the controller's
Manager, behind the lease (one writer; any replica that wins it takes over): it creates the
Secret at once, whether or not agents run yet, re-checks it every hour, renews the serving
certificate 30 days before expiry keeping the CA (certgen's rule: the CA is replaced only near
its own expiry, the old one staying in `ca.crt` while valid), and backs off on API errors.
It needs get, create and update of that one Secret (manifests/base/controller-rbac.yaml).
"""

from __future__ import annotations

from typing import Final

from localcache.api import peer
from localcache.runtime import kube, manager
from localcache.runtime.serving import kubecerts, secretbundle

SECRET_NAME: Final = "localcache-peer-tls"
COMPONENT: Final = "peer"
RUNNABLE: Final = "peer-tls"


def spec(namespace: str) -> secretbundle.BundleSpec:
    """The peer bundle's Secret in `namespace` and what its certificate covers."""
    return secretbundle.BundleSpec(
        namespace=namespace,
        secret_name=SECRET_NAME,
        names=(peer.SERVER_NAME,),
        component=COMPONENT,
    )


def setup(
    mgr: manager.Manager, *, kube_api: kube.Kube, namespace: str
) -> secretbundle.SecretBundleManager:
    """Register the peer TLS bundle's manager on `mgr` (module docstring); returns it."""
    bundles = secretbundle.SecretBundleManager(kubecerts.KubeCertStore(kube_api), spec(namespace))
    mgr.add_runnable(RUNNABLE, bundles, needs_leader=True)
    return bundles
