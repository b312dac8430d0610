"""A deduplicating, rate-limited work queue, with client-go's ``workqueue`` semantics.

The kubernetes Python client has informers' raw material (``watch.Watch``) but no work
queue, so this is the one piece of controller machinery written here. It is small and
follows client-go's contract exactly, because the readmission gate's correctness leans on
two of its guarantees:

- **dedup**: a key added any number of times before a worker takes it is processed once
  (a burst of watch events for one Workload costs one decision);
- **one at a time per key**: a key being processed is never handed to a second worker; an
  add while it is processed is remembered and the key comes back after ``done``, so no
  event is lost and no two decisions about one Workload ever run concurrently.

``add_rate_limited`` re-adds a key after a per-key exponential backoff (``forget`` resets
it); ``add_after`` re-adds after a fixed delay. Time is ``time.monotonic`` (injectable).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Thread-safe. Invariants: a key is at most once in the ready queue; a key returned by
    ``get`` is not returned again until ``done`` is called for it."""

    def __init__(
        self,
        *,
        base_delay: float = 0.005,
        max_delay: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base = base_delay
        self._max = max_delay
        self._clock = clock
        self._cond = threading.Condition()
        self._ready: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self._shutdown = False
        self.adds = 0
        """Keys offered (before dedup), for metrics and tests."""

    # ---- adding ---------------------------------------------------------------------

    def add(self, key: K) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        self.adds += 1
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # comes back in done(): never two workers on one key
        self._ready.append(key)
        self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            heapq.heappush(self._delayed, (self._clock() + delay, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> None:
        """Re-add after ``base_delay * 2**(failures-1)``, at most ``max_delay``."""
        with self._cond:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
        self.add_after(key, min(self._base * 2 ** min(failures - 1, 62), self._max))

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts the backoff afresh."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # ---- taking ---------------------------------------------------------------------

    def _promote_locked(self) -> float | None:
        """Move due delayed keys to the ready queue; seconds until the next one is due."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            self._add_locked(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float) -> K | None:
        """The next key, or None after ``timeout`` seconds or once shut down."""
        deadline = self._clock() + timeout
        with self._cond:
            while True:
                next_due = self._promote_locked()
                if self._ready:
                    key = self._ready.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                remaining = deadline - self._clock()
                if self._shutdown or remaining <= 0:
                    return None
                self._cond.wait(remaining if next_due is None else min(remaining, next_due))

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._ready.append(key)
                self._cond.notify()

    # ---- state ----------------------------------------------------------------------

    def shutdown(self) -> None:
        """Wake every waiting ``get`` (they return None); later adds are dropped."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def depth(self) -> int:
        """Keys waiting to be processed now (not the delayed ones, not those in progress)."""
        with self._cond:
            return len(self._ready)

    def delayed(self) -> int:
        with self._cond:
            return len(self._delayed)

    def idle(self) -> bool:
        """Nothing ready, delayed or in progress."""
        with self._cond:
            return not self._ready and not self._delayed and not self._processing
