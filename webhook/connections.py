"""Bounds on the enforcer's TLS connections: timeouts, a connection cap, bounded memory.

On its own, aiohttp keeps a connection open for as long as the client likes (its keep-alive
timer is an hour), puts no time limit on a request's headers or body, and accepts any
number of connections; asyncio's TLS layer (``loop.create_server(ssl=...)``) gives every
connection a 256 KiB receive buffer, and has no public way to make it smaller. This module
puts bounds on all of that, below aiohttp and without its handlers' help:

  - ``GuardedTLSSite`` (an aiohttp ``BaseSite``) accepts TCP connections in a loop of its
    own, one at a time and only when the guard has room, and hands each to
    ``loop.connect_accepted_socket`` as a plain TCP connection.
  - ``TLSConnection`` (an ``asyncio.BufferedProtocol``) does TLS itself with the ``ssl``
    module's ``SSLObject`` over memory BIOs, the public API meant for this, so it owns the
    receive buffer, and gives aiohttp an ordinary ``asyncio.Transport`` (``TLSTransport``).
    It tells the guard when bytes arrive and when a request's headers are complete (the end
    of the header block in the decrypted stream).
  - ``ConnectionGuard`` counts, times out, evicts and drains; aiohttp's public
    ``on_response_prepare`` signal tells it when a request is answered (``answered``).

Invariants (``Limits`` holds the numbers, from ``webhook.*``):
  - At most ``max_connections`` TCP connections are open at once, TLS handshakes included.
    At the cap, the next connection is accepted only by evicting one: the connection that
    has waited longest without a request in progress and has been silent for
    ``EVICT_QUIET_S``, or one whose request has been sending its headers for
    ``EVICT_SLOW_HEADERS_S`` without finishing them (a client's headers come in one TLS
    record; a slowloris trickles them). A connection in its TLS handshake, or whose request
    has its headers, is never evicted. With nothing to evict, nothing is accepted: the
    kernel's listen backlog (``LISTEN_BACKLOG``, up to ``somaxconn``) holds the newcomers
    until a connection is answered or closed, so a burst is queued, not refused.
  - A connection with no request in progress is closed ``idle_timeout`` after its last
    answer if it sends nothing. Once it sends a byte of its next request it has
    ``header_timeout`` to complete the headers. From accept, the TLS handshake and the
    first request's headers share one ``header_timeout``.
  - A request's body must arrive within ``body_timeout`` of its headers (``Enforcer._read``).
    At most ``max_in_flight_body_bytes`` of bodies are buffered in the whole process at
    once (``BodyBudget``); a request waits for room, within its body timeout.
  - Each connection reads the socket into a buffer of ``READ_BUFFER`` bytes, not 256 KiB;
    the buffer grows (doubling, up to ``WIDE_READ_BUFFER``) only after two reads in a row
    have filled it and aiohttp has taken all of them without pausing; it is
    ``READ_BUFFER`` while aiohttp has paused reading (as wide as before once it resumes)
    and once the request is answered.
    aiohttp's header limits (``MAX_HEADERS``, ``MAX_FIELD_SIZE``) bound what a connection's
    headers can hold. So the memory of a connection is bounded, and the process's memory
    is bounded by ``max_connections`` times that plus the body budget.
  - While draining (``ConnectionGuard.drain``), every answer carries ``Connection: close``.
    A connection that has sent any part of a request (its body still arriving included) is
    not closed before that request is answered, unless its own header or body timeout or
    ``drain_timeout`` runs out first. Only idle connections are closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import hdrs, web

from holdwarden.config import WebhookConfig

log = logging.getLogger("holdwarden.webhook.connections")

# One TLS record is at most 16 KiB (plus its header and tag); two fit. asyncio's TLS layer
# reads into 256 KiB per connection, which is what made 1,000 idle connections cost 343 MB.
READ_BUFFER = 32 * 1024
# While aiohttp takes everything a connection reads without pausing (a request whose body
# has its room in the body budget: Enforcer._read raises aiohttp's chunk size to the body
# bound) and reads keep filling the buffer, the next read's buffer is twice as large, up
# to this. 32 KiB reads made a 1.5 MB review cost ~1.9x the aiohttp floor's CPU (eight
# times the socket reads, TLS reads and aiohttp data_received calls). A body waiting for
# the budget makes aiohttp pause after 32 KiB, within its second read: it stays at 32 KiB.
WIDE_READ_BUFFER = 256 * 1024
# A peer that never takes our close_notify (and the rest of what we wrote) cannot hold its
# memory for long: the TCP connection is aborted this long after the close began.
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
DRAIN_IDLE_AFTER = 0.5
# The kernel queues this many completed handshakes (TCP) the site has not accepted yet; it
# is capped by net.core.somaxconn (4096 by default since Linux 5.4). At the connection cap
# this queue is where a burst waits.
LISTEN_BACKLOG = 4096
# At the cap, a connection silent this long (its handshake done, no byte of a request
# since, or since its last answer) may be evicted for a newcomer. A connection in its
# handshake, or one whose request has just begun to arrive, is never taken: in a burst of
# new connections, evicting "the longest idle" took exactly those, and 700 of 1,000 reviews
# were reset.
EVICT_QUIET_S = 0.5
# At the cap, a connection whose request began this long ago and still has not finished
# its headers may be evicted too. A client sends its headers at once (the kube-apiserver's
# fit in one TLS record); without this, 300 slowloris connections held every slot until
# their header timeout and fresh clients' reviews waited behind them (p99 977 ms).
EVICT_SLOW_HEADERS_S = 0.5
# TLS 1.2 suites: forward secret (ECDHE) and authenticated encryption (AES-GCM, ChaCha20)
# only, so no CBC suite. TLS 1.3 suites are all AEAD and are not affected by this string.
AEAD_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# The end of an HTTP/1.1 header block.
_HEADERS_END = b"\r\n\r\n"


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
    """AEAD-only TLS 1.2 (TLS 1.3 as it is), no renegotiation, and optional mutual TLS.

    With ``client_ca_file`` the handshake fails unless the client presents a certificate
    that this CA signed (``webhook.clientCAFile``). The context's certificate can still be
    hot-reloaded: ``load_cert_chain`` keeps these settings.
    """
    context.minimum_version = max(context.minimum_version, ssl.TLSVersion.TLSv1_2)
    context.set_ciphers(AEAD_TLS12_CIPHERS)
    # No TLS 1.2 renegotiation: TLSConnection never starts one, and a client's would be a
    # handshake in the middle of a request, outside every timeout here.
    context.options |= (
        ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    )
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
        "quiet_since",
        "reading_since",
        "request_since",
        "since",
        "tail",
        "tls",
        "transport",
    )

    def __init__(self, tls: TLSConnection, now: float) -> None:
        self.tls = tls
        self.transport: asyncio.Transport | None = None  # the TCP transport
        self.since = now  # accepted, or last answered
        # When the first byte of the next request arrived (accept counts: the handshake
        # and the first request share one header timeout); None while silent.
        self.reading_since: float | None = now
        # When the first decrypted byte of the current request arrived; None until then.
        self.request_since: float | None = None
        # The request has its headers (their end was seen) and is not answered yet.
        self.busy = False
        self.closed = False  # forgotten by the guard: counted out, or never admitted
        # Since when it has been silent with its TLS handshake done (after the handshake,
        # or after its last answer); None during the handshake and once bytes of a request
        # have come. Only a connection silent for EVICT_QUIET_S may be evicted.
        self.quiet_since: float | None = None
        # The last bytes of a request's headers so far, so that an end of the header block
        # split across two reads is seen.
        self.tail = b""


class _State(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"  # aiohttp has the connection
    CLOSING = "closing"  # our close_notify is sent or queued; the TCP close is under way
    CLOSED = "closed"


class TLSConnection(asyncio.BufferedProtocol):
    """The server side of one TLS connection over a plain TCP transport.

    TLS is done with ``ssl.SSLObject`` over two ``ssl.MemoryBIO``: what the socket gives is
    written into one and decrypted, what aiohttp writes is encrypted into the other and
    written to the socket. aiohttp sees ``transport`` (a ``TLSTransport``) once the
    handshake is done, as it would see asyncio's own TLS transport. Owning the receive
    buffer is what keeps an idle connection at tens of KiB: asyncio's TLS layer allocates
    256 KiB for each, with no public setting.
    """

    def __init__(
        self, app: asyncio.BaseProtocol, context: ssl.SSLContext, guard: ConnectionGuard
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._app = app
        self._context = context
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._guard = guard
        self._tcp: asyncio.Transport | None = None
        self._state = _State.HANDSHAKE
        self._app_connected = False
        self._app_reading = True  # aiohttp has not paused reading
        self._tcp_write_paused = False
        self._buffer = bytearray(READ_BUFFER)
        self._view = memoryview(self._buffer)
        self._size_before_pause = READ_BUFFER
        self._full_reads = 0  # full reads in a row that aiohttp took without pausing
        self._shutdown_timer: asyncio.TimerHandle | None = None
        self.transport = TLSTransport(self)
        self.conn = _Conn(self, time.monotonic())

    # -- what the guard and the tests read --------------------------------------------

    @property
    def read_buffer_size(self) -> int:
        """The size of the buffer the socket is read into (and decrypted into)."""
        return len(self._buffer)

    @property
    def handshake_done(self) -> bool:
        return self._state is not _State.HANDSHAKE

    def narrow(self) -> None:
        """Back to READ_BUFFER (the request that widened the buffer is answered)."""
        self._size_before_pause = READ_BUFFER
        self._full_reads = 0
        self._resize(READ_BUFFER)

    def _resize(self, size: int) -> None:
        # A new buffer, never a resized one: the old one may still be referred to by the
        # read that called us (aiohttp pauses from within data_received); it is freed
        # when that is done.
        if size != len(self._buffer):
            self._buffer = bytearray(size)
            self._view = memoryview(self._buffer)

    # -- the TCP side (asyncio.BufferedProtocol) --------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's TCP transport has asyncio.Transport's
        # methods without being a subclass of it.
        self._tcp = transport = cast(asyncio.Transport, transport)
        self.conn.transport = transport
        if not self._guard.admit(self.conn):
            self._state = _State.CLOSED
            transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        if not conn.busy:
            if conn.reading_since is None:
                conn.reading_since = time.monotonic()
            conn.quiet_since = None  # bytes came: a request may be on its way
        self._incoming.write(self._view[:nbytes])
        if self._state is _State.HANDSHAKE:
            self._handshake()
        if self._state is _State.OPEN and self._app_reading:
            self._read()
            # aiohttp took all of two full reads of a body in a row without pausing: read
            # twice as much at once from now on. One is not enough: a body that waits for
            # the budget fills aiohttp's 32 KiB after one, and would pull a wide read in.
            # Headers never widen it: aiohttp buffers them whatever their size (within
            # its header limits), and the body after them may be one that waits.
            size = len(self._buffer)
            if nbytes == size and self._app_reading and self.conn.busy:
                self._full_reads += 1
                if self._full_reads >= 2 and size < WIDE_READ_BUFFER:
                    self._resize(min(2 * size, WIDE_READ_BUFFER))
            else:
                self._full_reads = 0

    def eof_received(self) -> bool:
        # The peer shut its side without a close_notify: nothing more can come, so close
        # (returning False makes asyncio close the TCP transport).
        if self._state is _State.OPEN:
            with contextlib.suppress(Exception):
                self._app_eof()
        return False

    def pause_writing(self) -> None:
        self._tcp_write_paused = True
        if self._app_connected:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        self._tcp_write_paused = False
        if self._app_connected:
            self._app.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._state = _State.CLOSED
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None
        self._guard.forget(self.conn)
        if self._app_connected:
            self._app_connected = False
            self._app.connection_lost(exc)

    # -- TLS ----------------------------------------------------------------------------

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except ssl.SSLError as exc:
            # A client without an acceptable certificate, or no common suite: its alert
            # goes out, then the connection closes. Clients' mistakes, so not a warning.
            log.debug("TLS handshake failed: %s", exc)
            self._flush()
            self._close_tcp()
            return
        self._flush()
        self._state = _State.OPEN
        self._guard.handshake_done(self.conn)
        self._app_connected = True
        self._app.connection_made(self.transport)
        if self._tcp_write_paused:
            self._app.pause_writing()

    def _read(self) -> None:
        """Decrypt what the BIO holds and give it to aiohttp, READ_BUFFER... at a time,
        until it is empty or aiohttp pauses reading."""
        view = self._view
        size = len(view)
        filled = 0
        eof = False
        try:
            while True:
                if filled == size:
                    self._deliver(bytes(view[:filled]))
                    filled = 0
                    if self._state is not _State.OPEN or not self._app_reading:
                        return
                # Decrypted straight into the read buffer (its bytes are in the BIO by
                # now). With a buffer, read() returns a count (typeshed says bytes).
                count: object = self._ssl.read(size - filled, view[filled:])
                assert isinstance(count, int)
                if count == 0:
                    eof = True  # the peer's close_notify
                    break
                filled += count
        except ssl.SSLWantReadError:
            pass  # the BIO holds no whole record any more
        except ssl.SSLZeroReturnError:
            eof = True
        except ssl.SSLError as exc:
            log.debug("TLS read failed: %s", exc)
            self.abort()
            return
        if filled:
            self._deliver(bytes(view[:filled]))
        self._flush()  # a TLS 1.3 KeyUpdate or a ticket may need an answer
        if eof and self._state is _State.OPEN:
            self._app_eof()
            self.close()

    def _deliver(self, data: bytes) -> None:
        conn = self.conn
        if not conn.busy:
            # The next request's headers, until their end: the guard times them and may
            # evict a connection that trickles them.
            if conn.request_since is None:
                conn.request_since = time.monotonic()
                conn.quiet_since = None  # the handshake's end may have set it this turn
            if _HEADERS_END in data or _HEADERS_END in conn.tail + data[:3]:
                conn.tail = b""
                self._guard.headers_complete(conn)
            else:
                conn.tail = (conn.tail + data[-3:])[-3:]
        app = self._app
        assert isinstance(app, asyncio.Protocol)
        app.data_received(data)

    def _app_eof(self) -> None:
        app = self._app
        if isinstance(app, asyncio.Protocol | asyncio.BufferedProtocol):
            app.eof_received()

    def _flush(self) -> None:
        if self._outgoing.pending and self._tcp is not None and not self._tcp.is_closing():
            self._tcp.write(self._outgoing.read())

    def _close_tcp(self) -> None:
        tcp = self._tcp
        if tcp is None or tcp.is_closing():
            return
        # close() sends what is buffered first; a peer that does not read it gets
        # TLS_SHUTDOWN_TIMEOUT, then the connection is aborted.
        tcp.close()
        self._shutdown_timer = self._loop.call_later(TLS_SHUTDOWN_TIMEOUT, tcp.abort)

    # -- the application side (what TLSTransport forwards) ------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._state is not _State.OPEN or not data:
            return
        try:
            self._ssl.write(data)
        except ssl.SSLError as exc:
            log.debug("TLS write failed: %s", exc)
            self.abort()
            return
        self._flush()

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._state is not _State.OPEN:
            return
        try:
            for data in chunks:
                if data:
                    self._ssl.write(data)
        except ssl.SSLError as exc:
            log.debug("TLS write failed: %s", exc)
            self.abort()
            return
        self._flush()  # one TCP write for all of them

    def close(self) -> None:
        """close_notify, then close the TCP connection once what we wrote is sent."""
        if self._state is _State.HANDSHAKE:
            self.abort()  # nothing to say goodbye to
            return
        if self._state is not _State.OPEN:
            return
        self._state = _State.CLOSING
        # unwrap() queues our close_notify and wants the peer's; we do not wait for it.
        with contextlib.suppress(ssl.SSLError):
            self._ssl.unwrap()
        if self._outgoing.pending and self._tcp is not None and not self._tcp.is_closing():
            self._tcp.write(self._outgoing.read())
        self._close_tcp()

    def abort(self) -> None:
        self._state = _State.CLOSED
        if self._tcp is not None:
            self._tcp.abort()

    def is_closing(self) -> bool:
        return self._state is not _State.OPEN

    def pause_reading(self) -> None:
        if self._app_reading:
            self._app_reading = False
            # aiohttp has as much as it wants: stop reading the socket, and hold no wide
            # buffer meanwhile (a body waiting for the budget may wait for seconds).
            self._size_before_pause = len(self._buffer)
            self._resize(READ_BUFFER)
            if self._tcp is not None and not self._tcp.is_closing():
                self._tcp.pause_reading()

    def resume_reading(self) -> None:
        if not self._app_reading:
            self._app_reading = True
            # aiohttp resumes when its handler reads the body: go on as wide as before.
            self._resize(self._size_before_pause)
            if self._tcp is not None and not self._tcp.is_closing():
                self._tcp.resume_reading()
            # Records still in the BIO are decrypted on the next turn of the loop, not
            # inside aiohttp's call (it resumes from within its own read).
            self._loop.call_soon(self._read_pending)

    def _read_pending(self) -> None:
        if self._state is _State.OPEN and self._app_reading:
            self._read()

    def is_reading(self) -> bool:
        return self._state is _State.OPEN and self._app_reading

    def get_write_buffer_size(self) -> int:
        tcp = 0 if self._tcp is None else self._tcp.get_write_buffer_size()
        return tcp + self._outgoing.pending

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._tcp is not None:
            self._tcp.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0) if self._tcp is None else self._tcp.get_write_buffer_limits()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sslcontext":
            return self._context
        if name == "ssl_object":
            return self._ssl
        if name == "peercert":
            return self._ssl.getpeercert()
        if name == "cipher":
            return self._ssl.cipher()
        if name == "compression":
            return self._ssl.compression()
        return default if self._tcp is None else self._tcp.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._app = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._app


class TLSTransport(asyncio.Transport):
    """What aiohttp sees of a ``TLSConnection``: an ordinary asyncio transport."""

    def __init__(self, tls: TLSConnection) -> None:
        super().__init__()
        self.tls = tls

    @property
    def conn(self) -> _Conn:
        return self.tls.conn

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.tls.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.tls.writelines(list_of_data)

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot half-close")

    def close(self) -> None:
        self.tls.close()

    def abort(self) -> None:
        self.tls.abort()

    def is_closing(self) -> bool:
        return self.tls.is_closing()

    def pause_reading(self) -> None:
        self.tls.pause_reading()

    def resume_reading(self) -> None:
        self.tls.resume_reading()

    def is_reading(self) -> bool:
        return self.tls.is_reading()

    def get_write_buffer_size(self) -> int:
        return self.tls.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.tls.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.tls.get_write_buffer_limits()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.tls.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.tls.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.tls.get_protocol()


# --- the guard -------------------------------------------------------------------------------


class ConnectionGuard:
    """Counts, times out, evicts and drains the connections of one TLS site."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # Connections with no request in progress, the one answered longest ago first:
        # eviction takes the first that qualifies, and a drain closes them.
        self._idle: collections.OrderedDict[_Conn, None] = collections.OrderedDict()
        self._open: dict[_Conn, None] = {}
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

    @staticmethod
    def _evictable_at(conn: _Conn) -> float | None:
        """When ``conn`` may be evicted, if nothing changes: EVICT_QUIET_S into its
        silence, or EVICT_SLOW_HEADERS_S into headers it has not finished."""
        if conn.busy or conn.closed:
            return None
        if conn.quiet_since is not None:
            return conn.quiet_since + EVICT_QUIET_S
        if conn.request_since is not None:
            return conn.request_since + EVICT_SLOW_HEADERS_S
        return None  # in its TLS handshake

    def _evictable(self, now: float) -> _Conn | None:
        """The longest-idle connection that may be evicted now, if any."""
        for conn in self._idle:
            at = self._evictable_at(conn)
            if at is not None and at <= now:
                return conn
        return None

    def _next_evictable_in(self, now: float) -> float | None:
        """Seconds until some idle connection may be evicted."""
        times = [at for conn in self._idle if (at := self._evictable_at(conn)) is not None]
        return max(0.0, min(times) - now) if times else None

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
            # Until a connection goes away or idles, or the earliest candidate for
            # eviction qualifies; with no candidate, at most the header timeout (by then
            # the sweeper has closed, or the server answered, whatever held the slots).
            # Not woken when a connection becomes a candidate: taking connections of a
            # burst the moment they qualify evicted more of those whose client was slow.
            wait = self._next_evictable_in(time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(
                    wait if wait is not None else self.limits.header_timeout
                ):
                    await self._room.wait()

    async def reserve(self) -> None:
        """A slot for the connection just accepted, held until its ``admit``: at the cap
        an evictable connection is evicted now; with none to spare, wait for room.
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
        if self._reserved > 0:
            self._reserved -= 1
        self._made_room()

    def _made_room(self) -> None:
        if self._room is not None:
            self._room.set()

    def admit(self, conn: _Conn) -> bool:
        """A new connection: count it, in the slot ``reserve`` kept for it (the site's
        accept loop). Without one, only under the cap."""
        if self._reserved > 0:
            # Draining too: until the listener closes, a newcomer is served (and told to
            # go elsewhere by Connection: close on its answer).
            self._reserved -= 1
        elif self.count >= self.limits.max_connections:
            self.rejected += 1
            conn.closed = True
            if self.rejected == 1 or self.rejected % 1000 == 0:
                log.warning(
                    "connection refused: at the connection cap",
                    extra={"fields": {"maxConnections": self.limits.max_connections}},
                )
            return False
        self.count += 1
        self._idle[conn] = None
        self._open[conn] = None
        return True

    def handshake_done(self, conn: _Conn) -> None:
        if not conn.busy and not conn.closed and conn.request_since is None:
            conn.quiet_since = time.monotonic()

    def headers_complete(self, conn: _Conn) -> None:
        """The request on ``conn`` has its headers: in progress until answered."""
        conn.busy = True
        conn.quiet_since = None
        self._idle.pop(conn, None)

    def answered(self, conn: _Conn) -> None:
        """The request on ``conn`` is answered (its response is being written)."""
        if conn.closed:
            return
        conn.busy = False
        conn.since = time.monotonic()
        conn.reading_since = None
        conn.request_since = None
        conn.tail = b""
        conn.quiet_since = conn.since
        conn.tls.narrow()
        self._idle[conn] = None
        self._idle.move_to_end(conn)  # now the most recently answered
        if self.closing and self._changed is not None:
            self._changed.set()
        self._made_room()

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """aiohttp's ``on_response_prepare`` signal: every answer, right before its
        headers are written. While draining, the answer closes its connection."""
        transport = request.transport
        if isinstance(transport, TLSTransport):
            self.answered(transport.conn)
        if self.closing:
            # aiohttp has computed the headers by now (the signal is for changing them):
            # Connection: close for the client, force_close so aiohttp closes after it.
            response.force_close()
            response.headers[hdrs.CONNECTION] = "close"

    @property
    def in_progress(self) -> int:
        """Connections with a request being read, handled or answered."""
        return sum(1 for conn in self._open if conn.busy and not conn.closed)

    def read_buffer_sizes(self) -> list[int]:
        """Each open connection's read buffer in bytes (metrics and tests)."""
        return [conn.tls.read_buffer_size for conn in self._open if not conn.closed]

    def forget(self, conn: _Conn) -> None:
        """The connection is gone (or is being aborted): count it out, once."""
        if conn.closed:
            return
        conn.closed = True
        self.count -= 1
        self._idle.pop(conn, None)
        self._open.pop(conn, None)
        if self._changed is not None:
            self._changed.set()
        self._made_room()

    def _abort(self, conn: _Conn) -> None:
        self.forget(conn)
        if conn.transport is not None:
            conn.transport.abort()

    def _close_idle(self, conn: _Conn) -> None:
        # A clean close (TLS close_notify, then FIN) once the handshake is done; a
        # connection still in its handshake has nothing to say goodbye to.
        if conn.tls.handshake_done:
            self._idle.pop(conn, None)
            conn.tls.close()
        else:
            self._abort(conn)

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
            elif now - conn.since > (DRAIN_IDLE_AFTER if self.closing else limits.idle_timeout):
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
        left = [conn for conn in self._open if not conn.closed]
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
    """A TLS site whose connections are ``TLSConnection`` under ``guard``.

    It listens and accepts itself (``loop.sock_accept``): one connection at a time, and
    only when the guard has room, where ``loop.create_server`` would accept whatever
    arrives. Each accepted socket becomes a plain TCP connection
    (``loop.connect_accepted_socket``) whose protocol does TLS.
    """

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
        # aiohttp's own TLS setting stays unset: this site does TLS itself.
        super().__init__(runner, backlog=backlog)
        self._hw_runner = runner
        self._hw_context = ssl_context
        self._hw_backlog = backlog
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
        """Listen, and accept in a loop of our own."""
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._hw_runner.server
        assert server is not None, "the runner is set up first"
        context = self._hw_context
        guard = self._guard

        def connection() -> TLSConnection:
            return TLSConnection(server(), context, guard)

        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=self._hw_backlog
        )
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept_forever(loop, listener, connection))

    async def _accept_forever(
        self,
        loop: asyncio.AbstractEventLoop,
        listener: socket.socket,
        factory: Callable[[], TLSConnection],
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
