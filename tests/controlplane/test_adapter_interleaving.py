"""Randomized interleavings of Hold, Release and Open, checked on every committed state.

A seeded scheduler plans each schedule: which adapter instance (two per schedule, "old"
and "new" supervisor processes sharing one clock) sends which call with which hold
instance, when, with what delays before its read, before its write (the adapter's
``before_request`` hook, i.e. before the deadline check), or on the wire (the HTTP layer,
after the deadline check), and which calls straggle (block until the schedule moves on).
Other writers run all the time: ``KueueActor`` (Kueue mode) and ``TrainerActor`` write
status every ~150 ms and act on the objects as their controllers do; in about a third of
the Kueue schedules Kueue also deactivates the Workload for its own reason mid-schedule.

Each schedule runs in epochs: epoch n issues Hold(n), Release(n) and Open calls. Two kinds:

- *disciplined*: the supervisor's rule from the spec ("places a new hold instance only
  after every earlier call has landed or expired at its deadline plus that bound"): at
  each epoch change the shared clock jumps past every earlier deadline + ``call_bound``,
  stragglers are let go and awaited. Only the deadline stops them.
- *overlapping*: stragglers carry deadlines that are still valid and are let go at random
  moments of the next epoch, so old calls really race newer ones and only the
  resourceVersion precondition stops them.

A ``Watcher`` records every committed change of the TrainJob, its Workload and its pods;
every write an adapter sent is attributed to its call from the HTTP response's
resourceVersion. On every schedule, over every committed state, these must hold:

(a) a newer hold is never undone by an older call: no write by a call of instance m while
    an instance > m is in force; in disciplined schedules also: once instance n has been
    in force, no lower instance is ever in force again;
(b) a held object is never running: held ⇒ Workload ``active=false`` (Kueue mode) /
    TrainJob ``suspend=true`` (plain mode); no unsuspend of a held TrainJob; no pod created
    by a decision Trainer made on a held TrainJob;
(c) never two executions: no unsuspend while a pod of the previous execution remains.

Plus: every call ends in an outcome the spec allows; a straggler let go after its deadline
sends nothing; at the end, a held TrainJob is suspended with no pods.

Seeds: ``HOLDWARDEN_INTERLEAVING_SEED`` (default 20261202) and
``HOLDWARDEN_INTERLEAVING_SCHEDULES`` (per mode). Thread timing is not deterministic; the
seed fixes the plan (calls, instances, delays, stragglers), and failures print it.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta, Config, Ref
from holdwarden.adapter.errors import (
    AdapterError,
    Conflict,
    NotFound,
    PodsRemain,
    Rejected,
    StaleHold,
)
from holdwarden.adapter.kube import Request
from holdwarden.config import ReadmissionConfig
from holdwarden.readmission.controller import (
    ADMISSION_CHECK_GROUP,
    ADMISSION_CHECK_VERSION,
    ADMISSION_CHECKS,
    ReadmissionGate,
)
from holdwarden.readmission.decisions import GateAction
from holdwarden.vocabulary import (
    JOBSET_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    parse_hold_instance,
)
from rig.builders import trainjob_body
from rig.localcluster import (
    GATE_IDENTITY,
    JOB_CONTROLLER_IDENTITY,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    TRAINER_IDENTITY,
    LocalCluster,
)
from tests.support.actors import (
    DECIDED_ON_ANNOTATION,
    DECIDED_ON_WORKLOAD_ANNOTATION,
    KueueActor,
    TrainerActor,
    Watcher,
    WatchEvent,
    controller_uid,
    is_active,
    is_suspended,
)
from tests.support.adapters import BlockingAsyncAdapter, caller_context

Obj = dict[str, Any]
ANN = Annotations()
SEED = int(os.environ.get("HOLDWARDEN_INTERLEAVING_SEED", "20261202"))
SCHEDULES = int(os.environ.get("HOLDWARDEN_INTERLEAVING_SCHEDULES", "30"))
PARALLEL = 3  # schedules run at once (each on its own TrainJob, adapters and clock)


# The call the current thread makes: a context variable rather than a thread-local, since
# the sync adapter sends a Kueue-mode read's second GET from a worker thread running in a
# copy of the caller's context, and that request is the call's too. A thread of its own
# starts with no call, as with a thread-local.
_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("call", default=None)


# ---- the clock and the calls -------------------------------------------------------------


class SharedClock:
    """Wall time plus an offset the supervisor moves forward (never back)."""

    def __init__(self) -> None:
        self._offset = timedelta(0)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return datetime.now(UTC) + self._offset

    def advance_past(self, instant: datetime) -> None:
        with self._lock:
            gap = instant - (datetime.now(UTC) + self._offset)
            if gap > timedelta(0):
                self._offset += gap + timedelta(milliseconds=1)


@dataclass
class Call:
    """One planned adapter call and what became of it."""

    id: int
    op: str  # hold | release | open
    instance: int | None
    epoch: int
    adapter: int
    offset: float  # seconds after the epoch starts
    lifetime: float  # deadline = issue time + lifetime (virtual seconds)
    delays: dict[str, float] = field(default_factory=dict)  # verb -> sleep before it
    wire_delay: float = 0.0  # sleep on the wire before a write (after the deadline check)
    block_at: str | None = None  # straggler: verb at which it blocks until let go
    deadline: datetime | None = None
    outcome: str = "not run"
    detail: str = ""
    released: threading.Event = field(default_factory=threading.Event)
    let_go_at: float | None = None  # monotonic time it was let go (stragglers)
    let_go_after_deadline: bool = False
    blocked: bool = False
    blocked_when_let_go: bool = False
    sent_after_let_go: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def label(self) -> str:
        inst = "" if self.instance is None else f"({self.instance})"
        straggle = f" straggles@{self.block_at}" if self.block_at else ""
        return f"#{self.id} a{self.adapter} {self.op}{inst} e{self.epoch}{straggle}"


@dataclass
class Write:
    call: Call | None
    method: str
    url: str
    status: int
    rv: int | None


class Recorder:
    """What every adapter sent, at the HTTP layer (below the adapter's own counting)."""

    def __init__(self) -> None:
        self.writes: list[Write] = []
        self.requests: Counter[str] = Counter()
        self.lock = threading.Lock()


class RecordingPool:
    """Wraps a urllib3 PoolManager: counts requests, delays PUTs on the wire for the call
    that asks it, and records each write's response resourceVersion."""

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        call: Call | None = _CALL.get()
        if call is not None and call.blocked_when_let_go:
            call.sent_after_let_go.append(f"{method} {url}")
        # The adapter's writes are merge PATCHes (adapter/patches.py); PUT kept for others.
        if call is not None and method in ("PUT", "PATCH") and call.wire_delay:
            time.sleep(call.wire_delay)
        response = self._inner.request(method, url, *args, **kwargs)
        with self._recorder.lock:
            self._recorder.requests[method] += 1
            if response.status == 409:
                self._recorder.requests["409"] += 1
        if method in ("PUT", "PATCH", "POST") and "dryRun" not in url:
            rv: int | None = None
            try:
                body = json.loads(response.data)
                rv = int(body["metadata"]["resourceVersion"])
            except (ValueError, KeyError, TypeError):
                rv = None
            with self._recorder.lock:
                self._recorder.writes.append(Write(call, method, url, response.status, rv))
        return response


def recording_trace(recorder: Recorder) -> aiohttp.TraceConfig:
    """What ``RecordingPool`` does, for the asyncio adapter (aiohttp trace signals): count
    requests, delay a call's writes on the wire, record each write's response
    resourceVersion. The call is the one whose thread made the blocking call."""
    trace = aiohttp.TraceConfig()

    async def on_start(_: Any, ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
        call: Call | None = caller_context()
        ctx.call, ctx.status = call, None
        if call is not None and call.blocked_when_let_go:
            call.sent_after_let_go.append(f"{params.method} {params.url}")
        if call is not None and params.method in ("PUT", "PATCH") and call.wire_delay:
            await asyncio.sleep(call.wire_delay)

    async def on_end(_: Any, ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
        ctx.status = params.response.status
        with recorder.lock:
            recorder.requests[params.method] += 1
            if params.response.status == 409:
                recorder.requests["409"] += 1

    async def on_body(_: Any, ctx: Any, params: aiohttp.TraceResponseChunkReceivedParams) -> None:
        # The adapter reads every answer's body whole: this fires once per request.
        url = str(params.url)
        if params.method not in ("PUT", "PATCH", "POST") or "dryRun" in url:
            return
        rv: int | None = None
        try:
            rv = int(json.loads(params.chunk)["metadata"]["resourceVersion"])
        except (ValueError, KeyError, TypeError):
            rv = None
        with recorder.lock:
            recorder.writes.append(Write(ctx.call, params.method, url, ctx.status or 0, rv))

    trace.on_request_start.append(on_start)
    trace.on_request_end.append(on_end)
    trace.on_response_chunk_received.append(on_body)
    return trace


def _before_request(req: Request) -> None:
    """The adapter's hook: runs before its deadline check of every request."""
    call: Call | None = _CALL.get()
    if call is None:
        return
    if call.block_at == req.verb and not call.blocked:
        call.blocked = True
        if not call.released.wait(timeout=60):
            raise AssertionError(f"{call.label()} was never let go")
    delay = call.delays.pop(req.verb, 0.0)
    if delay:
        time.sleep(delay)


# ---- planning ----------------------------------------------------------------------------


@dataclass
class Plan:
    seed: int
    mode: str
    disciplined: bool
    epochs: int
    calls: list[Call]
    pauses: list[float]
    kueue_deactivation: tuple[int, float] | None = None  # (epoch, offset): Kueue's own

    def describe(self) -> str:
        kind = "disciplined" if self.disciplined else "overlapping"
        lines = [f"seed {self.seed} ({self.mode}, {kind}, {self.epochs} epochs)"]
        if self.kueue_deactivation is not None:
            epoch, offset = self.kueue_deactivation
            lines.append(f"  Kueue deactivates for its own reason in e{epoch} at +{offset:.2f}s")
        for c in self.calls:
            extras = []
            if c.delays:
                extras.append(f"delays={c.delays}")
            if c.wire_delay:
                extras.append(f"wire={c.wire_delay:.3f}")
            lines.append(
                f"  {c.label()} at +{c.offset:.2f}s life {c.lifetime:.1f}s"
                f" {' '.join(extras)} -> {c.outcome} {c.detail[:160]}"
            )
        return "\n".join(lines)


def make_plan(seed: int, mode: str) -> Plan:
    rng = random.Random(seed)
    disciplined = rng.random() < 0.5
    epochs = rng.randint(2, 4)
    calls: list[Call] = []

    def add(op: str, instance: int | None, epoch: int, offset: float) -> None:
        call = Call(
            id=len(calls),
            op=op,
            instance=instance,
            epoch=epoch,
            adapter=rng.randrange(2),
            offset=offset,
            lifetime=rng.uniform(1.5, 3.0),
        )
        if rng.random() < 0.35:
            call.delays["update"] = rng.uniform(0.0, 0.25)  # between read and write
        if rng.random() < 0.2:
            call.delays["get"] = rng.uniform(0.0, 0.2)
        if rng.random() < 0.15:
            call.wire_delay = rng.uniform(0.0, 0.15)
        if op != "open" and epoch < epochs and rng.random() < 0.4:
            call.block_at = rng.choice(["get", "update"])
            if not disciplined:
                call.lifetime = 30.0  # still valid when let go in the next epoch
        calls.append(call)

    for epoch in range(1, epochs + 1):
        for _ in range(rng.choice([1, 1, 2])):
            add("hold", epoch, epoch, rng.uniform(0.0, 0.3))
        for _ in range(rng.choice([0, 1, 1, 2])):
            add("release", epoch, epoch, rng.uniform(0.0, 0.8))
        if rng.random() < (0.8 if epoch == 1 else 0.3):
            add("open", None, epoch, rng.uniform(0.0, 0.6))
    pauses = [rng.uniform(0.0, 0.5) for _ in range(epochs)]
    deactivation = None
    if mode == "kueue" and rng.random() < 0.3:
        deactivation = (rng.randint(1, epochs), rng.uniform(0.0, 0.6))
    return Plan(seed, mode, disciplined, epochs, calls, pauses, deactivation)


# ---- running one schedule ----------------------------------------------------------------


class Schedule:
    def __init__(
        self,
        plan: Plan,
        cluster: LocalCluster,
        namespace: str,
        recorder: Recorder,
        admin: k8s.ApiClient,
        kueue_actor: KueueActor | None = None,
        driver: str = "sync",
    ) -> None:
        self.plan = plan
        self.kueue_actor = kueue_actor
        self.problems: list[str] = []
        self.namespace = namespace
        self.name = f"j{plan.seed % 10_000_000}"
        self.ref = Ref(namespace, self.name)
        self.recorder = recorder
        self.admin = admin
        self.clock = SharedClock()
        self.config = Config(mode=plan.mode)  # type: ignore[arg-type]
        self.clients = [cluster.api_client(SUPERVISOR_IDENTITY) for _ in range(2)]
        self.adapters: list[Any] = []  # Adapter, or AsyncAdapter behind blocking methods
        for api in self.clients:
            if driver == "sync":
                adapter = Adapter(
                    self.config, api, clock=self.clock.now, before_request=_before_request
                )
                # It sends through its own client (a copy of the caller's): record there.
                rest: Any = adapter.api_client.rest_client
                rest.pool_manager = RecordingPool(rest.pool_manager, recorder)
                self.adapters.append(adapter)
            else:
                blocking = BlockingAsyncAdapter(
                    self.config,
                    api,
                    clock=self.clock.now,
                    before_request=_before_request,  # run in the call's own thread
                    context_of_caller=_CALL.get,
                )
                blocking.inner.trace_configs.append(recording_trace(recorder))
                self.adapters.append(blocking)
        self.start_rv = 0

    def close(self) -> None:
        for adapter in self.adapters:
            adapter.close()
        for api in self.clients:
            api.close()  # type: ignore[no-untyped-call]

    def meta(self, call: Call) -> CallMeta:
        call.deadline = self.clock.now() + timedelta(seconds=call.lifetime)
        return CallMeta(deadline=call.deadline, instance=call.instance)

    def run_call(self, call: Call) -> None:
        _CALL.set(call)
        adapter = self.adapters[call.adapter]
        try:
            meta = self.meta(call)
            if call.op == "hold":
                adapter.hold(self.ref, meta, f"schedule {self.plan.seed} call {call.id}")
            elif call.op == "open":
                adapter.open(self.ref, meta)
            else:
                self._release(adapter, meta)
            call.outcome = "ok"
        except StaleHold as exc:
            call.outcome, call.detail = "stale", str(exc)
        except PodsRemain as exc:
            call.outcome, call.detail = "pods-remain", str(exc)
        except NotFound as exc:
            call.outcome, call.detail = "error", f"NotFound: {exc}"
        except Rejected as exc:
            call.outcome, call.detail = "rejected", str(exc)
        except Conflict as exc:
            call.outcome, call.detail = "conflict", str(exc)
        except AdapterError as exc:
            call.outcome, call.detail = "error", f"{type(exc).__name__}: {exc}"
        except Exception:
            call.outcome, call.detail = "error", traceback.format_exc()
        finally:
            _CALL.set(None)

    def _release(self, adapter: Adapter, meta: CallMeta) -> None:
        """The supervisor's Release: PodsRemain means "try again shortly"."""
        assert meta.deadline is not None
        while True:
            try:
                adapter.release(self.ref, meta)
                return
            except PodsRemain:
                if self.clock.now() + timedelta(seconds=0.1) >= meta.deadline:
                    raise
                time.sleep(0.1)

    def launch(self, call: Call) -> None:
        def body() -> None:
            time.sleep(call.offset)
            self.run_call(call)

        call.thread = threading.Thread(target=body, name=call.label(), daemon=True)
        call.thread.start()

    def let_go(self, call: Call) -> None:
        assert call.deadline is not None or not call.blocked
        call.blocked_when_let_go = call.blocked
        call.let_go_at = time.monotonic()
        call.let_go_after_deadline = call.deadline is not None and self.clock.now() >= call.deadline
        call.released.set()

    def run(self) -> None:
        plan = self.plan
        body = trainjob_body(self.name, queue="user-queue" if plan.mode == "kueue" else None)
        body["metadata"]["namespace"] = self.namespace
        if plan.mode == "kueue":
            body["spec"]["suspend"] = True  # as Kueue's webhook would set it
        start_meta = CallMeta(deadline=self.clock.now() + timedelta(seconds=20))
        self.adapters[0].start(body, start_meta)
        for adapter in self.adapters:
            adapter.preflight(self.namespace)
        stragglers: list[Call] = []
        for epoch in range(1, plan.epochs + 1):
            earlier = [c for c in plan.calls if c.epoch < epoch]
            if epoch > 1:
                self._change_epoch(earlier, stragglers)
            now_calls = [c for c in plan.calls if c.epoch == epoch]
            for call in now_calls:
                self.launch(call)
            kueue = self._kueue_deactivation(epoch)
            for call in now_calls:
                if call.block_at is None:
                    assert call.thread is not None
                    call.thread.join(timeout=60)
            if kueue is not None:
                kueue.join(timeout=60)
            stragglers = [c for c in now_calls if c.block_at is not None]
            time.sleep(plan.pauses[epoch - 1])
        for call in plan.calls:
            if not call.released.is_set():
                self.let_go(call)
        for call in plan.calls:
            if call.thread is not None:
                call.thread.join(timeout=60)

    def _kueue_deactivation(self, epoch: int) -> threading.Thread | None:
        """Kueue deactivates the Workload for its own reason (a time limit), if planned."""
        planned = self.plan.kueue_deactivation
        if planned is None or planned[0] != epoch or self.kueue_actor is None:
            return None
        actor = self.kueue_actor

        def body() -> None:
            time.sleep(planned[1])
            try:
                actor.deactivate(self.name)
            except Exception:
                self.problems.append(f"Kueue's own deactivation failed:\n{traceback.format_exc()}")

        thread = threading.Thread(target=body, name=f"kueue-deactivate-{self.name}", daemon=True)
        thread.start()
        return thread

    def _change_epoch(self, earlier: list[Call], stragglers: list[Call]) -> None:
        if self.plan.disciplined:
            # Every earlier call has landed or expired at its deadline plus call_bound.
            for call in earlier:  # a call not issued yet has no deadline to wait out
                assert call.thread is not None
                while call.deadline is None and call.thread.is_alive():
                    time.sleep(0.005)
            bound = self.adapters[0].call_bound
            latest = max((c.deadline for c in earlier if c.deadline is not None), default=None)
            if latest is not None:
                self.clock.advance_past(latest + bound)
            for call in stragglers:
                self.let_go(call)
            for call in earlier:
                assert call.thread is not None
                call.thread.join(timeout=60)
        else:
            rng = random.Random(self.plan.seed * 7919 + len(earlier))
            for call in stragglers:
                timer = threading.Timer(rng.uniform(0.0, 0.6), self.let_go, args=(call,))
                timer.daemon = True
                timer.start()


# ---- the invariants ----------------------------------------------------------------------


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    pod_races: int = 0  # pods Trainer created on a read made before a hold landed
    kueue_races: int = 0  # unsuspends Kueue decided on a read made before a hold landed
    reholds: int = 0  # hold n placed again after Release(n) lifted it (the spec allows it)
    states: int = 0


def check_schedule(plan: Plan, name: str, events: list[WatchEvent], writes: list[Write]) -> Verdict:
    """Check (a), (b), (c) over every committed state of this schedule's objects."""
    verdict = Verdict()
    writer: dict[int, Call | None] = {}
    for w in writes:
        if w.rv is not None and 200 <= w.status < 300:
            writer[w.rv] = w.call
    kueue = plan.mode == "kueue"
    tj_uid: str | None = None
    wl_name: str | None = None
    tj: Obj | None = None
    wl: Obj | None = None
    pods: dict[str, tuple[int, int]] = {}  # name -> (created rv, decided-on rv)
    in_force: int | None = None
    held_since = 0  # rv at which the current unbroken hold (any instance) began
    max_in_force = 0

    def fail(event: WatchEvent, text: str) -> None:
        who = writer.get(event.rv)
        by = (
            who.label()
            if who is not None
            else ("adapter(start)" if event.rv in writer else "other")
        )
        verdict.violations.append(f"rv {event.rv} {event.kind}/{event.name} by {by}: {text}")

    for event in events:
        obj = event.obj
        meta = obj["metadata"]
        if event.kind == "trainjob":
            if meta["name"] != name:
                continue
        elif event.kind == "workload":
            if wl_name is None and tj_uid is not None and controller_uid(obj) == tj_uid:
                wl_name = meta["name"]
            if meta["name"] != wl_name:
                continue
        elif (meta.get("labels") or {}).get(JOBSET_NAME_LABEL) != name:
            continue
        verdict.states += 1
        deleted = event.type == "DELETED"

        if event.kind == "pod":
            if deleted:
                pods.pop(meta["name"], None)
                continue
            if meta["name"] in pods:
                continue
            decided = int((meta.get("annotations") or {}).get(DECIDED_ON_ANNOTATION, "0"))
            pods[meta["name"]] = (event.rv, decided)
            held_tj = tj is not None and (not kueue) and in_force is not None
            if held_tj or (tj is not None and is_suspended(tj)):
                if held_tj and decided >= held_since:
                    fail(event, f"pod created on a decision made while held (rv {decided})")
                else:
                    verdict.pod_races += 1
            continue

        if event.kind == "trainjob":
            if deleted:
                tj = None
                continue
            tj_uid = meta["uid"]
            before = tj
            tj = obj
            was_suspended = before is None or is_suspended(before)
            if was_suspended and not is_suspended(obj):
                if pods:
                    fail(
                        event,
                        f"(c) unsuspended while pods of the previous execution remain: "
                        f"{sorted(pods)}",
                    )
                if kueue and in_force is not None:
                    ann = meta.get("annotations") or {}
                    decided = int(ann.get(DECIDED_ON_WORKLOAD_ANNOTATION, "0"))
                    if decided >= held_since:
                        fail(event, f"(b) unsuspended on a read of held Workload (rv {decided})")
                    else:
                        verdict.kueue_races += 1
                if not kueue and _hold(obj) is not None:
                    fail(event, f"(b) unsuspended while hold {_hold(obj)} is in force")
        if event.kind == "workload":
            if deleted:
                continue
            wl = obj

        held_obj = wl if kueue else tj
        if held_obj is None or event.kind != ("workload" if kueue else "trainjob"):
            continue
        raw = _hold(held_obj)
        new = parse_hold_instance(raw) if raw is not None else None
        if raw is not None and new is None:
            fail(event, f"malformed hold instance {raw!r}")
        call = writer.get(event.rv)
        if call is None and new != in_force:
            call = _landed_unanswered(plan, new, in_force)
        # (a) weak: no write by an older call while a newer instance is in force.
        if in_force is not None and call is not None:
            if call.op == "open" and (new != in_force or not _hold_field(held_obj, kueue)):
                fail(event, f"(a) Open changed hold {in_force} (now {new})")
            if call.instance is not None and call.instance < in_force:
                fail(event, f"(a) call of instance {call.instance} wrote while {in_force} held")
        if new != in_force and (call is None or call.op == "open"):
            fail(event, f"hold instance changed {in_force} -> {new} by a non-hold writer")
        # (a) strong, under the supervisor's discipline.
        if plan.disciplined and new is not None and new < max_in_force:
            fail(event, f"(a) instance {new} in force after instance {max_in_force} was")
        # (b) held => the hold field is set.
        if new is not None and not _hold_field(held_obj, kueue):
            field_ = "spec.active=false" if kueue else "spec.suspend=true"
            fail(event, f"(b) hold {new} in force without {field_}")
        if in_force is None and new is not None:
            held_since = event.rv
            if new == max_in_force:
                verdict.reholds += 1
        in_force = new
        max_in_force = max(max_in_force, new or 0)
    return verdict


def _landed_unanswered(plan: Plan, new: int | None, in_force: int | None) -> Call | None:
    """The call that made a hold change whose answer never came back to it.

    Writes are attributed by their response's resourceVersion; a write that landed after
    its client timed out (the call says it "may still land") has none. Only a Hold of the
    new instance, or a Release of the one in force, can have made the change; it is then
    checked as that call's write (rule (a) still applies to it)."""
    for call in plan.calls:
        if "may still land" not in call.detail:
            continue
        if call.op == "hold" and new is not None and call.instance == new:
            return call
        if call.op == "release" and new is None and call.instance == in_force:
            return call
    return None


def _hold(obj: Obj) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN.hold_instance)
    return None if value is None else str(value)


def _hold_field(obj: Obj, kueue: bool) -> bool:
    return not is_active(obj) if kueue else is_suspended(obj)


def check_outcomes(plan: Plan) -> list[str]:
    """Every call ends as the spec allows; a straggler let go late sends nothing."""
    problems = []
    allowed = {"ok", "stale", "rejected", "conflict"}
    if plan.mode == "plain":
        allowed.add("pods-remain")
    for call in plan.calls:
        if call.outcome not in allowed:
            problems.append(f"{call.label()}: outcome {call.outcome}: {call.detail}")
        if call.blocked_when_let_go and call.let_go_after_deadline:
            if call.sent_after_let_go:
                problems.append(
                    f"{call.label()}: let go after its deadline yet sent {call.sent_after_let_go}"
                )
            if call.outcome != "rejected":
                problems.append(f"{call.label()}: let go after its deadline but {call.outcome}")
    return problems


# ---- the test ----------------------------------------------------------------------------


@dataclass
class Totals:
    schedules: int = 0
    disciplined: int = 0
    states: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    pod_races: int = 0
    kueue_races: int = 0
    stragglers_refused_by_deadline: int = 0
    kueue_deactivations: int = 0
    reholds: int = 0


def _custom(api: k8s.ApiClient) -> Any:
    return k8s.CustomObjectsApi(api)


def _settle(schedule: Schedule, kueue_actor: KueueActor | None, watcher: Watcher) -> list[str]:
    """Let the controllers finish, then check the final state; fence the watch."""
    admin, ns, name = schedule.admin, schedule.namespace, schedule.name
    custom = _custom(admin)
    core = k8s.CoreV1Api(admin)
    kueue = schedule.plan.mode == "kueue"
    problems: list[str] = []
    # Returns as soon as the job has settled; the bound is for three schedules' actors, the
    # gate and a watcher sharing one starved process.
    deadline = time.monotonic() + 30
    while True:
        tj = custom.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, name
        )
        held_obj = tj
        wl = None
        if kueue:
            assert kueue_actor is not None
            wl = kueue_actor.workload_of(name)
            held_obj = wl
        pods = core.list_namespaced_pod(ns, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
        held = held_obj is not None and _hold(held_obj) is not None
        settled = (is_suspended(tj) and not pods) if held else True
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if held and not settled:
        problems.append(f"final: held but suspend={is_suspended(tj)} and {len(pods)} pods")
    opened = bool((tj["metadata"].get("annotations") or {}).get(ANN.opened))
    if not kueue and not held and opened and is_suspended(tj):
        problems.append("final: plain, opened, not held, yet suspended (release lost the run)")
    watcher.fence_pods()
    watcher.wait_until_seen("trainjob", int(tj["metadata"]["resourceVersion"]))
    if wl is not None:
        watcher.wait_until_seen("workload", int(wl["metadata"]["resourceVersion"]))
    return problems


def _cleanup(schedule: Schedule, kueue_actor: KueueActor | None) -> None:
    custom = _custom(schedule.admin)
    ns, name = schedule.namespace, schedule.name
    if kueue_actor is not None:
        wl = kueue_actor.workload_of(name)
        if wl is not None:
            custom.delete_namespaced_custom_object(
                WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, wl["metadata"]["name"]
            )
    custom.delete_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, name
    )


def _start_readmission_gate(
    cluster: LocalCluster, admin: k8s.ApiClient, check: str
) -> ReadmissionGate:
    """Create an AdmissionCheck served by a fresh gate (its own controller name) and start it."""
    controller = f"holdwarden.io/{check}"
    k8s.CustomObjectsApi(admin).create_cluster_custom_object(
        ADMISSION_CHECK_GROUP,
        ADMISSION_CHECK_VERSION,
        ADMISSION_CHECKS,
        {
            "apiVersion": f"{ADMISSION_CHECK_GROUP}/{ADMISSION_CHECK_VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {"controllerName": controller},
        },
    )
    config = Config(
        readmission=ReadmissionConfig(
            enabled=True, controller_name=controller, interval=timedelta(milliseconds=50)
        )
    )
    gate = ReadmissionGate(config, cluster.api_client(GATE_IDENTITY))
    gate.start()
    return gate


@pytest.fixture
def actors(
    request: pytest.FixtureRequest, cluster: LocalCluster, namespace: str
) -> Iterator[tuple[KueueActor | None, Watcher]]:
    mode: str = request.param
    with cluster.api_client() as admin, Watcher(admin, namespace) as watcher:
        with (
            cluster.api_client(TRAINER_IDENTITY) as trainer_api,
            cluster.api_client(JOB_CONTROLLER_IDENTITY) as pods_api,
            TrainerActor(
                trainer_api,
                namespace,
                create_delay=0.05,
                delete_delay=0.3,
                status_heartbeat=0.15,
                pods_api=pods_api,
            ),
        ):
            if mode == "kueue":
                # Kueue mode runs the real readmission gate: Kueue (the actor) admits a
                # Workload only once the gate has marked its AdmissionCheck Ready.
                check = f"readmission-{namespace}"
                gate = _start_readmission_gate(cluster, admin, check)
                try:
                    with (
                        cluster.api_client(KUEUE_IDENTITY) as kueue_api,
                        KueueActor(
                            kueue_api, namespace, heartbeat=0.15, admission_check=check
                        ) as kueue_actor,
                    ):
                        yield kueue_actor, watcher
                    # The gate really decided admissions: it marked checks Ready and the
                    # actor admitted (only) through them.
                    assert gate.applied[GateAction.MARK_READY] > 0, gate.applied
                    assert kueue_actor.admissions > 0
                finally:
                    gate.stop()
                assert gate.errors == 0, "the readmission gate failed a pass (see the log)"
            else:
                yield None, watcher
        time.sleep(0.2)


@pytest.mark.parametrize("driver", ["sync", "asyncio"])
@pytest.mark.parametrize("actors", ["kueue", "plain"], indirect=True)
def test_interleavings_keep_the_hold_invariants(
    actors: tuple[KueueActor | None, Watcher],
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
    driver: str,
) -> None:
    """The sync adapter, and the asyncio one (half as many schedules, on seeds of their
    own: the two share every decision, so its schedules test its driver)."""
    kueue_actor, watcher = actors
    mode = "kueue" if kueue_actor is not None else "plain"
    recorder = Recorder()
    totals = Totals()
    failures: list[str] = []
    lock = threading.Lock()
    base = SEED + (0 if mode == "kueue" else 1_000_000) + (0 if driver == "sync" else 2_000_000)
    schedules = SCHEDULES if driver == "sync" else max(1, SCHEDULES // 2)
    began = time.monotonic()

    def one(index: int) -> None:
        plan = make_plan(base + index, mode)
        schedule = Schedule(
            plan, cluster, namespace, recorder, admin_client, kueue_actor, driver=driver
        )
        try:
            schedule.run()
            problems = schedule.problems + _settle(schedule, kueue_actor, watcher)
            with recorder.lock:
                writes = list(recorder.writes)
            verdict = check_schedule(plan, schedule.name, watcher.events(), writes)
            problems += verdict.violations + check_outcomes(plan)
            _cleanup(schedule, kueue_actor)
        except Exception:
            problems = [f"schedule crashed:\n{traceback.format_exc()}"]
            verdict = Verdict()
        finally:
            schedule.close()
        with lock:
            totals.schedules += 1
            totals.disciplined += plan.disciplined
            totals.states += verdict.states
            totals.pod_races += verdict.pod_races
            totals.kueue_races += verdict.kueue_races
            totals.kueue_deactivations += plan.kueue_deactivation is not None
            totals.reholds += verdict.reholds
            totals.outcomes.update(f"{c.op}:{c.outcome}" for c in plan.calls)
            totals.stragglers_refused_by_deadline += sum(
                c.blocked_when_let_go and c.let_go_after_deadline and c.outcome == "rejected"
                for c in plan.calls
            )
            if problems:
                failures.append("\n".join([plan.describe(), *(f"  !! {p}" for p in problems)]))

    _run_parallel(one, schedules, PARALLEL)
    if kueue_actor is not None:
        kueue_actor.check()
    watcher.check()
    elapsed = time.monotonic() - began
    summary = (
        f"interleavings [{mode}, {driver}]: {totals.schedules} schedules "
        f"({totals.disciplined} disciplined, {totals.schedules - totals.disciplined} "
        f"overlapping) in {elapsed:.0f}s, seeds {base}..{base + schedules - 1}; "
        f"{totals.states} committed states checked; HTTP {dict(recorder.requests)}; "
        f"stragglers refused by deadline {totals.stragglers_refused_by_deadline}; "
        f"Kueue's own deactivations {totals.kueue_deactivations}; "
        f"same-instance re-holds after its release {totals.reholds}; "
        f"actor races (decided before a hold landed): trainer {totals.pod_races}, "
        f"kueue {totals.kueue_races}; outcomes {dict(sorted(totals.outcomes.items()))}"
    )
    with capsys.disabled():
        print(f"\n{summary}")
    assert not failures, f"{len(failures)} schedule(s) broke an invariant:\n" + "\n\n".join(
        failures
    )
    assert totals.schedules == schedules
    # Writes were attributed to their calls (else check (a) would have checked nothing).
    attributed = sum(w.call is not None and w.rv is not None for w in recorder.writes)
    assert attributed > 0, recorder.writes[:5]
    assert totals.states > schedules * 10, "the watch saw the objects change"


def _run_parallel(fn: Callable[[int], None], count: int, width: int) -> None:
    next_index = iter(range(count))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            fn(index)

    threads = [threading.Thread(target=worker, name=f"schedules-{i}") for i in range(width)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# ---- the checker has teeth (pure: synthetic event records) --------------------------------


def _tj_event(rv: int, *, suspend: bool, hold: int | None, type_: str = "MODIFIED") -> WatchEvent:
    ann = {} if hold is None else {ANN.hold_instance: str(hold)}
    obj: Obj = {
        "metadata": {"name": "j", "uid": "u", "resourceVersion": str(rv), "annotations": ann},
        "spec": {"suspend": suspend},
    }
    return WatchEvent("trainjob", type_, rv, obj)


def _pod_event(rv: int, type_: str, decided: int = 1) -> WatchEvent:
    obj: Obj = {
        "metadata": {
            "name": "j-node-0",
            "resourceVersion": str(rv),
            "labels": {JOBSET_NAME_LABEL: "j"},
            "annotations": {DECIDED_ON_ANNOTATION: str(decided)},
        }
    }
    return WatchEvent("pod", type_, rv, obj)


def _plain_plan(disciplined: bool, *calls: Call) -> Plan:
    return Plan(1, "plain", disciplined, 2, list(calls), [0.0, 0.0])


def _write(call: Call, rv: int) -> Write:
    return Write(call, "PUT", "/trainjobs/j", 200, rv)


def test_checker_flags_an_older_call_writing_over_a_newer_hold() -> None:
    hold2 = Call(0, "hold", 2, 2, 0, 0.0, 1.0)
    hold1 = Call(1, "hold", 1, 1, 1, 0.0, 1.0)
    events = [
        _tj_event(1, suspend=False, hold=None, type_="ADDED"),
        _tj_event(2, suspend=True, hold=2),
        _tj_event(3, suspend=True, hold=1),
    ]
    verdict = check_schedule(
        _plain_plan(True, hold2, hold1), "j", events, [_write(hold2, 2), _write(hold1, 3)]
    )
    assert any("(a) call of instance 1 wrote while 2 held" in v for v in verdict.violations)
    assert any("(a) instance 1 in force after instance 2" in v for v in verdict.violations)


def test_checker_flags_a_hold_without_the_hold_field_and_a_run_with_pods_left() -> None:
    hold1 = Call(0, "hold", 1, 1, 0, 0.0, 1.0)
    release1 = Call(1, "release", 1, 1, 0, 0.0, 1.0)
    events = [
        _tj_event(1, suspend=False, hold=None, type_="ADDED"),
        _pod_event(2, "ADDED"),
        _tj_event(3, suspend=False, hold=1),  # held, yet not suspended
        _tj_event(4, suspend=True, hold=1),
        _tj_event(5, suspend=False, hold=None),  # released while the pod remains
    ]
    writes = [_write(hold1, 3), _write(hold1, 4), _write(release1, 5)]
    verdict = check_schedule(_plain_plan(False, hold1, release1), "j", events, writes)
    assert any("(b) hold 1 in force without spec.suspend=true" in v for v in verdict.violations)
    assert any("(c) unsuspended while pods" in v for v in verdict.violations)


def test_checker_accepts_a_clean_hold_and_release() -> None:
    hold1 = Call(0, "hold", 1, 1, 0, 0.0, 1.0)
    release1 = Call(1, "release", 1, 1, 0, 0.0, 1.0)
    events = [
        _tj_event(1, suspend=False, hold=None, type_="ADDED"),
        _pod_event(2, "ADDED"),
        _tj_event(3, suspend=True, hold=1),
        _pod_event(4, "DELETED"),
        _tj_event(5, suspend=False, hold=None),
    ]
    writes = [_write(hold1, 3), _write(release1, 5)]
    verdict = check_schedule(_plain_plan(True, hold1, release1), "j", events, writes)
    assert verdict.violations == []
    assert verdict.states == 5


# ---- a TrainJob deleted and created again under the same name ----------------------------


def test_hold_after_the_trainjob_is_recreated_holds_the_new_workload(
    cluster: LocalCluster, admin_client: k8s.ApiClient, namespace: str
) -> None:
    """A long-lived adapter must hold the Workload of the TrainJob that exists now.

    The TrainJob is deleted and a new one started under the same name (same Ref) by
    another process (here a second adapter instance: a restarted or second supervisor).
    Until the garbage collector gets to it, the old Workload is still there, owned by the
    old uid and not yet marked for deletion (here no garbage collector runs, as when it
    lags). Hold by the first, long-lived adapter must write the new TrainJob's Workload
    (label job-uid=<new uid> and a controller ownerReference to it), never the old one,
    and Observe must then say held.
    """
    with (
        cluster.api_client(KUEUE_IDENTITY) as kueue_api,
        KueueActor(kueue_api, namespace, heartbeat=None, readmission_gate=False) as kueue,
        cluster.api_client(SUPERVISOR_IDENTITY) as api,
        cluster.api_client(SUPERVISOR_IDENTITY) as other_api,
    ):
        adapter = Adapter(Config(mode="kueue"), api)
        other = Adapter(Config(mode="kueue"), other_api)
        ref = Ref(namespace, "again")

        def meta(instance: int | None = None) -> CallMeta:
            return CallMeta(datetime.now(UTC) + timedelta(seconds=20), instance)

        def body() -> Obj:
            tj = trainjob_body("again", queue="user-queue", suspend=True)
            tj["metadata"]["namespace"] = namespace
            return tj

        adapter.start(body(), meta())
        adapter.hold(ref, meta(1), "first")
        adapter.release(ref, meta(1))
        old = kueue.workload_of("again")
        assert old is not None
        _custom(admin_client).delete_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, "again"
        )
        other.start(body(), meta())
        new = kueue.workload_of("again")
        assert new is not None and new["metadata"]["name"] != old["metadata"]["name"]

        adapter.hold(ref, meta(2), "second")

        def workload(name: str) -> Obj:
            got: Obj = _custom(admin_client).get_namespaced_custom_object(
                WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, name
            )
            return got

        new_now = workload(new["metadata"]["name"])
        old_now = workload(old["metadata"]["name"])
        assert (_hold(new_now), is_active(new_now)) == ("2", False), (
            "hold 2 must be on the Workload of the TrainJob that exists now"
        )
        assert _hold(old_now) is None, "the dead TrainJob's Workload must not be written"
        assert adapter.observe(ref).state.value == "held"


def test_checker_attributes_a_write_that_landed_after_its_timeout_to_its_call() -> None:
    """A Hold whose PATCH landed after its client timed out has no response to attribute
    its write by; it is checked as that call's write, and an unexplained change is still
    flagged."""
    late = Call(0, "hold", 2, 1, 0, 0.0, 1.0, outcome="rejected")
    late.detail = "update trainjobs j: sent, but no answer within 0.015s; it may still land"
    events = [
        _tj_event(1, suspend=False, hold=None, type_="ADDED"),
        _tj_event(2, suspend=True, hold=2),
    ]
    verdict = check_schedule(_plain_plan(True, late), "j", events, [])
    assert verdict.violations == []
    answered = Call(0, "hold", 2, 1, 0, 0.0, 1.0, outcome="rejected", detail="refused")
    verdict = check_schedule(_plain_plan(True, answered), "j", events, [])
    assert any("non-hold writer" in v for v in verdict.violations), verdict.violations
