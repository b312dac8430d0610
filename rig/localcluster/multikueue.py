"""Two local control planes joined by the real MultiKueue: a manager and a worker.

Kueue on the manager dispatches through an AdmissionCheck whose controllerName is
MultiKueue's; it reaches the worker with a kubeconfig kept in a Secret in Kueue's
namespace, named by a ``MultiKueueCluster``. Kueue accepts only a kubeconfig that carries
its CA and credentials inline (no file paths), so the one made here does.

The identity on the worker is its own ServiceAccount ``kueue-system/multikueue-worker``
with what MultiKueue writes there (Workloads, TrainJobs) and what the readmission gate
reads through the same kubeconfig (pods, TrainJobs). ``server_url`` may name a proxy in
front of the worker's apiserver, so that a test can make the worker unreachable.
"""

from __future__ import annotations

import base64
from typing import Any

import yaml
from kubernetes import client as k8s

from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    MULTIKUEUE_CONTROLLER,
    MULTIKUEUE_KUBECONFIG_KEY,
    MULTIKUEUECLUSTER,
)
from rig.localcluster.cluster import LocalCluster, kubeconfig_document
from rig.localcluster.controllers import KUEUE_NAMESPACE
from rig.localcluster.realstory import eventually

WORKER_ACCOUNT = "multikueue-worker"
_TOKEN_SECONDS = 48 * 3600
_WORKER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["workloads"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["workloads/status"],
        "verbs": ["get", "patch", "update"],
    },
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainjobs"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs/status"], "verbs": ["get"]},
    # MultiKueue watches every kind the manager's Kueue integrates (controllers.py enables
    # batch/job and JobSet beside TrainJob): without these it never connects.
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {
        "apiGroups": ["jobset.x-k8s.io"],
        "resources": ["jobsets"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets/status"], "verbs": ["get"]},
    # The readmission gate on the manager counts the job's pods here.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
]


def worker_kubeconfig(worker: LocalCluster, server_url: str | None = None) -> bytes:
    """A kubeconfig MultiKueue accepts for ``worker`` (through ``server_url`` if given)."""
    name = f"{KUEUE_NAMESPACE}:{WORKER_ACCOUNT}"
    with worker.api_client() as admin:
        core = k8s.CoreV1Api(admin)
        rbac = k8s.RbacAuthorizationV1Api(admin)
        try:
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=KUEUE_NAMESPACE)))
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
        core.create_namespaced_service_account(
            KUEUE_NAMESPACE, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=WORKER_ACCOUNT))
        )
        role: Any = {"metadata": {"name": name}, "rules": _WORKER_RULES}
        rbac.create_cluster_role(role)
        binding: Any = {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": WORKER_ACCOUNT,
                              "namespace": KUEUE_NAMESPACE}],
        }  # fmt: skip
        rbac.create_cluster_role_binding(binding)
        status = core.create_namespaced_service_account_token(
            WORKER_ACCOUNT,
            KUEUE_NAMESPACE,
            k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=_TOKEN_SECONDS)
            ),
        ).status
    if status is None or not status.token:
        raise RuntimeError(f"TokenRequest for {name} on the worker gave no token")
    # Inline CA: the kubeconfig travels in a Secret to Kueue, which has no file of ours.
    config = kubeconfig_document(
        server_url or worker.server_url,
        WORKER_ACCOUNT,
        {"token": str(status.token)},
        ca_pem=(worker.workdir / "ca.crt").read_bytes(),
        cluster_name="worker",
    )
    return yaml.safe_dump(config).encode()


def connect_worker(manager_admin: k8s.ApiClient, name: str, kubeconfig: bytes) -> str:
    """Register a worker with the manager's MultiKueue; returns the AdmissionCheck's name
    (a ClusterQueue that lists it dispatches to this worker)."""
    core = k8s.CoreV1Api(manager_admin)
    custom = k8s.CustomObjectsApi(manager_admin)
    secret = f"{name}-kubeconfig"
    core.create_namespaced_secret(
        KUEUE_NAMESPACE,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=secret),
            data={MULTIKUEUE_KUBECONFIG_KEY: base64.b64encode(kubeconfig).decode()},
        ),
    )
    group = f"{MULTIKUEUECLUSTER.group}/{MULTIKUEUECLUSTER.version}"
    custom.create_cluster_custom_object(
        MULTIKUEUECLUSTER.group, MULTIKUEUECLUSTER.version, MULTIKUEUECLUSTER.plural,
        {"apiVersion": group, "kind": MULTIKUEUECLUSTER.kind, "metadata": {"name": name},
         "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret",
                                                    "location": secret}}}},
    )  # fmt: skip
    config_name = f"{name}-config"
    custom.create_cluster_custom_object(
        MULTIKUEUECLUSTER.group, MULTIKUEUECLUSTER.version, "multikueueconfigs",
        {"apiVersion": group, "kind": "MultiKueueConfig", "metadata": {"name": config_name},
         "spec": {"clusters": [name]}},
    )  # fmt: skip
    check = f"{name}-dispatch"
    custom.create_cluster_custom_object(
        ADMISSIONCHECK.group, ADMISSIONCHECK.version, ADMISSIONCHECK.plural,
        {"apiVersion": group, "kind": ADMISSIONCHECK.kind, "metadata": {"name": check},
         "spec": {"controllerName": MULTIKUEUE_CONTROLLER,
                  "parameters": {"apiGroup": MULTIKUEUECLUSTER.group,
                                 "kind": "MultiKueueConfig", "name": config_name}}},
    )  # fmt: skip
    return check


def cluster_active(manager_admin: k8s.ApiClient, name: str) -> bool:
    """The manager's Kueue says it is connected to worker ``name`` (condition Active)."""
    found: Any = k8s.CustomObjectsApi(manager_admin).get_cluster_custom_object(
        MULTIKUEUECLUSTER.group, MULTIKUEUECLUSTER.version, MULTIKUEUECLUSTER.plural, name
    )
    conditions = (found.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def wait_connected(manager_admin: k8s.ApiClient, name: str, timeout: float = 120) -> None:
    eventually(
        lambda: cluster_active(manager_admin, name),
        f"MultiKueue on the manager connects to worker {name}",
        timeout,
    )
