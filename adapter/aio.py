"""The asyncio adapter: the operations of the core it holds, driven over aiohttp.

``AsyncAdapter`` has the sync ``Adapter``'s contract exactly (the same operations, decisions,
deadline checks, retries, error classes and messages: they are the held
``holdwarden.adapter.core.Core``'s, ``holdwarden.adapter.operations``), with
``async`` methods. Only the transport differs: an ``aiohttp.ClientSession`` of the adapter's
own, built from a copy of a ``kubernetes.client`` configuration (so kubeconfig, in-cluster
config, client certificates, bearer tokens and their refresh hook, and impersonation
headers work as they do for the sync adapter).

Why aiohttp and not an asyncio Kubernetes client (kubernetes_asyncio): the core speaks plain
JSON over HTTP (a GET, a merge PATCH, a POST), so no generated client is needed; aiohttp is
already the enforcer's HTTP stack; and a second generated client would bring a second copy
of every model and its own version skew with ``kubernetes``. Credentials are still loaded by
the ``kubernetes`` package, so both adapters authenticate the same way.

How a failure is sorted (what the core needs to say whether a request can still land):
a request whose headers were never written (the connection was refused, did not resolve,
failed TLS, or no connection came within the timeout) is ``NotConnected``; once the
headers were written, a timeout is ``NoAnswer`` and a broken connection ``ConnectionLost``.
aiohttp's ``on_request_headers_sent`` trace signal marks the moment. aiohttp re-sends an
idempotent request (here only GETs: the adapter writes with PATCH and POST) once when a
kept-alive connection turns out closed, inside the same timeout; so no request goes out
after its deadline check's bound, and no write is ever re-sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import ssl
import time
from collections.abc import Iterator
from typing import Any, Literal, TypeVar, cast

import aiohttp
import msgspec
from kubernetes import client as k8s

from holdwarden import kubeclient
from holdwarden.adapter.core import Core, CoreView
from holdwarden.adapter.operations.context import Clock, Context
from holdwarden.adapter.steps import (
    ApiStatusError,
    BeforeRequest,
    ConnectionLost,
    DriverError,
    NextChange,
    NoAnswer,
    NotConnected,
    OpenWatch,
    Operation,
    RequestHook,
    Send,
    SendAll,
    Stepper,
    WatchFeed,
    WatchView,
)
from holdwarden.adapter.types import CallMeta, Observation, PreflightResult, Ref, ReleaseResult
from holdwarden.config import Config

T = TypeVar("T")

DEFAULT_CONNECTION_LIMIT = 16
"""Connections the adapter keeps to the API server at most; more concurrent calls wait
for one (inside their request's timeout)."""

USER_AGENT = "holdwarden-adapter (asyncio)"


class _Progress:
    """How far one request got: set by the trace signal once its headers are written."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


async def _headers_sent(
    session: aiohttp.ClientSession,
    context: Any,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    progress = context.trace_request_ctx
    if isinstance(progress, _Progress):
        progress.sent = True


def _ssl_context(configuration: k8s.Configuration) -> ssl.SSLContext:
    """The TLS settings of ``configuration`` (CA, client certificate, verification)."""
    if not configuration.verify_ssl:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(
            cafile=configuration.ssl_ca_cert or None,
            cadata=getattr(configuration, "ca_cert_data", None) or None,
        )
        if configuration.assert_hostname is False:
            context.check_hostname = False
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


class AsyncAdapter(CoreView):
    """Start, Open, Hold, Release, Observe and Preflight on TrainJobs, as coroutines.

    ``api_client``: a ``kubernetes.client.ApiClient`` whose configuration and default
    headers are copied, never used or modified (default: in-cluster config, else the
    kubeconfig). ``connection_limit``: connections kept to the API server at most. The
    other arguments are the sync ``Adapter``'s; a ``before_request`` hook may be a coroutine
    function (it is awaited).

    Use it as ``async with AsyncAdapter(config) as adapter:`` or call ``aclose()``. Its
    connections belong to the event loop of its first call; use it from that loop only.
    Many calls may run concurrently. Cancelling a call stops it at once, but a request it
    already sent may still land within ``call_bound`` after the call's deadline, as after
    any timeout.
    """

    def __init__(
        self,
        config: Config,
        api_client: k8s.ApiClient | None = None,
        *,
        clock: Clock | None = None,
        before_request: RequestHook | None = None,
        lazy_preflight: Literal["full", "access"] = "full",
        connection_limit: int = DEFAULT_CONNECTION_LIMIT,
    ) -> None:
        # The core is held: it hands out the operations this driver runs, and keeps the
        # state they share (caches, request log); the hook runs here, on BeforeRequest.
        self._core = Core(Context(config, clock=clock, lazy_preflight=lazy_preflight))
        self._hook = before_request
        if connection_limit < 1:
            raise ValueError(f"connection_limit must be at least 1, got {connection_limit}")
        source = api_client if api_client is not None else kubeclient.api_client()
        self._configuration = copy.deepcopy(source.configuration)
        self._headers = {
            **{str(k): str(v) for k, v in source.default_headers.items()},
            "User-Agent": USER_AGENT,
            "Accept": "application/json",
        }
        if api_client is None:
            source.close()  # type: ignore[no-untyped-call]  # ours, only a template
        self._base = str(self._configuration.host).rstrip("/")
        self._ssl = _ssl_context(self._configuration)
        self._proxy = self._configuration.proxy or None
        self._server_hostname = self._configuration.tls_server_name or None
        self._connection_limit = connection_limit
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.trace_configs: list[aiohttp.TraceConfig] = []
        """Extra aiohttp trace configs for the session (set before the first call); tests
        record and delay requests on the wire with them."""

    async def __aenter__(self) -> AsyncAdapter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the adapter's connections. Idempotent; the adapter must not be used after."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # ---- the contract ----------------------------------------------------------------

    async def start(self, trainjob: dict[str, Any], meta: CallMeta) -> Ref:
        """Create the TrainJob; in Kueue mode wait (bounded by the deadline) for its
        Workload, so every started object has one. On timeout the TrainJob stays created."""
        return await self._drive(self._core.start(trainjob, meta))

    async def open(self, ref: Ref, meta: CallMeta) -> None:
        """Mark the TrainJob opened (plain mode: and run it if it waits at its start gate)."""
        await self._drive(self._core.open(ref, meta))

    async def hold(self, ref: Ref, meta: CallMeta, reason: str) -> None:
        """Place hold ``meta.instance`` (see the spec's conflict rules)."""
        await self._drive(self._core.hold(ref, meta, reason))

    async def release(self, ref: Ref, meta: CallMeta) -> ReleaseResult:
        """Lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force.
        Returns what the caller must still act on (``ReleaseResult.warnings``)."""
        return await self._drive(self._core.release(ref, meta))

    async def observe(self, ref: Ref) -> Observation:
        """Classify the TrainJob (and its Workload in Kueue mode). Sends no writes."""
        return await self._drive(self._core.observe(ref))

    async def preflight(
        self, namespace: str = "default", *, refresh: bool = True
    ) -> PreflightResult:
        """Probe what the adapter can do in ``namespace`` (every probe, dry-run creates
        included) and cache it for Hold/Release. ``refresh=False`` returns the cached result
        when there is one (which may come from the lighter lazy check)."""
        return await self._drive(self._core.preflight(namespace, refresh))

    # ---- the driver ------------------------------------------------------------------

    async def _drive(self, operation: Operation[T]) -> T:
        """Run ``operation``'s steps on this event loop until it returns or raises (the
        sync driver's loop, with awaits). Every watch it opened is closed when it ends."""
        watches: list[_AsyncWatch] = []
        try:
            with Stepper(operation) as run:
                while (step := run.next()) is not None:
                    if isinstance(step, Send):
                        try:
                            run.reply(await self._perform(step))
                        except DriverError as exc:
                            run.fail(exc)
                    elif isinstance(step, BeforeRequest):
                        if self._hook is not None:
                            answer = self._hook(step.req)
                            if inspect.isawaitable(answer):
                                await answer
                    elif isinstance(step, OpenWatch):
                        try:
                            run.reply(await self._open_stream(step, watches))
                        except DriverError as exc:
                            run.fail(exc)
                    elif isinstance(step, NextChange):
                        run.reply(await cast(_AsyncWatch, step.watch).next_change(step.wait))
                    elif isinstance(step, SendAll):
                        run.reply(
                            tuple(await asyncio.gather(*map(self._perform_caught, step.sends)))
                        )
                    else:
                        await asyncio.sleep(step.seconds)
                return cast(T, run.result)
        finally:
            for watch in watches:
                await watch.close()

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the AsyncAdapter is closed")
        loop = asyncio.get_running_loop()
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_headers_sent)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connection_limit, ssl=self._ssl),
                headers=self._headers,
                trace_configs=[trace, *self.trace_configs],
            )
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "this AsyncAdapter's connections belong to another event loop; make one "
                "adapter per loop"
            )
        return self._session

    def _auth_headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Content-Type": content_type} if content_type else {}
        for auth in self._configuration.auth_settings().values():
            # Read per request: the configuration's refresh hook renews expiring tokens.
            if auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"])] = str(auth["value"])
        return headers

    async def _perform(self, step: Send) -> Any:
        """One request on the adapter's session; a non-2xx answer raises
        ``ApiStatusError``, a transport failure its core kind (see the module)."""
        session = self._session_for_loop()
        http = step.http
        data = msgspec.json.encode(http.body) if http.body is not None else None
        progress = _Progress()
        with _transport_errors(progress, step.timeout):
            async with asyncio.timeout(step.timeout):
                async with session.request(
                    http.method,
                    self._base + http.path,
                    params=list(http.query),
                    data=data,
                    headers=self._auth_headers(http.content_type),
                    proxy=self._proxy,
                    server_hostname=self._server_hostname,
                    timeout=aiohttp.ClientTimeout(total=step.timeout),
                    trace_request_ctx=progress,
                ) as response:
                    body = await response.read()
                    status, reason = response.status, str(response.reason or "")
        if not 200 <= status <= 299:
            raise ApiStatusError(status, reason, body.decode("utf-8", "replace"))
        if not http.decode:
            return None
        return msgspec.json.decode(body)

    async def _perform_caught(self, step: Send) -> Any:
        try:
            return await self._perform(step)
        except DriverError as exc:
            return exc

    async def _open_stream(self, step: OpenWatch, watches: list[_AsyncWatch]) -> _AsyncWatch:
        """Open the watch and wait (``step.timeout``) for its first event."""
        session = self._session_for_loop()
        http = step.http
        progress = _Progress()
        opened = time.monotonic()
        with _transport_errors(progress, step.timeout):
            async with asyncio.timeout(step.timeout):
                response = await session.request(
                    http.method,
                    self._base + http.path,
                    params=list(http.query),
                    headers=self._auth_headers(None),
                    proxy=self._proxy,
                    server_hostname=self._server_hostname,
                    timeout=aiohttp.ClientTimeout(
                        total=None, sock_connect=step.timeout, sock_read=step.lifetime
                    ),
                    trace_request_ctx=progress,
                )
            if not 200 <= response.status <= 299:
                async with response:
                    async with asyncio.timeout(step.timeout):
                        body = await response.read()
                raise ApiStatusError(
                    response.status, str(response.reason or ""), body.decode("utf-8", "replace")
                )
        watch = _AsyncWatch(response)
        watches.append(watch)
        # One budget for the headers and the first event (WATCH_OPEN_S).
        await watch.wait_first(max(0.0, step.timeout - (time.monotonic() - opened)))
        return watch


@contextlib.contextmanager
def _transport_errors(progress: _Progress, timeout: float) -> Iterator[None]:
    """aiohttp's failures, sorted into the core's three transport kinds by whether the
    request's headers were written (``progress.sent``)."""
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise NotConnected(f"connection refused or failed: {exc}") from exc
    except TimeoutError as exc:
        if not progress.sent:
            raise NotConnected(
                f"no connection within the request's timeout ({timeout:.3f}s)"
            ) from exc
        raise NoAnswer(f"no answer within {timeout:.3f}s") from exc
    except (aiohttp.ClientError, OSError) as exc:
        if not progress.sent:
            raise NotConnected(f"the request could not be sent: {exc!r}") from exc
        raise ConnectionLost(repr(exc)) from exc


class _AsyncWatch:
    """One open watch stream, read by a task of its own into a ``WatchFeed``; ``close()``
    cancels the task and closes the response, so a watch never outlives its call."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._feed = WatchFeed()
        self._changed = asyncio.Condition()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        reason = "the API server closed the watch"
        try:
            async for chunk in self._response.content.iter_any():
                async with self._changed:
                    if self._feed.feed(chunk):
                        self._changed.notify_all()
                    if self._feed.ended is not None:
                        break
        except asyncio.CancelledError:
            reason = "closed"
            raise
        except Exception as exc:  # any end of the stream just ends the feed
            reason = f"the watch stream broke: {exc!r}"
        finally:
            self._feed.end(reason)
            if not self._changed.locked():
                async with self._changed:
                    self._changed.notify_all()

    async def wait_first(self, timeout: float) -> None:
        """Return once the first event came; ``NoAnswer``/``ConnectionLost`` otherwise."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(
                        lambda: self._feed.events > 0 or self._feed.ended is not None
                    )
            except TimeoutError:
                pass
            if self._feed.events == 0:
                if self._feed.ended is None:
                    raise NoAnswer(f"the watch sent no event within {timeout:.3f}s")
                raise ConnectionLost(self._feed.ended)

    async def next_change(self, wait: float) -> WatchView:
        async with self._changed:
            seen = self._feed.events
            try:
                async with asyncio.timeout(wait):
                    await self._changed.wait_for(
                        lambda: self._feed.events > seen or self._feed.ended is not None
                    )
            except TimeoutError:
                pass
            return self._feed.view(self._feed.events > seen)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # ended either way
            await self._task
        self._response.close()
