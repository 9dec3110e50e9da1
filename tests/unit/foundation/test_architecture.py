"""Layer boundaries of design.md, checked on every module's imports (parsed, not executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "localcache"
DOMAIN = ("api", "caching", "controllers", "agent", "webhooks")
ISOLATED = ("controllers", "agent", "webhooks")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _violations(rule: str) -> list[str]:
    bad: list[str] = []
    for path in _modules():
        rel = _rel(path)
        for name in _imports(path):
            if rule == "kubernetes_asyncio" and name.split(".")[0] == "kubernetes_asyncio":
                if rel != "localcache/runtime/kube.py":
                    bad.append(f"{rel} imports {name}")
            elif rule == "prometheus_client" and name.split(".")[0] == "prometheus_client":
                if rel != "localcache/runtime/metrics.py":
                    bad.append(f"{rel} imports {name}")
            elif rule == "runtime" and rel.startswith("localcache/runtime/"):
                if "/testing/" in rel:
                    continue
                parts = name.split(".")
                if parts[0] == "localcache" and len(parts) > 1 and parts[1] in DOMAIN:
                    bad.append(f"{rel} imports domain module {name}")
            elif rule == "isolated":
                own = rel.split("/")[1]
                parts = name.split(".")
                if (
                    own in ISOLATED
                    and parts[0] == "localcache"
                    and len(parts) > 1
                    and parts[1] in ISOLATED
                    and parts[1] != own
                ):
                    bad.append(f"{rel} imports {name}")
    return sorted(set(bad))


@pytest.mark.parametrize("rule", ["kubernetes_asyncio", "prometheus_client", "runtime", "isolated"])
def test_layer_boundary_holds(rule: str) -> None:
    assert _violations(rule) == []


def test_the_boundary_check_sees_the_package() -> None:
    assert any(_rel(p) == "localcache/runtime/keys.py" for p in _modules())
