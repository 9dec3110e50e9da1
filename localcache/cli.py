"""Command line: `localcache controller|agent|run|download|fetch|origin-sums|import`, each
with `--help`.

Flags and their environment variables are defined once in `localcache.settings`.

Expected failures end in one line on stderr, `localcache COMMAND: error: ...`, and exit 1:
a kubeconfig that is missing or unusable, an apiserver that does not answer or refuses us
(`controller` and `agent` check this before anything starts), a bad URI or destination
(`download`, `fetch`), a step of an import pod that cannot proceed (`import`); `fetch` exits
3 when no peer could serve and the origin should; `origin-sums` always exits 0. Usage errors
are argparse's (usage line and message, exit 2). A traceback means a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from localcache import settings as settings_mod
from localcache.download import importcommand as import_command
from localcache.download import peercommand as fetch_command
from localcache.download import program as download_program
from localcache.download import seedsums as origin_sums_command
from localcache.runtime import errors

_DESCRIPTIONS = {
    "controller": "Run the LocalModelCache and LocalModelNamespaceCache reconcilers and the "
    "admission webhook server (InferenceService mutation, cache validation).",
    "agent": "Run the node agent for one node: download Jobs, model folders, per-model status.",
    "run": "Run controller, webhooks and agent in one process. With a reachable kubeconfig it "
    "runs against that cluster (the agent only with --node-name); with none it starts a local "
    "control plane with two demo nodes, applies a sample cache and prints how to watch it.",
}


def _version() -> str:
    try:
        return importlib.metadata.version("localcache")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localcache",
        description=(
            "Pre-downloads ML models onto node-local disks for KServe "
            "(serving.kserve.io/v1alpha1 LocalModelCache, LocalModelNamespaceCache)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"localcache {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in ("controller", "agent", "run"):
        help_text = _DESCRIPTIONS[command].split(":")[0].split(".")[0]
        cmd = sub.add_parser(command, help=help_text, description=_DESCRIPTIONS[command])
        settings_mod.add_arguments(cmd, command)
        if command == "run":
            cmd.add_argument(
                "--local",
                action="store_true",
                help="always start a local control plane, even when a kubeconfig is reachable",
            )
            cmd.add_argument(
                "--exit-when-ready",
                action="store_true",
                help="(local mode) stop once the sample cache is Ready instead of running on",
            )
    download = sub.add_parser(
        "download",
        help="download a file:// or http(s):// model URI atomically",
        description="Download a model URI into a directory; writes are atomic.",
    )
    download_program.add_arguments(download)
    fetch = sub.add_parser(
        "fetch",
        help="fetch a model folder from peer nodes, verified and atomically",
        description=(
            "Fetch a model folder from peer nodes' agents into a directory (a peer-mode "
            "download Job runs this): sha256-verified, resumed across peers, written "
            "atomically. Exit 3: no peer could serve it, use the origin."
        ),
    )
    fetch_command.add_arguments(fetch)
    origin_sums = sub.add_parser(
        "origin-sums",
        help="record the SHA-256 an s3:// origin stores for each object of a model",
        description=(
            "While KServe's storage initializer downloads an s3:// model (a sidecar of a "
            "seed's download Job), record the SHA-256 the origin stores for each object in "
            "the download's folder, for the agent to check the bytes against. Exits 0."
        ),
    )
    origin_sums_command.add_arguments(origin_sums)
    import_cmd = sub.add_parser(
        "import",
        help="the steps of a shared-volume cache's import pod (prepare, progress, place)",
        description=(
            "Stage a model on a shared claim and move it into place atomically (the import "
            "Job of a LocalModelNamespaceCache with spec.pvcRef runs these)."
        ),
    )
    import_command.add_arguments(import_cmd)
    prepare = sub.add_parser(
        "prepare-models-root",
        help="make a node's models root usable by the agent and download pods",
        description=(
            "Create the models root if missing and give it owner UID:GID and mode 2775 "
            "(the agent DaemonSet's init container runs this as root with CAP_CHOWN and "
            "CAP_FOWNER only). Nothing below the root is changed."
        ),
    )
    prepare.add_argument(
        "--models-root",
        action="append",
        help="a models root (repeat for several; default /mnt/models)",
    )
    prepare.add_argument(
        "--owner", default="65532:1000", help="UID:GID: the agent's uid, the download fsGroup"
    )
    csi_node = sub.add_parser(
        "csi-node",
        help="serve localcache's CSI node plugin (the volumes tenant pods mount)",
        description=(
            "Serve the CSI node plugin that publishes localcache's volumes: a pod sees only "
            "the folder its namespace may read (the agent DaemonSet's privileged csi-node "
            "container runs this)."
        ),
    )
    from localcache.csi import command as csi_command

    csi_command.add_arguments(csi_node)
    return parser


def _prepare_models_root(args: argparse.Namespace) -> int:
    from localcache.agent.disk import rootdir

    for root in args.models_root or ["/mnt/models"]:
        try:
            uid, gid = rootdir.parse_owner(args.owner)
            changes = rootdir.prepare(Path(root), uid=uid, gid=gid)
        except (ValueError, OSError, rootdir.RootError) as exc:
            print(f"localcache prepare-models-root: {exc}", file=sys.stderr)
            return 1
        for change in changes or [f"{root} already prepared"]:
            print(change)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "download":
        return download_program.run(args)
    if args.command == "import":
        return import_command.run(args)
    if args.command == "fetch":
        return fetch_command.run(args)
    if args.command == "origin-sums":
        return origin_sums_command.run(args)
    if args.command == "prepare-models-root":
        return _prepare_models_root(args)
    if args.command == "csi-node":
        from localcache.csi import command as csi_command

        return csi_command.run(args)
    try:
        settings = settings_mod.from_args(args, args.command)
    except settings_mod.SettingsError as exc:
        parser.error(str(exc))
    # Imported here so `--help` and `download` stay fast and light.
    from localcache import app

    app.configure_logging(settings.logging)
    try:
        return asyncio.run(_run(args, settings))
    except KeyboardInterrupt:
        return 130
    except errors.LocalcacheError as exc:  # expected: one line, no traceback
        print(f"localcache {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, settings: settings_mod.Settings) -> int:
    from localcache import app

    if args.command == "run":
        local = _devenv_local()
        code: int = await local.run(
            settings, force_local=args.local, exit_when_ready=args.exit_when_ready
        )
        return code
    await app.check_apiserver(settings.connection)
    if args.command == "controller":
        return await app.run_controller(settings)
    return await app.run_agent(settings)


def _devenv_local() -> types.ModuleType:
    """`localcache.devenv.local`, which only a clone has: the image and the wheel leave the
    development environment out, so `run` there ends with one line saying so."""
    try:
        from localcache.devenv import local
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("localcache.devenv"):
            raise
        raise errors.ConfigError(
            "`localcache run` needs a clone of the repository (localcache.devenv is not "
            "installed here); in a cluster run `localcache controller` and `localcache agent`"
        ) from None
    return local


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
