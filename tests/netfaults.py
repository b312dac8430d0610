"""Network faults between a client and the real kube-apiserver."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
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
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

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
        self._closed.set()
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

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
