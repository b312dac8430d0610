"""The adapter's core: the operations of one adapter, with its state, and nothing of I/O.

A driver (``holdwarden.adapter.kube.Adapter`` on the kubernetes client,
``holdwarden.adapter.aio.AsyncAdapter`` on aiohttp) *holds* a ``Core`` and only runs the steps
of the operations it hands out: it decides nothing and maps no error. So the deadline checks,
the request timeouts, the retry loop, the error classes and their messages, the caches and the
request log exist once, in ``holdwarden.adapter.operations`` (one module per operation; its
docstring lists the invariants they keep), for both drivers.
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import Any

from holdwarden.adapter.operations import hold, observe, open, preflight, release, start
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.steps import Operation, Request
from holdwarden.adapter.types import CallMeta, Observation, PreflightResult, Ref, ReleaseResult
from holdwarden.config import Config

__all__ = ["Core", "CoreView"]


class Core:
    """Start, Open, Hold, Release, Observe and Preflight, as operations to drive, on the
    state of one adapter (``context``: its configuration, clock, caches and request log;
    tests seed its caches).

    Preflight runs lazily, once per namespace, on the first Hold or Release there (bounded
    by that call's deadline), after that call's first read (so the call's own errors, e.g.
    a missing TrainJob, come first), and is cached per adapter; ``preflight(ns)`` runs it
    again and replaces the cached result, ``Context.forget_preflight()`` drops it. How the
    lazy run probes is ``Context``'s ``lazy_preflight``.
    """

    def __init__(self, context: Context) -> None:
        self.context = context

    def start(self, trainjob: dict[str, Any], meta: CallMeta) -> Operation[Ref]:
        return start.start(self.context, trainjob, meta)

    def open(self, ref: Ref, meta: CallMeta) -> Operation[None]:
        return open.open_(self.context, ref, meta)

    def hold(self, ref: Ref, meta: CallMeta, reason: str) -> Operation[None]:
        return hold.hold(self.context, ref, meta, reason)

    def release(self, ref: Ref, meta: CallMeta) -> Operation[ReleaseResult]:
        return release.release(self.context, ref, meta)

    def observe(self, ref: Ref) -> Operation[Observation]:
        return observe.observe(self.context, ref)

    def preflight(self, namespace: str, refresh: bool) -> Operation[PreflightResult]:
        return preflight.preflight(self.context, namespace, refresh)


class CoreView:
    """What both drivers show of the ``Core`` they hold (``self._core``): its bound, its
    request count and log, and its preflight cache. Only these forwards are shared; the
    core itself is held, not inherited."""

    _core: Core

    @property
    def config(self) -> Config:
        return self._core.context.config

    @property
    def call_bound(self) -> timedelta:
        """``timeouts.apiserverRequest`` + 5 s: how long after its deadline a call's last
        request may still commit (the margin covers clock skew and the etcd commit of a
        request that timed out at the API server)."""
        return self._core.context.call_bound

    @property
    def request_count(self) -> int:
        """Requests sent so far (every verb, every call); the benchmark reads it."""
        return self._core.context.request_count

    @property
    def request_log(self) -> deque[Request]:
        """The last 10,000 requests sent, each with the timeout it was allowed."""
        return self._core.context.request_log

    def forget_preflight(self, namespace: str | None = None) -> None:
        """Drop the cached preflight of ``namespace`` (every namespace when None): the next
        Hold or Release there probes again (e.g. after RBAC or the enforcer changed)."""
        self._core.context.forget_preflight(namespace)
