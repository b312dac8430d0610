"""What one adapter's operations share: its configuration, clock, caches and request log,
and the one way every request is sent (``Context.send``, ``Context.send_all``).

Sending is here, once, for every operation and every probe: the ``before_request`` hook,
the deadline check immediately before the request (a passed deadline: ``DeadlinePassed``,
nothing sent), the request's timeout ``min(deadline - now, timeouts.apiserverRequest)``,
the count and the log, and what a transport failure means for whether the request can
still land (``Unreachable``: nothing sent; otherwise it may land within ``call_bound``).
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Literal

from holdwarden.adapter import steps
from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.errors import AdapterError, DeadlinePassed, Invalid, Rejected, Unreachable
from holdwarden.adapter.preflight import Preflight
from holdwarden.adapter.steps import (
    ApiStatusError,
    ConnectionLost,
    DriverError,
    Http,
    NoAnswer,
    NotConnected,
    Operation,
    Request,
    Send,
    SendAll,
)
from holdwarden.adapter.types import CallMeta, PreflightResult, Ref
from holdwarden.config import Config
from holdwarden.vocabulary import Annotations, Mode

CALL_BOUND_MARGIN = timedelta(seconds=5)

Clock = Callable[[], datetime]

Answer = Obj | ApiStatusError | AdapterError
"""One answer of ``Context.send_all``: the object, the API server's refusal, or the
adapter error its transport failure means."""


def utc_now() -> datetime:
    return datetime.now(UTC)


class Context:
    """One adapter's shared state, and its sending (see the module).

    ``clock``: returns the current aware datetime (tests inject one). ``lazy_preflight``:
    how a namespace's first Hold or Release probes: ``"full"`` (default) as
    ``preflight()`` does, including the dry-run creates; ``"access"`` only
    SelfSubjectAccessReviews (no ``create`` right needed: what the CLI's hold and release
    use).
    """

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        lazy_preflight: Literal["full", "access"] = "full",
    ) -> None:
        if lazy_preflight not in ("full", "access"):
            raise ValueError(f"lazy_preflight must be 'full' or 'access', got {lazy_preflight!r}")
        self.config = config
        self.mode: Mode = config.mode
        self.annotations = Annotations(config.annotation_prefix)
        self.clock: Clock = clock or utc_now
        self.lazy_preflight = lazy_preflight
        self._lock = threading.Lock()
        self.request_count = 0
        self.request_log: deque[Request] = deque(maxlen=10_000)
        self.workloads: dict[Ref, tuple[str, str]] = {}
        """ref -> (TrainJob uid, Workload name): spares the LIST of Workloads on every call."""
        self.preflights: dict[str, PreflightResult] = {}
        """namespace -> the preflight Hold and Release there rely on."""
        self.random = random.Random()  # the conflict backoff's draws
        self.probes = Preflight(config, self.annotations, self.clock, self.send)

    @property
    def call_bound(self) -> timedelta:
        """``timeouts.apiserverRequest`` + 5 s: how long after its deadline a call's last
        request may still commit (the margin covers clock skew and the etcd commit of a
        request that timed out at the API server)."""
        return self.config.apiserver_request_timeout + CALL_BOUND_MARGIN

    def forget_preflight(self, namespace: str | None = None) -> None:
        """Drop the cached preflight of ``namespace`` (every namespace when None)."""
        if namespace is None:
            self.preflights.clear()
        else:
            self.preflights.pop(namespace, None)

    def deadline(self, meta: CallMeta) -> datetime:
        """The call's deadline: ``Invalid`` when missing or naive, ``DeadlinePassed`` when
        it has passed."""
        deadline = getattr(meta, "deadline", None)
        if not isinstance(deadline, datetime):
            raise Invalid("the call carries no deadline (CallMeta.deadline)")
        if deadline.tzinfo is None or deadline.utcoffset() is None:
            raise Invalid("CallMeta.deadline must be timezone-aware, e.g. datetime.now(UTC)")
        if deadline <= self.clock():
            raise DeadlinePassed(f"the call's deadline {deadline.isoformat()} has passed")
        return deadline

    def log(self, req: Request, timeout: float) -> None:
        """Count ``req`` and append it to the request log, with its timeout."""
        with self._lock:
            self.request_count += 1
            self.request_log.append(replace(req, timeout=timeout))

    # ---- sending ---------------------------------------------------------------------

    def send(self, req: Request, deadline: datetime | None, http: Http) -> Operation[Obj]:
        """Send one request: hook, deadline check, bounded timeout, count, then the step;
        a driver's transport failure becomes the adapter's error, with what it means for
        whether the request can still land. An ``ApiStatusError`` passes through. Returns
        the decoded object (``{}`` when ``http.decode`` is false: nothing reads it)."""
        limit = yield from self._prepare(req, deadline)
        try:
            answer = yield from steps.send(Send(req, http, max(limit.total_seconds(), 0.001)))
        except (NotConnected, NoAnswer, ConnectionLost) as exc:
            raise self._transport_failure(req, deadline, limit, exc) from exc
        if not http.decode:
            return {}
        return _object(req, answer)

    def send_all(
        self, requests: list[tuple[Request, Http]], deadline: datetime | None
    ) -> Operation[list[Answer]]:
        """Send ``requests`` at once, each prepared as ``send`` prepares one (hook,
        deadline check, timeout, count). Returns, for each in order, its decoded object,
        its ``ApiStatusError``, or the ``AdapterError`` its transport failure means."""
        sends: list[Send] = []
        limits: list[timedelta] = []
        for req, http in requests:
            limit = yield from self._prepare(req, deadline)
            limits.append(limit)
            sends.append(Send(req, http, max(limit.total_seconds(), 0.001)))
        answers = yield from steps.send_all(SendAll(tuple(sends)))
        out: list[Answer] = []
        for send, limit, answer in zip(sends, limits, answers, strict=True):
            if isinstance(answer, NotConnected | NoAnswer | ConnectionLost):
                failure = self._transport_failure(send.req, deadline, limit, answer)
                failure.__cause__ = answer
                out.append(failure)
            elif isinstance(answer, ApiStatusError):
                out.append(answer)
            else:
                try:
                    out.append(_object(send.req, answer))
                except AdapterError as exc:
                    out.append(exc)
        return out

    def _prepare(self, req: Request, deadline: datetime | None) -> Operation[timedelta]:
        """The hook, then the deadline check (DeadlinePassed: not sent), then the count
        and the log; returns the request's time limit."""
        yield from steps.before(req)
        limit = self.config.apiserver_request_timeout
        if deadline is not None:
            remaining = deadline - self.clock()
            if remaining <= timedelta(0):
                raise DeadlinePassed(
                    f"deadline passed before {req.verb} {req.resource} {req.name}: not sent"
                )
            limit = min(limit, remaining)
        self.log(req, max(limit.total_seconds(), 0.001))
        return limit

    def _transport_failure(
        self, req: Request, deadline: datetime | None, limit: timedelta, exc: DriverError
    ) -> AdapterError:
        """What a transport failure of ``req`` means for the caller, as its error."""
        if isinstance(exc, NotConnected):
            # No connection was made, so no byte of this request reached the API server.
            not_sent = f"{req.verb} {req.resource} {req.name}: not sent"
            if deadline is not None and self.clock() >= deadline:
                return DeadlinePassed(
                    f"{not_sent}: no connection to the API server before the deadline ({exc})"
                )
            return Unreachable(
                f"{not_sent}: cannot connect to the API server ({exc}); nothing of this"
                " request can land"
            )
        if isinstance(exc, NoAnswer):
            message = (
                f"{req.verb} {req.resource} {req.name}: sent, but no answer within"
                f" {limit.total_seconds():.3f}s (deadline or timeouts.apiserverRequest); it"
                f" may still land within call_bound ({self.call_bound.total_seconds():g}s"
                " after the deadline): place a new hold instance only after that"
            )
            # Cut off by the call's own deadline: the same outcome as a deadline that
            # passed before sending, so callers (Start's wait) can treat both alike.
            if deadline is not None and self.clock() >= deadline:
                return DeadlinePassed(message)
            return Rejected(message)
        # The connection was made and then lost (reset, closed mid-answer): the request
        # may have been received, so a write may still land, as after a timeout.
        return AdapterError(
            f"{req.verb} {req.resource} {req.name}: the connection to the API server was"
            f" lost after the request was sent ({exc}); it may still land within"
            f" call_bound ({self.call_bound.total_seconds():g}s after the deadline)"
        )


def _object(req: Request, answer: object) -> Obj:
    """A decoded answer as the object the API server always sends (a JSON object)."""
    if not isinstance(answer, dict):
        raise AdapterError(
            f"{req.verb} {req.resource} {req.name}: the API server's answer is not an object"
        )
    return answer
