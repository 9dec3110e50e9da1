"""The download container's environment and resources from `spec.download` (`api.download`):
which names may be set, by whom, and how the layers merge. Pure, no I/O.

Layers, later wins: the container template (a ClusterStorageContainer's, else
`storageInitializer`'s image and resources), then `HF_DEFAULTS` for each name the template
does not set (the Hugging Face variables KServe's pod mutator gives storage-initializer
containers, `AddDefaultHuggingFaceEnvVars`), then the node group's `spec.download`, then the
cache's (`apply`). A variable replaces the earlier one of the same name; each resource amount
(memory or cpu of requests or limits) replaces the earlier one. The credentials localcache injects
come after all of them and are never replaced: a layer's variable whose name is `reserved`
(or one the injection sets) is dropped, and the validating webhook refuses caches that set
one (`violations`), naming the field.

Who may set what (`violations`):
- any writer: no `reserved` name (what localcache sets for credentials: `AWS_*`, `S3_*`,
  `AZURE_*`, `AZ_*`, `HDFS_*`, `GIT_*`, `HF_TOKEN`, `STORAGE_CONFIG`, `<host>-headers`, ...),
  exactly one of `value` and `valueFrom` (with exactly one reference), no name twice;
- a namespace cache (a tenant's): only `TENANT_NAMES` (download tuning: `HF_HUB_DISABLE_XET`,
  `HF_XET_*`, timeouts). Its download may be one that needs no credentials, whose folder every
  cache of the URI then reuses: a variable that redirects the download (`HF_ENDPOINT`, a
  proxy, a CA bundle) would let one tenant choose what everyone is served. For the same
  reason a node group's references apply only to cluster caches' Jobs: in a namespace cache's
  Job only its literal values apply (`literal_layer`), since a reference would resolve in the
  tenant's namespace.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

from localcache.api import download

Obj = dict[str, Any]

HF_DEFAULTS: Final = (
    ("HF_HUB_ENABLE_HF_TRANSFER", "1"),
    ("HF_XET_HIGH_PERFORMANCE", "1"),
    ("HF_XET_NUM_CONCURRENT_RANGE_GETS", "8"),
)
"""KServe v0.20 `pkg/utils/storage.go` `AddDefaultHuggingFaceEnvVars`."""

_RESERVED_PREFIXES: Final = ("AWS_", "S3_", "AZURE_", "AZ_", "HDFS_", "GIT_", "KERBEROS_")
_RESERVED_NAMES: Final = frozenset(
    {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "MODELSCOPE_API_TOKEN",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "STORAGE_CONFIG",
        "STORAGE_OVERRIDE_CONFIG",
        "AWSANONYMOUSCREDENTIAL",
        "HOME",
    }
)
TENANT_NAMES: Final = re.compile(
    r"HF_HUB_DISABLE_XET|HF_HUB_ENABLE_HF_TRANSFER|HF_HUB_DOWNLOAD_TIMEOUT|HF_HUB_ETAG_TIMEOUT"
    r"|HF_HUB_DISABLE_PROGRESS_BARS|HF_XET_[A-Z0-9_]+"
)


def reserved(name: str) -> bool:
    """Whether `name` is one localcache sets for credentials (or HOME for the agent's uid)."""
    upper = name.upper()
    return (
        upper in _RESERVED_NAMES
        or upper.startswith(_RESERVED_PREFIXES)
        or upper.endswith(("-HEADERS", "_HEADERS"))
    )


def violations(
    spec: download.DownloadSpec | None, *, field: str, tenant: bool
) -> list[tuple[str, str]]:
    """`(field.env[i]..., why)` for each variable `spec` may not set (module docstring);
    `tenant` for a namespace cache."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, var in enumerate((spec.env if spec else None) or []):
        where = f"{field}.env[{i}]"
        if reserved(var.name):
            out.append((f"{where}.name", f"{var.name} is set by localcache for credentials"))
        elif tenant and not TENANT_NAMES.fullmatch(var.name):
            allowed = TENANT_NAMES.pattern.replace("|", ", ")
            out.append(
                (
                    f"{where}.name",
                    f"a namespace cache may set only download tuning variables ({allowed}), "
                    f"not {var.name}",
                )
            )
        if var.name in seen:
            out.append((f"{where}.name", f"{var.name} is set twice"))
        seen.add(var.name)
        refs = var.value_from and [
            r for r in (var.value_from.secret_key_ref, var.value_from.config_map_key_ref) if r
        ]
        if (var.value is None) == (var.value_from is None) or (
            var.value_from is not None and len(refs or []) != 1
        ):
            out.append(
                (where, "exactly one of value and valueFrom (with one of secretKeyRef, "
                 "configMapKeyRef)")
            )  # fmt: skip
    return out


def apply(
    container: Obj,
    layers: Sequence[download.DownloadSpec | None],
    *,
    injected: Iterable[str] = (),
) -> Obj:
    """`container` (a copy) with `HF_DEFAULTS` and the `layers` (node group's, then cache's)
    applied; variables named `reserved` or in `injected` are dropped, never applied."""
    out = copy.deepcopy(container)
    env: list[Obj] = list(out.get("env") or [])
    taken = {str(e.get("name")) for e in env}
    env += [{"name": n, "value": v} for n, v in HF_DEFAULTS if n not in taken]
    banned = set(injected)
    resources: Obj = out.get("resources") or {}
    for layer in layers:
        if layer is None:
            continue
        for var in layer.env or []:
            if reserved(var.name) or var.name in banned:
                continue
            env = [e for e in env if e.get("name") != var.name] + [var.to_dict()]
        for kind in ("requests", "limits"):
            amounts = getattr(layer.resources, kind) if layer.resources else None
            if amounts is None:
                continue
            given = {k: v for k, v in amounts.to_dict().items() if k in ("memory", "cpu")}
            resources = {**resources, kind: {**(resources.get(kind) or {}), **given}}
    out["env"] = env
    if resources:
        out["resources"] = resources
    return out


def tenant_layer(spec: download.DownloadSpec | None) -> download.DownloadSpec | None:
    """A namespace cache's `spec.download` with only the variables a tenant may set
    (`TENANT_NAMES`): what the agent applies even where no webhook checked it."""
    if spec is None or not spec.env:
        return spec
    kept = [v for v in spec.env if TENANT_NAMES.fullmatch(v.name) and not reserved(v.name)]
    return spec.model_copy(update={"env": kept})


def literal_layer(spec: download.DownloadSpec | None) -> download.DownloadSpec | None:
    """A node group's `spec.download` for a namespace cache's Job: its literal variables only.
    A reference would resolve in the tenant's namespace, where the tenant chooses its value."""
    if spec is None or not spec.env:
        return spec
    return spec.model_copy(update={"env": [v for v in spec.env if v.value_from is None]})
