"""The steps the adapter's operations yield, and what a driver answers them with.

An operation (``holdwarden.adapter.operations``, ``holdwarden.adapter.preflight``) is a generator.
It yields *steps*, each through its typed helper below (``send``, ``send_all``, ``pause``,
``open_watch``, ``next_change``, ``before``), and is resumed with their results:

- ``Send(req, http, timeout)``: send one HTTP request and resume with its decoded JSON
  answer (None when ``http.decode`` is false), or throw one of the ``DriverError`` classes
  into the generator: ``ApiStatusError`` (a non-2xx answer), ``NotConnected`` (no byte was
  sent), ``NoAnswer`` (sent, then timed out), ``ConnectionLost`` (sent, then the connection
  broke).
- ``SendAll(sends)``: send several requests at once and resume with a tuple of their
  answers, each a decoded body or the ``DriverError`` it met (a Kueue-mode read sends its
  two GETs so).
- ``Pause(seconds)``: sleep (Start's wait for the Workload, a conflict's backoff).
- ``OpenWatch(req, http, timeout, lifetime)``: open a watch (a streaming GET) and resume,
  once its first event (the object's state now) came, with an opaque handle; or throw a
  ``DriverError`` as for ``Send``. The driver closes every watch when the operation ends.
- ``NextChange(watch, wait)``: wait up to ``wait`` seconds for an event that arrives after
  the step began, then resume with the watch's newest ``WatchView`` (fresh or not).

A driver (``holdwarden.adapter.kube.Adapter`` on the kubernetes client,
``holdwarden.adapter.aio.AsyncAdapter`` on aiohttp) only runs steps: it decides nothing and maps no
error. So the deadline checks, the retries, the error classes and the request log are the same in
both, written once in the operations (``holdwarden.adapter.operations``).

This module is only the vocabulary both sides share: the operations import it to ask, the drivers
(``holdwarden.adapter.kube``, ``holdwarden.adapter.aio``) to answer. It decides nothing and sends
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, NewType, TypeVar
from urllib.parse import quote

import msgspec

from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.errors import AdapterError, Invalid, NotFound, Rejected
from holdwarden.vocabulary import Resource

FIELD_MANAGER = "holdwarden-adapter"
"""The field manager of every write the adapter sends (and of its dry-run probes)."""
# Every write is a merge PATCH (adapter/patches.py), so ``patch`` is the RBAC verb the
# supervisor needs on the held resource (and on TrainJobs for Open); preflight asks for it.
WRITE_VERB = "patch"

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One request the adapter is about to send (what the request log and hook see)."""

    verb: str  # get | list | create | update | dry-run-create | access-review | ...
    resource: str  # trainjobs | workloads | pods | selfsubjectaccessreviews | ...
    namespace: str
    name: str = ""
    timeout: float | None = None
    """Seconds the request was allowed (set in the request log once it is sent)."""


RequestHook = Callable[[Request], Any]
"""Called with each ``Request`` before its deadline check. The asyncio adapter awaits what
it returns when that is awaitable; the sync adapter ignores the return value."""

# ---- steps: what an operation asks its driver to do ---------------------------------------


@dataclass(frozen=True)
class Http:
    """One HTTP request to the API server, with a path relative to its host."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: Obj | None = None
    content_type: str = "application/json"
    decode: bool = True
    """False: the answer's body is not decoded (nothing reads it)."""


@dataclass(frozen=True)
class BeforeRequest:
    req: Request


@dataclass(frozen=True)
class Send:
    req: Request
    http: Http
    timeout: float
    """Seconds the whole request may take (connect, send, answer)."""


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class SendAll:
    """Send these requests at once (concurrently); resume with a tuple holding, for each
    in order, its decoded answer or the ``DriverError`` it met (never thrown in)."""

    sends: tuple[Send, ...]


@dataclass(frozen=True)
class OpenWatch:
    req: Request
    http: Http
    timeout: float
    """Seconds to connect, get the response headers and the first event (the object's
    state now), all together (``WATCH_OPEN_S``)."""
    lifetime: float
    """Seconds the stream may stay open at most (the read timeout between its events)."""


WatchHandle = NewType("WatchHandle", object)
"""What ``OpenWatch`` resumes with: the driver's own watch, opaque to the operations."""


@dataclass(frozen=True)
class NextChange:
    watch: WatchHandle
    """The handle ``OpenWatch`` resumed with."""
    wait: float
    """Seconds to wait at most for an event that arrives after this step began."""


@dataclass(frozen=True)
class WatchView:
    """What a watch said so far: its newest event, and whether one came during the wait."""

    fresh: bool
    event_type: str | None
    obj: Obj | None
    ended: str | None
    """Why the stream ended (None while it is open)."""


WATCH_EVENT_MAX_BYTES = 4 * 1024 * 1024
"""A longer line is not an event of one object: the feed ends instead of buffering it."""


class WatchFeed:
    """The bytes of one watch stream, parsed: how many object events came, and the newest.

    Pure (no I/O, no lock): a driver feeds it what it reads, under its own lock or loop.
    It keeps only the newest event's object, so its memory is bounded by one object and
    ``WATCH_EVENT_MAX_BYTES`` of partial line, however long the stream runs.
    """

    def __init__(self) -> None:
        self.events = 0
        self.newest_type: str | None = None
        self.newest: Obj | None = None
        self.ended: str | None = None
        self._partial = b""

    def feed(self, data: bytes) -> int:
        """Parse ``data`` (any split of the stream); returns the object events it held."""
        if self.ended is not None:
            return 0
        *lines, self._partial = (self._partial + data).split(b"\n")
        parsed = 0
        for line in lines:
            if line.strip():
                parsed += self._event(line)
        if len(self._partial) > WATCH_EVENT_MAX_BYTES:
            self.end(f"a watch event longer than {WATCH_EVENT_MAX_BYTES} bytes")
        return parsed

    def _event(self, line: bytes) -> int:
        try:
            event = msgspec.json.decode(line)
        except msgspec.DecodeError:
            self.end("the watch sent a line that is not JSON")
            return 0
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if kind == "ERROR":
            message = obj.get("message") if isinstance(obj, dict) else None
            self.end(f"the watch ended with an error: {message or obj!r}")
            return 0
        if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
            self.events += 1
            self.newest_type, self.newest = str(kind), obj
            return 1
        return 0  # BOOKMARK (not asked for) or an unknown type: no state in it

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason

    def view(self, fresh: bool) -> WatchView:
        return WatchView(fresh, self.newest_type, self.newest, self.ended)


Step = BeforeRequest | Send | SendAll | Pause | OpenWatch | NextChange
Operation = Generator[Step, object, T]
"""An operation: yields steps, returns a ``T``. What a bare ``yield`` resumes with is
``object``: an operation asks for a step through the typed helpers below (``yield from
send(step)``, ...), each of which says what its step resumes with, so mypy checks every use
of a step's result."""

# ---- the steps, typed: what each one resumes with ------------------------------------------
# Each helper is the one place its step is yielded; its send type is the driver's answer to
# that step (the contract above). A generator's ``yield from`` takes the helper's return
# type, so an operation's body works with typed results.


def before(req: Request) -> Generator[BeforeRequest, None, None]:
    """Run the ``before_request`` hook for ``req`` (resumes with nothing)."""
    yield BeforeRequest(req)


def send(step: Send) -> Generator[Send, object, object]:
    """Send one request; resumes with its decoded JSON (None when not decoded), or a
    ``DriverError`` is thrown in. The caller (``operations.context``) narrows it."""
    return (yield step)


def send_all(step: SendAll) -> Generator[SendAll, tuple[object, ...], tuple[object, ...]]:
    """Send several requests at once; resumes with, for each, its decoded JSON or the
    ``DriverError`` it met."""
    return (yield step)


def pause(seconds: float) -> Generator[Pause, None, None]:
    """Sleep ``seconds``."""
    yield Pause(seconds)


def open_watch(step: OpenWatch) -> Generator[OpenWatch, WatchHandle, WatchHandle]:
    """Open a watch; resumes with its handle, or a ``DriverError`` is thrown in."""
    return (yield step)


def next_change(watch: WatchHandle, wait: float) -> Generator[NextChange, WatchView, WatchView]:
    """Wait up to ``wait`` seconds for the watch's next event; resumes with its view."""
    return (yield NextChange(watch, wait))


class Stepper(Generic[T]):
    """Runs one operation for a driver: ``next()`` gives the step to do (None once the
    operation has returned: then ``result`` holds its value), ``reply``/``fail`` say how
    the last ``Send`` went. An exception the operation raises comes out of ``next()``.

    Used as a context manager, it closes the operation however the driver leaves it."""

    def __init__(self, operation: Operation[T]) -> None:
        self._operation = operation
        self._reply: object = None
        self._failure: DriverError | None = None
        self.result: T | None = None

    def next(self) -> Step | None:
        reply, failure = self._reply, self._failure
        self._reply, self._failure = None, None
        try:
            if failure is not None:
                return self._operation.throw(failure)
            return self._operation.send(reply)
        except StopIteration as done:
            self.result = done.value
            return None

    def reply(self, value: object) -> None:
        self._reply = value

    def fail(self, failure: DriverError) -> None:
        self._failure = failure

    def __enter__(self) -> Stepper[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._operation.close()


# ---- what a driver throws into an operation -------------------------------------------------


class DriverError(Exception):
    """How one ``Send`` failed; a driver raises exactly one of the subclasses."""


class ApiStatusError(DriverError):
    """The API server answered with a non-2xx status. ``body`` is its text (a Status)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class NotConnected(DriverError):
    """No connection was made (refused, name unknown, connect timed out): not a byte of the
    request reached the API server. The message says which, in words."""


class NoAnswer(DriverError):
    """The request was sent (or may have been) and no complete answer came in time."""


class ConnectionLost(DriverError):
    """The connection broke after the request was sent (reset, closed mid-answer)."""


def api_message(exc: ApiStatusError) -> str:
    """The API server's Status message, else the raw reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or f"HTTP {exc.status}")


def error_for(exc: ApiStatusError, what: str) -> AdapterError:
    """Map an API error (other than a 409 the caller handles) to the adapter's classes."""
    message = api_message(exc)
    if exc.status == 404:
        return NotFound(f"{what}: not found ({message})")
    if exc.status == 403:
        return Rejected(f"{what}: refused by the API server: {message}")
    if exc.status in (400, 422):
        return Invalid(f"{what}: the API server found the object invalid: {message}")
    return AdapterError(f"{what}: API error {exc.status}: {message}")


def no_request(value: T) -> Operation[T]:
    """An operation that sends nothing and returns ``value`` at once.

    For the places that take an operation (``write_loop.read_decide_write``'s ``decide``)
    when the answer needs no request: a pure decision. It yields no step, so a driver
    running it sees it end at its first ``next()``."""
    yield from ()
    return value


def custom_path(resource: Resource, namespace: str | None, name: str = "") -> str:
    """The path of a custom resource collection (cluster-scoped when ``namespace`` is None)
    or, with ``name``, of one object."""
    base = f"/apis/{resource.group}/{resource.version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{resource.plural}"
    return f"{base}/{quote(name, safe='')}" if name else base
