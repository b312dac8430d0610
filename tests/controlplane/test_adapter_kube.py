"""Both adapters against the REAL local control plane (etcd + kube-apiserver, real CRDs).

Every test runs twice: with the sync ``Adapter`` and with the asyncio ``AsyncAdapter``
(through ``tests.support.adapters.BlockingAsyncAdapter``, which gives it blocking methods), so the
two drivers are held to exactly the same behaviour.

The adapter runs as the supervisor's service account. No Kueue or Trainer controller runs:
where the story needs one, the test acts as it, impersonating its service account (the
Workload is created and its status written as Kueue; pods are created as Trainer).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta, Config, Ref, State
from holdwarden.adapter.errors import (
    Conflict,
    Invalid,
    NotFound,
    PodsRemain,
    Rejected,
    StaleHold,
    Unsupported,
)
from holdwarden.adapter.kube import FIELD_MANAGER, MAX_RETRIES, Request
from holdwarden.adapter.operations.write_loop import WATCH_OPEN_S
from holdwarden.adapter.steps import Send
from holdwarden.config import TimeoutsConfig
from holdwarden.objects import kueue_workload_names
from holdwarden.vocabulary import JOBSET_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from rig.builders import kueue_workload_body, trainjob_body, workload_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from tests.support.adapters import BlockingAsyncAdapter
from tests.support.netfaults import BufferingWatchProxy
from tests.support.rbac_helpers import wait_allowed

pytestmark = pytest.mark.controlplane

A = Annotations("holdwarden.io")
HOLDER = "dispatch-test"


def meta(instance: int | None = None, seconds: float = 20) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=seconds), instance)


_DRIVER: dict[str, Any] = {"name": "sync", "made": []}


@pytest.fixture(params=["sync", "asyncio"], autouse=True)
def driver(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which adapter ``make`` builds for this run of the test; asyncio ones are closed
    after it. A test that pins ``driver`` by parametrize runs with that one only."""
    _DRIVER["name"] = request.param
    yield request.param
    for made in _DRIVER["made"]:
        made.close()
    _DRIVER.update(name="sync", made=[])


def make_with(config: Config, api: k8s.ApiClient, **kwargs: Any) -> Adapter:
    """The adapter of this test's driver (the asyncio one behind blocking methods)."""
    if _DRIVER["name"] == "sync":
        return Adapter(config, api, **kwargs)
    made = BlockingAsyncAdapter(config, api, **kwargs)
    _DRIVER["made"].append(made)
    return made  # type: ignore[return-value]  # the same methods, blocking


def make(
    cluster: LocalCluster,
    api: k8s.ApiClient,
    mode: str,
    **kwargs: Any,
) -> Adapter:
    config = Config(
        mode=mode,  # type: ignore[arg-type]
        holder=HOLDER,
        timeouts=TimeoutsConfig(apiserver_request=cluster.request_timeout),
    )
    return make_with(config, api, **kwargs)


class Cluster:
    """Reads and writes the tests make as other parties (admin, Kueue, Trainer)."""

    def __init__(self, ns: str, admin: k8s.ApiClient, kueue: k8s.ApiClient) -> None:
        self.ns = ns
        self.admin = k8s.CustomObjectsApi(admin)
        self.kueue = k8s.CustomObjectsApi(kueue)
        self.core = k8s.CoreV1Api(admin)

    def tj_args(self) -> tuple[str, str, str, str]:
        return (TRAINJOB.group, TRAINJOB.version, self.ns, TRAINJOB.plural)

    def wl_args(self) -> tuple[str, str, str, str]:
        return (WORKLOAD.group, WORKLOAD.version, self.ns, WORKLOAD.plural)

    def trainjob(self, name: str) -> dict[str, Any]:
        obj: Any = self.admin.get_namespaced_custom_object(*self.tj_args(), name)
        return dict(obj)

    def workload(self, name: str) -> dict[str, Any]:
        obj: Any = self.admin.get_namespaced_custom_object(*self.wl_args(), name)
        return dict(obj)

    def create_trainjob(self, name: str, *, queue: str | None = None, suspend: bool = True) -> Any:
        return self.admin.create_namespaced_custom_object(
            *self.tj_args(), trainjob_body(name, queue=queue, suspend=suspend)
        )

    def create_workload(self, trainjob: dict[str, Any], name: str | None = None) -> Any:
        """As Kueue does: label job-uid + controller ownerReference, and Kueue's name
        unless ``name`` is given (a Workload found only by its label)."""
        return self.kueue.create_namespaced_custom_object(
            *self.wl_args(), kueue_workload_body(trainjob, name, queue="user-queue")
        )

    def kueue_job(self, name: str) -> tuple[Ref, str]:
        tj = self.create_trainjob(name, queue="user-queue")
        wl = self.create_workload(tj)
        return Ref(self.ns, name), wl["metadata"]["name"]

    def set_workload_condition(self, wl_name: str, type_: str, reason: str) -> None:
        """As Kueue: write a Workload condition through the status subresource."""
        wl: Any = self.kueue.get_namespaced_custom_object(*self.wl_args(), wl_name)
        conds = [c for c in (wl.get("status") or {}).get("conditions", []) if c["type"] != type_]
        conds.append(
            {
                "type": type_,
                "status": "True",
                "reason": reason,
                "message": f"{reason} (test)",
                "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        wl.setdefault("status", {})["conditions"] = conds
        self.kueue.replace_namespaced_custom_object_status(*self.wl_args(), wl_name, wl)

    def bump_workload_status(self, wl_name: str) -> None:
        """A routine Kueue status write: it changes the Workload's resourceVersion."""
        self.set_workload_condition(wl_name, "QuotaReserved", f"Pending{uuid.uuid4().hex[:6]}")

    def set_workload_active(self, wl_name: str, active: bool, api: Any = None) -> None:
        api = api or self.kueue
        wl = api.get_namespaced_custom_object(*self.wl_args(), wl_name)
        wl["spec"]["active"] = active
        api.replace_namespaced_custom_object(*self.wl_args(), wl_name, wl)

    def trainer_writes_status(self, name: str, trainer: k8s.ApiClient) -> None:
        """As Trainer: a routine TrainJob status write (the status subresource)."""
        api: Any = k8s.CustomObjectsApi(trainer)
        tj: Any = api.get_namespaced_custom_object(*self.tj_args(), name)
        tj["status"] = {
            "conditions": [
                {
                    "type": "Suspended",
                    "status": "True",
                    "reason": f"Suspended{uuid.uuid4().hex[:4]}",
                    "message": "suspended",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
        api.replace_namespaced_custom_object_status(*self.tj_args(), name, tj)

    def set_suspend(self, name: str, suspend: bool) -> None:
        """Another writer (an admin, no enforcer here) sets spec.suspend."""
        self.admin.patch_namespaced_custom_object(
            *self.tj_args(), name, {"spec": {"suspend": suspend}}
        )

    def bump_trainjob(self, name: str) -> None:
        """Another writer touches the TrainJob (a label), changing its resourceVersion."""
        tj = self.trainjob(name)
        tj["metadata"].setdefault("labels", {})["touched"] = uuid.uuid4().hex[:8]
        self.admin.replace_namespaced_custom_object(*self.tj_args(), name, tj)


@pytest.fixture
def kc(namespace: str, admin_client: k8s.ApiClient, kueue_client: k8s.ApiClient) -> Cluster:
    return Cluster(namespace, admin_client, kueue_client)


def updates(adapter: Adapter) -> list[Request]:
    return [r for r in adapter.request_log if r.verb == "update"]


def hold_annotations(obj: dict[str, Any]) -> dict[str, str]:
    ann = obj["metadata"].get("annotations") or {}
    return {k: v for k, v in ann.items() if k in A.hold_keys}


# ==== Kueue mode ========================================================================


def test_kueue_hold_is_one_workload_update_and_leaves_the_trainjob_alone(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.preflight(kc.ns)
    tj_before = kc.trainjob("job")
    adapter.hold(ref, meta(3), "node lost")
    wl = kc.workload(wl_name)
    assert wl["spec"]["active"] is False
    held = hold_annotations(wl)
    assert held[A.hold_instance] == "3"
    assert held[A.hold_reason] == "node lost"
    assert held[A.held_by] == HOLDER
    held_at = datetime.strptime(held[A.held_at], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs(datetime.now(UTC) - held_at) < timedelta(seconds=30)
    assert [(r.resource, r.name) for r in updates(adapter)] == [(WORKLOAD.plural, wl_name)]
    tj_after = kc.trainjob("job")
    assert tj_after["metadata"]["resourceVersion"] == tj_before["metadata"]["resourceVersion"]
    assert not hold_annotations(tj_after)


def test_kueue_steady_state_hold_is_three_requests(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, _ = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(ref, meta(1), "first")  # lazy preflight + discovery
    before = adapter.request_count
    adapter.hold(ref, meta(2), "second")
    # GET TrainJob (its uid now) and GET the cached Workload, sent at once, then the PATCH:
    # see _read_held for why the TrainJob read cannot be skipped. The log records the two
    # GETs in the order the call prepared them.
    assert adapter.request_count - before == 3
    assert [(r.verb, r.resource) for r in list(adapter.request_log)[-3:]] == [
        ("get", TRAINJOB.plural),
        ("get", WORKLOAD.plural),
        ("update", WORKLOAD.plural),
    ]


def test_kueue_adapter_never_writes_spec_suspend(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.open(ref, meta())
    adapter.hold(ref, meta(1), "r")
    adapter.release(ref, meta(1))
    adapter.hold(ref, meta(2), "r")
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    mine = [m for m in tj["metadata"]["managedFields"] if m["manager"] == FIELD_MANAGER]
    assert mine, "the adapter's Open wrote the TrainJob under its field manager"
    for entry in mine:
        assert "f:spec" not in entry.get("fieldsV1", {}), entry
    wl = kc.workload(wl_name)
    wl_mine = [m for m in wl["metadata"]["managedFields"] if m["manager"] == FIELD_MANAGER]
    assert any("f:active" in str(m.get("fieldsV1")) for m in wl_mine)
    assert "suspend" not in str(wl_mine)
    # every TrainJob update the adapter sent was Open's mark
    assert [r.resource for r in updates(adapter)] == [
        TRAINJOB.plural,
        WORKLOAD.plural,
        WORKLOAD.plural,
        WORKLOAD.plural,
    ]


def test_kueue_release_refuses_other_instances_then_lifts_in_one_update(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(ref, meta(3), "r")
    rv = kc.workload(wl_name)["metadata"]["resourceVersion"]
    for other in (2, 4):
        with pytest.raises(StaleHold):
            adapter.release(ref, meta(other))
    assert kc.workload(wl_name)["metadata"]["resourceVersion"] == rv
    n = len(updates(adapter))
    adapter.release(ref, meta(3))
    assert len(updates(adapter)) == n + 1
    wl = kc.workload(wl_name)
    assert wl["spec"]["active"] is True
    assert hold_annotations(wl) == {}
    with pytest.raises(StaleHold):  # no hold in force: refused, word for word
        adapter.release(ref, meta(3))


def test_kueue_older_hold_is_refused_newer_supersedes(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(ref, meta(5), "r")
    with pytest.raises(StaleHold) as raised:
        adapter.hold(ref, meta(4), "late")
    assert isinstance(raised.value, Rejected)
    adapter.hold(ref, meta(5), "again")  # idempotent, no write
    adapter.hold(ref, meta(6), "newer")
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "6"


@pytest.mark.parametrize(
    ("cause",), [("MaximumExecutionTimeExceeded",), ("RequeuingLimitExceeded",)]
)
def test_observe_kueue_own_deactivation_by_reason(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, cause: str
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    kc.set_workload_active(wl_name, False)
    kc.set_workload_condition(wl_name, "Evicted", f"DeactivatedDueTo{cause}")
    before = adapter.request_count
    obs = adapter.observe(ref)
    assert obs.state is State.DEACTIVATED_BY_KUEUE
    assert obs.kueue_cause == cause
    assert obs.hold_instance is None
    sent = list(adapter.request_log)[before:]
    assert sent and all(r.verb in ("get", "list") for r in sent), "Observe never writes"


def test_observe_deactivation_in_progress(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    kc.set_workload_condition(wl_name, "DeactivationTarget", "RequeuingLimitExceeded")
    obs = adapter.observe(ref)
    assert obs.state is State.DEACTIVATED_BY_KUEUE
    assert obs.kueue_cause == "RequeuingLimitExceeded"


def test_observe_deactivation_by_someone_else_is_never_a_hold(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
    kc: Cluster,
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    kc.set_workload_active(wl_name, False, api=k8s.CustomObjectsApi(editor_client))
    assert adapter.observe(ref).state is State.DEACTIVATED_BY_OTHER
    kc.set_workload_condition(wl_name, "Evicted", "Deactivated")
    obs = adapter.observe(ref)
    assert obs.state is State.DEACTIVATED_BY_OTHER
    assert obs.hold_instance is None and obs.kueue_cause is None
    # and Release of any instance refuses: there is no hold of ours to lift
    with pytest.raises(StaleHold):
        adapter.release(ref, meta(1))
    assert kc.workload(wl_name)["spec"]["active"] is False


def test_observe_our_hold(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    assert adapter.observe(ref).state is State.AT_START_GATE
    adapter.open(ref, meta())
    obs = adapter.observe(ref)
    assert obs.state is State.WAITING_FOR_ADMISSION and obs.opened
    adapter.hold(ref, meta(7), "drain node-3")
    kc.set_workload_condition(wl_name, "Evicted", "Deactivated")  # what Kueue then writes
    obs = adapter.observe(ref)
    assert obs.state is State.HELD
    assert (obs.hold_instance, obs.hold_reason, obs.held_by) == (7, "drain node-3", HOLDER)
    assert obs.workload == wl_name


def test_kueue_hold_without_workload_is_rejected(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("orphan", queue="user-queue")
    adapter = make(cluster, supervisor_client, "kueue")
    with pytest.raises(Rejected) as raised:
        adapter.hold(Ref(kc.ns, "orphan"), meta(1), "r")
    assert type(raised.value) is Rejected
    assert "no Workload" in str(raised.value)
    with pytest.raises(NotFound):
        adapter.hold(Ref(kc.ns, "missing"), meta(1), "r")


def test_kueue_workload_needs_controller_owner_reference(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """A Workload carrying the job-uid label but no controller ownerReference is not it."""
    tj = kc.create_trainjob("job", queue="user-queue")
    body = workload_body("impostor", trainjob=tj)
    body["metadata"]["ownerReferences"][0]["controller"] = False
    kc.kueue.create_namespaced_custom_object(*kc.wl_args(), body)
    adapter = make(cluster, supervisor_client, "kueue")
    with pytest.raises(Rejected, match="no Workload"):
        adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
    assert kc.workload("impostor")["spec"].get("active", True) is True


def test_kueue_rediscovers_a_replaced_workload(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(ref, meta(1), "r")
    adapter.release(ref, meta(1))
    kc.kueue.delete_namespaced_custom_object(*kc.wl_args(), wl_name)
    new = kc.create_workload(kc.trainjob("job"), name="replacement")
    adapter.hold(ref, meta(2), "r")
    assert hold_annotations(kc.workload(new["metadata"]["name"]))[A.hold_instance] == "2"


def workload_requests(adapter: Adapter) -> list[tuple[str, str | None]]:
    return [(r.verb, r.name) for r in adapter.request_log if r.resource == WORKLOAD.plural]


def test_kueue_finds_the_workload_by_kueues_name_without_a_list(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """A GET by the name Kueue gives, not a LIST that grows with the namespace."""
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(ref, meta(1), "r")
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "1"
    reads = [r for r in workload_requests(adapter) if r[0] in ("get", "list")]
    assert reads and set(reads) == {("get", wl_name)}


def test_kueue_finds_a_workload_named_otherwise_by_its_label(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """A Workload under another name (another Kueue version, workload slicing) is found
    by the LIST once the predicted name misses."""
    tj = kc.create_trainjob("job", queue="user-queue")
    kc.create_workload(tj, name="named-otherwise")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
    assert hold_annotations(kc.workload("named-otherwise"))[A.hold_instance] == "1"
    predicted = kueue_workload_names("job", tj["metadata"]["uid"])[0]
    reads = [r for r in workload_requests(adapter) if r[0] in ("get", "list")]
    assert reads[:2] == [("get", predicted), ("list", "")]
    assert [verb for verb, _ in reads].count("list") == 1, "found once, then remembered"


def test_kueue_does_not_take_a_workload_of_kueues_name_that_is_not_the_trainjobs(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """The predicted name alone does not make a Workload the TrainJob's: one owned by
    another TrainJob, under exactly that name, is left alone and the LIST decides."""
    tj = kc.create_trainjob("job", queue="user-queue")
    other = kc.create_trainjob("other", queue="user-queue")
    predicted = kueue_workload_names("job", tj["metadata"]["uid"])[0]
    kc.create_workload(other, name=predicted)
    kc.create_workload(tj, name="the-real-one")
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
    assert hold_annotations(kc.workload("the-real-one"))[A.hold_instance] == "1"
    assert not hold_annotations(kc.workload(predicted))


def start_while_kueue_makes_the_workload(
    adapter: Adapter, kc: Cluster, name: str, after_s: float, workload_name: str | None = None
) -> tuple[Ref, float]:
    """Start ``name`` while, as Kueue, a thread makes its Workload ``after_s`` later (under
    ``workload_name``, or Kueue's name). Returns the ref and the seconds Start took."""
    body = trainjob_body(name, queue="user-queue")
    body["metadata"]["namespace"] = kc.ns

    def kueue_creates_the_workload() -> None:
        time.sleep(after_s)
        kc.create_workload(kc.trainjob(name), name=workload_name)

    actor = threading.Thread(target=kueue_creates_the_workload)
    actor.start()
    t0 = time.monotonic()
    try:
        ref = adapter.start(body, meta(seconds=15))
    finally:
        actor.join()
    return ref, time.monotonic() - t0


def test_start_waits_for_the_workload(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "kueue")
    ref, elapsed = start_while_kueue_makes_the_workload(adapter, kc, "started", 1.0)
    assert ref == Ref(kc.ns, "started")
    assert elapsed >= 0.9, "Start returned before the Workload existed"
    adapter.preflight(kc.ns)
    before = adapter.request_count
    adapter.hold(ref, meta(1), "r")  # Workload found by Start is cached: no LIST
    # The TrainJob and its Workload, the runtime (the TrainJob is not suspended), the PATCH.
    assert adapter.request_count - before == 4
    # While it waited, Start polled by Kueue's name; a LIST at most once a second.
    polls = workload_requests(adapter)
    assert polls.count(("list", "")) <= polls.count(("get", polls[0][1])) // 10 + 1


def test_start_finds_a_workload_named_otherwise_within_a_second_or_two(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "kueue")
    ref, _ = start_while_kueue_makes_the_workload(
        adapter, kc, "renamed", 0.3, workload_name="renamed-elsewhere"
    )
    assert ref == Ref(kc.ns, "renamed")
    assert ("list", "") in workload_requests(adapter), "found by its label"
    adapter.hold(ref, meta(1), "r")
    assert hold_annotations(kc.workload("renamed-elsewhere"))[A.hold_instance] == "1"


def test_start_times_out_at_the_deadline_without_workload(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "kueue")
    body = trainjob_body("lonely", queue="user-queue")
    body["metadata"]["namespace"] = kc.ns
    # The deadline includes the POST: 5 s leaves a starved machine time for it, and the
    # call must still end at the deadline (not before), well short of twice it.
    t0 = time.monotonic()
    with pytest.raises(Rejected, match="Workload did not appear"):
        adapter.start(body, meta(seconds=5.0))
    elapsed = time.monotonic() - t0
    assert 4.8 <= elapsed <= 10.0, elapsed
    assert kc.trainjob("lonely")["metadata"]["name"] == "lonely"


def test_start_validates_the_body(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "kueue")
    body = trainjob_body("nolabel")
    body["metadata"]["namespace"] = kc.ns
    with pytest.raises(Invalid, match="queue-name"):
        adapter.start(body, meta())
    assert adapter.request_count == 0


# ==== plain mode ========================================================================


def test_plain_hold_is_one_update_with_suspend_and_annotations(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "plain")
    body = trainjob_body("job")
    body["metadata"]["namespace"] = kc.ns
    ref = adapter.start(body, meta())
    assert kc.trainjob("job")["spec"]["suspend"] is True  # at its start gate
    adapter.open(ref, meta())
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is False
    assert tj["metadata"]["annotations"][A.attempt] == "1"
    n = len(updates(adapter))
    adapter.hold(ref, meta(2), "r")
    assert len(updates(adapter)) == n + 1
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    assert set(hold_annotations(tj)) == set(A.hold_keys)
    assert adapter.observe(ref).state is State.HELD


def make_pod(ns: str, job: str, trainer: k8s.ApiClient) -> str:
    name = f"{job}-node-0-{uuid.uuid4().hex[:5]}"
    k8s.CoreV1Api(trainer).create_namespaced_pod(
        ns,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels={JOBSET_NAME_LABEL: job}),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
        ),
    )
    return name


def test_plain_release_with_pods_remaining_writes_nothing(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    kc: Cluster,
) -> None:
    adapter = make(cluster, supervisor_client, "plain")
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    adapter.open(ref, meta())
    pod = make_pod(kc.ns, "job", trainer_client)
    make_pod(kc.ns, "other", trainer_client)  # another job's pod does not count
    adapter.hold(ref, meta(1), "r")
    rv = kc.trainjob("job")["metadata"]["resourceVersion"]
    n = len(updates(adapter))
    with pytest.raises(PodsRemain):
        adapter.release(ref, meta(1))
    assert len(updates(adapter)) == n
    tj = kc.trainjob("job")
    assert tj["metadata"]["resourceVersion"] == rv
    assert tj["spec"]["suspend"] is True and hold_annotations(tj)[A.hold_instance] == "1"
    k8s.CoreV1Api(trainer_client).delete_namespaced_pod(pod, kc.ns, grace_period_seconds=0)
    deadline = time.monotonic() + 10
    while (
        k8s.CoreV1Api(trainer_client)
        .list_namespaced_pod(kc.ns, label_selector=f"{JOBSET_NAME_LABEL}=job")
        .items
    ):
        assert time.monotonic() < deadline, "the pod did not go away"
        time.sleep(0.1)
    adapter.release(ref, meta(1))
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is False
    assert tj["metadata"]["annotations"][A.attempt] == "2"
    assert hold_annotations(tj) == {}


def pod_lists(adapter: Adapter) -> int:
    """Release's pod checks (the lazy preflight's own pod LIST is named: not counted)."""
    return sum(
        1 for r in adapter.request_log if (r.verb, r.resource, r.name) == ("list", "pods", "")
    )


def test_the_trainjob_generation_moves_with_its_spec_only(
    trainer_client: k8s.ApiClient, kc: Cluster
) -> None:
    """What ``decisions.pod_check_carries_over`` relies on, shown on the real CRD: status
    and metadata writes leave ``metadata.generation`` alone; a spec.suspend change raises
    it."""
    kc.create_trainjob("job", suspend=True)
    generation = kc.trainjob("job")["metadata"]["generation"]
    kc.trainer_writes_status("job", trainer_client)
    kc.bump_trainjob("job")  # a label
    kc.admin.patch_namespaced_custom_object(
        *kc.tj_args(), "job", {"metadata": {"annotations": {"x": "y"}}}
    )
    assert kc.trainjob("job")["metadata"]["generation"] == generation
    kc.set_suspend("job", False)
    kc.set_suspend("job", True)
    assert kc.trainjob("job")["metadata"]["generation"] == generation + 2


def test_a_plain_release_retried_after_a_status_write_lists_the_pods_once(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    kc: Cluster,
) -> None:
    """A conflict from Trainer's status write leaves the TrainJob suspended at the same
    generation: the retry writes on its read at once, with the first try's pod check (no
    second LIST between its read and its write)."""
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    make(cluster, supervisor_client, "plain").open(ref, meta())
    make(cluster, supervisor_client, "plain").hold(ref, meta(1), "r")
    adapter = make(
        cluster,
        supervisor_client,
        "plain",
        before_request=interleave(lambda: kc.trainer_writes_status("job", trainer_client), 2),
    )
    adapter.release(ref, meta(1))
    assert len(updates(adapter)) == 3 and pod_lists(adapter) == 1
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is False and hold_annotations(tj) == {}
    assert tj["metadata"]["annotations"][A.attempt] == "2"


def test_a_plain_release_lists_the_pods_again_when_the_job_ran_between_its_tries(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    kc: Cluster,
) -> None:
    """Between the first try's pod check and its write, someone unsuspends the job, a pod
    starts, and the job is suspended again (no enforcer here to refuse it). The generation
    moved, so the retry lists the pods again, finds the pod, and writes nothing."""
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    make(cluster, supervisor_client, "plain").open(ref, meta())
    make(cluster, supervisor_client, "plain").hold(ref, meta(1), "r")

    def ran_and_stopped() -> None:
        kc.set_suspend("job", False)
        make_pod(kc.ns, "job", trainer_client)
        kc.set_suspend("job", True)

    adapter = make(
        cluster, supervisor_client, "plain", before_request=interleave(ran_and_stopped, 1)
    )
    with pytest.raises(PodsRemain):
        adapter.release(ref, meta(1))
    assert len(updates(adapter)) == 1 and pod_lists(adapter) == 2
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True and hold_annotations(tj)[A.hold_instance] == "1"


def test_plain_held_before_opened_stays_suspended_after_release(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "plain")
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    adapter.hold(ref, meta(1), "r")
    adapter.release(ref, meta(1))
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    assert A.attempt not in (tj["metadata"].get("annotations") or {})
    assert adapter.observe(ref).state is State.AT_START_GATE
    adapter.open(ref, meta())
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is False and tj["metadata"]["annotations"][A.attempt] == "1"


def test_plain_release_of_ended_job_keeps_it_suspended(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "plain")
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    adapter.open(ref, meta())
    adapter.hold(ref, meta(1), "r")
    tj = kc.trainjob("job")
    tj["status"] = {
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "JobsetCompleted",
                "message": "done",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    kc.admin.replace_namespaced_custom_object_status(*kc.tj_args(), "job", tj)
    adapter.release(ref, meta(1))
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    assert tj["metadata"]["annotations"][A.attempt] == "1"
    assert adapter.observe(ref).state is State.ENDED


def test_plain_open_on_held_object_writes_only_the_opened_mark(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    adapter = make(cluster, supervisor_client, "plain")
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    adapter.hold(ref, meta(4), "r")
    held = hold_annotations(kc.trainjob("job"))
    adapter.open(ref, meta())
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    assert hold_annotations(tj) == held
    assert A.opened in tj["metadata"]["annotations"]
    assert A.attempt not in tj["metadata"]["annotations"]
    adapter.open(ref, meta())  # idempotent
    assert kc.trainjob("job")["metadata"]["resourceVersion"] == tj["metadata"]["resourceVersion"]


def test_stale_open_never_lifts_a_hold(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """Open reads the object at its gate, a Hold lands before Open's write: the write
    conflicts, Open re-reads, sees the hold and writes only the opened mark."""
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    holder = make(cluster, supervisor_client, "plain")
    fired: list[bool] = []

    def hold_lands_before_open_writes(req: Request) -> None:
        if req.verb == "update" and not fired:
            fired.append(True)
            holder.hold(ref, meta(9), "overtakes open")

    opener = make(cluster, supervisor_client, "plain", before_request=hold_lands_before_open_writes)
    opener.open(ref, meta())
    assert fired
    assert len(updates(opener)) == 2  # the conflicted try and the mark-only retry
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    assert hold_annotations(tj)[A.hold_instance] == "9"
    assert A.opened in tj["metadata"]["annotations"]
    assert A.attempt not in tj["metadata"]["annotations"]


# ==== stale calls and conflicts =========================================================


def interleave(action: Callable[[], None], times: int = 1) -> Callable[[Request], None]:
    """A hook that runs ``action`` (another writer) just before the adapter's first
    ``times`` updates, i.e. between the adapter's read and its write."""
    left = [times]

    def hook(req: Request) -> None:
        if req.verb == "update" and left[0] > 0:
            left[0] -= 1
            action()

    return hook


@pytest.fixture
def kueue_job(kc: Cluster) -> Iterator[tuple[Ref, str]]:
    yield kc.kueue_job("job")


def test_conflict_from_another_writer_is_retried(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, wl_name = kueue_job
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: kc.bump_workload_status(wl_name), times=3),
    )
    adapter.hold(ref, meta(1), "r")
    assert len(updates(adapter)) == 4
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "1"
    adapter2 = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: kc.bump_workload_status(wl_name), times=2),
    )
    adapter2.release(ref, meta(1))
    assert len(updates(adapter2)) == 3
    assert kc.workload(wl_name)["spec"]["active"] is True


def test_hold_overtaken_by_newer_hold_between_read_and_write_is_stale(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, wl_name = kueue_job
    other = make(cluster, supervisor_client, "kueue")
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: other.hold(ref, meta(3), "newer")),
    )
    with pytest.raises(StaleHold):
        adapter.hold(ref, meta(2), "older")
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "3"


def test_hold_after_conflict_with_other_instance_is_stale_even_if_older(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    """Word for word: after a conflict, an instance other than the one the last read saw
    is StaleHold — even an older one (hold 1 landed between Hold(5)'s read and write)."""
    ref, wl_name = kueue_job
    other = make(cluster, supervisor_client, "kueue")
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: other.hold(ref, meta(1), "older")),
    )
    with pytest.raises(StaleHold):
        adapter.hold(ref, meta(5), "r")
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "1"


def test_hold_whose_earlier_try_landed_succeeds_after_conflict(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, wl_name = kueue_job
    other = make(cluster, supervisor_client, "kueue")
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: other.hold(ref, meta(2), "same instance")),
    )
    adapter.hold(ref, meta(2), "r")
    assert len(updates(adapter)) == 1
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "2"


def test_release_overtaken_by_newer_hold_is_stale(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, wl_name = kueue_job
    other = make(cluster, supervisor_client, "kueue")
    other.hold(ref, meta(1), "r")
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: other.hold(ref, meta(2), "newer")),
    )
    with pytest.raises(StaleHold):
        adapter.release(ref, meta(1))
    wl = kc.workload(wl_name)
    assert wl["spec"]["active"] is False and hold_annotations(wl)[A.hold_instance] == "2"


def test_eight_retries_then_conflict(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, wl_name = kueue_job
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: kc.bump_workload_status(wl_name), times=100),
    )
    with pytest.raises(Conflict):
        adapter.hold(ref, meta(1, seconds=60), "r")
    assert len(updates(adapter)) == 1 + MAX_RETRIES == 9
    assert hold_annotations(kc.workload(wl_name)) == {}


def watch_streams_open() -> int:
    """Watch readers of the sync driver still running (threads named holdwarden-watch)."""
    return sum(1 for t in threading.enumerate() if t.name == "holdwarden-watch")


def test_a_retry_reads_from_a_watch_that_ends_with_the_call(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    """After a conflict the retry decides on the Workload as its watch delivers it (no GET
    of the TrainJob or the Workload again), and the write carries that state's
    resourceVersion; the watch is closed when the call returns."""
    ref, wl_name = kueue_job
    warm = make(cluster, supervisor_client, "kueue")
    warm.hold(ref, meta(1), "warm")  # the lazy preflight and discovery, out of the way
    warm.release(ref, meta(1))
    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(lambda: kc.bump_workload_status(wl_name), times=1),
    )
    adapter._core.context.preflights.update(warm._core.context.preflights)
    adapter._core.context.workloads.update(warm._core.context.workloads)
    adapter.hold(ref, meta(2), "r")
    assert [(r.verb, r.resource) for r in adapter.request_log] == [
        ("get", TRAINJOB.plural),
        ("get", WORKLOAD.plural),
        ("update", WORKLOAD.plural),
        ("watch", WORKLOAD.plural),
        ("update", WORKLOAD.plural),
    ]
    wl = kc.workload(wl_name)
    assert wl["spec"]["active"] is False and hold_annotations(wl)[A.hold_instance] == "2"
    # The bump the retry was decided on is still there: nothing of it was overwritten.
    assert any(c["type"] == "QuotaReserved" for c in wl["status"]["conditions"])
    deadline = time.monotonic() + 10
    while watch_streams_open() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch_streams_open() == 0


def test_a_retry_decides_on_the_write_its_watch_delivers(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    """A write that comes while the retry waits on the watch is the state it decides on:
    the write after it is preconditioned on that write's resourceVersion and lands."""
    ref, wl_name = kueue_job
    writer_done = threading.Event()

    def bump_then_bump_again_soon() -> None:
        kc.bump_workload_status(wl_name)  # makes the first try conflict

        def later() -> None:
            time.sleep(0.01)  # while the retry waits for the next write
            kc.bump_workload_status(wl_name)
            writer_done.set()

        threading.Thread(target=later, daemon=True).start()

    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        before_request=interleave(bump_then_bump_again_soon, times=1),
    )
    adapter.hold(ref, meta(1), "r")
    assert writer_done.wait(10)
    assert hold_annotations(kc.workload(wl_name))[A.hold_instance] == "1"
    verbs = [r.verb for r in adapter.request_log if r.resource == WORKLOAD.plural]
    # One watch at most for the whole call; every retry after it read from it (the second
    # bump may land before or after the watch opened: either way no GET of the Workload).
    assert verbs.count("watch") == 1
    assert verbs[verbs.index("watch") :].count("get") == 0


def test_without_the_watch_right_retries_read_with_gets(
    cluster: LocalCluster, admin_client: k8s.ApiClient, kc: Cluster
) -> None:
    """A supervisor bound to a role without ``watch`` (an older install) still retries,
    with a paused GET per retry, as before watches were used."""
    user = f"nowatch-{uuid.uuid4().hex[:6]}"
    rbac: Any = k8s.RbacAuthorizationV1Api(admin_client)
    rbac.create_namespaced_role(
        kc.ns,
        {
            "metadata": {"name": user},
            "rules": [
                {
                    "apiGroups": [TRAINJOB.group],
                    "resources": ["trainjobs"],
                    "verbs": ["get", "patch", "update"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        kc.ns,
        {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    api = cluster.api_client(user)
    try:
        wait_allowed(api, "get", f"{TRAINJOB.plural}.{TRAINJOB.group}", kc.ns)
        config = Config(
            mode="plain",
            holder=HOLDER,
            timeouts=TimeoutsConfig(apiserver_request=cluster.request_timeout),
        )
        adapter = make_with(
            config,
            api,
            lazy_preflight="access",
            before_request=interleave(lambda: kc.bump_trainjob("job"), times=2),
        )
        adapter.hold(ref, meta(1), "r")
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert hold_annotations(kc.trainjob("job"))[A.hold_instance] == "1"
    verbs = [r.verb for r in adapter.request_log if r.resource == "trainjobs"]
    # The first read twice (the lazy access check ran between: the decision is made on a
    # fresh read), one watch tried (refused: 403), then each retry a GET.
    assert verbs == ["get", "get", "update", "watch", "get", "update", "get", "update"]


def test_plain_conflict_retries_then_conflict(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    adapter = make(
        cluster,
        supervisor_client,
        "plain",
        before_request=interleave(lambda: kc.bump_trainjob("job"), times=100),
    )
    with pytest.raises(Conflict):
        adapter.open(ref, meta(seconds=60))
    assert len(updates(adapter)) == 9


# ==== deadlines =========================================================================


class FakeClock:
    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


def test_deadline_expiring_between_read_and_write_sends_no_write(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, wl_name = kueue_job
    clock = FakeClock()

    def time_passes_before_the_write(req: Request) -> None:
        if req.verb == "update":
            clock.offset = timedelta(seconds=30)

    adapter = make(
        cluster,
        supervisor_client,
        "kueue",
        clock=clock,
        before_request=time_passes_before_the_write,
    )
    adapter.preflight(kc.ns)
    rv = kc.workload(wl_name)["metadata"]["resourceVersion"]
    before = adapter.request_count
    with pytest.raises(Rejected, match="deadline passed"):
        adapter.hold(ref, meta(1, seconds=10), "r")
    assert updates(adapter) == []
    # The TrainJob, then its Workload under the name Kueue gave it: no LIST.
    assert [r.verb for r in list(adapter.request_log)[before:]] == ["get", "get"]
    assert adapter.request_count - before == 2
    assert kc.workload(wl_name)["metadata"]["resourceVersion"] == rv


def test_missing_naive_or_passed_deadline(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, _ = kueue_job
    adapter = make(cluster, supervisor_client, "kueue")
    with pytest.raises(Invalid):
        adapter.hold(ref, CallMeta(None, 1), "r")
    with pytest.raises(Invalid):
        adapter.hold(ref, CallMeta(datetime.now() + timedelta(seconds=30), 1), "r")
    with pytest.raises(Rejected):
        adapter.hold(ref, CallMeta(datetime.now(UTC) - timedelta(seconds=1), 1), "r")
    with pytest.raises(Invalid):
        adapter.hold(ref, meta(None), "r")
    with pytest.raises(Invalid):
        adapter.release(ref, meta(0))
    with pytest.raises(Invalid):
        adapter.open(ref, CallMeta(None))
    assert adapter.request_count == 0


def test_deadline_bounds_each_request_timeout(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, kueue_job: tuple[Ref, str]
) -> None:
    ref, _ = kueue_job
    adapter = make(cluster, supervisor_client, "kueue")
    adapter.hold(ref, meta(1, seconds=5), "r")
    timeouts = [r.timeout for r in adapter.request_log]
    assert timeouts and all(t is not None and 0 < t <= 5 for t in timeouts)
    short = make_with(
        Config(
            mode="kueue",
            holder=HOLDER,
            timeouts=TimeoutsConfig(apiserver_request=timedelta(seconds=2)),
        ),
        supervisor_client,
    )
    short.hold(ref, meta(2, seconds=50), "r")
    assert all(r.timeout == 2.0 for r in short.request_log)


def test_call_bound(cluster: LocalCluster, supervisor_client: k8s.ApiClient) -> None:
    adapter = make(cluster, supervisor_client, "kueue")
    assert adapter.call_bound == cluster.request_timeout + timedelta(seconds=5)


# ==== preflight =========================================================================


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_preflight_as_supervisor(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, namespace: str, mode: str
) -> None:
    adapter = make(cluster, supervisor_client, mode)
    result = adapter.preflight(namespace)
    assert result.hold_round_trip.supported, result.hold_round_trip.reason
    assert result.update_workloads.supported
    assert result.list_pods.supported
    assert result.hold_supported and result.hold_unsupported_reason is None
    # no enforcer is installed in this namespace: the hold-breaking dry run is accepted
    assert not result.enforcer_installed.supported
    assert "no enforcer" in result.enforcer_installed.reason
    assert not [r for r in adapter.request_log if r.verb == "update"]
    assert all(r.verb != "create" for r in adapter.request_log), "only dry-run creates"


def test_preflight_detects_an_admission_refusal_naming_the_rule(
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
    namespace: str,
) -> None:
    """Stand in for the enforcer with a real in-apiserver ValidatingAdmissionPolicy that
    refuses what the enforcer refuses, with a message naming the rule; scoped to this
    test's namespace."""
    adm = k8s.AdmissionregistrationV1Api(admin_client)
    name = f"holdwarden-test-{namespace}"
    adm.create_validating_admission_policy(
        {  # type: ignore[arg-type]  # a dict body is sent as is
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [TRAINJOB.group],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": [TRAINJOB.plural],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": (
                            f"!has(object.metadata.annotations) || !('{A.hold_instance}' in"
                            " object.metadata.annotations) || (has(object.spec.suspend) &&"
                            " object.spec.suspend == true)"
                        ),
                        "message": "held-trainjob-suspended: a held TrainJob must be suspended",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {  # type: ignore[arg-type]
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        adapter = make(cluster, supervisor_client, "plain")
        deadline = time.monotonic() + 20
        while True:  # policies take effect asynchronously
            result = adapter.preflight(namespace)
            if result.enforcer_installed.supported or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result.enforcer_installed.supported, result.enforcer_installed.reason
        assert "held-trainjob-suspended" in result.enforcer_installed.reason
        assert result.hold_round_trip.supported  # a correctly held object passes
    finally:
        adm.delete_validating_admission_policy_binding(name)
        adm.delete_validating_admission_policy(name)


def test_unsupported_without_rights(
    cluster: LocalCluster, unprivileged_client: k8s.ApiClient, kc: Cluster
) -> None:
    ref, wl_name = kc.kueue_job("job")
    adapter = make(cluster, unprivileged_client, "kueue")
    result = adapter.preflight(kc.ns)
    assert not result.hold_round_trip.supported
    assert not result.update_workloads.supported
    assert not result.list_pods.supported
    assert not result.hold_supported
    with pytest.raises(Unsupported) as raised:
        adapter.hold(ref, meta(1), "r")
    assert raised.value.reason == result.hold_unsupported_reason
    with pytest.raises(Unsupported):
        adapter.release(ref, meta(1))
    assert hold_annotations(kc.workload(wl_name)) == {}


def test_unsupported_in_kueue_mode_without_workload_update(
    cluster: LocalCluster, admin_client: k8s.ApiClient, kc: Cluster
) -> None:
    """The round trip works (create is allowed), but updating Workloads is not: Hold is
    unsupported, found lazily by the first Hold."""
    user = f"creator-{kc.ns}"
    rbac = k8s.RbacAuthorizationV1Api(admin_client)
    rbac.create_namespaced_role(
        kc.ns,
        {  # type: ignore[arg-type]
            "metadata": {"name": "create-only"},
            "rules": [
                {
                    "apiGroups": [WORKLOAD.group],
                    "resources": [WORKLOAD.plural],
                    "verbs": ["get", "list", "create"],
                },
                {
                    "apiGroups": [TRAINJOB.group],
                    "resources": [TRAINJOB.plural],
                    "verbs": ["get", "create"],
                },
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        kc.ns,
        {  # type: ignore[arg-type]
            "metadata": {"name": "create-only"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "create-only",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    ref, wl_name = kc.kueue_job("job")
    api = cluster.api_client(user)
    try:
        wait_allowed(api, "get", f"{WORKLOAD.plural}.{WORKLOAD.group}", kc.ns)
        wait_allowed(api, "create", f"{TRAINJOB.plural}.{TRAINJOB.group}", kc.ns)
        adapter = make(cluster, api, "kueue")
        with pytest.raises(Unsupported, match="may not update Workloads"):
            adapter.hold(ref, meta(1), "r")
        assert updates(adapter) == []
        result = adapter.preflight(kc.ns)
        assert result.hold_round_trip.supported, result.hold_round_trip.reason
        assert not result.update_workloads.supported
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert hold_annotations(kc.workload(wl_name)) == {}


def test_plain_hold_and_release_overtaken_by_newer_hold(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    other = make(cluster, supervisor_client, "plain")
    late_hold = make(
        cluster,
        supervisor_client,
        "plain",
        before_request=interleave(lambda: other.hold(ref, meta(2), "newer")),
    )
    with pytest.raises(StaleHold):
        late_hold.hold(ref, meta(1), "older")
    late_release = make(
        cluster,
        supervisor_client,
        "plain",
        before_request=interleave(lambda: other.hold(ref, meta(3), "newest")),
    )
    with pytest.raises(StaleHold):
        late_release.release(ref, meta(2))
    tj = kc.trainjob("job")
    assert tj["spec"]["suspend"] is True
    assert hold_annotations(tj)[A.hold_instance] == "3"


def test_plain_routine_status_conflict_is_retried(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    kc: Cluster,
) -> None:
    """Trainer's status writes bump the TrainJob's resourceVersion: Hold retries."""
    kc.create_trainjob("job", suspend=True)
    ref = Ref(kc.ns, "job")
    adapter = make(
        cluster,
        supervisor_client,
        "plain",
        before_request=interleave(lambda: kc.trainer_writes_status("job", trainer_client), 2),
    )
    adapter.hold(ref, meta(1), "r")
    assert len(updates(adapter)) == 3
    assert hold_annotations(kc.trainjob("job"))[A.hold_instance] == "1"


@pytest.mark.parametrize("driver", ["sync"])  # the urllib3 pool is the sync driver's
def test_transport_retries_are_off(cluster: LocalCluster, supervisor_client: k8s.ApiClient) -> None:
    """urllib3 would re-send a timed-out PUT on its own, after the deadline check; the
    adapter's own client never does (the caller's is left alone: test_adapter_supervisor)."""
    adapter = make(cluster, supervisor_client, "kueue")
    retries = adapter.api_client.rest_client.pool_manager.connection_pool_kw["retries"]
    # False itself, or the Retry the client builds from it (total=False: raise at once).
    assert retries is False or (retries.total is False and retries.redirect == 0)


# The asyncio twin: tests/controlplane/test_adapter_aio.py.
@pytest.mark.parametrize("driver", ["sync"])
def test_a_kueue_read_has_its_two_gets_in_flight_together(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    kc: Cluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the Workload's name cached, the TrainJob's GET and the Workload's are on the
    wire at the same time: each waits at a two-party barrier before it is sent, which a
    driver sending them one after the other breaks (after 10 s, never a hang)."""
    ref, _ = kc.kueue_job("job")
    adapter = make(cluster, supervisor_client, "kueue")
    try:
        adapter.hold(ref, meta(1), "first")  # lazy preflight + discovery fill the cache
        barrier = threading.Barrier(2, timeout=10)
        met: list[str] = []
        perform = adapter._perform

        def at_barrier(step: Send) -> Any:
            if step.req.verb == "get":
                barrier.wait()
                met.append(step.req.resource)
            return perform(step)

        monkeypatch.setattr(adapter, "_perform", at_barrier)
        adapter.hold(ref, meta(2), "second")
        assert sorted(met) == sorted([TRAINJOB.plural, WORKLOAD.plural])
        monkeypatch.undo()
        assert adapter.observe(ref).hold_instance == 2
    finally:
        adapter.close()


# ==== a watch behind a buffering intermediary ===========================================


@pytest.fixture
def buffering_proxy(cluster: LocalCluster) -> Iterator[BufferingWatchProxy]:
    proxy = BufferingWatchProxy(cluster.server_url, cluster.ca, cluster.workdir)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.mark.parametrize(
    ("mode", "call"),
    [("kueue", "hold"), ("kueue", "release"), ("plain", "hold"), ("plain", "release")],
)
def test_a_watch_behind_a_buffering_intermediary_costs_a_conflicted_call_seconds(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    kc: Cluster,
    buffering_proxy: BufferingWatchProxy,
    mode: str,
    call: str,
) -> None:
    """One foreign status write between the call's read and its write: the retry's watch,
    which the proxy answers only when the watch ends, is given up within WATCH_OPEN_S and
    the retry reads with a GET. Before the watch had a bound of its own, the call ended in
    DeadlinePassed after its whole 30 s deadline."""
    if mode == "kueue":
        ref, wl_name = kc.kueue_job("job")

        def other_writer() -> None:
            kc.bump_workload_status(wl_name)
    else:
        kc.create_trainjob("job")
        ref = Ref(kc.ns, "job")

        def other_writer() -> None:
            kc.trainer_writes_status("job", trainer_client)

    if call == "release":
        make(cluster, supervisor_client, mode).hold(ref, meta(1), "node lost")
    through = cluster.api_client(SUPERVISOR_IDENTITY)
    through.configuration.host = buffering_proxy.url
    adapter = make(cluster, through, mode, before_request=interleave(other_writer, times=1))
    try:
        adapter.preflight(ref.namespace)  # through the proxy too; no watch in it
        started = time.monotonic()
        if call == "hold":
            adapter.hold(ref, CallMeta(datetime.now(UTC) + timedelta(seconds=30), 1), "r")
        else:
            adapter.release(ref, CallMeta(datetime.now(UTC) + timedelta(seconds=30), 1))
        took = time.monotonic() - started
    finally:
        through.close()  # type: ignore[no-untyped-call]
    verbs = [r.verb for r in adapter.request_log]
    watch_at = verbs.index("watch")
    assert "get" in verbs[watch_at:], verbs  # the retry read with a GET
    assert verbs[-1] == "update", verbs
    (watch,) = [r for r in adapter.request_log if r.verb == "watch"]
    assert watch.timeout is not None and watch.timeout <= WATCH_OPEN_S
    assert buffering_proxy.watches_held >= 1
    assert took < 6.0, f"{call} took {took:.1f}s behind the buffering proxy"
    held = kc.workload(wl_name) if mode == "kueue" else kc.trainjob("job")
    present = A.hold_instance in (held["metadata"].get("annotations") or {})
    assert present is (call == "hold")
