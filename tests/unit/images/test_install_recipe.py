"""The Dockerfile and the local recipe install the same packages at the same versions.

Both image builds run hack/install-localcache.sh: the Dockerfile's builder stage, and
hack/build-images.sh in a chroot. When the local image for the current sources is in the image
cache, its venv is checked against constraints.txt and its config against the Dockerfile, and
its packages are listed: no development environment (localcache.devenv) and no test tools.
"""

from __future__ import annotations

import email.parser
import json
import re
import subprocess
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = "hack/install-localcache.sh"
SITE_PACKAGES = re.compile(
    r"opt/localcache/lib/python3\.\d+/site-packages/([^/]+)\.dist-info/METADATA"
)
PACKAGE_INIT = re.compile(r"opt/localcache/lib/python3\.\d+/site-packages/(.+)/__init__\.py")
# Never in the image: the development environment and the test tools (botocore is shipped:
# `localcache fetch --prove-s3` needs it; boto3 is the test object store's).
NOT_SHIPPED = ("localcache.devenv", "tests", "pytest", "_pytest", "boto3", "moto")
# Put into every venv by `python3 -m venv` (ensurepip of the base Python), not by the recipe.
VENV_BOOTSTRAP = frozenset({"pip", "setuptools"})

Instruction = tuple[str, str]


def _normalise(name: str) -> str:
    """PEP 503."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _instructions(text: str) -> list[Instruction]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    found: list[Instruction] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1].strip() + " "
            continue
        keyword, _, args = (current + stripped).partition(" ")
        found.append((keyword.upper(), args.strip()))
        current = ""
    return found


def _stages(text: str) -> dict[str, list[Instruction]]:
    """Instructions by stage name ("AS name", else the stage's index); "final" is the last."""
    stages: list[tuple[str, list[Instruction]]] = []
    for keyword, args in _instructions(text):
        if keyword == "FROM":
            words = args.split()
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else ""
            stages.append((name or str(len(stages)), []))
        elif stages:
            stages[-1][1].append((keyword, args))
    named = dict(stages)
    named["final"] = stages[-1][1]
    return named


def _args(stage: list[Instruction], keyword: str) -> list[str]:
    return [args for kw, args in stage if kw == keyword]


def _shell_function(name: str) -> str:
    text = (ROOT / "hack" / "build-images.sh").read_text()
    match = re.search(rf"^{re.escape(name)}\(\) {{.*?^}}", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"hack/build-images.sh defines no function {name}"
    return match.group(0)


def test_dockerfile_builder_stage_installs_only_through_the_recipe() -> None:
    builder = _stages((ROOT / "Dockerfile").read_text())["builder"]
    assert any(SCRIPT in args for args in _args(builder, "COPY"))
    runs = _args(builder, "RUN")
    assert any(SCRIPT in run for run in runs)
    assert not any("pip" in run for run in runs), "pip runs outside the shared recipe"


def test_dockerfile_final_stage_holds_only_the_venv() -> None:
    final = _stages((ROOT / "Dockerfile").read_text())["final"]
    assert _args(final, "COPY") == ["--from=builder /opt/localcache /opt/localcache"]
    assert _args(final, "RUN") == []


def test_local_image_recipe_runs_the_same_script_on_the_same_sources() -> None:
    assert f"sh /src/{SCRIPT} /src" in _shell_function("build_localcache")
    sources = _shell_function("localcache_sources")
    for path in ("pyproject.toml", "constraints.txt", "README.md", SCRIPT, "find localcache"):
        assert path in sources


@dataclass(frozen=True)
class LocalImage:
    config: dict[str, Any]
    dist_versions: dict[str, str]  # PEP 503 name -> version, from the venv's *.dist-info
    python_packages: frozenset[str]  # import packages in site-packages, dotted: localcache.agent


def _local_image_tarball() -> Path | None:
    plan = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-images.sh"), "--plan", "localcache"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    tar = Path(json.loads(plan.stdout)["localcache"]["tar"])
    return tar if tar.is_file() else None


def _read_image(path: Path) -> LocalImage:
    headers = email.parser.HeaderParser()
    versions: dict[str, str] = {}
    packages: set[str] = set()
    with tarfile.open(path) as image:
        (manifest,) = json.load(_member(image, "manifest.json"))
        config = json.load(_member(image, manifest["Config"]))
        (layer_name,) = manifest["Layers"]
        with tarfile.open(fileobj=_member(image, layer_name), mode="r|gz") as layer:
            for entry in layer:
                package = PACKAGE_INIT.fullmatch(entry.name)
                if package is not None:
                    packages.add(package.group(1).replace("/", "."))
                if SITE_PACKAGES.fullmatch(entry.name):
                    f = layer.extractfile(entry)
                    assert f is not None
                    metadata = headers.parsestr(f.read().decode())
                    versions[_normalise(metadata["Name"])] = metadata["Version"]
    return LocalImage(
        config=config["config"], dist_versions=versions, python_packages=frozenset(packages)
    )


def _member(tar: tarfile.TarFile, name: str) -> Any:
    f = tar.extractfile(name)
    assert f is not None, name
    return f


@pytest.fixture(scope="module")
def local_image() -> LocalImage:
    path = _local_image_tarball()
    if path is None:
        pytest.skip("no localcache image for these sources in the cache: run hack/build-images.sh")
    return _read_image(path)


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_normalise(name)] = version.strip()
    return pins


def test_local_image_venv_holds_exactly_the_pinned_versions(local_image: LocalImage) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = dict(local_image.dist_versions)
    assert installed.pop("localcache", None) == pyproject["version"]
    pins = _pins()
    unpinned = {
        name: (version, pins.get(name))
        for name, version in installed.items()
        if name not in VENV_BOOTSTRAP and pins.get(name) != version
    }
    assert unpinned == {}
    for requirement in pyproject["dependencies"]:
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        assert _normalise(name) in installed, f"dependency {name} is not installed"


def test_local_image_runs_like_the_dockerfile_image(local_image: LocalImage) -> None:
    final = _stages((ROOT / "Dockerfile").read_text())["final"]
    config = local_image.config
    assert config["User"] == _args(final, "USER")[0]
    assert config["WorkingDir"] == _args(final, "WORKDIR")[0]
    assert config["Entrypoint"] == json.loads(_args(final, "ENTRYPOINT")[0])
    assert config["Cmd"] == json.loads(_args(final, "CMD")[0])
    env = dict(e.split("=", 1) for e in config["Env"])
    for assignment in " ".join(_args(final, "ENV")).split():
        key, _, value = assignment.partition("=")
        if key == "PATH":  # PATH=/opt/localcache/bin:$PATH
            assert env["PATH"].startswith(value.removesuffix("$PATH"))
        else:
            assert env[key] == value


def _shipped(packages: frozenset[str], name: str) -> bool:
    return any(p == name or p.startswith(name + ".") for p in packages)


def test_local_image_holds_no_development_environment_and_no_test_tools(
    local_image: LocalImage,
) -> None:
    packages = local_image.python_packages
    assert {"localcache", "localcache.agent", "localcache.runtime"} <= packages, sorted(packages)
    assert [name for name in NOT_SHIPPED if _shipped(packages, name)] == []
