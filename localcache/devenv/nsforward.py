"""A TCP forwarder from this machine's loopback into a network namespace of the test bed.

    python -m localcache.devenv.nsforward --netns /proc/PID/ns/net \
        --map 127.0.0.1:41000=127.0.0.1:6443 [--map ...]

Each `--map LISTEN=TARGET` listens on LISTEN in the forwarder's own (the host's) network
namespace and connects each accepted client to TARGET inside `--netns`. This is how host-side
clients (pytest, kubectl) reach the apiserver and test servers of the test bed without the
test bed adding any address, route or link to the host's namespace. Outbound sockets are made
on threads that entered the namespace, so each socket belongs to it for life. It prints
`ready` once every listener is bound, and runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

from localcache.devenv import netns

CONNECT_TIMEOUT_S = 10.0
CHUNK = 256 * 1024


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


class Forwarder:
    def __init__(self, netns_path: str) -> None:
        fd = os.open(netns_path, os.O_RDONLY)
        self._netns_fd = fd
        self._pool = ThreadPoolExecutor(4, initializer=self._enter, thread_name_prefix="netns")

    def _enter(self) -> None:
        netns.setns_net(self._netns_fd)

    async def _target_socket(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self._pool, socket.socket)
        sock.setblocking(False)
        return sock

    def handler(self, target: tuple[str, int]) -> object:
        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            sock = await self._target_socket()
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.sock_connect(sock, target), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                sock.close()
                client_w.close()
                return
            target_r, target_w = await asyncio.open_connection(sock=sock)
            await asyncio.gather(_pump(client_r, target_w), _pump(target_r, client_w))

        return handle


async def _serve(args: argparse.Namespace) -> None:
    forwarder = Forwarder(args.netns)
    servers = []
    for mapping in args.map:
        listen, _, target = mapping.partition("=")
        host, port = _split(listen)
        handle = forwarder.handler(_split(target))
        servers.append(await asyncio.start_server(handle, host, port))  # type: ignore[arg-type]
    print("ready", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="nsforward")
    parser.add_argument("--netns", required=True)
    parser.add_argument("--map", action="append", required=True, help="LISTEN=TARGET")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
