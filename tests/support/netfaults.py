"""Network faults between a client and the real kube-apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class FreezableProxy:
    """A TCP forwarder to ``upstream`` that can stop passing bytes on: a path that has gone
    silent (a partition, a stalled apiserver) with every connection left open, which is
    what both ends then see. Bytes are only ever held back, never changed or dropped."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    @classmethod
    def in_front_of(cls, url: str) -> FreezableProxy:
        """A proxy to the server at ``url`` (scheme://host:port)."""
        server = urlsplit(url)
        assert server.hostname is not None and server.port is not None, url
        return cls((server.hostname, server.port))

    @property
    def url(self) -> str:
        """The apiserver's URL through this proxy (127.0.0.1 is in its certificate)."""
        return f"https://127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self.frozen.set()

    def thaw(self) -> None:
        """Pass on what was held back, and everything after it."""
        self.frozen.clear()

    def close(self) -> None:
        """Stop forwarding and end the accepting thread (the pumps end within 50 ms).
        ``shutdown`` wakes the thread blocked in ``accept``; ``close`` alone would not, and
        the thread would outlive the test into the interpreter's exit."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self._acceptor.join(10)
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()
        assert not self._acceptor.is_alive(), "the proxy's accepting thread did not end in 10 s"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.05)
        while not self._closed.is_set():
            if self.frozen.is_set():
                time.sleep(0.05)
                continue
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class BufferingWatchProxy:
    """A TLS reverse proxy to the real kube-apiserver that holds back every watch response
    until the watch ends, then sends it whole (as some API gateways and auth proxies do
    with streamed responses); every other request passes straight through.

    It serves 127.0.0.1 with a certificate of the cluster's CA, so a client that trusts the
    apiserver trusts it, and forwards with the admin's client certificate, passing the
    caller's ``Impersonate-*`` headers on: the apiserver sees the caller's identity.
    """

    def __init__(self, upstream_url: str, ca: Any, workdir: Path) -> None:
        from holdwarden.certs.generate import generate_serving

        pair = generate_serving(ca, "proxy", "default", ip_addresses=["127.0.0.1"])
        (workdir / "proxy.crt").write_bytes(pair.cert_pem)
        (workdir / "proxy.key").write_bytes(pair.key_pem)
        self._serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._serving.load_cert_chain(workdir / "proxy.crt", workdir / "proxy.key")
        self._upstream_tls = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
        self._upstream_tls.load_cert_chain(workdir / "admin.crt", workdir / "admin.key")
        self.upstream = upstream_url
        self.watches_held = 0
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        started = threading.Event()
        self.port = 0

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="buffering-proxy", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the buffering proxy did not start within 10 s")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        self._session = ClientSession(
            connector=TCPConnector(ssl=self._upstream_tls),
            timeout=ClientTimeout(total=120),
            auto_decompress=False,
        )

        async def forward(request: web.Request) -> web.StreamResponse:
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() in ("accept", "content-type") or k.lower().startswith("impersonate-")
            }
            body = await request.read()
            async with self._session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=headers,
                data=body or None,
            ) as upstream:
                if request.query.get("watch") in ("true", "1"):
                    self.watches_held += 1
                payload = await upstream.read()  # a watch: only when the watch has ended
                return web.Response(
                    status=upstream.status,
                    body=payload,
                    content_type=upstream.content_type,
                )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._serving)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()
            await self._session.close()
            # Handlers of watches still held back: end them here, not at garbage collection.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
