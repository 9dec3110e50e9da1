"""What a real-node test bed is made of: the hack/ builds (cached; quick when nothing changed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from localcache.runtime.testing import testbed
from tests.e2e.realnodes import cluster as cluster_mod
from tests.e2e.realnodes.cluster import REPO

ALIASES = {
    "localcache": (cluster_mod.LOCALCACHE_IMAGE,),
    "storage-initializer": (cluster_mod.STORAGE_INITIALIZER_IMAGE,),
}


def hack(script: str) -> str:
    """Run a hack/ build script; its last line of output (the path it reports)."""
    done = subprocess.run(
        ["bash", str(REPO / "hack" / script)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"hack/{script} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def images(*names: str) -> list[testbed.Image]:
    """The locally built images to import into every node (default: all the operator needs)."""
    wanted = names or ("pause", "localcache", "storage-initializer")
    built = json.loads(Path(hack("build-images.sh")).read_text())
    return [
        testbed.Image(
            ref=built[name]["ref"], tarball=Path(built[name]["tar"]), aliases=ALIASES.get(name, ())
        )
        for name in wanted
    ]
