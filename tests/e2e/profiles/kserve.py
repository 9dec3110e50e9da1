"""KServe v0.20.0's own objects, read from its Go module (no stand-ins): the CRDs as its charts
ship them, its `inferenceservice-config` and the YAML of its docs/samples/localmodelcache.

The module and the ConfigMap come from `tests.support.kserve_addon` (the migration tests'
too); the CRDs here are the files of `config/crd/full` as KServe's CRD charts ship them.

`module_dir()` runs `go mod download` (the Go module proxy, or the module cache offline) and
skips, saying so, where Go or the module is unavailable (a failure under
LOCALCACHE_REQUIRE_REAL_NODES=1).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import kserve_addon

VERSION = "v0.20.0"
MODULE = "github.com/kserve/kserve"
NAMESPACE = "kserve"
CONFIG_MAP = "inferenceservice-config"
# KServe's CRDs as `kserve-crd` and `kserve-localmodel-crd` install them (the same files as
# config/crd/full); the LLM ones are left out: their conversion webhook needs KServe running.
CRD_DIRS = ("config/crd/full", "config/crd/full/clusterstoragecontainer",
            "config/crd/full/localmodel")  # fmt: skip
SAMPLE_README = "docs/samples/localmodelcache/README.md"
COMPLETE_SETUP = "Example: Complete HuggingFace Model Caching Setup"
_YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
_CREATE_NAMESPACE = re.compile(r"^kubectl create namespace (\S+)$", re.MULTILINE)

Obj = dict[str, Any]


def module_dir() -> Path:
    """The unpacked KServe module (read only); skips (fails in CI) where it is unavailable."""
    try:
        return kserve_addon.module_dir(VERSION)
    except (OSError, kserve_addon.AddonError) as exc:
        _unavailable(str(exc))
        raise


def _unavailable(reason: str) -> None:
    if os.environ.get("LOCALCACHE_REQUIRE_REAL_NODES") == "1":
        pytest.fail(f"KServe's module is required here: {reason}")
    pytest.skip(reason)


def crd_documents() -> list[Obj]:
    """KServe's CRDs, as shipped."""
    root = module_dir()
    docs: list[Obj] = []
    for folder in CRD_DIRS:
        for path in sorted((root / folder).glob("serving.kserve.io_*.yaml")):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def crd_names() -> list[str]:
    return [d["metadata"]["name"] for d in crd_documents()]


def inferenceservice_config(storage_initializer_image: str) -> Obj:
    """KServe's `kserve/inferenceservice-config`, only the storage initializer image and
    `localModel.enabled` changed (`kserve_addon.inferenceservice_config`)."""
    module_dir()
    return kserve_addon.inferenceservice_config(storage_initializer_image, version=VERSION)


def _sample_text(section: str) -> str:
    text = (module_dir() / SAMPLE_README).read_text()
    if not section:
        return text
    (part,) = [p for p in re.split(r"^## ", text, flags=re.MULTILINE) if p.startswith(section)]
    return part


def sample_namespaces(section: str = "") -> list[str]:
    """The namespaces the sample's shell steps create (`kubectl create namespace X`)."""
    return _CREATE_NAMESPACE.findall(_sample_text(section))


def sample_documents(section: str = "") -> list[Obj]:
    """The YAML blocks of KServe's docs/samples/localmodelcache README, in order: all of
    them, or those of the `## ` section whose title starts with `section`."""
    text = _sample_text(section)
    docs: list[Obj] = []
    for block in _YAML_BLOCK.findall(text):
        loaded = [d for d in yaml.safe_load_all(block) if d]
        docs += [d for d in loaded if isinstance(d, dict) and "kind" in d]
    return docs
