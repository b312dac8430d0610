"""The adapter's operations, with no I/O in them: the part the sync and asyncio drivers share.

Each operation (Start, Open, Hold, Release, Observe, Preflight) is a generator in its own
module. It yields *steps* (``holdwarden.adapter.steps``: send a request, send several at once,
pause, open a watch, wait for its next change) and is resumed with their results; a driver
(``holdwarden.adapter.kube.Adapter``, ``holdwarden.adapter.aio.AsyncAdapter``) only runs the
steps, through the ``holdwarden.adapter.core.Core`` it holds.

The modules:

- ``context``: one adapter's shared state (configuration, clock, caches, request log) and
  the one way every request is sent (hook, deadline check, timeout, transport failures).
- ``reads``: the GET of one object; ``workloads``: finding a TrainJob's Workload (Kueue
  mode) and its cache; ``held``: what Hold and Release share (the instance, the read of the
  held object, the lazy preflight before the first write).
- ``write_loop``: read, decide, write, and the retries after a conflict.
- ``start``, ``open``, ``hold``, ``release``, ``observe``, ``preflight``: the operations.

Why typed step helpers and not async/await with a generated sync twin: a step is yielded
only through a helper in ``holdwarden.adapter.steps`` (``yield from steps.send(...)``,
``steps.next_change(...)``, ...) whose type says what the step resumes with, and an
``Operation``'s own resume type is ``object``; so mypy checks every use of every step's
result, and a bare ``yield`` whose result is used unchecked does not type-check. The
operations stay plain, synchronous, deterministic generators that a test drives with a
script (``tests/unit/test_adapter_core.py``) and that both drivers share as they are: no
generated code to keep in step, no build step in CI.

Invariants kept here (the spec's and issue 11's):

- Every write is a merge PATCH of only what the decision changed (``holdwarden.adapter.patches``),
  carrying the read's ``metadata.resourceVersion``: the API server refuses it (409) if anything
  changed since, exactly as it would a PUT of the object as read (``write_loop.write``).
- For a hold-family call, the deadline is checked immediately before every request (a
  passed deadline → ``DeadlinePassed``, nothing sent) and bounds the request's timeout:
  ``min(deadline - now, timeouts.apiserverRequest)`` (``context.Context.send``).
- A request that could not connect raises ``Unreachable`` (nothing sent); one that was sent
  and timed out or lost its connection says it may still land within ``call_bound``.
- A call retries at most ``MAX_RETRIES`` (8) times after its first try, then ``Conflict``.
  A retry reads the object from a watch opened at the first conflict, as soon as the next
  write of the object arrives (``write_loop.read_after_change``); the read is still the
  object at one resourceVersion, and the write still carries exactly that resourceVersion.
- In Kueue mode no request the adapter sends writes ``spec.suspend``.
"""
