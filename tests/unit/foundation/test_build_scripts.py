"""hack/ build scripts: a cached binary is recognised every time, and `make help` lists every
target.

The version checks once piped `BIN --version` into `grep -q` under `set -o pipefail`: grep
exits at its first match, the writer gets SIGPIPE, the pipeline fails, and a cached binary was
rebuilt at random (3 runs in 20). `binary_reports` captures the output first.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LIB = REPO / "hack" / "lib" / "k8s-build.sh"


def _fake_binary(tmp_path: Path) -> Path:
    """Prints its version line, then a lot more: grep -q leaves long before the writer."""
    fake = tmp_path / "etcd"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'echo "etcd Version: 3.6.13"\n'
        'for i in $(seq 1 20000); do echo "Git SHA: padding line $i"; done\n'
    )
    fake.chmod(0o755)
    return fake


def _check(fake: Path, pattern: str) -> int:
    script = f'set -euo pipefail\nsource "{LIB}"\nbinary_reports "{fake}" "{pattern}"'
    return subprocess.run(["bash", "-c", script], check=False).returncode


def test_a_cached_binary_is_recognised_every_time(tmp_path: Path) -> None:
    fake = _fake_binary(tmp_path)
    results = [_check(fake, "etcd Version: 3.6.13[[:space:]]*") for _ in range(20)]
    assert results == [0] * 20


def test_another_version_is_not_recognised(tmp_path: Path) -> None:
    assert _check(_fake_binary(tmp_path), "etcd Version: 3.6.14[[:space:]]*") != 0


def test_no_build_script_pipes_a_version_into_grep() -> None:
    for script in (REPO / "hack").rglob("*.sh"):
        text = script.read_text()
        assert not re.search(r"--version[^\n|]*\|\s*grep", text), f"{script} pipes into grep"


def test_make_help_lists_every_documented_target() -> None:
    makefile = (REPO / "Makefile").read_text()
    documented = set(re.findall(r"^([a-z0-9-]+):.*## ", makefile, flags=re.MULTILINE))
    shown = subprocess.run(
        ["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    listed = {line.split()[0] for line in shown.splitlines() if line.strip()}
    assert "e2e-kind" in documented
    assert documented == listed
