"""Preflight: probe what the adapter can do in a namespace and cache it for Hold/Release.

The probes themselves are ``holdwarden.adapter.preflight``'s; the lazy run on a namespace's
first Hold or Release is ``holdwarden.adapter.operations.held``'s.
"""

from __future__ import annotations

from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.steps import Operation
from holdwarden.adapter.types import PreflightResult


def preflight(ctx: Context, namespace: str, refresh: bool) -> Operation[PreflightResult]:
    """Probe what the adapter can do in ``namespace`` (every probe, dry-run creates
    included) and cache it for Hold/Release. ``refresh=False`` returns the cached result
    when there is one (which may come from the lighter lazy check)."""
    if not refresh:
        cached = ctx.preflights.get(namespace)
        if cached is not None:
            return cached
    result = yield from ctx.probes.run(namespace, None, scan=True)
    ctx.preflights[namespace] = result
    return result
