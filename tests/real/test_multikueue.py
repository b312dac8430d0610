"""MultiKueue: a hold on the manager cluster, the execution on a worker cluster.

Two local control planes: a manager running the real Kueue (with MultiKueue), Trainer and
JobSet, and a worker running all four real controllers. The manager's Kueue reaches the
worker through a kubeconfig Secret and a MultiKueueCluster, over a proxy that the test can
freeze (the worker goes silent: a partition). The enforcer and the readmission gate run on
the manager, the gate's AdmissionCheck beside MultiKueue's in the ClusterQueue.

What Kueue v0.19.2 does (docs/explanation/readmission-gate.md, "MultiKueue"): it
dispatches only once every
other admission check is Ready; a deactivated manager Workload makes it delete the
worker's mirror TrainJob (its pods then terminate there); and on reactivation it
dispatches again without waiting for the old pods. So only the gate, counting the pods on
every worker, keeps two executions from running at once. Shown here:

- the job's pods exist on the worker only; A is 1;
- Hold on the manager: Kueue evicts, the worker's mirror is deleted, its pods terminate
  (one kept by a finalizer, as an unconfirmed termination);
- Release: the gate keeps the job waiting, naming the worker's pod; nothing is dispatched;
- the worker goes silent and the pod goes: the gate still waits ("could not be counted");
- the worker is reachable again: the job is dispatched once, A rises to exactly 2, and
  pods of the two executions never exist at once on the worker.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, Ref
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import MULTIKUEUE_CONTROLLER, TRAINJOB
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.multikueue import connect_worker, wait_connected, worker_kubeconfig
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    condition,
    eventually,
    make_queues,
    wait_local_queue_active,
    with_requests,
)
from tests.real.enforcer import Enforcement, enforcement
from tests.real.story import assert_no_false_positives, live_pod_sets, meta
from tests.support.actors import Watcher
from tests.support.netfaults import FreezableProxy

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(1500)]

WORKER = "worker-1"
WAITING_S = 20.0
"""How long the test watches the gate keep a released job waiting, each time."""


@dataclass
class Pair:
    manager: LocalCluster
    worker: LocalCluster
    proxy: FreezableProxy
    dispatch_check: str
    enforced: Enforcement


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    worker = LocalCluster(controllers=CONTROLLERS)
    manager = LocalCluster(controllers=("jobset", "trainer", "kueue"))
    proxy: FreezableProxy | None = None
    try:
        worker.start()
        manager.start()
        proxy = FreezableProxy.in_front_of(worker.server_url)
        with manager.api_client() as admin:
            check = connect_worker(admin, WORKER, worker_kubeconfig(worker, proxy.url))
            wait_connected(admin, WORKER)
        with enforcement(manager, tmp_path_factory.mktemp("mk-enforcer")) as enforced:
            yield Pair(manager, worker, proxy, check, enforced)
    finally:
        if proxy is not None:
            proxy.close()
        manager.stop()
        worker.stop()


def _gate_entry(objects: Objects, check_name: str) -> dict[str, Any]:
    workload = objects.workload() or {}
    for entry in (workload.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == check_name:
            return dict(entry)
    return {}


def _mirror(objects: Objects) -> dict[str, Any] | None:
    try:
        return objects.trainjob()
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _assert_still_waiting(
    manager: Objects, worker: Objects, check_name: str, pods: set[str], seconds: float
) -> None:
    """For ``seconds``: the gate's check stays Pending, A stays 1, and the worker gets
    no new mirror and no pod beyond ``pods``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        entry = _gate_entry(manager, check_name)
        assert entry.get("state") != "Ready", f"readmitted too early: {entry}"
        assert manager.attempt() == "1"
        assert _mirror(worker) is None, "MultiKueue dispatched again while pods may remain"
        assert worker.pod_uids() <= pods
        time.sleep(0.5)


def test_a_hold_on_the_manager_stops_the_worker_and_release_waits_for_the_workers_pods(
    pair: Pair,
) -> None:
    manager_admin, worker_admin = pair.manager.api_client(), pair.worker.api_client()
    namespace = f"mk-{uuid.uuid4().hex[:8]}"
    pair.manager.create_namespace(namespace, labels=pair.enforced.labels())
    pair.worker.create_namespace(namespace)
    make_queues(manager_admin, namespace, [pair.dispatch_check, pair.enforced.check_name])
    make_queues(worker_admin, namespace)  # the worker admits what MultiKueue sends it
    wait_local_queue_active(manager_admin, namespace)
    on_manager, on_worker = Objects(manager_admin, namespace), Objects(worker_admin, namespace)
    check = pair.enforced.check_name
    watcher = Watcher(worker_admin, namespace)
    watcher.start()
    supervisor = pair.manager.api_client(SUPERVISOR_IDENTITY)
    adapter = Adapter(Config(mode="kueue"), supervisor)
    try:
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
        body["metadata"]["namespace"] = namespace
        ref = adapter.start(body, meta())
        assert ref == Ref(namespace, "job")
        # Kueue's webhook hands the TrainJob to MultiKueue: Trainer makes nothing here.
        assert on_manager.trainjob()["spec"].get("managedBy") == MULTIKUEUE_CONTROLLER
        adapter.open(ref, meta())

        first = eventually(on_worker.pod_uids, "the job's pods exist on the worker", 300)
        eventually(lambda: on_manager.attempt() == "1", "the gate records attempt 1")
        assert not on_manager.pods(), "pods of a MultiKueue job on the manager"
        kept = on_worker.keep(on_worker.pods()[0])

        adapter.hold(ref, meta(1), "node lost")
        eventually(
            lambda: condition(on_manager.workload(), "Evicted"),
            "Kueue evicts the manager's Workload",
        )
        eventually(lambda: _mirror(on_worker) is None, "MultiKueue deletes the worker's copy")

        def only_kept_terminating() -> k8s.V1ObjectMeta | None:
            pods = [p.metadata for p in on_worker.pods() if p.metadata is not None]
            if [m.name for m in pods] == [kept] and pods[0].deletion_timestamp is not None:
                return pods[0]
            return None

        # The garbage collector deletes the mirror's JobSet, Jobs and pods; the finalizer
        # keeps one pod terminating (its kubelet never confirms, as on a lost node).
        left_meta = eventually(only_kept_terminating, "the worker's pods are deleted", 180)
        assert adapter.observe(ref).state is State.HELD

        adapter.release(ref, meta(1))
        waiting = eventually(
            lambda: (
                f"remain on MultiKueue worker cluster '{WORKER}'"
                in str(_gate_entry(on_manager, check).get("message"))
                and _gate_entry(on_manager, check)
            ),
            "the gate names the worker's pod",
        )
        print(f"gate, worker's pod left: {waiting['message']}")
        _assert_still_waiting(on_manager, on_worker, check, {str(left_meta.uid)}, WAITING_S)

        pair.proxy.freeze()  # the worker goes silent, for Kueue and the gate alike
        try:
            on_worker.let_go(kept)
            eventually(lambda: not on_worker.pods(), "the kept pod goes (seen directly)")
            silent = eventually(
                lambda: (
                    "could not be counted" in str(_gate_entry(on_manager, check).get("message"))
                    and _gate_entry(on_manager, check)
                ),
                "the gate waits on the silent worker",
            )
            print(f"gate, worker silent: {silent['message']}")
            _assert_still_waiting(on_manager, on_worker, check, set(), WAITING_S)
        finally:
            pair.proxy.thaw()

        eventually(lambda: on_manager.attempt() == "2", "the gate admits attempt 2", 300)
        second = eventually(
            lambda: on_worker.pod_uids() - first, "the second execution's pods on the worker", 300
        )
        time.sleep(5)  # a second rise would show within a few gate passes
        assert on_manager.attempt() == "2"
    finally:
        watcher.stop()
        for api in (supervisor, manager_admin, worker_admin):
            api.close()  # type: ignore[no-untyped-call]

    events = watcher.events()
    for live in live_pod_sets(events):
        assert not (live & first and live & second), "pods of two executions at once"
    mirrors = [
        (e.type, e.rv, e.obj["metadata"]["uid"][:8], e.obj["spec"].get("suspend"))
        for e in events
        if e.kind == "trainjob" and e.type in ("ADDED", "DELETED")
    ]
    print(f"mirror events: {mirrors}")
    # One copy at a time: every creation after the first follows a deletion. (MultiKueue
    # may make one more copy than the two executions need: once in five runs it deleted
    # and re-created the second one right after dispatching it, before it ran.)
    kinds = [m[0] for m in mirrors]
    assert kinds[0] == "ADDED" and all(a != b for a, b in itertools.pairwise(kinds))
    assert kinds.count("ADDED") >= 2, mirrors
    assert_no_false_positives(pair.manager, pair.enforced)


def test_the_manager_trainjob_names_multikueue_and_trainer_leaves_it_alone(pair: Pair) -> None:
    """The facts the gate leans on, on the real controllers: the manager's TrainJob is
    MultiKueue's, and no JobSet or pod of it exists on the manager."""
    with pair.manager.api_client() as admin:
        namespace = f"mk-{uuid.uuid4().hex[:8]}"
        pair.manager.create_namespace(namespace, labels=pair.enforced.labels())
        make_queues(admin, namespace, [pair.dispatch_check, pair.enforced.check_name])
        wait_local_queue_active(admin, namespace)
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=False))
        body["metadata"]["namespace"] = namespace
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body
        )
        objects = Objects(admin, namespace)
        eventually(objects.workload, "Kueue makes the Workload")
        assert objects.trainjob()["spec"].get("managedBy") == MULTIKUEUE_CONTROLLER
        time.sleep(5)
        jobsets: Any = k8s.CustomObjectsApi(admin).list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets"
        )
        assert not jobsets["items"] and not objects.pods()


def test_a_trainjob_made_before_kueue_knows_its_queue_runs_nowhere(pair: Pair) -> None:
    """The race ``wait_local_queue_active`` avoids, made certain: the TrainJob exists before
    its queues, so Kueue's webhook cannot name MultiKueue and Trainer's default manager
    stays. What Kueue does then (docs/explanation/readmission-gate.md, "MultiKueue"):
    MultiKueue's check is
    Rejected and the Workload deactivated. Nothing runs on the manager or the worker."""
    with pair.manager.api_client() as admin, pair.worker.api_client() as worker_admin:
        namespace = f"mk-{uuid.uuid4().hex[:8]}"
        pair.manager.create_namespace(namespace, labels=pair.enforced.labels())
        pair.worker.create_namespace(namespace)
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=False))
        body["metadata"]["namespace"] = namespace
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body
        )
        on_manager, on_worker = Objects(admin, namespace), Objects(worker_admin, namespace)
        assert on_manager.trainjob()["spec"].get("managedBy") != MULTIKUEUE_CONTROLLER
        make_queues(admin, namespace, [pair.dispatch_check, pair.enforced.check_name])
        make_queues(worker_admin, namespace)
        wait_local_queue_active(admin, namespace)

        def dispatch_rejected() -> dict[str, Any] | None:
            entry = _gate_entry(on_manager, pair.dispatch_check)
            return entry if entry.get("state") == "Rejected" else None

        rejected = eventually(dispatch_rejected, "MultiKueue rejects a job it does not manage")
        print(f"MultiKueue's check: {rejected}")
        eventually(
            lambda: (on_manager.workload() or {}).get("spec", {}).get("active") is False,
            "Kueue deactivates the Workload",
        )
        time.sleep(5)  # a dispatch or a local start would show within a few passes
        assert _mirror(on_worker) is None, "MultiKueue dispatched a job it rejected"
        assert not on_worker.pods() and not on_manager.pods()
        assert on_manager.trainjob()["spec"].get("suspend") is True
    assert_no_false_positives(pair.manager, pair.enforced)
