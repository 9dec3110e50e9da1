"""`python -m localcache` and the `localcache` command (pyproject's script) run the command line.

The two sidecars localcache runs, `localcache origin-sums --sidecar` (a seed's checksums) and
`localcache import progress` (an import pod's size), hold SIGTERM from here, before the
command's modules load (half a second of imports, longer under a CPU limit); only the
interpreter's own start (tens of milliseconds) comes before. The kubelet stops a
sidecar once its pod's download ends: when the download fails at once, the signal could come
while the process, PID 1 of its container and without a handler yet, drops it, and the pod then
waits out its termination grace before its Job fails. Held, the signal waits for the command to
take it (`download.seedsums`, `download.importcommand`).
"""

import signal
import sys
from collections.abc import Sequence


def main() -> int:
    if holds_sigterm(sys.argv[1:]):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    from localcache import cli

    return cli.main()


def holds_sigterm(args: Sequence[str]) -> bool:
    """Whether `args` run one of localcache's sidecars."""
    if list(args[:2]) == ["import", "progress"]:
        return True
    return bool(args) and args[0] == "origin-sums" and "--sidecar" in args[1:]


if __name__ == "__main__":
    sys.exit(main())
