"""What only the asyncio adapter has, against the REAL local control plane: concurrent calls
on one event loop, awaited hooks, cancellation, its own connections, and its transport
failures sorted as the sync adapter's are (never connected, no answer, connection lost).

Its contract itself (every Start/Open/Hold/Release/Observe/Preflight behaviour) is checked
by tests/controlplane/test_adapter_kube.py, which runs every test on both adapters.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import AsyncAdapter, Config, Ref, State
from holdwarden.adapter.errors import AdapterError, Conflict, Rejected, StaleHold, Unreachable
from holdwarden.adapter.kube import FIELD_MANAGER
from holdwarden.adapter.steps import Request, Send
from holdwarden.config import TimeoutsConfig
from holdwarden.vocabulary import TRAINJOB, WORKLOAD
from rig.localcluster import LocalCluster
from tests.controlplane.test_adapter_kube import HOLDER, Cluster, hold_annotations, meta
from tests.controlplane.test_adapter_supervisor import _client_for, _closed_port, _Silent

pytestmark = pytest.mark.controlplane


@pytest.fixture
def kc(namespace: str, admin_client: k8s.ApiClient, kueue_client: k8s.ApiClient) -> Cluster:
    return Cluster(namespace, admin_client, kueue_client)


def config(cluster: LocalCluster, mode: str = "plain") -> Config:
    return Config(
        mode=mode,  # type: ignore[arg-type]
        holder=HOLDER,
        timeouts=TimeoutsConfig(apiserver_request=cluster.request_timeout),
    )


@pytest.mark.parametrize("mode", ["kueue", "plain"])
async def test_a_refused_connection_is_unreachable_and_nothing_was_sent(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, mode: str
) -> None:
    with _client_for(supervisor_client, f"https://127.0.0.1:{_closed_port()}") as dead:
        async with AsyncAdapter(config(cluster, mode), dead) as adapter:
            ref = Ref("ns", "job")
            began = time.monotonic()
            for call in (
                lambda: adapter.hold(ref, meta(1), "r"),
                lambda: adapter.release(ref, meta(1)),
                lambda: adapter.open(ref, meta()),
                lambda: adapter.observe(ref),
            ):
                with pytest.raises(Unreachable, match="not sent") as raised:
                    await call()
                assert "may still land" not in str(raised.value)
                assert raised.value.exit_code == 9 and not isinstance(raised.value, Rejected)
            assert time.monotonic() - began < 5  # refused at once: no timeout waited for


async def test_a_timeout_after_sending_says_it_may_still_land(
    supervisor_client: k8s.ApiClient,
) -> None:
    silent = _Silent()
    try:
        with _client_for(supervisor_client, f"http://127.0.0.1:{silent.port}") as api:
            quick = Config(
                mode="plain", timeouts=TimeoutsConfig(apiserver_request=timedelta(seconds=0.5))
            )
            async with AsyncAdapter(quick, api) as adapter:
                with pytest.raises(Rejected) as raised:
                    await adapter.observe(Ref("ns", "job"))
        assert silent.received.is_set()  # it WAS sent
        text = str(raised.value)
        assert not isinstance(raised.value, Unreachable)
        assert "may still land" in text and "call_bound (5.5s" in text, text
    finally:
        silent.close()


async def test_a_connection_lost_after_sending_may_still_land(
    supervisor_client: k8s.ApiClient,
) -> None:
    hangup = _Silent(hang_up=True)
    try:
        with _client_for(supervisor_client, f"http://127.0.0.1:{hangup.port}") as api:
            async with AsyncAdapter(Config(mode="plain"), api) as adapter:
                with pytest.raises(AdapterError) as raised:
                    await adapter.observe(Ref("ns", "job"))
        text = str(raised.value)
        assert hangup.requests >= 1
        assert not isinstance(raised.value, (Unreachable, Rejected))
        assert "lost after the request was sent" in text and "may still land" in text, text
    finally:
        hangup.close()


async def test_many_concurrent_holds_on_one_loop(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """One adapter, one loop, 40 jobs held and released at once (more calls than its
    connection limit, so some wait for a connection)."""
    names = [f"job-{i}" for i in range(40)]
    for name in names:
        kc.create_trainjob(name)
    async with AsyncAdapter(config(cluster), supervisor_client, connection_limit=8) as adapter:
        refs = [Ref(kc.ns, name) for name in names]
        await asyncio.gather(*(adapter.hold(ref, meta(3, 60), "node lost") for ref in refs))
        for name in names:
            assert hold_annotations(kc.trainjob(name))[KEYS_INSTANCE] == "3"
        states = await asyncio.gather(*(adapter.observe(ref) for ref in refs))
        assert {observation.state for observation in states} == {State.HELD}
        await asyncio.gather(*(adapter.release(ref, meta(3, 60)) for ref in refs))
    for name in names:
        assert hold_annotations(kc.trainjob(name)) == {}


KEYS_INSTANCE = "holdwarden.io/hold-instance"


@pytest.mark.parametrize("mode", ["kueue", "plain"])
async def test_concurrent_holds_of_one_job_leave_the_newest_instance_in_force(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, mode: str
) -> None:
    """Ten instances raced on one job: each call lands or is overtaken (StaleHold, also
    for a newer instance that met a conflict with another hold: the spec's rule, or a
    Conflict after its retries). Writes are preconditioned on their read and an older
    instance never replaces a newer one, so the successful calls landed in increasing
    order: the newest of them is in force."""
    if mode == "kueue":
        ref, workload = kc.kueue_job("job")
    else:
        kc.create_trainjob("job")
        ref, workload = Ref(kc.ns, "job"), ""
    async with AsyncAdapter(config(cluster, mode), supervisor_client) as adapter:
        outcomes = await asyncio.gather(
            *(adapter.hold(ref, meta(n, 60), f"r{n}") for n in range(1, 11)),
            return_exceptions=True,
        )
    for outcome in outcomes:
        assert outcome is None or isinstance(outcome, (StaleHold, Conflict)), outcome
    landed = [n for n, outcome in enumerate(outcomes, start=1) if outcome is None]
    assert landed, outcomes
    held = kc.workload(workload) if mode == "kueue" else kc.trainjob("job")
    assert hold_annotations(held)[KEYS_INSTANCE] == str(max(landed)), (landed, outcomes)


async def test_an_async_hook_is_awaited_before_each_request(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job")
    seen: list[Request] = []

    async def hook(req: Request) -> None:
        await asyncio.sleep(0)
        seen.append(req)

    async with AsyncAdapter(config(cluster), supervisor_client, before_request=hook) as adapter:
        await adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
        assert len(seen) == adapter.request_count > 0
        assert [r.verb for r in seen][-1] == "update"


async def test_a_cancelled_call_sends_nothing_more_and_the_adapter_goes_on(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job")
    ref = Ref(kc.ns, "job")
    at_write = asyncio.Event()
    never = asyncio.Event()

    async def hook(req: Request) -> None:
        if req.verb == "update" and not at_write.is_set():
            at_write.set()
            await never.wait()  # the first write waits here until cancelled

    async with AsyncAdapter(config(cluster), supervisor_client, before_request=hook) as adapter:
        call = asyncio.create_task(adapter.hold(ref, meta(1, 60), "r"))
        async with asyncio.timeout(30):
            await at_write.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert hold_annotations(kc.trainjob("job")) == {}  # its write was never sent
        await adapter.hold(ref, meta(2), "r")
        assert hold_annotations(kc.trainjob("job"))[KEYS_INSTANCE] == "2"


async def test_it_copies_the_callers_client_and_keeps_who_the_caller_is(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    configuration = supervisor_client.configuration
    host, headers = configuration.host, dict(supervisor_client.default_headers)
    kc.create_trainjob("job")
    async with AsyncAdapter(config(cluster), supervisor_client) as adapter:
        await adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
    assert configuration.host == host and dict(supervisor_client.default_headers) == headers
    tj: Any = kc.trainjob("job")
    managers = {m["manager"] for m in tj["metadata"].get("managedFields") or []}
    assert FIELD_MANAGER in managers  # sent as the impersonated supervisor, by the adapter
    # The caller's client is still the caller's, open and working.
    k8s.CoreV1Api(supervisor_client).list_namespaced_pod(kc.ns)


async def test_closed_is_closed_and_one_loop_only(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job")
    ref = Ref(kc.ns, "job")
    adapter = AsyncAdapter(config(cluster), supervisor_client)
    assert (await adapter.observe(ref)).state is State.AT_START_GATE
    elsewhere: list[BaseException] = []

    def other_loop() -> None:
        try:
            asyncio.run(adapter.observe(ref))
        except BaseException as exc:  # recorded, asserted below
            elsewhere.append(exc)

    thread = threading.Thread(target=other_loop)
    thread.start()
    await asyncio.to_thread(thread.join, 30)
    assert len(elsewhere) == 1 and "another event loop" in str(elsewhere[0])
    await adapter.aclose()
    await adapter.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await adapter.observe(ref)


async def test_a_kueue_read_has_its_two_gets_in_flight_together(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    kc: Cluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio twin of the sync driver's test: with the Workload's name cached, both
    GETs of a Kueue-mode read wait at one two-party barrier before they are sent, which
    sending them one after the other would break (asyncio.timeout: never a hang)."""
    ref, _ = kc.kueue_job("job")
    async with AsyncAdapter(config(cluster, "kueue"), supervisor_client) as adapter:
        await adapter.hold(ref, meta(1), "first")  # lazy preflight + discovery fill the cache
        barrier = asyncio.Barrier(2)
        met: list[str] = []
        perform = adapter._perform

        async def at_barrier(step: Send) -> Any:
            if step.req.verb == "get":
                async with asyncio.timeout(10):
                    await barrier.wait()
                met.append(step.req.resource)
            return await perform(step)

        monkeypatch.setattr(adapter, "_perform", at_barrier)
        await adapter.hold(ref, meta(2), "second")
        assert sorted(met) == sorted([TRAINJOB.plural, WORKLOAD.plural])
        monkeypatch.undo()
        assert (await adapter.observe(ref)).hold_instance == 2
