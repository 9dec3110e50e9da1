"""Layer boundaries of design.md, checked on every module's imports (parsed, not executed)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "localcache"
DOMAIN = ("api", "caching", "controllers", "agent", "webhooks")
ISOLATED = ("controllers", "agent", "webhooks")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, relative to the repository: localcache/app.py
    name: str  # what it imports, dotted: localcache.runtime.kube
    top_level: bool  # at module level (not inside a function or method)

    @property
    def parts(self) -> list[str]:
        return self.name.split(".")

    def of(self, package: str) -> bool:
        return self.name == package or self.name.startswith(package + ".")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _names(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _imports_in(source: str, module: str) -> Iterator[Import]:
    def visit(node: ast.AST, top_level: bool) -> Iterator[Import]:
        for name in _names(node):
            yield Import(module, name, top_level)
        inside = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            yield from visit(child, top_level and not inside)

    yield from visit(ast.parse(source, filename=module), True)


def _imports(path: Path) -> Iterator[Import]:
    return _imports_in(path.read_text(), _rel(path))


def _kubernetes_asyncio(i: Import) -> bool:
    return i.parts[0] == "kubernetes_asyncio" and i.module != "localcache/runtime/kube.py"


def _prometheus_client(i: Import) -> bool:
    return i.parts[0] == "prometheus_client" and i.module != "localcache/runtime/metrics.py"


#: Where aiohttp may be imported: the framework's serving side and its transport, the
#: download program (`localcache download`, inside Jobs), and the agent's peer server (the
#: data plane's serving side, design.md; its handlers are the HTTP surface itself) with its
#: proof checker (the presigned HEADs it runs at the origin, and the proof's body).
AIOHTTP_HOMES = (
    "localcache/runtime/serving/",
    "localcache/runtime/transport.py",
    "localcache/download/",
    "localcache/agent/peer/server.py",
    "localcache/agent/peer/proofs.py",
)


def _aiohttp(i: Import) -> bool:
    """HTTP serving and client code stays in its homes; the domain speaks through them."""
    return i.parts[0] == "aiohttp" and not i.module.startswith(AIOHTTP_HOMES)


def _runtime(i: Import) -> bool:
    """The framework knows no domain package and no development environment."""
    return i.module.startswith("localcache/runtime/") and (
        (i.parts[0] == "localcache" and len(i.parts) > 1 and i.parts[1] in DOMAIN)
        or i.of("localcache.devenv")
    )


def _isolated(i: Import) -> bool:
    own = i.module.split("/")[1]
    return (
        own in ISOLATED
        and i.parts[0] == "localcache"
        and len(i.parts) > 1
        and i.parts[1] in ISOLATED
        and i.parts[1] != own
    )


def _tests(i: Import) -> bool:
    """Nothing under localcache/ imports the test suite."""
    return i.parts[0] == "tests"


def _devenv(i: Import) -> bool:
    """Only cli.py imports the development environment, and only inside a function (the
    image and the wheel leave it out)."""
    if not i.of("localcache.devenv") or i.module.startswith("localcache/devenv/"):
        return False
    return i.module != "localcache/cli.py" or i.top_level


def _devenv_needs_no_pytest(i: Import) -> bool:
    """`localcache run` reaches devenv: it must not need the test tools."""
    return i.module.startswith("localcache/devenv/") and i.parts[0] in ("pytest", "boto3", "moto")


def _settings(i: Import) -> bool:
    """The flag table imports no domain package."""
    return (
        i.module == "localcache/settings.py"
        and i.parts[0] == "localcache"
        and len(i.parts) > 1
        and i.parts[1] in DOMAIN
    )


#: What the download program (`localcache download`, inside download Jobs) may import from
#: localcache: itself, the durable writes it shares with the agent, leaf modules, and the peer
#: wire models `localcache fetch` speaks (`api.peer`, on `api.meta` and `api.quantity`), and
#: where the storage initializer puts an origin's files (`api.originpaths`, on `api.peer`).
DOWNLOAD_NEEDS = (
    "localcache.download",
    "localcache.runtime.durable",
    "localcache.runtime.fstree",
    "localcache.runtime.clock",
    "localcache.runtime.errors",
    "localcache.api.quantity",
    "localcache.api.peer",
    "localcache.api.originpaths",
    "localcache.api.meta",
)


def _download(i: Import) -> bool:
    """A download Job's pod needs no agent, controller, webhook or devenv: `download/` imports
    only what `DOWNLOAD_NEEDS` lists (and the packages on the way to it)."""
    if not i.module.startswith("localcache/download/") or i.parts[0] != "localcache":
        return False
    return not any(i.of(needed) or needed.startswith(i.name + ".") for needed in DOWNLOAD_NEEDS)


RULES: dict[str, Callable[[Import], bool]] = {
    "kubernetes_asyncio": _kubernetes_asyncio,
    "prometheus_client": _prometheus_client,
    "aiohttp": _aiohttp,
    "runtime": _runtime,
    "isolated": _isolated,
    "tests": _tests,
    "devenv": _devenv,
    "devenv_needs_no_pytest": _devenv_needs_no_pytest,
    "settings": _settings,
    "download": _download,
}


def _violations(rule: str) -> list[str]:
    broken = RULES[rule]
    bad = (i for path in _modules() for i in _imports(path) if broken(i))
    return sorted({f"{i.module} imports {i.name}" for i in bad})


@pytest.mark.parametrize("rule", sorted(RULES))
def test_layer_boundary_holds(rule: str) -> None:
    assert _violations(rule) == []


def test_the_boundary_check_sees_the_package() -> None:
    assert any(_rel(p) == "localcache/runtime/keys.py" for p in _modules())


@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        ("localcache/app.py", "from localcache.devenv import local", "devenv"),
        ("localcache/cli.py", "from localcache.devenv import local", "devenv"),
        ("localcache/agent/x.py", "import tests.support.plugin", "tests"),
        ("localcache/runtime/x.py", "from localcache.devenv import waiting", "runtime"),
        ("localcache/settings.py", "from localcache.agent import roots", "settings"),
        ("localcache/devenv/x.py", "import pytest", "devenv_needs_no_pytest"),
        ("localcache/download/x.py", "from localcache.agent.disk import tree", "download"),
        ("localcache/download/x.py", "from localcache.runtime import kube", "download"),
        ("localcache/webhooks/isvc.py", "from aiohttp import web", "aiohttp"),
        ("localcache/runtime/informer.py", "import aiohttp", "aiohttp"),
        ("localcache/runtime/informer.py", "import prometheus_client", "prometheus_client"),
        ("localcache/runtime/apiverbs.py", "import kubernetes_asyncio", "kubernetes_asyncio"),
    ],
)
def test_each_rule_catches_what_it_forbids(module: str, source: str, rule: str) -> None:
    assert any(RULES[rule](i) for i in _imports_in(source, module))


@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        ("localcache/runtime/metrics.py", "import prometheus_client", "prometheus_client"),
        ("localcache/runtime/serving/tls.py", "from aiohttp import web", "aiohttp"),
        ("localcache/runtime/transport.py", "import aiohttp", "aiohttp"),
        ("localcache/download/fetch.py", "import aiohttp", "aiohttp"),
    ],
)
def test_each_rule_allows_its_homes(module: str, source: str, rule: str) -> None:
    assert not any(RULES[rule](i) for i in _imports_in(source, module))


def test_a_lazy_devenv_import_in_cli_is_allowed() -> None:
    source = "def run() -> None:\n    from localcache.devenv import local\n"
    imports = list(_imports_in(source, "localcache/cli.py"))
    assert imports
    assert not any(_devenv(i) for i in imports)


def test_the_download_program_may_import_what_it_needs() -> None:
    source = (
        "from localcache.runtime import durable\n"
        "from localcache.runtime import clock as clock_mod\n"
        "from localcache.api import quantity\n"
        "from localcache.download import http\n"
    )
    imports = list(_imports_in(source, "localcache/download/program.py"))
    assert imports
    assert not any(_download(i) for i in imports)


MAX_MODULE_LINES = 400
GENERATED = PACKAGE / "csi" / "proto"  # hack/gen-csi-protos.sh


def test_no_module_of_the_package_is_over_400_lines() -> None:
    """One job a module (issue 19): a module that outgrows this is split, not stretched."""
    long = {
        _rel(path): lines
        for path in _modules()
        if GENERATED not in path.parents
        and (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
