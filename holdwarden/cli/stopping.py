"""How both processes (``holdwarden serve`` and ``holdwarden gate``) wait to be stopped."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable


def stop_waiter(
    until: Callable[[], Awaitable[None]] | None,
    log: logging.Logger,
    on_hangup: Callable[[], None] | None = None,
) -> Callable[[], Awaitable[None]]:
    """What to await once the server has started: ``until`` if given (tests), else the first
    SIGTERM or SIGINT.

    Without ``until`` the handlers go in now, before the server starts: a SIGTERM that
    arrives while it is starting (a rollout that changes its mind, or a test that stops it
    right after "serving") must stop it cleanly and exit 0, not kill the process with the
    default action. ``on_hangup`` handles SIGHUP (logrotate's postrotate), whose default
    action would end the process.
    """
    if until is not None:
        return until
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_hangup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hangup)

    async def stopped() -> None:
        await stop.wait()
        log.info("stopping")

    return stopped
