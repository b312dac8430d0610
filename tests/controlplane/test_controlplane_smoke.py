"""Smoke tests that prove the control plane is a real kube-apiserver with the real CRDs."""

from __future__ import annotations

import os
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.vocabulary import TRAINJOB, WORKLOAD
from rig.builders import trainjob_body, workload_body
from rig.localcluster import LocalCluster


def test_creates_a_trainjob_through_the_official_client(
    admin_client: k8s.ApiClient, namespace: str
) -> None:
    custom = k8s.CustomObjectsApi(admin_client)
    created: Any = custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, trainjob_body("smoke")
    )
    read: Any = custom.get_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, "smoke"
    )
    assert read["metadata"]["uid"] == created["metadata"]["uid"]
    # The schema's default is applied by the server, not by us.
    assert read["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"


def test_stale_resource_version_put_gets_409(admin_client: k8s.ApiClient, namespace: str) -> None:
    custom = k8s.CustomObjectsApi(admin_client)
    args = (TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural)
    first: Any = custom.create_namespaced_custom_object(*args, trainjob_body("stale"))
    first["metadata"].setdefault("annotations", {})["x"] = "1"
    custom.replace_namespaced_custom_object(*args, "stale", first)  # bumps resourceVersion
    first["metadata"]["annotations"]["x"] = "2"  # still carries the old resourceVersion
    with pytest.raises(k8s.ApiException) as raised:
        custom.replace_namespaced_custom_object(*args, "stale", first)
    assert raised.value.status == 409


def test_impersonated_user_without_rbac_gets_403(
    unprivileged_client: k8s.ApiClient, namespace: str
) -> None:
    custom = k8s.CustomObjectsApi(unprivileged_client)
    with pytest.raises(k8s.ApiException) as raised:
        custom.list_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural
        )
    assert raised.value.status == 403
    assert "mallory" in (raised.value.body or "")


def test_workload_active_defaults_to_true(admin_client: k8s.ApiClient, namespace: str) -> None:
    custom = k8s.CustomObjectsApi(admin_client)
    body = workload_body("defaults")
    assert "active" not in body["spec"]
    created: Any = custom.create_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, body
    )
    assert created["spec"]["active"] is True


def test_impersonated_controllers_have_their_rights(
    kueue_client: k8s.ApiClient, trainer_client: k8s.ApiClient, namespace: str
) -> None:
    k8s.CustomObjectsApi(kueue_client).create_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, workload_body("by-kueue")
    )
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", labels={"jobset.sigs.k8s.io/jobset-name": "j"}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
    )
    created = k8s.CoreV1Api(trainer_client).create_namespaced_pod(namespace, pod)
    assert created.metadata is not None
    assert created.metadata.name == "p"
    managers = {m.manager for m in created.metadata.managed_fields or []}
    assert managers, "the server records who wrote the pod"


def test_stop_leaves_no_process_behind() -> None:
    # Start-up time is reported (not asserted) in the session summary and by
    # bench/controlplane_bench.py: timing assertions make flaky tests on noisy machines.
    cluster = LocalCluster()
    cluster.start()
    processes = [process for _name, process in cluster._processes]
    assert all(process.poll() is None for process in processes)
    cluster.stop()
    for process in processes:
        assert process.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.kill(process.pid, 0)
