"""The shell blocks of README.md's "Migrating from KServe's localmodel" section, run as a user
would run them: bash with `set -euo pipefail`, the test bed's kubeconfig, and on PATH only the
kubectl built with the control plane, helm (hack/build-helm.sh) and the system's tools, from
the repository's root (the blocks name `charts/localcache` and `manifests/...`).

`block(heading)` is the one ```sh block under a `### heading` that starts with `heading`;
`run(script)` runs it and fails with its output when it exits non-zero.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support import installs

README = installs.REPO_ROOT / "README.md"
SECTION = "## Migrating from KServe's localmodel"
BLOCK_TIMEOUT_S = 600


def section() -> str:
    text = README.read_text()
    start = text.index(SECTION + "\n")
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def block(heading: str) -> str:
    """The one shell block under the `### ` heading that starts with `heading`."""
    parts = re.split(r"^### ", section(), flags=re.MULTILINE)
    (part,) = [p for p in parts if p.startswith(heading)] or [""]
    assert part, f"README.md has no '### {heading}' under {SECTION!r}"
    blocks = re.findall(r"^```sh\n(.*?)^```$", part, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"'### {heading}' should hold one ```sh block, has {len(blocks)}"
    return str(blocks[0])


@dataclass(frozen=True)
class Shell:
    kubeconfig: Path
    kubectl: Path
    helm: Path

    def run(self, script: str, *, what: str) -> str:
        """`script` by bash -euo pipefail; its output, or an AssertionError with it."""
        with tempfile.TemporaryDirectory(prefix="localcache-readme-") as tmp:
            tools = Path(tmp) / "bin"
            tools.mkdir()
            (tools / "kubectl").symlink_to(self.kubectl)
            (tools / "helm").symlink_to(self.helm)
            env = {
                "PATH": f"{tools}:/usr/local/bin:/usr/bin:/bin",
                "HOME": tmp,
                "KUBECONFIG": str(self.kubeconfig),
                "LANG": "C.UTF-8",
                "XDG_CACHE_HOME": os.path.join(tmp, "cache"),
            }
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=installs.REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
                check=False,
            )
        output = f"$ {what}\n{done.stdout}{done.stderr}"
        assert done.returncode == 0, f"README {what} failed ({done.returncode}):\n{output}"
        return output
