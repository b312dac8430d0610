"""The sync adapter: ``adapter.core``'s operations driven over the kubernetes client.

``Adapter`` runs each operation's steps (``adapter.core``) one after another on the calling
thread: a request goes out through the adapter's own ``kubernetes.client.ApiClient`` (a copy
of the caller's configuration with urllib3's retries off, so no request is re-sent behind
its back and the caller's client is never modified), and urllib3's failures are sorted into
the core's three transport kinds. Everything else (deadlines, timeouts, retries, decisions,
error classes and messages) is the core's, shared with ``adapter.aio.AsyncAdapter``.

Why the kubernetes client and not the generated API methods: the read-to-write gap is what
a busy node stretches (issue 11). The generated methods validate every argument with
pydantic and walk the whole body to serialize it; here a read is one ``msgspec`` decode of
the response bytes and a write's body is the small merge patch. Authentication, default
headers (impersonation) and the transport are the client's own (``param_serialize`` /
``call_api``).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Literal, TypeVar, cast

import msgspec
import urllib3
from kubernetes import client as k8s

from adapter.core import (
    CALL_BOUND_MARGIN,
    FIELD_MANAGER,
    MAX_RETRIES,
    START_POLL_INTERVAL_S,
    WRITE_VERB,
    AdapterCore,
    ApiStatusError,
    BeforeRequest,
    Clock,
    ConnectionLost,
    DriverError,
    NoAnswer,
    NotConnected,
    Operation,
    Request,
    RequestHook,
    Send,
    Stepper,
)
from adapter.types import CallMeta, Observation, PreflightResult, Ref
from holdwarden import kubeclient
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


class Adapter(AdapterCore):
    """Start, Open, Hold, Release, Observe and Preflight on TrainJobs, blocking.

    ``api_client``: a ``kubernetes.client.ApiClient`` whose configuration is copied
    (default: in-cluster config, else the kubeconfig). The other arguments are
    ``AdapterCore``'s. Thread-safe for concurrent calls.
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
        super().__init__(
            config, clock=clock, before_request=before_request, lazy_preflight=lazy_preflight
        )
        # The adapter's own client, built from a copy of the caller's configuration: the
        # caller's ApiClient is never modified (its retries, its pool) and stays the
        # caller's to use and close; ``close()`` closes only this one.
        self._api = _own_client(api_client)

    @property
    def api_client(self) -> k8s.ApiClient:
        """The adapter's own client (a copy of the caller's configuration, transport retries
        off). Read it, e.g. to count requests on the wire; do not reconfigure it."""
        return self._api

    def close(self) -> None:
        """Close the adapter's own connections (never the caller's client). Idempotent; the
        adapter must not be used afterwards."""
        self._api.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> Adapter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- the contract ----------------------------------------------------------------

    def start(self, trainjob: dict[str, Any], meta: CallMeta) -> Ref:
        """Create the TrainJob; in Kueue mode wait (bounded by the deadline) for its
        Workload, so every started object has one. On timeout the TrainJob stays created."""
        return self._drive(self._start(trainjob, meta))

    def open(self, ref: Ref, meta: CallMeta) -> None:
        """Mark the TrainJob opened (plain mode: and run it if it waits at its start gate)."""
        self._drive(self._open(ref, meta))

    def hold(self, ref: Ref, meta: CallMeta, reason: str) -> None:
        """Place hold ``meta.instance`` (see the spec's conflict rules)."""
        self._drive(self._hold(ref, meta, reason))

    def release(self, ref: Ref, meta: CallMeta) -> None:
        """Lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force."""
        self._drive(self._release(ref, meta))

    def observe(self, ref: Ref) -> Observation:
        """Classify the TrainJob (and its Workload in Kueue mode). Sends no writes."""
        return self._drive(self._observe(ref))

    def preflight(self, namespace: str = "default", *, refresh: bool = True) -> PreflightResult:
        """Probe what the adapter can do in ``namespace`` (every probe, dry-run creates
        included) and cache it for Hold/Release. ``refresh=False`` returns the cached result
        when there is one (which may come from the lighter lazy check)."""
        return self._drive(self._preflight(namespace, refresh))

    # ---- the driver ------------------------------------------------------------------

    def _drive(self, operation: Operation[T]) -> T:
        """Run ``operation``'s steps on this thread until it returns or raises.

        A transport failure of a ``Send`` is thrown into the operation (which maps it); an
        exception of the hook propagates to the caller as it is.
        """
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
                else:
                    time.sleep(step.seconds)
            return cast(T, run.result)

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
        try:
            response = self._api.call_api(*request, _request_timeout=step.timeout)
            data = response.read()  # type: ignore[no-untyped-call]
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
        if not 200 <= response.status <= 299:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            raise ApiStatusError(response.status, str(response.reason or ""), text)
        if not http.decode:
            return None
        return msgspec.json.decode(data)


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
