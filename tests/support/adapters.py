"""Both adapters behind one blocking interface, so one test checks both.

``BlockingAsyncAdapter`` runs an ``AsyncAdapter`` on an event loop in a thread of its own
and gives it the sync ``Adapter``'s blocking methods. A test written against ``Adapter``
then runs unchanged against the asyncio driver: same calls, same assertions, the same
real control plane.

The caller's ``before_request`` hook runs in the *calling* thread, as it does for the sync
adapter (tests keep per-call state in thread-locals and block in the hook): the asyncio
adapter's hook hands each request to the calling thread and awaits its answer, so a hook
that blocks one call never blocks the loop, or the adapter's other calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from holdwarden.adapter.aio import AsyncAdapter
from holdwarden.adapter.steps import Request

CALL_TIMEOUT_S = 180.0
"""No adapter call in the tests may take longer (each is bounded by its deadline anyway)."""


class _Caller:
    """One blocking call in flight: the queue its hook requests reach its thread by."""

    def __init__(self, context: Any) -> None:
        self.hooks: queue.Queue[tuple[Request, Future[None]] | None] = queue.Queue()
        self.context = context


CALLER: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar("caller", default=None)


def caller_context() -> Any:
    """What ``context_of_caller`` returned in the thread that made the current call (for
    trace callbacks on the adapter's loop); None outside a call."""
    caller = CALLER.get()
    return caller.context if caller is not None else None


class BlockingAsyncAdapter:
    """An ``AsyncAdapter`` with blocking methods (see the module). ``close()`` ends its
    loop thread; attributes that are not coroutines (request_log, call_bound, ...) are the
    inner adapter's."""

    def __init__(
        self,
        *args: Any,
        before_request: Callable[[Request], Any] | None = None,
        context_of_caller: Callable[[], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._user_hook = before_request
        self._context_of_caller = context_of_caller or (lambda: None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        hook = self._relay if before_request is not None else None
        self.inner = AsyncAdapter(*args, before_request=hook, **kwargs)

    async def _relay(self, req: Request) -> None:
        caller = CALLER.get()
        if caller is None or self._user_hook is None:
            return
        answer: Future[None] = Future()
        caller.hooks.put((req, answer))
        await asyncio.wrap_future(answer)

    def _run(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        caller = _Caller(self._context_of_caller())

        async def call() -> Any:
            CALLER.set(caller)
            try:
                return await make()
            finally:
                caller.hooks.put(None)

        done = asyncio.run_coroutine_threadsafe(call(), self._loop)
        # Serve the call's hook requests here, in the calling thread, until it ends.
        while True:
            item = caller.hooks.get(timeout=CALL_TIMEOUT_S)
            if item is None:
                break
            req, answer = item
            try:
                assert self._user_hook is not None
                self._user_hook(req)
            except BaseException as exc:  # the hook's failure is the call's, as in sync
                answer.set_exception(exc)
            else:
                answer.set_result(None)
        return done.result(timeout=CALL_TIMEOUT_S)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._run(lambda: attribute(*args, **kwargs))

        return blocking

    def close(self) -> None:
        if not self._loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self.inner.aclose(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> BlockingAsyncAdapter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
