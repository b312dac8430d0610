"""Preflight's trap probes (issue 29) against the REAL local control plane.

- trainerManagedBy: with a MultiKueue AdmissionCheck, Hold is refused on a control plane
  whose TrainJob CRD is Trainer v2.2.1's (a second control plane of this module's own,
  since the session's shared one serves v2.3.0's), and allowed on v2.3.0's. Trainer v2.2.1
  itself is not built here: the rig builds v2.3.0; the CRD is what preflight reads.
- trainJobRuntimes: a TrainJob naming a runtime that is gone (no Trainer webhook runs
  here to refuse its creation; tests/real/test_trainer_traps.py has the real webhook).
- kueueForceDelete and kueueRetention: Kueue's ConfigMap and an annotated pod.

All as the supervisor identity, with the rights the rig grants it (rig/localcluster/rbac.py).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta, Config, Ref
from holdwarden.adapter.errors import Unsupported
from holdwarden.config import TimeoutsConfig
from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    JOBSET_NAME_LABEL,
    KUEUE_CONFIG_KEY,
    KUEUE_CONFIG_MAP,
    MULTIKUEUE_CONTROLLER,
    SAFE_TO_FORCEFULLY_DELETE_ANNOTATION,
    TRAINJOB,
    WORKLOAD,
)
from rig.builders import kueue_workload_body, trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.cluster import find_crd_dir
from rig.localcluster.crds import CRD_FILES

pytestmark = pytest.mark.controlplane

V221_CRD = Path(__file__).resolve().parents[1] / "support" / "crds" / "trainer-v2.2.1"


def make(cluster: LocalCluster, api: k8s.ApiClient) -> Adapter:
    return Adapter(
        Config(
            mode="kueue",
            holder="dispatch-test",
            timeouts=TimeoutsConfig(apiserver_request=cluster.request_timeout),
        ),
        api,
    )


def multikueue_check(admin: k8s.ApiClient) -> str:
    name = f"mk-{uuid.uuid4().hex[:6]}"
    k8s.CustomObjectsApi(admin).create_cluster_custom_object(
        ADMISSIONCHECK.group,
        ADMISSIONCHECK.version,
        ADMISSIONCHECK.plural,
        {
            "apiVersion": ADMISSIONCHECK.api_version,
            "kind": ADMISSIONCHECK.kind,
            "metadata": {"name": name},
            "spec": {"controllerName": MULTIKUEUE_CONTROLLER},
        },
    )
    return name


def delete_check(admin: k8s.ApiClient, name: str) -> None:
    k8s.CustomObjectsApi(admin).delete_cluster_custom_object(
        ADMISSIONCHECK.group, ADMISSIONCHECK.version, ADMISSIONCHECK.plural, name
    )


@pytest.fixture(scope="module")
def v221_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane serving Trainer v2.2.1's TrainJob CRD (the rest as the session's)."""
    source, _ = find_crd_dir()
    crds = tmp_path_factory.mktemp("crds-v221")
    for name in CRD_FILES:
        shutil.copy(source / name, crds / name)
    shutil.copy(V221_CRD / "trainer.kubeflow.org_trainjobs.yaml", crds)
    local = LocalCluster(crd_dir=crds)
    local.start()
    try:
        yield local
    finally:
        local.stop()


def test_hold_is_refused_with_multikueue_and_a_trainer_that_ignores_managed_by(
    v221_cluster: LocalCluster,
) -> None:
    namespace = v221_cluster.create_namespace(f"t-{uuid.uuid4().hex[:8]}")
    with v221_cluster.api_client() as admin:
        multikueue_check(admin)
    with v221_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        adapter = make(v221_cluster, supervisor)
        result = adapter.preflight(namespace)
        cap = result.trainer_managed_by
        assert cap is not None and not cap.supported, cap
        assert "v2.2 or earlier" in cap.reason and "AdmissionCheck mk-" in cap.reason
        assert not result.hold_supported
        assert result.hold_unsupported_reason == cap.reason
        assert result.to_dict()["capabilities"]["trainerManagedBy"]["supported"] is False
    # Hold itself is refused before it writes: Unsupported, with the reason. (The job
    # and the Workload Kueue would make for it, made here: no Kueue runs on this plane.)
    with v221_cluster.api_client() as admin:
        custom = k8s.CustomObjectsApi(admin)
        created: Any = custom.create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural,
            trainjob_body("job", queue="q"),
        )  # fmt: skip
        custom.create_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural,
            kueue_workload_body(created, queue="q"),
        )  # fmt: skip
    with v221_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        adapter = make(v221_cluster, supervisor)
        with pytest.raises(Unsupported, match=r"ignores spec\.managedBy"):
            adapter.hold(
                Ref(namespace, "job"), CallMeta(datetime.now(UTC) + timedelta(seconds=20), 1), "r"
            )
        held: Any = k8s.CustomObjectsApi(supervisor).get_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural,
            kueue_workload_body(created, queue="q")["metadata"]["name"],
        )  # fmt: skip
        assert held["spec"].get("active", True) is True  # nothing written


def test_without_multikueue_a_v221_trainer_does_not_matter(v221_cluster: LocalCluster) -> None:
    namespace = v221_cluster.create_namespace(f"t-{uuid.uuid4().hex[:8]}")
    with v221_cluster.api_client() as admin:
        listed: Any = k8s.CustomObjectsApi(admin).list_cluster_custom_object(
            ADMISSIONCHECK.group, ADMISSIONCHECK.version, ADMISSIONCHECK.plural
        )
        for check in listed["items"]:
            delete_check(admin, check["metadata"]["name"])
    with v221_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        result = make(v221_cluster, supervisor).preflight(namespace)
    assert result.trainer_managed_by is not None and result.trainer_managed_by.supported
    assert "no MultiKueue in use seen here" in result.trainer_managed_by.reason
    assert result.hold_supported


def test_with_multikueue_a_v23_trainer_keeps_hold(
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
    namespace: str,
) -> None:
    if find_crd_dir()[1] == "minimal":
        pytest.skip("the upstream Trainer v2.3.0 CRDs (../shared/crds) are not here")
    check = multikueue_check(admin_client)
    try:
        result = make(cluster, supervisor_client).preflight(namespace)
    finally:
        delete_check(admin_client, check)
    cap = result.trainer_managed_by
    assert cap is not None and cap.supported, cap
    assert "v2.3 or later" in cap.reason
    assert result.hold_supported


def test_preflight_names_a_trainjob_whose_runtime_is_gone(
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
    namespace: str,
) -> None:
    body = trainjob_body("orphan", suspend=True)
    body["spec"]["runtimeRef"] = {
        "name": "gone-runtime",
        "apiGroup": TRAINJOB.group,
        "kind": "TrainingRuntime",
    }
    k8s.CustomObjectsApi(admin_client).create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body
    )
    result = make(cluster, supervisor_client).preflight(namespace)
    cap = result.extra["trainJobRuntimes"]
    assert not cap.supported, cap
    assert (
        f"TrainJob {namespace}/orphan names TrainingRuntime {namespace}/gone-runtime" in cap.reason
    )
    assert result.hold_supported  # reported, not a condition of Hold


@pytest.fixture
def kueue_config(admin_client: k8s.ApiClient) -> Iterator[k8s.CoreV1Api]:
    core = k8s.CoreV1Api(admin_client)
    try:
        core.create_namespace({"metadata": {"name": "kueue-system"}})  # type: ignore[arg-type]
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    try:
        yield core
    finally:
        try:
            core.delete_namespaced_config_map(KUEUE_CONFIG_MAP, "kueue-system")
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise


def test_preflight_reports_kueues_force_deletion_and_retention(
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    namespace: str,
    kueue_config: k8s.CoreV1Api,
) -> None:
    adapter = make(cluster, supervisor_client)
    before = adapter.preflight(namespace)
    assert before.extra["kueueForceDelete"].supported
    assert (
        "no ConfigMap kueue-system/kueue-manager-config" in before.extra["kueueForceDelete"].reason
    )
    assert before.extra["kueueRetention"].supported

    kueue_config.create_namespaced_config_map(
        "kueue-system",
        {  # type: ignore[arg-type]
            "metadata": {"name": KUEUE_CONFIG_MAP},
            "data": {
                KUEUE_CONFIG_KEY: (
                    "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
                    "featureGates:\n  FailureRecoveryPolicy: true\n"
                    "objectRetentionPolicies:\n  workloads:\n    afterDeactivatedByKueue: 10m\n"
                )
            },
        },
    )
    kueue_config.create_namespaced_pod(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {
                "name": "job-node-0-0",
                "labels": {JOBSET_NAME_LABEL: "job"},
                "annotations": {SAFE_TO_FORCEFULLY_DELETE_ANNOTATION: "true"},
            },
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    after = adapter.preflight(namespace)
    force = after.extra["kueueForceDelete"]
    assert not force.supported
    assert "job-node-0-0" in force.reason and "turns on the FailureRecoveryPolicy" in force.reason
    retention = after.extra["kueueRetention"]
    assert not retention.supported and "afterDeactivatedByKueue is 10m" in retention.reason
    assert after.hold_supported  # both reported, not conditions of Hold
