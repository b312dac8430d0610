"""The readmission gate against the real control plane, Kueue played through its identity."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta, Ref
from holdwarden.config import Config, ReadmissionConfig
from holdwarden.readmission.controller import (
    ADMISSION_CHECK_GROUP,
    ADMISSION_CHECK_VERSION,
    ADMISSION_CHECKS,
    ReadmissionGate,
)
from holdwarden.readmission.decisions import granted_attempt
from holdwarden.vocabulary import JOBSET_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from rig.builders import trainjob_body, workload_body
from rig.localcluster import GATE_IDENTITY, LocalCluster
from tests.support.actors import KueueActor, TrainerActor
from tests.support.netfaults import FreezableProxy

NOTES = Annotations()


@pytest.fixture
def check_name(admin_client: k8s.ApiClient) -> str:
    """An AdmissionCheck served by a gate with a controller name unique to this test."""
    name = f"readmission-{uuid.uuid4().hex[:8]}"
    k8s.CustomObjectsApi(admin_client).create_cluster_custom_object(
        ADMISSION_CHECK_GROUP,
        ADMISSION_CHECK_VERSION,
        ADMISSION_CHECKS,
        {
            "apiVersion": f"{ADMISSION_CHECK_GROUP}/{ADMISSION_CHECK_VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {"controllerName": f"holdwarden.io/{name}"},
        },
    )
    return name


def gate_config(check_name: str, **readmission: Any) -> Config:
    """A gate serving ``check_name`` with a Lease of its own and short lease timings."""
    settings: dict[str, Any] = {
        "enabled": True,
        "controller_name": f"holdwarden.io/{check_name}",
        "interval": timedelta(milliseconds=100),
        "lease_name": f"lease-{check_name}",
        "lease_namespace": "default",
        "lease_duration": timedelta(seconds=3),
        "renew_deadline": timedelta(seconds=2),
        "retry_period": timedelta(milliseconds=500),
        "watch_timeout": timedelta(seconds=30),
    }
    settings.update(readmission)
    return Config(readmission=ReadmissionConfig(**settings))


def failover_gate_config(check_name: str) -> Config:
    """``gate_config`` with a leader that renews in time on a starved machine: a renewal may
    take 4 s (not 2 s) before the leader steps down, and the Lease lasts 6 s. The failover
    test kills the leader and requires that the follower wrote nothing before the kill."""
    return gate_config(
        check_name, lease_duration=timedelta(seconds=6), renew_deadline=timedelta(seconds=4)
    )


def _gate(cluster: LocalCluster, check_name: str) -> ReadmissionGate:
    return ReadmissionGate(gate_config(check_name), cluster.api_client(GATE_IDENTITY))


class Objects:
    def __init__(self, admin: k8s.ApiClient, kueue: k8s.ApiClient, namespace: str) -> None:
        self.admin = k8s.CustomObjectsApi(admin)
        self.kueue = k8s.CustomObjectsApi(kueue)
        self.core = k8s.CoreV1Api(admin)
        self.namespace = namespace

    def trainjob(self) -> dict[str, Any]:
        found: Any = self.admin.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, self.namespace, TRAINJOB.plural, "job"
        )
        return dict(found)

    def workload(self) -> dict[str, Any]:
        found: Any = self.admin.get_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, self.namespace, WORKLOAD.plural, "wl"
        )
        return dict(found)

    def check(self, name: str) -> dict[str, Any]:
        checks = self.workload()["status"]["admissionChecks"]
        entry: dict[str, Any] = next(c for c in checks if c["name"] == name)
        return entry

    def annotate_trainjob(self, key: str, value: str) -> None:
        self.admin.patch_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, self.namespace, TRAINJOB.plural, "job",
            {"metadata": {"annotations": {key: value}}},
        )  # fmt: skip

    def hold(self, instance: str) -> None:
        """What the adapter's Kueue-mode Hold writes: the Workload inactive, with its hold
        instance (the other hold annotations do not matter to the gate)."""
        held = self.workload()
        held["metadata"].setdefault("annotations", {})[NOTES.hold_instance] = instance
        held["spec"]["active"] = False
        self._replace_workload(held)

    def release(self) -> None:
        """What the adapter's Release writes: the Workload active, the hold instance gone."""
        released = self.workload()
        del released["metadata"]["annotations"][NOTES.hold_instance]
        released["spec"]["active"] = True
        self._replace_workload(released)

    def _replace_workload(self, workload: dict[str, Any]) -> None:
        self.kueue.replace_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, self.namespace, WORKLOAD.plural, "wl", workload
        )

    def kueue_sets_check(self, name: str, state: str, **spec: Any) -> None:
        """What Kueue does: list the check on the Workload (Pending after an eviction)."""
        workload = self.workload()
        if spec:
            workload["spec"].update(spec)
            workload = dict(
                self.kueue.replace_namespaced_custom_object(  # type: ignore[call-overload]
                    WORKLOAD.group, WORKLOAD.version, self.namespace, WORKLOAD.plural, "wl",
                    workload,
                )
            )  # fmt: skip
        workload.setdefault("status", {})["admissionChecks"] = [
            {
                "name": name,
                "state": state,
                "message": "",
                "lastTransitionTime": "2026-12-02T12:00:00Z",
            }
        ]
        self.kueue.replace_namespaced_custom_object_status(
            WORKLOAD.group, WORKLOAD.version, self.namespace, WORKLOAD.plural, "wl", workload
        )


@pytest.fixture
def objects(admin_client: k8s.ApiClient, kueue_client: k8s.ApiClient, namespace: str) -> Objects:
    made = Objects(admin_client, kueue_client, namespace)
    created: Any = made.admin.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural,
        trainjob_body("job", queue="user-queue"),
    )  # fmt: skip
    made.kueue.create_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural,
        workload_body("wl", trainjob=created),
    )  # fmt: skip
    return made


def _pod(trainer: k8s.ApiClient, namespace: str, name: str) -> None:
    k8s.CoreV1Api(trainer).create_namespaced_pod(
        namespace,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels={JOBSET_NAME_LABEL: "job"}),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
        ),
    )


def test_gate_admits_only_an_opened_job_whose_old_pods_are_gone(
    cluster: LocalCluster, objects: Objects, check_name: str, trainer_client: k8s.ApiClient
) -> None:
    gate = _gate(cluster, check_name)
    objects.kueue_sets_check(check_name, "Pending")

    gate.run_once()
    assert objects.check(check_name)["state"] == "Pending"
    assert "has not been opened" in objects.check(check_name)["message"]

    objects.annotate_trainjob(NOTES.opened, "2026-12-02T12:00:00Z")
    _pod(trainer_client, objects.namespace, "job-node-0")
    gate.run_once()
    assert objects.check(check_name)["state"] == "Pending"
    assert "1 pod(s) of the previous execution remain" in objects.check(check_name)["message"]

    k8s.CoreV1Api(trainer_client).delete_namespaced_pod("job-node-0", objects.namespace)
    gate.run_once()
    check = objects.check(check_name)
    assert check["state"] == "Ready"
    assert granted_attempt(check["message"]) == 1
    assert objects.trainjob()["metadata"]["annotations"][NOTES.attempt] == "1"

    # Further passes change nothing: A is raised once per admission.
    version = objects.trainjob()["metadata"]["resourceVersion"]
    gate.run_once()
    gate.run_once()
    assert objects.trainjob()["metadata"]["resourceVersion"] == version
    assert objects.trainjob()["metadata"]["annotations"][NOTES.attempt] == "1"

    # The AdmissionCheck itself is kept Active.
    served: Any = objects.admin.get_cluster_custom_object(
        ADMISSION_CHECK_GROUP, ADMISSION_CHECK_VERSION, ADMISSION_CHECKS, check_name
    )
    assert any(
        c["type"] == "Active" and c["status"] == "True" for c in served["status"]["conditions"]
    )


def test_gate_keeps_a_held_workload_pending_and_counts_the_next_attempt(
    cluster: LocalCluster, objects: Objects, check_name: str
) -> None:
    gate = _gate(cluster, check_name)
    objects.annotate_trainjob(NOTES.opened, "2026-12-02T12:00:00Z")
    objects.annotate_trainjob(NOTES.attempt, "3")
    # A hold is in force and Kueue, having evicted, lists the check Pending again.
    objects.hold("2")
    objects.kueue_sets_check(check_name, "Pending")
    gate.run_once()
    assert objects.check(check_name)["state"] == "Pending"
    assert "hold instance 2 is in force" in objects.check(check_name)["message"]

    # Release (as the adapter writes it): active again, hold annotations gone.
    objects.release()
    gate.run_once()
    assert objects.check(check_name)["state"] == "Ready"
    assert objects.trainjob()["metadata"]["annotations"][NOTES.attempt] == "4"


def test_gate_thread_leads_resyncs_and_stops_promptly(
    cluster: LocalCluster, check_name: str, admin_client: k8s.ApiClient
) -> None:
    """Started, the gate fills its caches, takes its Lease, resyncs every interval; stopped,
    it releases the Lease (holder emptied) and every thread ends within the bound."""
    gate = _gate(cluster, check_name)
    gate.start()
    try:
        deadline = time.monotonic() + 20
        while not (gate.passes >= 3 and gate.may_write()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gate.synced() and gate.may_write(), "no cache sync or no lease within 20s"
        assert gate.passes >= 3
    finally:
        started = time.monotonic()
        gate.stop(timeout=5)
        stopped_in = time.monotonic() - started
    assert gate.errors == 0
    assert stopped_in < 15, f"stop took {stopped_in:.1f}s"
    lease = k8s.CoordinationV1Api(admin_client).read_namespaced_lease(
        f"lease-{check_name}", "default"
    )
    assert lease.spec is not None and not lease.spec.holder_identity, "the lease was not released"


def test_gate_stops_within_its_bound_when_the_apiserver_goes_silent(
    cluster: LocalCluster, check_name: str
) -> None:
    """Production Lease timings (a request may take 10 s); the path to the apiserver goes
    silent while the gate leads. stop(timeout=3) must end in about 3 s, and no write may
    start from its first line on. Before, the worker, the Lease's release (10 s a request)
    and each watch were each waited on for the whole timeout, one after another."""
    proxy = FreezableProxy.in_front_of(cluster.server_url)
    api = cluster.api_client(GATE_IDENTITY)
    api.configuration.host = proxy.url
    config = gate_config(
        check_name,
        lease_duration=timedelta(seconds=15),
        renew_deadline=timedelta(seconds=10),
        retry_period=timedelta(seconds=2),
    )
    gate = ReadmissionGate(config, api)
    gate.start()
    stopped = False
    try:
        deadline = time.monotonic() + 30
        while not (gate.synced() and gate.may_write()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gate.synced() and gate.may_write(), "no cache sync or no lease within 30s"
        proxy.freeze()
        time.sleep(2.5)  # the next Lease renewal (every 2 s) now waits on the wire
        started = time.monotonic()
        gate.stop(timeout=3)
        stopped = True
        took = time.monotonic() - started
        assert not gate.may_write()
        assert took < 3 + 1.5, f"stop took {took:.1f}s"
    finally:
        if not stopped:
            gate.stop(timeout=3)
        proxy.close()
        api.close()  # type: ignore[no-untyped-call]


def test_kueue_release_never_runs_a_second_execution_while_old_pods_remain(
    cluster: LocalCluster,
    check_name: str,
    kueue_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    job_controller_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
) -> None:
    """The whole Kueue-mode story with the real gate: Kueue (an actor) admits only through
    the AdmissionCheck, Trainer (an actor) deletes pods 2 s after a suspend, and the
    supervisor holds and at once releases through the adapter. The job must stay suspended
    until the held execution's pods are gone, then run again with A raised by one."""

    gate = _gate(cluster, check_name)
    gate.start()
    objects = Objects(admin_client, kueue_client, namespace)

    def pod_uids() -> set[str]:
        found = k8s.CoreV1Api(admin_client).list_namespaced_pod(
            namespace, label_selector=f"{JOBSET_NAME_LABEL}=job"
        )
        return {str(pod.metadata.uid) for pod in found.items if pod.metadata is not None}

    def pods() -> int:
        return len(pod_uids())

    def eventually(probe: Any, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not probe():
            assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
            time.sleep(0.05)

    def meta(instance: int | None = None) -> CallMeta:
        return CallMeta(datetime.now(UTC) + timedelta(seconds=20), instance)

    try:
        with (
            KueueActor(kueue_client, namespace, admission_check=check_name),
            TrainerActor(
                # 5 s: the Release and the pod LIST after it must fit before the trainer
                # deletes the held pods, with three actor threads in this process.
                trainer_client,
                namespace,
                delete_delay=5.0,
                pods_api=job_controller_client,
            ),
        ):
            adapter = Adapter(Config(mode="kueue"), supervisor_client)
            body = trainjob_body("job", queue="user-queue", suspend=True)
            body["metadata"]["namespace"] = namespace
            ref = adapter.start(body, meta())
            assert ref == Ref(namespace, "job")
            adapter.open(ref, meta())
            eventually(lambda: pods() == 2, "the first execution's pods")
            eventually(
                lambda: objects.trainjob()["metadata"]["annotations"].get(NOTES.attempt) == "1",
                "the gate records attempt 1",
            )

            adapter.hold(ref, meta(1), "node lost")
            eventually(lambda: objects.trainjob()["spec"]["suspend"] is True, "Kueue suspends")
            adapter.release(ref, meta(1))

            # Until the held execution's pods are gone, the job must not run (never two
            # executions). Old pods only ever disappear, so one still listed after the job
            # was seen running was there when it started running.
            held_pods = pod_uids()
            assert held_pods, "the test must release while pods remain"
            eventually(lambda: objects.trainjob()["spec"]["suspend"] is False, "runs again")
            assert not held_pods & pod_uids(), "ran while the held execution's pods remained"
            # The gate writes Ready (with the attempt it grants) first and records A on the
            # TrainJob right after, so A may trail the unsuspend by a moment.
            eventually(
                lambda: objects.trainjob()["metadata"]["annotations"].get(NOTES.attempt) == "2",
                "the gate records attempt 2",
            )
    finally:
        gate.stop()
    assert gate.errors == 0


def test_holdwarden_gate_runs_the_gate_in_its_own_process(
    cluster: LocalCluster, objects: Objects, check_name: str, tmp_path: Any
) -> None:
    """`holdwarden gate` runs the gate alone in its process (the enforcer's `holdwarden
    serve` no longer does), with the kubeconfig's credentials outside a cluster, and
    serves its own /metrics, /healthz and /readyz on readmission.metricsAddress."""

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {
        "readmission": {
            "enabled": True,
            "controllerName": f"holdwarden.io/{check_name}",
            "interval": "100ms",
            "metricsAddress": f"127.0.0.1:{port}",
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    objects.annotate_trainjob(NOTES.opened, "2026-12-02T12:00:00Z")
    objects.kueue_sets_check(check_name, "Pending")
    gate = subprocess.Popen(
        [sys.executable, "-m", "holdwarden.cli", "gate", "--config", str(tmp_path / "config.yaml")],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as got:
                return got.status, got.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        # Bounds for a busy machine (the full suite under two busy loops took 20 s here).
        deadline = time.monotonic() + 60
        while objects.check(check_name)["state"] != "Ready":
            assert gate.poll() is None, gate.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the gate never marked the check Ready"
            time.sleep(0.1)
        assert granted_attempt(objects.check(check_name)["message"]) == 1
        assert get("/healthz") == (200, "ok\n")
        deadline = time.monotonic() + 30
        while get("/readyz")[0] != 200:
            assert time.monotonic() < deadline, get("/readyz")
            time.sleep(0.1)
        # The counter moves once the whole reconcile has returned (the grant's second
        # write too), which can be a while after the check reads Ready. Every outcome's
        # series is served from the start at 0, so the wait is for the value, not the name.
        mark_ready = 'holdwarden_readmission_reconciles_total{outcome="mark-ready"}'
        deadline = time.monotonic() + 30  # its own bound, not what the Ready wait left
        while True:
            status, scraped = get("/metrics")
            assert status == 200
            if f"{mark_ready} 0.0" not in scraped or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        assert "holdwarden_readmission_leader 1.0" in scraped
        assert f"{mark_ready} 1.0" in scraped, scraped  # once: no second Ready
        # Its own registry: nothing of the enforcer's.
        assert "holdwarden_webhook_reviews_total" not in scraped
        # Readmitted: no Workload is counted as kept waiting (the alert's series, served).
        assert "holdwarden_readmission_stalled_workloads 0.0" in scraped
        assert "holdwarden_readmission_longest_stall_seconds 0.0" in scraped
    finally:
        gate.terminate()
        output = gate.communicate(timeout=15)[0].decode()
    assert gate.returncode == 0, output[-3000:]
    assert "readmission gate started" in output


def test_an_informer_lists_in_pages_and_misses_nothing(
    cluster: LocalCluster, admin_client: k8s.ApiClient, namespace: str
) -> None:
    """The start-up LIST goes in pages (limit and continue), so a cache of 100,000 pods
    never holds more than a page of full objects at once; every item of every page lands
    in the store, slimmed, and the list's resourceVersion is remembered for the watch."""
    import threading

    from holdwarden.readmission.informer import Informer, Store

    core = k8s.CoreV1Api(admin_client)
    label = f"page-{uuid.uuid4().hex[:6]}"
    for i in range(11):
        pod: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i}", "labels": {JOBSET_NAME_LABEL: label}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        core.create_namespaced_pod(namespace, pod)
    calls: list[dict[str, Any]] = []

    def listing(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return core.list_namespaced_pod(namespace, **kwargs)

    seen: list[Any] = []
    informer = Informer(
        "pods",
        listing,
        store=Store(),
        handler=lambda old, new: seen.append(new),
        stop=threading.Event(),
        request_timeout=10,
        watch_timeout=5,
        label_selector=f"{JOBSET_NAME_LABEL}={label}",
        transform=lambda pod: {"metadata": {"name": pod["metadata"]["name"],
                                            "namespace": pod["metadata"]["namespace"]}},
        list_page=4,
    )  # fmt: skip
    informer.relist()
    assert len(calls) == 3 and all(c["limit"] == 4 for c in calls)
    assert "_continue" not in calls[0] and all(c.get("_continue") for c in calls[1:])
    assert sorted(o["metadata"]["name"] for o in informer.store.values()) == sorted(
        f"p-{i}" for i in range(11)
    )
    assert all(set(o) == {"metadata"} for o in informer.store.values())  # slimmed per page
    assert len(seen) == 11 and informer.resource_version
