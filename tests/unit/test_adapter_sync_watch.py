"""The sync driver's watch stream (``holdwarden.adapter.kube._SyncWatch``) on its own, no server.

Its reader thread and the call's thread both touch one urllib3 response; these tests pin
the order ``close()`` keeps so that the two never close it at once. The response here is a
stand-in with urllib3's behaviour on that path (the reader's read fails once the socket is
shut down, and the reader then closes the response itself); the watch against the real API
server is tests/controlplane/test_adapter_kube.py's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import urllib3

from holdwarden.adapter.kube import _SyncWatch


class ClosingReaderResponse:
    """Streams one event, blocks until ``shutdown()``, then fails the read and, as urllib3's
    error path does, closes itself from the reader's thread, which takes a moment. A
    ``close()`` from another thread meanwhile raises what http.client raises then."""

    def __init__(self) -> None:
        self._shut = threading.Event()
        self._reader_closing = threading.Event()
        self.reader_closed = threading.Event()
        self.closes_while_reader_closing = 0

    def stream(self, amount: int, decode_content: bool) -> Iterator[bytes]:
        obj = {"metadata": {"name": "llm", "resourceVersion": "5"}}
        yield json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
        self._shut.wait(10)
        self._reader_closing.set()
        time.sleep(0.2)  # the reader's own close of the response, still under way
        self.reader_closed.set()
        raise urllib3.exceptions.ProtocolError("Connection broken: shut down")

    def shutdown(self) -> None:
        self._shut.set()
        # The interleaving that failed, made certain: the reader is already closing when
        # shutdown() returns to the call's thread.
        self._reader_closing.wait(5)

    def close(self) -> None:
        if self._reader_closing.is_set() and not self.reader_closed.is_set():
            self.closes_while_reader_closing += 1
            raise ValueError("I/O operation on closed file.")


def test_close_waits_for_the_reader_and_never_raises() -> None:
    response = ClosingReaderResponse()
    watch = _SyncWatch(response)  # type: ignore[arg-type]  # urllib3's response, in part
    watch.wait_first(5)
    watch.close()  # raised ValueError out of the call before the reader was joined first
    assert response.reader_closed.is_set() and response.closes_while_reader_closing == 0
    view = watch.next_change(0)
    assert view.ended is not None and view.obj is not None


class FailingCloseResponse(ClosingReaderResponse):
    def close(self) -> None:
        raise OSError("already gone")


def test_a_failing_close_is_only_cleanup() -> None:
    response: Any = FailingCloseResponse()
    watch = _SyncWatch(response)
    watch.wait_first(5)
    watch.close()  # the call's outcome was decided before: nothing raises out of here
    assert response.reader_closed.is_set()
