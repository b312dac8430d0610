"""The adapter's exact error classes.

Every error a hold-family call raises is one of these. ``classification`` is the word the
supervisor branches on; ``exit_code`` is what ``holdwarden hold|release|open|status`` exits
with, so scripts can branch too.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base of every adapter error."""

    classification = "error"
    exit_code = 1


class Rejected(AdapterError):
    """The call was refused: its deadline passed, the object cannot be held, or a newer call won."""

    classification = "rejected"
    exit_code = 3


class StaleHold(Rejected):
    """A newer hold instance (or none) is in force; this call has been overtaken."""

    exit_code = 4


class NotFound(Rejected):
    """The TrainJob (or, in Kueue mode, its Workload) does not exist."""

    exit_code = 5


class RuntimeMissing(Rejected):
    """The TrainJob's training runtime (``spec.runtimeRef``) does not exist, so Trainer's
    webhook, which reads it on every update of a TrainJob (v2.3), refuses every write of
    it: the adapter's, the readmission gate's, and Kueue's own suspend (on a Kueue-mode
    Hold of a running job) and unsuspend. Nothing was written; the hold, if any, stays in
    force. ``runtime`` names it (``Kind ns/name`` or
    ``Kind name``); re-create it (or delete the TrainJob) and call again.

    (An addition to the contract's classes: a ``Rejected`` like any other.)"""

    exit_code = 10

    def __init__(self, message: str, runtime: str) -> None:
        self.runtime = runtime
        super().__init__(message)


class DeadlinePassed(Rejected):
    """The call's deadline passed before a request could be sent; that request was not sent.

    (An addition to the contract's classes: a ``Rejected`` like any other.)"""


class Invalid(AdapterError):
    """The call itself is malformed: no deadline, a naive deadline, a bad instance or object."""

    classification = "invalid"
    exit_code = 2


class Unsupported(AdapterError):
    """Hold is not available here; ``reason`` says why (from preflight)."""

    classification = "unsupported"
    exit_code = 6

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"hold is not supported here: {reason}")


class PodsRemain(AdapterError):
    """Release would run the object while pods of its previous execution remain."""

    classification = "pods-remain"
    exit_code = 7


class Conflict(AdapterError):
    """Every try (the first plus eight retries) met a resourceVersion conflict."""

    classification = "conflict"
    exit_code = 8


class Unreachable(AdapterError):
    """The API server could not be reached: the connection was refused, could not be made
    in time, or the name did not resolve. The request that failed was NOT sent, so it cannot
    land; earlier requests of the same call (already answered) stand as they were answered.

    (An addition to the contract's classes.) A timeout *after* a request was sent is not
    this: that is ``Rejected``/``DeadlinePassed`` saying the write may still land within
    ``Adapter.call_bound``.
    """

    classification = "unreachable"
    exit_code = 9


__all__ = [
    "AdapterError",
    "Conflict",
    "DeadlinePassed",
    "Invalid",
    "NotFound",
    "PodsRemain",
    "Rejected",
    "RuntimeMissing",
    "StaleHold",
    "Unreachable",
    "Unsupported",
]
