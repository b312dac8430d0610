"""The test actors do what they claim, against the real control plane.

The interleaving test's invariants are only as good as the actors that play Kueue and
Trainer, so each claim of ``tests/support/actors.py`` is checked here on the real API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s

from holdwarden.adapter.decisions import classify
from holdwarden.adapter.types import Ref, State
from holdwarden.objects import kueue_workload_names
from holdwarden.vocabulary import (
    JOB_UID_LABEL,
    JOBSET_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    Annotations,
)
from rig.builders import trainjob_body
from rig.localcluster import UNPRIVILEGED_USER, LocalCluster
from tests.support.actors import (
    DECIDED_ON_ANNOTATION,
    HEARTBEAT_CONDITION,
    ActorError,
    KueueActor,
    TrainerActor,
    Watcher,
    find_condition,
)

T = TypeVar("T")
ANN = Annotations()


def eventually(probe: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def _custom(api: k8s.ApiClient) -> Any:
    return k8s.CustomObjectsApi(api)


def _tj(admin: k8s.ApiClient, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = _custom(admin).get_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, name
    )
    return got


def _wl(admin: k8s.ApiClient, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = _custom(admin).get_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, name
    )
    return got


def _create_tj(admin: k8s.ApiClient, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = _custom(admin).create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, body
    )
    return created


def _patch(admin: k8s.ApiClient, ns: str, res: Any, name: str, patch: dict[str, Any]) -> None:
    _custom(admin).patch_namespaced_custom_object(
        res.group, res.version, ns, res.plural, name, patch
    )


def _pods(admin: k8s.ApiClient, ns: str, name: str) -> list[Any]:
    return list(
        k8s.CoreV1Api(admin)
        .list_namespaced_pod(ns, label_selector=f"{JOBSET_NAME_LABEL}={name}")
        .items
    )


def test_kueue_actor_creates_the_workload_as_kueue_does(
    cluster: LocalCluster, kueue_client: k8s.ApiClient, admin_client: k8s.ApiClient, namespace: str
) -> None:
    with KueueActor(kueue_client, namespace) as kueue:
        queued = _create_tj(admin_client, namespace, trainjob_body("queued", queue="user-queue"))
        _create_tj(admin_client, namespace, trainjob_body("plain", suspend=True))
        workload = eventually(lambda: kueue.workload_of("queued"), what="a Workload appears")
        uid = queued["metadata"]["uid"]
        # Exactly the name Kueue v0.19.2 gives (tests/real/test_kueue_mode.py checks the
        # real one against the same function).
        assert workload["metadata"]["name"] == kueue_workload_names("queued", uid)[0]
        assert workload["metadata"]["labels"][JOB_UID_LABEL] == uid
        (owner,) = workload["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TrainJob",
            "queued",
            uid,
            True,
        )
        assert workload["spec"]["queueName"] == "user-queue"
        # A TrainJob created running without an admitted Workload is suspended by Kueue.
        eventually(lambda: _tj(admin_client, namespace, "queued")["spec"]["suspend"] is True)
        time.sleep(0.3)
        assert kueue.workload_of("plain") is None, "no Workload for a TrainJob without a queue"


def test_kueue_actor_admits_only_through_the_gate_then_evicts_on_deactivation(
    kueue_client: k8s.ApiClient, admin_client: k8s.ApiClient, namespace: str
) -> None:
    with KueueActor(kueue_client, namespace) as kueue:
        _create_tj(admin_client, namespace, trainjob_body("job", queue="q", suspend=True))
        wl_name = eventually(lambda: kueue.workload_of("job"))["metadata"]["name"]
        time.sleep(0.4)
        assert not _wl(admin_client, namespace, wl_name).get("status", {}).get("admission"), (
            "the readmission gate keeps an unopened TrainJob out"
        )
        assert _tj(admin_client, namespace, "job")["spec"]["suspend"] is True

        _patch(
            admin_client,
            namespace,
            TRAINJOB,
            "job",
            {"metadata": {"annotations": {ANN.opened: "2026-01-01T00:00:00Z"}}},
        )
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is False)
        admitted = _wl(admin_client, namespace, wl_name)
        assignments = admitted["status"]["admission"]["podSetAssignments"]
        assert len(assignments) == len(admitted["spec"]["podSets"])
        assert find_condition(admitted, "QuotaReserved")["status"] == "True"  # type: ignore[index]
        assert find_condition(admitted, "Admitted")["status"] == "True"  # type: ignore[index]

        # Someone (not Kueue) deactivates: Kueue evicts with reason exactly "Deactivated".
        _patch(admin_client, namespace, WORKLOAD, wl_name, {"spec": {"active": False}})
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is True)

        def unreserved() -> dict[str, Any] | None:
            wl = _wl(admin_client, namespace, wl_name)
            return wl if wl.get("status", {}).get("admission") is None else None

        evicted = eventually(unreserved)
        cond = find_condition(evicted, "Evicted")
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Deactivated")
        assert find_condition(evicted, "QuotaReserved")["status"] == "False"  # type: ignore[index]
        assert kueue.evictions >= 1 and kueue.admissions >= 1

        # Reactivated: admitted again (gate open: opened, no hold, no pods), Evicted reset.
        _patch(admin_client, namespace, WORKLOAD, wl_name, {"spec": {"active": True}})
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is False)
        cond = find_condition(_wl(admin_client, namespace, wl_name), "Evicted")
        assert cond is not None and cond["status"] == "False"


def test_kueue_actor_gate_waits_for_pods_and_holds(
    kueue_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    job_controller_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
) -> None:
    with (
        KueueActor(kueue_client, namespace) as kueue,
        # 3 s: the pods must outlive a 0.5 s sleep, two PATCHes and a LIST after the
        # suspend, on a starved machine too.
        TrainerActor(trainer_client, namespace, delete_delay=3.0, pods_api=job_controller_client),
    ):
        body = trainjob_body("job", queue="q", suspend=True)
        body["metadata"]["annotations"] = {ANN.opened: "2026-01-01T00:00:00Z"}
        _create_tj(admin_client, namespace, body)
        wl_name = eventually(lambda: kueue.workload_of("job"))["metadata"]["name"]
        eventually(lambda: len(_pods(admin_client, namespace, "job")) == 2, what="pods run")
        # A hold as the adapter writes it: active=false and the hold annotation together.
        _patch(
            admin_client,
            namespace,
            WORKLOAD,
            wl_name,
            {"metadata": {"annotations": {ANN.hold_instance: "1"}}, "spec": {"active": False}},
        )
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is True)
        # Lift only active (keep the annotation): the gate still refuses.
        _patch(admin_client, namespace, WORKLOAD, wl_name, {"spec": {"active": True}})
        time.sleep(0.5)
        assert _tj(admin_client, namespace, "job")["spec"]["suspend"] is True
        # Remove the annotation while pods of the held execution remain: still suspended.
        _patch(
            admin_client,
            namespace,
            WORKLOAD,
            wl_name,
            {"metadata": {"annotations": {ANN.hold_instance: None}}},
        )
        assert _pods(admin_client, namespace, "job"), "pods outlive the suspend for a while"
        assert _tj(admin_client, namespace, "job")["spec"]["suspend"] is True
        # Once Trainer has deleted them, the gate opens and the job runs again.
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is False)


def test_kueue_actor_own_deactivation_is_classified_as_kueue(
    kueue_client: k8s.ApiClient, admin_client: k8s.ApiClient, namespace: str
) -> None:
    with KueueActor(kueue_client, namespace, readmission_gate=False) as kueue:
        _create_tj(admin_client, namespace, trainjob_body("job", queue="q", suspend=True))
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is False)
        workload = kueue.deactivate("job")
        assert workload is not None and workload["spec"]["active"] is False
        wl_name = workload["metadata"]["name"]

        def evicted() -> dict[str, Any] | None:
            wl = _wl(admin_client, namespace, wl_name)
            cond = find_condition(wl, "Evicted")
            return wl if cond and cond["status"] == "True" else None

        wl = eventually(evicted)
        cond = find_condition(wl, "Evicted")
        assert cond is not None
        assert cond["reason"] == "DeactivatedDueToMaximumExecutionTimeExceeded"
        eventually(lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is True)
        observed = classify(
            _tj(admin_client, namespace, "job"),
            _wl(admin_client, namespace, wl_name),
            mode="kueue",
            annotations=ANN,
            ref=Ref(namespace, "job"),
        )
        assert observed.state is State.DEACTIVATED_BY_KUEUE
        assert observed.kueue_cause == "MaximumExecutionTimeExceeded"


def test_kueue_actor_heartbeat_makes_conflicts_routine(
    kueue_client: k8s.ApiClient, admin_client: k8s.ApiClient, namespace: str
) -> None:
    with KueueActor(kueue_client, namespace, heartbeat=0.2) as kueue:
        _create_tj(admin_client, namespace, trainjob_body("job", queue="q", suspend=True))
        wl_name = eventually(lambda: kueue.workload_of("job"))["metadata"]["name"]
        first = _wl(admin_client, namespace, wl_name)
        seen = {first["metadata"]["resourceVersion"]}

        def moved() -> bool:
            seen.add(_wl(admin_client, namespace, wl_name)["metadata"]["resourceVersion"])
            return len(seen) >= 4

        # Three status writes after the first read, due every ~200 ms: polled, bounded
        # generously, as a starved machine may delay the actor's ticks.
        eventually(moved, what="status writes every ~200 ms move resourceVersion (4 seen)")
        beat = find_condition(_wl(admin_client, namespace, wl_name), HEARTBEAT_CONDITION)
        assert beat is not None and beat["message"].startswith("beat ")
        # A write decided on the first read now meets a 409, as the adapter's will.
        first["metadata"].setdefault("annotations", {})["x"] = "y"
        with pytest.raises(k8s.ApiException) as raised:
            _custom(admin_client).replace_namespaced_custom_object(
                WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, wl_name, first
            )
        assert raised.value.status == 409


def test_trainer_actor_pods_follow_suspend_with_delays(
    trainer_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
    job_controller_client: k8s.ApiClient,
) -> None:
    with TrainerActor(
        trainer_client,
        namespace,
        create_delay=0.2,
        delete_delay=2.0,  # margin over the 0.5 s look below, on a starved machine too
        pods_api=job_controller_client,
    ) as trainer:
        _create_tj(admin_client, namespace, trainjob_body("job", suspend=True))
        time.sleep(0.5)
        assert _pods(admin_client, namespace, "job") == [], "a suspended TrainJob has no pods"

        _patch(admin_client, namespace, TRAINJOB, "job", {"spec": {"suspend": False}})
        pods = eventually(lambda: _pods(admin_client, namespace, "job"), what="pods appear")
        eventually(lambda: len(_pods(admin_client, namespace, "job")) == 2)
        pods = _pods(admin_client, namespace, "job")
        assert all(p.status.phase == "Pending" for p in pods)
        assert all(DECIDED_ON_ANNOTATION in (p.metadata.annotations or {}) for p in pods)

        _patch(admin_client, namespace, TRAINJOB, "job", {"spec": {"suspend": True}})
        suspended_at = time.monotonic()
        time.sleep(0.5)
        assert len(_pods(admin_client, namespace, "job")) == 2, "pods remain for a while"
        eventually(lambda: not _pods(admin_client, namespace, "job"), what="pods go away")
        assert time.monotonic() - suspended_at >= 1.9
        # The actor counts a pod once its own DELETE has answered, which can be after a
        # list no longer shows the pod (seen under CPU contention): wait for the count.
        eventually(
            lambda: (trainer.pods_created, trainer.pods_deleted) == (2, 2),
            what="the actor's counts: 2 pods created and 2 deleted",
        )


def test_watcher_sees_every_change_in_resource_version_order(
    trainer_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
    job_controller_client: k8s.ApiClient,
) -> None:
    def pods_are(count: int) -> Callable[[], bool]:
        return lambda: len(_pods(admin_client, namespace, "job")) == count

    with (
        Watcher(admin_client, namespace) as watcher,
        TrainerActor(
            trainer_client,
            namespace,
            create_delay=0.0,
            delete_delay=0.0,
            pods_api=job_controller_client,
        ),
    ):
        _create_tj(admin_client, namespace, trainjob_body("job", suspend=True))
        for suspend in (False, True, False, True):
            _patch(admin_client, namespace, TRAINJOB, "job", {"spec": {"suspend": suspend}})
            # Each window lasts until the actor has acted on it (two pods made, or all
            # gone), not a fixed time a starved actor might miss.
            eventually(
                pods_are(0 if suspend else 2),
                timeout=30,
                what=f"the actor's pods follow suspend={suspend}",
            )
        rv = int(_tj(admin_client, namespace, "job")["metadata"]["resourceVersion"])
        fence = watcher.fence_pods(timeout=30)
        watcher.wait_until_seen("trainjob", rv, timeout=30)
    events = watcher.events()
    assert [e.rv for e in events] == sorted(e.rv for e in events)
    suspends = [
        e.obj["spec"].get("suspend")
        for e in events
        if e.kind == "trainjob" and e.type in ("ADDED", "MODIFIED")
    ]
    # Every spec change is there, in order (status heartbeats repeat the current value).
    collapsed = [s for i, s in enumerate(suspends) if i == 0 or s != suspends[i - 1]]
    assert collapsed == [True, False, True, False, True]
    pod_events = [(e.type, e.name) for e in events if e.kind == "pod" and e.name != fence]
    assert sum(t == "ADDED" for t, _ in pod_events) == 4
    assert sum(t == "DELETED" for t, _ in pod_events) == 4


def _until_failed(actor: Any, timeout: float = 30.0) -> None:
    """Return once ``actor`` has met an error, or after ``timeout`` (the caller's
    ``stop()`` then shows whether it did): a starved actor may need more than one pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            actor.check()
        except ActorError:
            return
        time.sleep(0.05)


def test_actor_errors_are_raised_by_stop(cluster: LocalCluster, namespace: str) -> None:
    with cluster.api_client(UNPRIVILEGED_USER) as api:
        actor = TrainerActor(api, namespace, interval=0.05)
        actor.start()
        _until_failed(actor)
        with pytest.raises(ActorError, match="403"):
            actor.stop()


# -- reconciled with the real controllers (issue: real Kueue, Trainer, JobSet, KCM) -----


def _set_check(kueue: k8s.ApiClient, ns: str, wl_name: str, check: str, state: str) -> None:
    """As the readmission gate: set our AdmissionCheck's state on the Workload's status."""
    custom = _custom(kueue)
    for _ in range(20):
        wl: Any = custom.get_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, wl_name
        )
        for entry in wl["status"]["admissionChecks"]:
            if entry["name"] == check:
                entry["state"] = state
        try:
            custom.replace_namespaced_custom_object_status(
                WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, wl_name, wl
            )
            return
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError("could not set the check state: 20 conflicts")


def test_kueue_actor_reserves_quota_while_the_check_is_pending_then_admits(
    kueue_client: k8s.ApiClient, admin_client: k8s.ApiClient, namespace: str
) -> None:
    """Real Kueue keeps quota reserved while a check is Pending (even before Open), reports
    Admitted=False with UnsatisfiedChecks, and admits only once the check is Ready."""
    check = "gate"
    with KueueActor(kueue_client, namespace, admission_check=check, heartbeat=None) as kueue:
        _create_tj(admin_client, namespace, trainjob_body("job", queue="q", suspend=True))
        wl = eventually(
            lambda: (
                w
                if (w := kueue.workload_of("job"))
                and (find_condition(w, "QuotaReserved") or {}).get("status") == "True"
                else None
            ),
            what="quota reserved",
        )
        admitted = find_condition(wl, "Admitted") or {}
        assert (admitted.get("status"), admitted.get("reason")) == ("False", "UnsatisfiedChecks")
        assert wl["status"]["admission"]["podSetAssignments"]
        time.sleep(0.3)
        assert _tj(admin_client, namespace, "job")["spec"]["suspend"] is True
        _set_check(kueue_client, namespace, wl["metadata"]["name"], check, "Ready")
        eventually(
            lambda: t if (t := _tj(admin_client, namespace, "job"))["spec"]["suspend"] is False
            else None,
            what="unsuspended once the check is Ready",
        )  # fmt: skip
        wl = _wl(admin_client, namespace, wl["metadata"]["name"])
        assert (find_condition(wl, "Admitted") or {}).get("status") == "True"
        kueue.check()


def test_kueue_actor_writes_its_runtime_patch_and_eviction_records_as_kueue_does(
    kueue_client: k8s.ApiClient, admin_client: k8s.ApiClient, namespace: str
) -> None:
    with KueueActor(
        kueue_client, namespace, readmission_gate=False, heartbeat=None
    ) as kueue:  # fmt: skip
        _create_tj(admin_client, namespace, trainjob_body("job", queue="q", suspend=True))
        tj = eventually(
            lambda: t if (t := _tj(admin_client, namespace, "job"))["spec"]["suspend"] is False
            else None,
            what="admitted and started",
        )  # fmt: skip
        wl = kueue.workload_of("job")
        assert wl is not None
        wl_name = wl["metadata"]["name"]
        (patch,) = tj["spec"]["runtimePatches"]
        assert patch["manager"] == "kueue.x-k8s.io/manager"
        (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod_meta = job["template"]["spec"]["template"]["metadata"]
        assert pod_meta["annotations"] == {"kueue.x-k8s.io/workload": wl_name}
        assert pod_meta["labels"]["kueue.x-k8s.io/podset"] == job["name"]
        # Deactivation by someone else: the eviction records Kueue writes.
        _patch(kueue_client, namespace, WORKLOAD, wl_name, {"spec": {"active": False}})
        eventually(
            lambda: _tj(admin_client, namespace, "job")["spec"]["suspend"] is True,
            what="suspended after the deactivation",
        )
        wl = eventually(
            lambda: (
                w
                if (
                    find_condition(w := _wl(admin_client, namespace, wl_name), "Admitted") or {}
                ).get("reason")
                == "NoReservation"
                else None
            ),
            what="quota released",
        )
        requeued = find_condition(wl, "Requeued") or {}
        assert (requeued.get("status"), requeued.get("reason")) == ("False", "Deactivated")
        assert wl["status"]["schedulingStats"]["evictions"] == [
            {"reason": "Deactivated", "underlyingCause": "", "count": 1}
        ]
        assert "runtimePatches" not in _tj(admin_client, namespace, "job")["spec"]
        kueue.check()


def test_trainer_actor_writes_pods_as_the_job_controller(
    cluster: LocalCluster,
    trainer_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
) -> None:
    """Pods of a TrainJob are made and deleted by kube-controller-manager's Job controller,
    not by Trainer: with a pod identity that may not create pods, the actor fails."""
    with cluster.api_client(UNPRIVILEGED_USER) as no_pods:
        actor = TrainerActor(trainer_client, namespace, create_delay=0.0, pods_api=no_pods)
        actor.start()
        _create_tj(admin_client, namespace, trainjob_body("job", suspend=False))
        _until_failed(actor)
        with pytest.raises(ActorError, match="403"):
            actor.stop()
