"""The sync adapter: the operations of the core it holds, driven over the kubernetes client.

``Adapter`` holds a ``holdwarden.adapter.core.Core`` and runs the steps of each operation it
hands out (``holdwarden.adapter.operations``) one after another on the calling thread: a
request goes out through the adapter's own ``kubernetes.client.ApiClient`` (a copy of the
caller's configuration with urllib3's retries off, so no request is re-sent behind its back
and the caller's client is never modified), and urllib3's failures are sorted into the core's
three transport kinds. Everything else (deadlines, timeouts, retries, decisions, error classes
and messages) is the core's, shared with ``holdwarden.adapter.aio.AsyncAdapter``.

Why the kubernetes client and not the generated API methods: the read-to-write gap is what
a busy node stretches (issue 11). The generated methods validate every argument with
pydantic and walk the whole body to serialize it; here a read is one ``msgspec`` decode of
the response bytes and a write's body is the small merge patch. Authentication, default
headers (impersonation) and the transport are the client's own (``param_serialize`` /
``call_api``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import copy
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal, TypeVar, cast

import msgspec
import urllib3
from kubernetes import client as k8s

from holdwarden import kubeclient
from holdwarden.adapter.core import Core, CoreView
from holdwarden.adapter.operations.context import CALL_BOUND_MARGIN, Clock, Context
from holdwarden.adapter.operations.start import START_POLL_INTERVAL_S
from holdwarden.adapter.operations.write_loop import MAX_RETRIES
from holdwarden.adapter.steps import (
    FIELD_MANAGER,
    WRITE_VERB,
    ApiStatusError,
    BeforeRequest,
    ConnectionLost,
    DriverError,
    NextChange,
    NoAnswer,
    NotConnected,
    OpenWatch,
    Operation,
    Request,
    RequestHook,
    Send,
    SendAll,
    Stepper,
    WatchFeed,
    WatchView,
)
from holdwarden.adapter.types import CallMeta, Observation, PreflightResult, Ref, ReleaseResult
from holdwarden.config import Config

__all__ = [
    "CALL_BOUND_MARGIN",
    "FIELD_MANAGER",
    "MAX_RETRIES",
    "START_POLL_INTERVAL_S",
    "WRITE_VERB",
    "Adapter",
    "Request",
]

T = TypeVar("T")

WORKER_THREADS = 4
"""Threads that send the extra requests of a ``SendAll`` (a Kueue-mode read's second GET);
made on first use, shared by the adapter's calls, ended by ``close()``."""


class Adapter(CoreView):
    """Start, Open, Hold, Release, Observe and Preflight on TrainJobs, blocking.

    ``api_client``: a ``kubernetes.client.ApiClient`` whose configuration is copied
    (default: in-cluster config, else the kubeconfig). ``clock`` and ``lazy_preflight``
    are the held ``holdwarden.adapter.core.Core``'s; ``before_request`` is called with each
    request just before its deadline check (tests use it to interleave other writers or
    move the clock between a read and a write). Thread-safe for concurrent calls.
    """

    def __init__(
        self,
        config: Config,
        api_client: k8s.ApiClient | None = None,
        *,
        clock: Clock | None = None,
        before_request: RequestHook | None = None,
        lazy_preflight: Literal["full", "access"] = "full",
    ) -> None:
        # The core is held: it hands out the operations this driver runs, and keeps the
        # state they share (caches, request log); the hook runs here, on BeforeRequest.
        self._core = Core(Context(config, clock=clock, lazy_preflight=lazy_preflight))
        self._hook = before_request
        self._lock = threading.Lock()
        # The adapter's own client, built from a copy of the caller's configuration: the
        # caller's ApiClient is never modified (its retries, its pool) and stays the
        # caller's to use and close; ``close()`` closes only this one.
        self._api = _own_client(api_client)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def api_client(self) -> k8s.ApiClient:
        """The adapter's own client (a copy of the caller's configuration, transport retries
        off). Read it, e.g. to count requests on the wire; do not reconfigure it."""
        return self._api

    def close(self) -> None:
        """Close the adapter's own connections (never the caller's client). Idempotent; the
        adapter must not be used afterwards."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._api.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> Adapter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- the contract ----------------------------------------------------------------

    def start(self, trainjob: dict[str, Any], meta: CallMeta) -> Ref:
        """Create the TrainJob; in Kueue mode wait (bounded by the deadline) for its
        Workload, so every started object has one. On timeout the TrainJob stays created."""
        return self._drive(self._core.start(trainjob, meta))

    def open(self, ref: Ref, meta: CallMeta) -> None:
        """Mark the TrainJob opened (plain mode: and run it if it waits at its start gate)."""
        self._drive(self._core.open(ref, meta))

    def hold(self, ref: Ref, meta: CallMeta, reason: str) -> None:
        """Place hold ``meta.instance`` (see the spec's conflict rules)."""
        self._drive(self._core.hold(ref, meta, reason))

    def release(self, ref: Ref, meta: CallMeta) -> ReleaseResult:
        """Lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force.
        Returns what the caller must still act on (``ReleaseResult.warnings``)."""
        return self._drive(self._core.release(ref, meta))

    def observe(self, ref: Ref) -> Observation:
        """Classify the TrainJob (and its Workload in Kueue mode). Sends no writes."""
        return self._drive(self._core.observe(ref))

    def preflight(self, namespace: str = "default", *, refresh: bool = True) -> PreflightResult:
        """Probe what the adapter can do in ``namespace`` (every probe, dry-run creates
        included) and cache it for Hold/Release. ``refresh=False`` returns the cached result
        when there is one (which may come from the lighter lazy check)."""
        return self._drive(self._core.preflight(namespace, refresh))

    # ---- the driver ------------------------------------------------------------------

    def _drive(self, operation: Operation[T]) -> T:
        """Run ``operation``'s steps on this thread until it returns or raises.

        A transport failure of a ``Send`` or ``OpenWatch`` is thrown into the operation
        (which maps it); an exception of the hook propagates to the caller as it is. Every
        watch the operation opened is closed when it ends, however it ends.
        """
        watches: list[_SyncWatch] = []
        try:
            with Stepper(operation) as run:
                while (step := run.next()) is not None:
                    if isinstance(step, Send):
                        try:
                            run.reply(self._perform(step))
                        except DriverError as exc:
                            run.fail(exc)
                    elif isinstance(step, BeforeRequest):
                        if self._hook is not None:
                            self._hook(step.req)
                    elif isinstance(step, OpenWatch):
                        try:
                            run.reply(self._open_stream(step, watches))
                        except DriverError as exc:
                            run.fail(exc)
                    elif isinstance(step, NextChange):
                        run.reply(cast(_SyncWatch, step.watch).next_change(step.wait))
                    elif isinstance(step, SendAll):
                        run.reply(self._perform_all(step))
                    else:
                        time.sleep(step.seconds)
                return cast(T, run.result)
        finally:
            for watch in watches:
                watch.close()

    def _perform_all(self, step: SendAll) -> tuple[Any, ...]:
        """Each request of ``step`` at once: all but the first on the adapter's worker
        threads, the first on this thread. A worker runs in a copy of this thread's
        context (contextvars), as ``asyncio.to_thread`` does, so what identifies the call
        there (tracing, a test's recorder) follows its requests."""
        first, *others = step.sends  # the core never sends an empty SendAll
        pending = [
            self._workers().submit(contextvars.copy_context().run, self._perform_caught, send)
            for send in others
        ]
        answer = self._perform_caught(first)
        # Each worker's request is bounded by its own timeout: result() cannot hang.
        return (answer, *(future.result() for future in pending))

    def _perform_caught(self, step: Send) -> Any:
        try:
            return self._perform(step)
        except DriverError as exc:
            return exc

    def _workers(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=WORKER_THREADS, thread_name_prefix="holdwarden-adapter"
                )
            return self._pool

    def _open_stream(self, step: OpenWatch, watches: list[_SyncWatch]) -> _SyncWatch:
        """Open the watch and wait (``step.timeout``) for its first event."""
        http = step.http
        request = self._api.param_serialize(
            http.method,
            http.path,
            query_params=list(http.query) or None,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        opened = time.monotonic()
        with _transport_errors():
            # Both timeouts short: the headers must come within step.timeout too (an
            # intermediary that buffers a watch sends them only when it ends).
            response = self._api.call_api(*request, _request_timeout=(step.timeout, step.timeout))
        if 200 <= response.status <= 299:
            # From the headers on, events may be far apart: the stream's own read timeout.
            _set_read_timeout(response.response, step.lifetime)
        if not 200 <= response.status <= 299:
            with _transport_errors():
                data = response.read()  # type: ignore[no-untyped-call]
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            raise ApiStatusError(response.status, str(response.reason or ""), text)
        watch = _SyncWatch(response.response)
        watches.append(watch)
        watch.wait_first(max(0.0, step.timeout - (time.monotonic() - opened)))
        return watch

    def _perform(self, step: Send) -> Any:
        """One request through the adapter's client, without the generated API layer; a
        non-2xx answer raises ``ApiStatusError``, a transport failure its core kind."""
        http = step.http
        request = self._api.param_serialize(
            http.method,
            http.path,
            query_params=list(http.query) or None,
            header_params={"Accept": "application/json", "Content-Type": http.content_type},
            body=http.body,
            auth_settings=["BearerToken"],
        )
        with _transport_errors():
            response = self._api.call_api(*request, _request_timeout=step.timeout)
            data = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            raise ApiStatusError(response.status, str(response.reason or ""), text)
        if not http.decode:
            return None
        return msgspec.json.decode(data)


def _set_read_timeout(response: urllib3.BaseHTTPResponse, seconds: float) -> None:
    """The read timeout of the socket under a streamed ``response`` (its headers read)."""
    connection = getattr(response, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is None:
        raise ConnectionLost("the watch's connection is gone before its first event")
    sock.settimeout(seconds)


@contextlib.contextmanager
def _transport_errors() -> Iterator[None]:
    """urllib3's failures, sorted into the core's three transport kinds."""
    try:
        yield
    except (
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.ConnectTimeoutError,
    ) as exc:
        # Before urllib3's TimeoutError: in urllib3 2.x NewConnectionError (refused,
        # unresolvable) IS a ConnectTimeoutError, a TimeoutError. Either way no
        # connection was made, so no byte of this request reached the API server.
        raise NotConnected(_connect_failure(exc)) from exc
    except (urllib3.exceptions.TimeoutError, TimeoutError) as exc:
        raise NoAnswer(str(exc)) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ConnectionLost(str(exc)) from exc


class _SyncWatch:
    """One open watch stream, read by a thread of its own into a ``WatchFeed``.

    The thread only parses; the operation's thread waits on the condition. ``close()``
    shuts the socket down (which ends a read blocked in the thread) and joins the thread,
    so a watch never outlives the call that opened it.
    """

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._feed = WatchFeed()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="holdwarden-watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        reason = "the API server closed the watch"
        try:
            for chunk in self._response.stream(64 * 1024, decode_content=True):
                with self._changed:
                    if self._feed.feed(chunk):
                        self._changed.notify_all()
                    if self._feed.ended is not None:
                        break
        except Exception as exc:  # any end of the stream just ends the feed
            reason = f"the watch stream broke: {exc!r}"
        with self._changed:
            self._feed.end(reason)
            self._changed.notify_all()

    def wait_first(self, timeout: float) -> None:
        """Return once the first event came; ``NoAnswer``/``ConnectionLost`` otherwise."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._feed.events > 0 or self._feed.ended is not None, timeout
            )
            if self._feed.events == 0:
                if self._feed.ended is None:
                    raise NoAnswer(f"the watch sent no event within {timeout:.3f}s")
                raise ConnectionLost(self._feed.ended)

    def next_change(self, wait: float) -> WatchView:
        with self._changed:
            seen = self._feed.events
            fresh = self._changed.wait_for(
                lambda: self._feed.events > seen or self._feed.ended is not None, wait
            )
            return self._feed.view(fresh and self._feed.events > seen)

    def close(self) -> None:
        """End the stream, then the reader, then the response, in that order; never raises.

        Why the order: the reader thread, once ``shutdown()`` breaks its read, closes the
        response itself (urllib3's error path), and a ``close()`` from this thread at the
        same moment raised ``ValueError: I/O operation on closed file`` out of a call whose
        write had already landed (seen under a 50 Hz writer on a busy node). So the reader
        is joined first, and a close that still fails is only cleanup: the call's outcome
        is already decided."""
        with contextlib.suppress(Exception):  # already closed: nothing to shut down
            self._response.shutdown()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # the reader closed it, or is stuck closing it
            self._response.close()


def _own_client(api_client: k8s.ApiClient | None) -> k8s.ApiClient:
    """A new ApiClient from a copy of ``api_client``'s configuration (default: in-cluster,
    else the kubeconfig), with transport retries off.

    urllib3 re-sends idempotent methods (GET and PUT) on its own by default, and client-go
    style read retries re-send GETs: a re-sent PUT could go out after the deadline check, so
    the adapter's client never retries in the transport. The copy keeps what identifies the
    caller (credentials, TLS, proxy, the refresh hook, default headers such as
    impersonation) and shares nothing mutable with it: the caller's client is not touched.
    """
    source = api_client if api_client is not None else kubeclient.api_client()
    configuration = copy.deepcopy(source.configuration)
    configuration.retries = False
    configuration.client_go_retries = False
    own = k8s.ApiClient(configuration)
    own.default_headers.update(source.default_headers)
    own.cookie = source.cookie
    if api_client is None:
        source.close()  # type: ignore[no-untyped-call]  # ours, only a template
    return own


def _connect_failure(exc: Exception) -> str:
    """What went wrong while connecting, in words (refused, timed out, name unknown)."""
    if isinstance(exc, urllib3.exceptions.NameResolutionError):
        return f"the API server's name does not resolve: {exc}"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"connection refused or failed: {exc}"
    return f"no connection within the request's timeout: {exc}"
