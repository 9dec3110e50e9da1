"""`certs.CertStore` over the Kube client: the Secrets that hold serving certificates and the
webhook configurations whose `caBundle` they are written into."""

from __future__ import annotations

from typing import Any

from localcache.runtime import kube


class KubeCertStore:
    """`certs.CertStore` over the Kube client: Secrets and webhook configurations."""

    def __init__(self, client: kube.Kube) -> None:
        self._kube = client

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._kube.get(kube.SECRETS, name, namespace=namespace)

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._kube.create(kube.SECRETS, body, namespace=namespace)

    async def replace_secret(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        del name  # the body's metadata names the Secret
        return await self._kube.replace(kube.SECRETS, body, namespace=namespace)

    async def get_webhook_configuration(self, kind: str, name: str) -> dict[str, Any]:
        return await self._kube.get(_webhook_resource(kind), name)

    async def patch_webhook_configuration(
        self, kind: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await self._kube.patch(_webhook_resource(kind), name, ops, patch_type="json")


def _webhook_resource(kind: str) -> kube.Resource:
    if kind == "mutating":
        return kube.MUTATING_WEBHOOK_CONFIGURATIONS
    return kube.VALIDATING_WEBHOOK_CONFIGURATIONS
