"""The real controllers run, as their own identities, and carry a TrainJob end to end:
Kueue admits it, Trainer makes its JobSet, JobSet its Jobs, the Job controller its pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from holdwarden.vocabulary import JOB_UID_LABEL, JOBSET_NAME_LABEL, TRAINJOB, WORKLOAD
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster
from rig.localcluster.realstory import LOCAL_QUEUE, eventually, make_queues

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]


def _client_from(cluster: LocalCluster, kubeconfig: Path) -> k8s.ApiClient:
    """A client with the bearer token of a controller's kubeconfig."""
    (user,) = yaml.safe_load(kubeconfig.read_text())["users"]
    configuration = k8s.Configuration()
    configuration.host = cluster.server_url
    configuration.ssl_ca_cert = str(cluster.workdir / "ca.crt")
    configuration.api_key = {"authorization": f"Bearer {user['user']['token']}"}
    return k8s.ApiClient(configuration)


@pytest.mark.parametrize("name", ["kueue", "trainer", "jobset"])
def test_each_controller_authenticates_as_its_service_account(
    real_cluster: LocalCluster, name: str
) -> None:
    assert real_cluster.controllers is not None
    controller = real_cluster.controllers.by_name[name]
    kubeconfig = real_cluster.workdir / "controllers" / f"{name}.kubeconfig"
    with _client_from(real_cluster, kubeconfig) as api:
        review: Any = k8s.AuthenticationV1Api(api).create_self_subject_review(
            k8s.V1SelfSubjectReview()
        )
    assert review.status.user_info.username == controller.identity


def test_kube_controller_manager_runs_the_job_controller_as_its_service_account(
    real_admin: k8s.ApiClient,
) -> None:
    # --use-service-account-credentials: it makes the account, then acts as it.
    account = k8s.CoreV1Api(real_admin).read_namespaced_service_account(
        "job-controller", "kube-system"
    )
    assert account.metadata is not None


def test_a_queued_trainjob_runs_through_all_four_controllers(
    real_admin: k8s.ApiClient, real_namespace: str
) -> None:
    make_queues(real_admin, real_namespace)
    custom = k8s.CustomObjectsApi(real_admin)
    created: Any = custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, real_namespace, TRAINJOB.plural,
        trainjob_body("job", queue=LOCAL_QUEUE),
    )  # fmt: skip
    # Kueue's own TrainJob webhook suspends a queued TrainJob at creation.
    assert created["spec"]["suspend"] is True

    def workload() -> dict[str, Any] | None:
        found: Any = custom.list_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, real_namespace, WORKLOAD.plural,
            label_selector=f"{JOB_UID_LABEL}={created['metadata']['uid']}",
        )  # fmt: skip
        items = found["items"]
        return dict(items[0]) if items else None

    def admitted() -> bool:
        found = workload()
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)

    eventually(workload, "Kueue creates the Workload")
    eventually(admitted, "Kueue admits the Workload")

    def running() -> bool:
        job: Any = custom.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, real_namespace, TRAINJOB.plural, "job"
        )
        return job["spec"].get("suspend") is False

    eventually(running, "Kueue unsuspends the TrainJob")

    def pods() -> list[Any]:
        return list(
            k8s.CoreV1Api(real_admin)
            .list_namespaced_pod(real_namespace, label_selector=f"{JOBSET_NAME_LABEL}=job")
            .items
        )

    found = eventually(pods, "the Job controller creates the TrainJob's pods")
    # No scheduler or kubelet: the pods exist and stay Pending.
    assert all(pod.status.phase == "Pending" for pod in found)
