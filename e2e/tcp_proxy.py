"""A TCP proxy on 127.0.0.1 that can go silent, for the fault tests (e2e/test_faults.py).

Between a client and the apiserver it forwards bytes both ways until ``stall()``: from
then on every open connection, and every one accepted while stalled, forwards nothing
more in either direction and stays open (a stalled load balancer, a half-open TCP
connection: no reset, no FIN, only silence). ``resume()`` forwards new connections again;
the stalled ones stay silent until the client gives up on them. TLS passes through
untouched (the apiserver's certificate names 127.0.0.1, whatever the port).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass


@dataclass
class _Connection:
    stalled: bool


class StallingProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._stalled = False
        self._connections: list[_Connection] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)

    def stall(self) -> None:
        """Every connection, open or to come, goes silent."""
        self._stalled = True
        for connection in list(self._connections):
            connection.stalled = True

    def resume(self) -> None:
        """New connections forward again; the stalled ones stay silent."""
        self._stalled = False

    def stop(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(stalled=self._stalled)
        self._connections.append(connection)
        try:
            if connection.stalled:
                await asyncio.Event().wait()  # accepted, never answered
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            await asyncio.gather(
                self._pump(reader, up_writer, connection),
                self._pump(up_reader, writer, connection),
            )
        finally:
            self._connections.remove(connection)
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _pump(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        try:
            while True:
                data = await src.read(65536)
                if connection.stalled:
                    await asyncio.Event().wait()  # what was read is never delivered
                if not data:
                    break
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()
