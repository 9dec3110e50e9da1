"""`localcache csi-node`: the CSI node plugin's flags and process (stops on SIGTERM/SIGINT).

Run as the privileged `csi-node` container of the agent's DaemonSet: it mounts the kubelet's
`plugins/<driver>/` (its endpoint), `plugins_registry/` (its registration socket) and `pods/`
(with Bidirectional propagation: where the views are published), and the models roots (as
`--models-root HOST=CONTAINER`, like the agent).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from localcache.csi import DRIVER_NAME

if TYPE_CHECKING:
    from localcache.csi import service

KUBELET_DIR = "/var/lib/kubelet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    driver = DRIVER_NAME
    parser.add_argument("--driver-name", default=driver, help="CSI driver name (%(default)s)")
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (env NODE_NAME)",
    )
    parser.add_argument(
        "--endpoint",
        default="/csi/csi.sock",
        help="the CSI socket in this container (%(default)s)",
    )
    parser.add_argument(
        "--kubelet-endpoint",
        default=f"{KUBELET_DIR}/plugins/{driver}/csi.sock",
        help="the same socket as the kubelet sees it (%(default)s)",
    )
    parser.add_argument(
        "--registration-socket",
        default=f"/registration/{driver}-reg.sock",
        help="the registration socket in this container, in the kubelet's plugins_registry",
    )
    parser.add_argument(
        "--models-root",
        action="append",
        metavar="HOST=CONTAINER",
        help="a models root: its host path (the node group's PV path) and where this container "
        "sees it; repeat for several (default /mnt/models=/mnt/models)",
    )
    parser.add_argument(
        "--work-dir",
        default="/run/localcache-csi",
        help="where views are assembled before they are published (%(default)s)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument("--log-format", default="json", choices=["json", "console"])


def parse_roots(values: list[str] | None) -> dict[str, Path]:
    roots: dict[str, Path] = {}
    for value in values or ["/mnt/models=/mnt/models"]:
        host, sep, inside = value.partition("=")
        if not sep or not host.startswith("/") or not inside.startswith("/"):
            raise ValueError(f"--models-root wants HOST=CONTAINER, two absolute paths: {value!r}")
        roots[os.path.normpath(host)] = Path(inside)
    return roots


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        print("localcache csi-node: error: --node-name (or NODE_NAME) is required")
        return 2
    try:
        roots = parse_roots(args.models_root)
    except ValueError as exc:
        print(f"localcache csi-node: error: {exc}")
        return 2
    from localcache.csi import service
    from localcache.runtime import errors
    from localcache.runtime import logging as logging_mod

    logging_mod.configure(level=args.log_level, renderer=args.log_format)
    try:
        version = importlib.metadata.version("localcache")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    plugin = service.Plugin(
        driver_name=args.driver_name,
        node_name=args.node_name,
        roots=roots,
        work_dir=Path(args.work_dir),
        version=version,
    )
    try:
        asyncio.run(_main(plugin, args))
    except errors.LocalcacheError as exc:
        print(f"localcache csi-node: error: {exc}")
        return 1
    return 0


async def _main(plugin: service.Plugin, args: argparse.Namespace) -> None:
    from localcache.csi import service
    from localcache.runtime import kube

    async with await kube.Kube.auto() as client:
        task = asyncio.create_task(
            service.serve(
                plugin,
                client,
                endpoint=Path(args.endpoint),
                registration_socket=Path(args.registration_socket),
                endpoint_for_kubelet=args.kubelet_endpoint,
            )
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
