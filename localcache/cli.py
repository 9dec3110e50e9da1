"""Command line: `localcache controller|agent|run|download`, each with `--help`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localcache",
        description=(
            "Pre-downloads ML models onto node-local disks for KServe "
            "(serving.kserve.io/v1alpha1 LocalModelCache, LocalModelNamespaceCache)."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("controller", help="cache reconcilers + admission webhook server")
    sub.add_parser("agent", help="per-node agent: download Jobs and model folders")
    sub.add_parser(
        "run",
        help="everything in one process: against the current kubeconfig, or a local control plane",
    )
    sub.add_parser("download", help="download a file:// or http(s):// model URI atomically")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(f"localcache {args.command}: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
