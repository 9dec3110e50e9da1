"""The model server program runs from a bare file on a bare Python (the in-cluster e2e mode
ships it in a ConfigMap to the operator's image, which holds no devenv)."""

from __future__ import annotations

import subprocess
import sys

from localcache.devenv import fileserver


def test_the_file_server_runs_as_a_script_with_the_standard_library_only() -> None:
    done = subprocess.run(
        # -I: no user site, no cwd on the path; -S: no site-packages (so no localcache)
        [sys.executable, "-I", "-S", fileserver.__file__, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--rate" in done.stdout
