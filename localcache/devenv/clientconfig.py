"""How the harness's clients authenticate to a local control plane: a user's client-certificate
files (`Credentials`) and the kubeconfig that names them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Credentials:
    """Paths of a user's client certificate, as written for kubeconfigs and `rest()`."""

    user: str
    cert_path: Path
    key_path: Path


def kubeconfig(server: str, ca_path: Path, creds: Credentials) -> dict[str, Any]:
    """A kubeconfig with one cluster (`server`, trusting `ca_path`) and one user (`creds`)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "localcache-test",
                "cluster": {"server": server, "certificate-authority": str(ca_path)},
            }
        ],
        "users": [
            {
                "name": creds.user,
                "user": {
                    "client-certificate": str(creds.cert_path),
                    "client-key": str(creds.key_path),
                },
            }
        ],
        "contexts": [
            {
                "name": "localcache-test",
                "context": {"cluster": "localcache-test", "user": creds.user},
            }
        ],
        "current-context": "localcache-test",
    }
