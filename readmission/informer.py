"""List+watch caches (informers) built on the kubernetes client's ``watch.Watch``.

An ``Informer`` keeps a ``Store`` equal to what the apiserver holds for one resource (one
label selector, cluster-wide), and calls a handler with every change it applies:

1. LIST (``_request_timeout`` per page; items and the list's resourceVersion) in pages of
   ``list_page`` items (``limit`` and ``continue``: one consistent snapshot), each page
   slimmed as it comes, so a start-up LIST of 100,000 pods never holds more than a page of
   full objects; then the store is replaced and the difference reported to the handler, so
   nothing changed during a gap is lost;
2. WATCH from that resourceVersion (``allowWatchBookmarks``, a server-side
   ``timeout_seconds`` and a client read timeout a little longer), resumed from the last
   resourceVersion seen (an event's or a bookmark's) whenever it ends or breaks;
3. back to 1 when the apiserver says the resourceVersion has expired (410 Gone, as an
   HTTP status or an ERROR event), or after any other error, with a bounded backoff.

Invariants: the store only moves forward along the apiserver's history for this
resource, except at a relist, which replaces it whole; every key that changed reaches the
handler at least once; ``synced`` is set after the first LIST has been applied. A
``transform`` may slim objects before they are stored (pods: only their metadata).
Objects are the JSON dicts the apiserver sent (no model deserialization).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import urllib3
from kubernetes import watch as _watch_module
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("holdwarden.informer")

Obj = dict[str, Any]
Handler = Callable[[Obj | None, Obj | None], None]
"""Called with (old, new): (None, obj) added, (old, new) updated, (old, None) deleted."""
IndexFunc = Callable[[Obj], Iterable[str]]

_GONE = 410
# The client's watch module is untyped; treat it as such.
watch: Any = _watch_module


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object (client-go's key)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Store:
    """A thread-safe map of key to object with secondary indexes (client-go's Indexer).

    Index functions map an object to the index values it is found under; ``by_index``
    answers from the indexes without scanning.
    """

    def __init__(self, indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        self._indexers = dict(indexers or {})
        self._indices: dict[str, dict[str, set[str]]] = {n: {} for n in self._indexers}

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            index = self._indices[name]
            for value in func(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def _index(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            for value in func(obj):
                self._indices[name].setdefault(value, set()).add(key)

    def upsert(self, obj: Obj) -> Obj | None:
        key = object_key(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, old)
            self._items[key] = obj
            self._index(key, obj)
        return old

    def delete(self, key: str) -> Obj | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old)
        return old

    def replace(self, objs: Iterable[Obj]) -> list[tuple[Obj | None, Obj | None]]:
        """Make the store hold exactly ``objs``; the changes, as (old, new) pairs."""
        fresh = {object_key(o): o for o in objs}
        changes: list[tuple[Obj | None, Obj | None]] = []
        with self._lock:
            for key in list(self._items):
                if key not in fresh:
                    old = self._items.pop(key)
                    self._unindex(key, old)
                    changes.append((old, None))
            for key, obj in fresh.items():
                previous = self._items.get(key)
                if previous is not None:
                    if _rv(previous) == _rv(obj):
                        continue  # unchanged across the relist
                    self._unindex(key, previous)
                self._items[key] = obj
                self._index(key, obj)
                changes.append((previous, obj))
        return changes

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def values(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def by_index(self, name: str, value: str) -> list[Obj]:
        with self._lock:
            return [self._items[k] for k in self._indices[name].get(value, ())]

    def count_by_index(self, name: str, value: str) -> int:
        with self._lock:
            return len(self._indices[name].get(value, ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _rv(obj: Mapping[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return value if isinstance(value, str) else None


class InformerStats:
    """What an informer did, read by the metrics at scrape time (ints bumped by its one
    thread; reading an int needs no lock)."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0
        self.events = 0
        self.bookmarks = 0
        self.expired = 0
        """Relists forced by 410 Gone (the resourceVersion had expired)."""
        self.errors = 0


LIST_PAGE = 500
"""Items per page of an informer's LIST (client-go's reflector pages by 500 too)."""


class Informer:
    """One resource's list+watch loop in a thread (``start``/``stop``), or one LIST at a
    time (``relist``) for a synchronous pass."""

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        *,
        store: Store,
        handler: Handler,
        stop: threading.Event,
        request_timeout: float,
        watch_timeout: int,
        label_selector: str | None = None,
        transform: Callable[[Obj], Obj] | None = None,
        on_restart: Callable[[str, str, BaseException | None], None] | None = None,
        max_backoff: float = 10.0,
        list_page: int = LIST_PAGE,
    ) -> None:
        self.list_page = list_page
        self.name = name
        self._list_call = list_call
        self.store = store
        self._handler = handler
        self._stop = stop
        self._request_timeout = request_timeout
        self._watch_timeout = max(1, int(watch_timeout))
        self._selector = label_selector
        self._transform = transform
        self._on_restart = on_restart
        self._max_backoff = max_backoff
        # return_type=object: events carry the JSON dicts as sent (no model building).
        # Not deserialize=False: with it the client fails on an ERROR event (410 included)
        # with a KeyError instead of raising ApiException (kubernetes 37.0.2).
        self._watch = watch.Watch(return_type=object)
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.stats = InformerStats()
        self.resource_version: str | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}")
        self._thread.daemon = True
        self._thread.start()

    def alive(self) -> bool:
        """Started and its thread still running (it ends only when told to stop)."""
        return self._thread is not None and self._thread.is_alive()

    def interrupt(self) -> None:
        """Unblock a watch waiting for its next event (the stop flag must be set first)."""
        self._watch.stop()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end, interrupting its watch meanwhile; True if it ended."""
        thread = self._thread
        if thread is None:
            return True
        remaining = timeout
        while thread.is_alive() and remaining > 0:
            self.interrupt()  # again: the watch may have started after the last try
            thread.join(min(0.2, remaining))
            remaining -= 0.2
        return not thread.is_alive()

    # ---- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self.relist()
                backoff = 0.2
                while not self._stop.is_set():
                    if not self._watch_once():
                        break  # expired: relist
            except Exception as exc:  # an informer must outlive any error
                if self._stop.is_set():
                    break
                self.stats.errors += 1
                if self._on_restart is not None:
                    self._on_restart(self.name, "error", exc)
                log.warning("informer %s: %s; relisting in %.1fs", self.name, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def relist(self) -> None:
        """LIST (in pages), replace the store, report every difference; remembers the
        list's RV. A continue token that expires mid-way (410) starts the LIST again."""
        items: list[Obj] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {
                "label_selector": self._selector,
                "limit": self.list_page,
                "_preload_content": False,
                "_request_timeout": self._request_timeout,
            }
            if token:
                kwargs["_continue"] = token
            try:
                response = self._list_call(**kwargs)
            except ApiException as exc:
                if exc.status == _GONE and token:
                    items, token = [], None  # the snapshot expired: from the start
                    continue
                raise
            try:
                data = json.loads(response.data)
            finally:
                response.release_conn()
            items.extend(self._slim(item) for item in data.get("items") or [])
            meta = data.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self.stats.lists += 1
        changes = self.store.replace(items)
        self.resource_version = meta["resourceVersion"]
        self.synced.set()
        for old, new in changes:
            self._handler(old, new)

    def _slim(self, obj: Obj) -> Obj:
        return self._transform(obj) if self._transform is not None else obj

    def _watch_once(self) -> bool:
        """One watch request from the last resourceVersion; False when it has expired."""
        self.stats.watches += 1
        try:
            stream = self._watch.stream(
                self._list_call,
                label_selector=self._selector,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                # Connect like any request; a read may wait for the whole server-side
                # timeout (plus slack), after which the server has ended the watch anyway.
                _request_timeout=(self._request_timeout, self._watch_timeout + 15),
            )
            for event in stream:
                if self._stop.is_set():
                    self._watch.stop()
                    break
                if isinstance(event, dict):  # the client yields None for a blank line
                    self._apply(event)
        except ApiException as exc:
            if exc.status == _GONE:
                self.stats.expired += 1
                if self._on_restart is not None:
                    self._on_restart(self.name, "expired", None)
                log.info("informer %s: resourceVersion expired; relisting", self.name)
                return False
            raise
        except (urllib3.exceptions.HTTPError, OSError, json.JSONDecodeError) as exc:
            # A broken or timed-out stream: resume from the last resourceVersion seen.
            if not self._stop.is_set():
                log.debug("informer %s: watch ended (%s); resuming", self.name, exc)
        return True

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("raw_object", event.get("object"))
        if not isinstance(obj, dict):
            return
        if kind == "ERROR":
            # The client raises for ERROR events itself; a stray one ends this watch.
            code = obj.get("code")
            raise ApiException(status=code if isinstance(code, int) else 500, reason=str(obj))
        rv = _rv(obj)
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            if rv:
                self.resource_version = rv
            return
        self.stats.events += 1
        if kind in ("ADDED", "MODIFIED"):
            slim = self._slim(obj)
            old = self.store.upsert(slim)
            self._handler(old, slim)
        elif kind == "DELETED":
            old = self.store.delete(object_key(obj))
            self._handler(old, None)
        if rv:
            self.resource_version = rv
