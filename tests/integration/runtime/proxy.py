"""A TCP proxy for tests that can freeze its open connections: they stay open, but no more
bytes pass in either direction (a silently dead network path). New connections still work."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class _Connection:
    writers: list[asyncio.StreamWriter]
    frozen: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FreezableProxy:
    def __init__(self, *, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._connections: list[_Connection] = []
        self.frozen_connections = 0

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    def freeze_existing(self) -> None:
        """Stop forwarding on every connection open now (sockets are left open)."""
        for conn in self._connections:
            if not conn.frozen.is_set():
                conn.frozen.set()
                self.frozen_connections += 1

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for c in self._connections for t in c.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in self._connections:
            for writer in conn.writers:
                writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        conn = _Connection([writer, up_writer])
        self._connections.append(conn)
        conn.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, conn), name="proxy-pump-up"),
            asyncio.create_task(self._pump(up_reader, writer, conn), name="proxy-pump-down"),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        for w in conn.writers:
            w.close()

    @staticmethod
    async def _pump(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, conn: _Connection
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if conn.frozen.is_set():
                    await asyncio.Event().wait()  # swallow the bytes, hold the socket open
                dst.write(data)
                await dst.drain()
