"""Preflight and Observe on a cluster that has more than holdwarden in its write path.

Against the REAL local control plane. Trainer's (and Kueue's) TrainJob webhooks refuse a
TrainJob naming a runtime that does not exist; the apiserver's own ValidatingAdmissionPolicy
models that here (same verdict, "runtime not found"), so no extra server is needed. The real
Trainer webhook is exercised by the real-controller suite.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta, Config, Ref, State
from holdwarden.config import TimeoutsConfig
from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    CLUSTERQUEUE,
    CLUSTERTRAININGRUNTIME,
    JOBSET_NAME_LABEL,
    LOCALQUEUE,
    MULTIKUEUE_CONTROLLER,
    TRAINJOB,
    Annotations,
)
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster

pytestmark = pytest.mark.controlplane

A = Annotations("holdwarden.io")
GATE = "holdwarden.io/readmission"


def make(cluster: LocalCluster, api: k8s.ApiClient, mode: str) -> Adapter:
    config = Config(
        mode=mode,  # type: ignore[arg-type]
        holder="dispatch-test",
        timeouts=TimeoutsConfig(apiserver_request=cluster.request_timeout),
    )
    return Adapter(config, api)


def meta(instance: int) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=20), instance)


@pytest.fixture
def runtime_check(admin_client: k8s.ApiClient, namespace: str) -> Iterator[str]:
    """A ClusterTrainingRuntime, and an admission check refusing TrainJobs naming any other.

    That is the verdict Trainer's validating webhook and Kueue's TrainJob webhook give a
    TrainJob whose runtime does not exist. Scoped to this test's namespace.
    """
    custom = k8s.CustomObjectsApi(admin_client)
    adm = k8s.AdmissionregistrationV1Api(admin_client)
    runtime = f"rt-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(
        CLUSTERTRAININGRUNTIME.group,
        CLUSTERTRAININGRUNTIME.version,
        CLUSTERTRAININGRUNTIME.plural,
        {
            "apiVersion": CLUSTERTRAININGRUNTIME.api_version,
            "kind": CLUSTERTRAININGRUNTIME.kind,
            "metadata": {"name": runtime},
            "spec": {"template": {"spec": {"replicatedJobs": []}}},
        },
    )
    name = f"runtime-exists-{uuid.uuid4().hex[:6]}"
    adm.create_validating_admission_policy(
        {  # type: ignore[arg-type]
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
                            "operations": ["CREATE"],
                            "resources": [TRAINJOB.plural],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"object.spec.runtimeRef.name == '{runtime}'",
                        "messageExpression": (
                            "'ClusterTrainingRuntime.trainer.kubeflow.org \"' + "
                            "object.spec.runtimeRef.name + '\" not found: runtime not found'"
                        ),
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
        _wait_policy_active(custom, namespace)
        yield runtime
    finally:
        adm.delete_validating_admission_policy_binding(name)
        adm.delete_validating_admission_policy(name)
        _delete_runtime(admin_client, runtime)


def _delete_runtime(admin: k8s.ApiClient, name: str) -> None:
    try:
        k8s.CustomObjectsApi(admin).delete_cluster_custom_object(
            CLUSTERTRAININGRUNTIME.group,
            CLUSTERTRAININGRUNTIME.version,
            CLUSTERTRAININGRUNTIME.plural,
            name,
        )
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise


def _wait_policy_active(custom: k8s.CustomObjectsApi, namespace: str) -> None:
    """Policies take effect asynchronously: wait until a bad runtime is refused."""
    body = trainjob_body("probe-missing-runtime", suspend=True)
    body["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            custom.create_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body, dry_run="All"
            )
        except k8s.ApiException as exc:
            if "runtime not found" in (exc.body or ""):
                return
        time.sleep(0.3)
    raise AssertionError("the runtime-exists policy did not take effect within 20s")


def test_plain_mode_preflight_and_hold_pass_a_runtime_checking_webhook(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
    runtime_check: str,
) -> None:
    """Observed on real Trainer: the probe named a runtime that did not exist, so Trainer
    refused it and plain-mode Hold and Release were Unsupported."""
    custom = k8s.CustomObjectsApi(admin_client)
    body = trainjob_body("job", suspend=True)
    body["spec"]["runtimeRef"]["name"] = runtime_check
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body
    )
    adapter = make(cluster, supervisor_client, "plain")
    result = adapter.preflight(namespace)
    assert result.hold_round_trip.supported, result.hold_round_trip.reason
    assert result.hold_supported
    # No enforcer here: the probe reaches the hold check and is accepted, and says so.
    assert not result.enforcer_installed.supported
    assert "no enforcer is installed" in result.enforcer_installed.reason
    ref = Ref(namespace, "job")
    adapter.hold(ref, meta(1), "node lost")
    assert adapter.observe(ref).state is State.HELD
    adapter.release(ref, meta(1))


def test_a_probe_refused_by_another_webhook_is_reported_as_such(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
    runtime_check: str,
) -> None:
    """With no runtime to name, the probe is refused before the hold check: preflight says
    whose refusal it was, and that the enforcer probe is inconclusive, not "no enforcer"."""
    _delete_runtime(admin_client, runtime_check)
    result = make(cluster, supervisor_client, "plain").preflight(namespace)
    assert not result.hold_round_trip.supported
    assert "runtime not found" in result.hold_round_trip.reason
    assert "not by a hold rule" in result.hold_round_trip.reason
    assert not result.enforcer_installed.supported
    assert result.enforcer_installed.reason.startswith("inconclusive: ")
    assert "runtime not found" in result.enforcer_installed.reason


def test_kueue_mode_enforcer_probe_is_a_workload(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, namespace: str, runtime_check: str
) -> None:
    """Kueue mode probes with its own held kind, so no TrainJob webhook can answer first."""
    adapter = make(cluster, supervisor_client, "kueue")
    result = adapter.preflight(namespace)
    assert result.hold_round_trip.supported, result.hold_round_trip.reason
    probes = [r for r in adapter.request_log if r.verb == "dry-run-create"]
    assert [r.resource for r in probes] == ["workloads", "workloads"]


# -- the readmission gate, seen from preflight (Kueue mode) -----------------------------


def _cluster_object(resource: Any, body: dict[str, Any], admin: k8s.ApiClient) -> None:
    k8s.CustomObjectsApi(admin).create_cluster_custom_object(
        resource.group, resource.version, resource.plural, body
    )


def _queue(
    admin: k8s.ApiClient,
    namespace: str,
    checks: list[str],
    gate_controller: str | None,
    controllers: dict[str, str] | None = None,
) -> str:
    """A LocalQueue in ``namespace`` on a new ClusterQueue that applies ``checks`` (each
    served by ``controllers[check]``, else by ``gate_controller``)."""
    suffix = uuid.uuid4().hex[:6]
    for check in checks:
        controller = (controllers or {}).get(check) or gate_controller or "example.com/other"
        _cluster_object(
            ADMISSIONCHECK,
            {
                "apiVersion": ADMISSIONCHECK.api_version,
                "kind": ADMISSIONCHECK.kind,
                "metadata": {"name": check},
                "spec": {"controllerName": controller},
            },
            admin,
        )
    cq = f"cq-{suffix}"
    spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": []}
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    _cluster_object(
        CLUSTERQUEUE,
        {
            "apiVersion": CLUSTERQUEUE.api_version,
            "kind": CLUSTERQUEUE.kind,
            "metadata": {"name": cq},
            "spec": spec,
        },
        admin,
    )
    lq = f"lq-{suffix}"
    k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
        LOCALQUEUE.group,
        LOCALQUEUE.version,
        namespace,
        LOCALQUEUE.plural,
        {
            "apiVersion": LOCALQUEUE.api_version,
            "kind": LOCALQUEUE.kind,
            "metadata": {"name": lq},
            "spec": {"clusterQueue": cq},
        },
    )
    return lq


@pytest.mark.parametrize(
    ("queues", "gated", "says"),
    [
        pytest.param([], False, "no LocalQueue", id="no-queue"),
        pytest.param([("none", None)], False, "lists no AdmissionCheck", id="ungated"),
        pytest.param([("other", "example.com/other")], False, "lists no", id="other-check"),
        pytest.param([("gate", GATE)], True, "only through", id="gated"),
        pytest.param([("gate", GATE), ("none", None)], False, "lists no", id="one-of-two-ungated"),
    ],
)
def test_kueue_preflight_reports_whether_the_readmission_gate_guards_the_queues(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
    queues: list[tuple[str, str | None]],
    gated: bool,
    says: str,
) -> None:
    created = []
    for kind, controller in queues:
        checks = [] if kind == "none" else [f"{kind}-{uuid.uuid4().hex[:6]}"]
        created.append(_queue(admin_client, namespace, checks, controller))
    result = make(cluster, supervisor_client, "kueue").preflight(namespace)
    gate = result.capabilities()["readmissionGate"]
    assert gate.supported is gated, gate.reason
    assert says in gate.reason
    if not gated and queues:
        ungated = [lq for lq, (kind, c) in zip(created, queues, strict=True) if c != GATE]
        assert all(lq in gate.reason for lq in ungated)
    # Reported, not a condition of Hold: the spec fixes when Hold is unsupported.
    assert result.hold_supported


@pytest.mark.parametrize(
    ("with_gate", "supported", "says"),
    [
        pytest.param(False, False, "without an AdmissionCheck of", id="multikueue-ungated"),
        pytest.param(True, True, "counts the job's pods on every worker", id="multikueue-gated"),
    ],
)
def test_kueue_preflight_reports_a_multikueue_queue_without_the_gate(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    namespace: str,
    with_gate: bool,
    supported: bool,
    says: str,
) -> None:
    """A queue that dispatches through MultiKueue is safe to release only through the gate
    (docs/explanation/readmission-gate.md, "MultiKueue"); preflight says which, and Hold
    stays supported."""
    dispatch, gate = f"mk-{uuid.uuid4().hex[:6]}", f"gate-{uuid.uuid4().hex[:6]}"
    checks = [dispatch, gate] if with_gate else [dispatch]
    lq = _queue(
        admin_client, namespace, checks, None, {dispatch: MULTIKUEUE_CONTROLLER, gate: GATE}
    )
    result = make(cluster, supervisor_client, "kueue").preflight(namespace)
    found = result.capabilities()["multiKueue"]
    assert found.supported is supported, found.reason
    assert says in found.reason and lq in found.reason
    assert result.hold_supported


def test_plain_preflight_has_no_gate_capability(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, namespace: str
) -> None:
    result = make(cluster, supervisor_client, "plain").preflight(namespace)
    assert "readmissionGate" not in result.capabilities()


# -- Observe: pods of a previous execution ----------------------------------------------


def _pod(trainer: k8s.ApiClient, ns: str, job: str, finalizer: bool = False) -> str:
    name = f"{job}-node-0-{uuid.uuid4().hex[:5]}"
    k8s.CoreV1Api(trainer).create_namespaced_pod(
        ns,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(
                name=name,
                labels={JOBSET_NAME_LABEL: job},
                finalizers=["holdwarden.io/test-keeps-it"] if finalizer else None,
            ),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
        ),
    )
    return name


def _drop_finalizer(admin: k8s.ApiClient, ns: str, name: str) -> None:
    k8s.CoreV1Api(admin).patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})


def test_observe_reports_leftover_pods_of_a_previous_execution(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    admin_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    namespace: str,
) -> None:
    """Observed on real Kueue without the gate: status said "running" beside a terminating
    pod of the held execution. Observe now names such pods."""
    custom = k8s.CustomObjectsApi(admin_client)
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, trainjob_body("job")
    )
    adapter = make(cluster, supervisor_client, "plain")
    ref = Ref(namespace, "job")
    adapter.open(ref, meta(1))
    current = _pod(trainer_client, namespace, "job")
    dying = _pod(trainer_client, namespace, "job", finalizer=True)
    k8s.CoreV1Api(admin_client).delete_namespaced_pod(dying, namespace)
    try:
        observed = adapter.observe(ref)
        assert observed.state is State.RUNNING
        assert observed.leftover_pods == (dying,)  # the current execution's pod is not listed
        assert observed.to_dict()["leftoverPods"] == [dying]
        adapter.hold(ref, meta(1), "node lost")
        held = adapter.observe(ref)
        assert held.state is State.HELD
        assert held.leftover_pods == tuple(sorted([current, dying]))
    finally:
        _drop_finalizer(admin_client, namespace, dying)
