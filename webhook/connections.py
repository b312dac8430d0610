"""Bounds on the enforcer's TLS connections: timeouts, a connection cap, bounded memory.

On its own, aiohttp keeps a connection open for as long as the client likes (its keep-alive
timer is an hour), puts no time limit on a request's headers or body, and accepts any
number of connections. asyncio's TLS layer also gives every connection a 256 KiB receive
buffer. This module puts bounds on all of that. It works below aiohttp, in the TLS protocol
of each connection (``GuardedTLSProtocol``), and beside it, in the handlers, which mark when a
request has its headers and when it has been answered (``ConnectionGuard.begin``/``end``).

Invariants (``Limits`` holds the numbers, from ``webhook.*``):
  - At most ``max_connections`` TCP connections are open at once, TLS handshakes included.
    At the cap, the next connection is accepted only by evicting the connection that has
    waited longest without a request in progress. If every connection has one, nothing is
    accepted: the kernel's listen backlog (``LISTEN_BACKLOG``, up to ``somaxconn``) holds
    the newcomers until a connection is answered or closed, so a burst is queued, not
    refused. A request in progress is never cut off to make room.
  - A connection with no request in progress is closed ``idle_timeout`` after its last
    answer if it sends nothing. Once it sends a byte of its next request it has
    ``header_timeout`` to complete the headers. From accept, the TLS handshake and the
    first request's headers share one ``header_timeout``.
  - A request's body must arrive within ``body_timeout`` of its headers (``Enforcer._read``).
    At most ``max_in_flight_body_bytes`` of bodies are buffered in the whole process at
    once (``BodyBudget``); a request waits for room, within its body timeout.
  - Each connection's receive buffer is ``READ_BUFFER`` bytes, not 256 KiB, and aiohttp's
    header limits (``HEADER_LIMITS``) bound what a connection's headers can hold. So the
    memory of a connection is bounded, and the process's memory is bounded by
    ``max_connections`` times that plus the body budget.
  - While draining (``ConnectionGuard.drain``), every answer carries ``Connection: close``.
    A connection that has sent any part of a request (its body still arriving included) is
    not closed before that request is answered, unless its own header or body timeout or
    ``drain_timeout`` runs out first. Only idle connections are closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
import time
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from holdwarden.config import WebhookConfig

log = logging.getLogger("holdwarden.webhook.connections")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# One TLS record is at most 16 KiB (plus its header and tag); two fit. asyncio's default of
# 256 KiB per connection is what made 1,000 idle connections cost 343 MB.
READ_BUFFER = 32 * 1024
# A connection whose request has reserved a body larger than READ_BUFFER in the body budget
# reads with a buffer of min(body, WIDE_READ_BUFFER) until that body is read, then goes
# back to READ_BUFFER. 32 KiB reads made a 1.5 MB review cost ~1.9x the aiohttp floor's
# CPU (eight times the socket reads, TLS reads and aiohttp data_received calls); a wide
# buffer is never larger than the body it serves, so all wide buffers together stay
# within webhook.maxInFlightBodyBytes (the process's bound grows by at most that) and the
# idle-connection bound is unchanged.
WIDE_READ_BUFFER = 256 * 1024
# Encrypted bytes asyncio's TLS layer holds for a connection whose reader is paused, before
# it stops reading the socket; its default (256 KiB) is per connection too.
TLS_READ_HIGH_WATER = 64 * 1024
# A peer that never answers our close_notify cannot hold its memory for asyncio's default
# 30 s.
TLS_SHUTDOWN_TIMEOUT = 2.0
# The kube-apiserver sends fewer than ten headers (Host, User-Agent, Content-Type,
# Content-Length, Accept, Accept-Encoding, maybe Authorization and traceparent). 16 of at
# most 8 KiB each bound what a connection's headers can hold: measured, ~300 KiB of RSS
# for a connection that sends the most it may (32 such headers cost ~580 KiB).
MAX_HEADERS = 16
MAX_FIELD_SIZE = 8190  # aiohttp: a header's name and value together
MAX_LINE_SIZE = 8190
# aiohttp buffers up to twice this of a body the handler has not read yet, then stops
# reading the socket; its default (64 KiB) allowed 128 KiB per connection.
PAYLOAD_BUFFER = 16 * 1024
# After an early answer (408, 413), aiohttp reads and discards what is left of the body for
# this long, so the client can read the answer before the connection closes.
LINGERING_TIME = 2.0
# During a drain, a connection counts as idle once it has been answered this long ago.
# By then aiohttp has written the answer.
_DRAIN_IDLE_AFTER = 0.5
# The kernel queues this many completed handshakes (TCP) the site has not accepted yet; it
# is capped by net.core.somaxconn (4096 by default since Linux 5.4). At the connection cap
# this queue is where a burst waits.
LISTEN_BACKLOG = 4096
# At the cap, only a connection silent this long (its handshake done, no byte of a request
# since, or since its last answer) is evicted for a newcomer. A connection in its handshake,
# or one whose request has just begun to arrive, is never taken: in a burst of new
# connections, evicting "the longest idle" took exactly those, and 700 of 1,000 reviews
# were reset.
EVICT_QUIET_S = 0.5
# TLS 1.2 suites: forward secret (ECDHE) and authenticated encryption (AES-GCM, ChaCha20)
# only, so no CBC suite. TLS 1.3 suites are all AEAD and are not affected by this string.
AEAD_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


@dataclass(frozen=True)
class Limits:
    """The connection limits, in seconds and counts."""

    idle_timeout: float
    header_timeout: float
    body_timeout: float
    max_connections: int
    max_in_flight_body_bytes: int

    @classmethod
    def from_config(cls, hook: WebhookConfig) -> Limits:
        return cls(
            idle_timeout=hook.idle_timeout.total_seconds(),
            header_timeout=hook.header_timeout.total_seconds(),
            body_timeout=hook.body_timeout.total_seconds(),
            max_connections=hook.max_connections,
            max_in_flight_body_bytes=hook.max_in_flight_body_bytes,
        )


def harden_tls(context: ssl.SSLContext, client_ca_file: str | None) -> None:
    """AEAD-only TLS 1.2 (TLS 1.3 as it is), and optional mutual TLS.

    With ``client_ca_file`` the handshake fails unless the client presents a certificate
    that this CA signed (``webhook.clientCAFile``). The context's certificate can still be
    hot-reloaded: ``load_cert_chain`` keeps these settings.
    """
    context.minimum_version = max(context.minimum_version, ssl.TLSVersion.TLSv1_2)
    context.set_ciphers(AEAD_TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if client_ca_file:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED


# --- the body budget -------------------------------------------------------------------------


class BodyBudget:
    """At most ``limit`` bytes of request bodies held at once; waiters are served in order.

    ``acquire(n)`` returns the bytes it reserved (``n``, capped at ``limit``); the caller
    must ``release`` exactly that, also when it fails.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def try_acquire(self, n: int) -> int | None:
        """Reserve ``n`` bytes now if there is room and nobody is waiting, else None."""
        n = max(0, min(n, self.limit))
        if not self._waiters and self.used + n <= self.limit:
            self.used += n
            return n
        return None

    async def acquire(self, n: int) -> int:
        n = max(0, min(n, self.limit))
        if not self._waiters and self.used + n <= self.limit:
            self.used += n  # the fast path: no queue, room now
            return n
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(n)  # granted as we were cancelled: give it back
            else:
                waiter.cancel()  # _wake skips it
            raise
        return n

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.used + n > self.limit:
                return
            self._waiters.popleft()
            self.used += n
            waiter.set_result(None)


# --- per-connection state --------------------------------------------------------------------


class _Conn:
    """One TCP connection, as the guard sees it."""

    __slots__ = (
        "busy",
        "closed",
        "handler",
        "quiet_since",
        "reading_since",
        "since",
        "tls",
        "transport",
    )

    def __init__(self, handler: Any, now: float, tls: GuardedTLSProtocol | None = None) -> None:
        self.handler = handler  # aiohttp's RequestHandler for this connection
        self.tls = tls  # its TLS protocol, whose read buffer a large body widens
        self.transport: asyncio.Transport | None = None  # the TCP transport
        self.since = now  # accepted, or last answered
        # When the first byte of the next request arrived (accept counts: the handshake
        # and the first request share one header timeout); None while silent.
        self.reading_since: float | None = now
        self.busy = False  # a request has its headers and is not answered yet
        self.closed = False  # forgotten by the guard: counted out, or never admitted
        # Since when it has been silent with its TLS handshake done (after the handshake,
        # or after its last answer); None during the handshake and once bytes of a request
        # have come. Only a connection silent for EVICT_QUIET_S may be evicted.
        self.quiet_since: float | None = None


class GuardedTLSProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a small receive buffer, reporting to a ConnectionGuard.

    It wraps aiohttp's per-connection protocol the way ``loop.create_server(ssl=...)``
    would, so aiohttp sees an ordinary TLS transport.
    """

    max_size = READ_BUFFER  # SSLProtocol allocates its receive buffer of this size

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        app_protocol: asyncio.BaseProtocol,
        context: ssl.SSLContext,
        guard: ConnectionGuard,
    ) -> None:
        super().__init__(
            loop,
            app_protocol,
            context,
            # No waiter: nobody awaits the handshake (a failed one would otherwise leave
            # a future whose exception is never retrieved). asyncio accepts None here.
            None,  # type: ignore[arg-type]
            server_side=True,
            ssl_handshake_timeout=guard.limits.header_timeout,  # type: ignore[arg-type]
            ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
        )
        # SSLProtocol's own flow-control setter (no public one before the handshake).
        self._set_read_buffer_limits(high=TLS_READ_HIGH_WATER)  # type: ignore[attr-defined]
        self._hw_guard = guard
        self._hw_conn = _Conn(app_protocol, time.monotonic(), self)

    @property
    def read_buffer_size(self) -> int:
        """The size of the buffer the socket is read into, and of each TLS read."""
        return self.max_size

    def set_read_buffer(self, size: int) -> None:
        """Read the socket, and decrypt, ``size`` bytes at a time from now on.

        The buffer is replaced between reads (asyncio fills it and hands it over within one
        callback), so no read is split across the old and the new buffer. The encrypted
        bytes held while the reader is paused keep their bound (TLS_READ_HIGH_WATER): a
        wide read may pass it once, and reading then pauses until they are decrypted, so a
        wide connection costs at most its buffer more than a narrow one.
        """
        if size == self.max_size:
            return
        # SSLProtocol reads its class attribute max_size and its private buffer; an instance
        # attribute and a new buffer are its only knobs (asyncio has no public setter).
        self.max_size = size  # type: ignore[misc]
        self._ssl_buffer = bytearray(size)
        self._ssl_buffer_view = memoryview(self._ssl_buffer)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._hw_conn.transport = transport
        if not self._hw_guard.admit(self._hw_conn):
            transport.abort()
            return
        super().connection_made(transport)

    def buffer_updated(self, nbytes: int) -> None:
        conn = self._hw_conn
        if not conn.busy and conn.reading_since is None:
            conn.reading_since = time.monotonic()
        conn.quiet_since = None  # bytes came: a request may be on its way
        super().buffer_updated(nbytes)

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        super()._on_handshake_complete(handshake_exc)
        if handshake_exc is None and not self._hw_conn.busy:
            self._hw_conn.quiet_since = time.monotonic()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._hw_guard.forget(self._hw_conn)
        super().connection_lost(exc)


# --- the guard -------------------------------------------------------------------------------


class ConnectionGuard:
    """Counts, times out, evicts and drains the connections of one TLS site."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # Connections with no request in progress, the one answered longest ago first:
        # eviction takes the first, and a drain closes them.
        self._idle: collections.OrderedDict[_Conn, None] = collections.OrderedDict()
        self._by_handler: dict[object, _Conn] = {}
        self.count = 0
        self.closing = False
        # What happened, for logs and tests.
        self.evicted = 0
        self.rejected = 0
        self.idle_closed = 0
        self.header_timeouts = 0
        self.cut_off = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        # Set whenever a connection goes away or becomes idle: room for the accept loop.
        self._room: asyncio.Event | None = None
        self._reserved = 0  # accepted, not yet admitted (at most one: one accept loop)
        self.backpressured = 0
        """Times the accept loop waited at the cap (every connection busy)."""

    # -- connection life ---------------------------------------------------------------

    def _evictable(self, now: float) -> _Conn | None:
        """The longest-idle connection that has been silent for EVICT_QUIET_S, if any."""
        for conn in self._idle:
            if conn.quiet_since is not None and now - conn.quiet_since >= EVICT_QUIET_S:
                return conn
        return None

    def _next_evictable_in(self, now: float) -> float | None:
        """Seconds until some idle connection will have been silent long enough."""
        waits = [
            conn.quiet_since + EVICT_QUIET_S - now
            for conn in self._idle
            if conn.quiet_since is not None
        ]
        return max(0.0, min(waits)) if waits else None

    def has_room(self) -> bool:
        """A connection may be accepted now: under the cap, or one can be evicted."""
        if self.count + self._reserved < self.limits.max_connections:
            return True
        return self._evictable(time.monotonic()) is not None

    async def wait_for_room(self) -> None:
        """Return once ``has_room``; until then the site accepts nothing (backpressure)."""
        if self.has_room():
            return
        if self._room is None:
            self._room = asyncio.Event()
        self.backpressured += 1
        if self.backpressured == 1 or self.backpressured % 1000 == 0:
            log.warning(
                "at the connection cap with no connection to spare: newcomers wait in the "
                "listen backlog",
                extra={"fields": {"maxConnections": self.limits.max_connections}},
            )
        while not self.has_room():
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_evictable_in(time.monotonic())):
                    await self._room.wait()

    async def reserve(self) -> None:
        """A slot for the connection just accepted, held until its ``admit``: at the cap
        the longest-silent connection is evicted now; with none to spare, wait for room.
        Taken right before the connection is made, so nothing can fill the slot between."""
        while True:
            if self.count + self._reserved < self.limits.max_connections:
                break
            victim = self._evictable(time.monotonic())
            if victim is not None:
                self.evicted += 1
                self._abort(victim)
                continue
            await self.wait_for_room()
        self._reserved += 1

    def unreserve(self) -> None:
        """The reserved connection was never made."""
        self._reserved -= 1
        self._made_room()

    def _made_room(self) -> None:
        if self._room is not None:
            self._room.set()

    def admit(self, conn: _Conn) -> bool:
        """A new connection: count it, in the slot ``reserve`` kept for it (the site's
        accept loop), else evicting the longest-idle one at the cap."""
        if self._reserved > 0:
            # Draining too: until the listener closes, a newcomer is served (and told to
            # go elsewhere by Connection: close on its answer).
            self._reserved -= 1
            self.count += 1
            self._idle[conn] = None
            self._by_handler[conn.handler] = conn
            return True
        if self.count >= self.limits.max_connections:
            victim = next(iter(self._idle), None)
            if victim is None or self.closing:
                self.rejected += 1
                conn.closed = True
                if self.rejected == 1 or self.rejected % 1000 == 0:
                    log.warning(
                        "connection refused: every connection has a request in progress",
                        extra={"fields": {"maxConnections": self.limits.max_connections}},
                    )
                return False
            self.evicted += 1
            self._abort(victim)
        self.count += 1
        self._idle[conn] = None
        self._by_handler[conn.handler] = conn
        return True

    @property
    def in_progress(self) -> int:
        """Connections with a request being read, handled or answered."""
        return sum(1 for conn in self._by_handler.values() if conn.busy and not conn.closed)

    def forget(self, conn: _Conn) -> None:
        """The connection is gone (or is being aborted): count it out, once."""
        if conn.closed:
            return
        conn.closed = True
        self.count -= 1
        self._idle.pop(conn, None)
        self._by_handler.pop(conn.handler, None)
        if self._changed is not None:
            self._changed.set()
        self._made_room()

    def _abort(self, conn: _Conn) -> None:
        self.forget(conn)
        if conn.transport is not None:
            conn.transport.abort()

    def _close_idle(self, conn: _Conn) -> None:
        # A clean close (TLS close_notify, then FIN) once aiohttp has the connection; a
        # connection still in its handshake has nothing to say goodbye to.
        handler = conn.handler
        if getattr(handler, "transport", None) is not None:
            self._idle.pop(conn, None)
            handler.force_close()
        else:
            self._abort(conn)

    # -- requests (the handlers) --------------------------------------------------------

    def begin(self, handler: object) -> None:
        conn = self._by_handler.get(handler)
        if conn is not None:
            conn.busy = True
            self._idle.pop(conn, None)

    def widen_reads(self, handler: object, body_bytes: int) -> bool:
        """A request on ``handler``'s connection has ``body_bytes`` of the body budget
        reserved: read its connection min(body_bytes, WIDE_READ_BUFFER) at a time until
        ``narrow_reads``. False (nothing changed) for a body that fits READ_BUFFER."""
        conn = self._by_handler.get(handler)
        size = min(body_bytes, WIDE_READ_BUFFER)
        if conn is None or conn.tls is None or conn.closed or size <= READ_BUFFER:
            return False
        conn.tls.set_read_buffer(size)
        return True

    def read_buffer_sizes(self) -> list[int]:
        """Each open connection's read buffer in bytes (metrics and tests)."""
        return [
            conn.tls.read_buffer_size
            for conn in self._by_handler.values()
            if conn.tls is not None and not conn.closed
        ]

    def narrow_reads(self, handler: object) -> None:
        """Back to READ_BUFFER: the body that justified a wide buffer has been read."""
        conn = self._by_handler.get(handler)
        if conn is not None and conn.tls is not None:
            conn.tls.set_read_buffer(READ_BUFFER)

    def end(self, handler: object) -> None:
        conn = self._by_handler.get(handler)
        if conn is not None and not conn.closed:
            conn.busy = False
            conn.since = time.monotonic()
            conn.reading_since = None
            conn.quiet_since = conn.since
            self._idle[conn] = None  # now the most recently answered
            if self.closing and self._changed is not None:
                self._changed.set()
            self._made_room()

    def tracked(self, handler: Handler) -> Handler:
        """``handler``, marking its request in progress; while draining, its answer closes
        the connection. (``Enforcer.validate`` does the same inline, on the hot path.)"""
        guard = self

        async def track(request: web.Request) -> web.StreamResponse:
            protocol = request.protocol
            guard.begin(protocol)
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                if guard.closing:
                    exc.force_close()
                raise
            finally:
                guard.end(protocol)
            if guard.closing:
                response.force_close()
            return response

        return track

    # -- timeouts -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the sweeper that applies the idle and header timeouts."""
        self._changed = asyncio.Event()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="connection-sweeper")

    async def _sweep_forever(self) -> None:
        # A quarter of the shortest timeout, so a timeout fires at most 25 % late.
        interval = max(0.02, min(1.0, self.limits.header_timeout / 4, self.limits.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep(time.monotonic())
            except Exception:  # never let the sweeper die; it is what bounds connections
                log.exception("connection sweep failed")

    def sweep(self, now: float) -> None:
        """Close connections past their idle or header timeout (and, while draining, idle
        ones)."""
        limits = self.limits
        for conn in list(self._idle):
            if conn.busy or conn.closed:
                continue
            if conn.reading_since is not None:
                if now - conn.reading_since > limits.header_timeout:
                    self.header_timeouts += 1
                    self._abort(conn)
            elif now - conn.since > (_DRAIN_IDLE_AFTER if self.closing else limits.idle_timeout):
                self.idle_closed += 1
                self._close_idle(conn)

    # -- draining -----------------------------------------------------------------------

    def drain(self) -> None:
        """From now on every answer closes its connection (``Connection: close``)."""
        self.closing = True

    def close_idle_now(self) -> None:
        """Close every connection that has no request and no part of one, now."""
        for conn in list(self._idle):
            if not conn.busy and not conn.closed and conn.reading_since is None:
                self.idle_closed += 1
                self._close_idle(conn)

    async def wait_empty(self, timeout: float) -> bool:
        """Wait until no connection is left, for at most ``timeout`` s; True if none is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.count > 0:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            changed = self._changed
            if changed is None:
                return self.count == 0
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 0.1))
        return True

    def closed_by_reason(self) -> dict[str, int]:
        """What the server closed or refused so far (for metrics)."""
        return {
            "evicted": self.evicted,
            "refused": self.rejected,
            "idle": self.idle_closed,
            "header-timeout": self.header_timeouts,
            "drain-cut-off": self.cut_off,
        }

    def abort_all(self) -> int:
        """Abort whatever is left; returns how many."""
        left = [conn for conn in self._by_handler.values() if not conn.closed]
        for conn in left:
            self._abort(conn)
        self.cut_off += len(left)
        return len(left)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None


class GuardedTLSSite(web.BaseSite):
    """A TCP site whose connections run ``GuardedTLSProtocol`` (TLS) under ``guard``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext,
        guard: ConnectionGuard,
        backlog: int = LISTEN_BACKLOG,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    @property
    def bound_port(self) -> int:
        return int(self._listener.getsockname()[1]) if self._listener is not None else 0

    async def start(self) -> None:
        """Listen, and accept in a loop of our own: one connection at a time, and only
        when the guard has room (``loop.create_server`` would accept whatever arrives)."""
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        context = self._ssl_context
        assert server is not None and context is not None
        guard = self._guard

        def connection() -> GuardedTLSProtocol:
            return GuardedTLSProtocol(loop, server(), context, guard)

        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=self._backlog
        )
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept_forever(loop, listener, connection))

    async def _accept_forever(
        self,
        loop: asyncio.AbstractEventLoop,
        listener: socket.socket,
        factory: Callable[[], GuardedTLSProtocol],
    ) -> None:
        while True:
            await self._guard.wait_for_room()
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # closed under us (stop_listening), or out of files
                if listener.fileno() == -1:
                    return
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                # The guard may have filled up while we waited for this connection: it
                # waits here, its handshake not begun (one socket at most), until room.
                await self._guard.reserve()
            except BaseException:  # cancelled (stop_listening) while it waited for room
                sock.close()
                raise
            try:
                await loop.connect_accepted_socket(factory, sock)
            except OSError:
                sock.close()
                if self._guard._reserved > 0:
                    self._guard.unreserve()

    def stop_listening(self) -> None:
        """Close the listening socket; open connections go on. What waits in the backlog
        is reset by the kernel (the apiserver retries elsewhere)."""
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def stop(self) -> None:
        self.stop_listening()
        await super().stop()
