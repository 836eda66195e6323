"""The metrics and health endpoint: `GET /metrics` (Prometheus) and `GET /healthz`.

A few lines of asyncio HTTP/1.0 instead of prometheus-client's threaded server: /healthz must
ask the event loop's own state (readers up, store answering), and one loop means no locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = structlog.get_logger("dlrfeed.http")

HealthCheck = Callable[[], Awaitable[tuple[bool, str]]]


class MetricsServer:
    """Serves /metrics and /healthz on HOST:PORT until `close()`."""

    def __init__(self, registry: CollectorRegistry, health: HealthCheck) -> None:
        self._registry = registry
        self._health = health
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        """Bind and serve (port 0 picks a free one, see `port`)."""
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics_listening", host=host, port=self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request_line = await reader.readline()
                while (await reader.readline()).strip():
                    pass  # headers: nothing we need
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            if path == "/metrics":
                status, content_type, body = (
                    "200 OK",
                    CONTENT_TYPE_LATEST,
                    generate_latest(self._registry),
                )
            elif path == "/healthz":
                ready, reason = await self._health()
                status = "200 OK" if ready else "503 Service Unavailable"
                content_type, body = "text/plain; charset=utf-8", (reason + "\n").encode()
            else:
                status, content_type, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            return
        finally:
            writer.close()
