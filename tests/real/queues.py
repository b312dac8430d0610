"""Kueue queue objects for the real-controller tests: a flavor, a ClusterQueue (optionally
with AdmissionChecks) and a LocalQueue in the test's namespace."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client as k8s

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
LOCAL_QUEUE = "user-queue"


def _create(api: k8s.ApiClient, plural: str, body: dict[str, Any], namespace: str = "") -> None:
    custom = k8s.CustomObjectsApi(api)
    if namespace:
        custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, plural, body)
    else:
        custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, body)


def make_queues(api: k8s.ApiClient, namespace: str, admission_checks: Sequence[str] = ()) -> str:
    """A ClusterQueue of its own (name returned) that admits this namespace's LocalQueue.

    Quota is generous: the TrainJobs' pods ask for nothing, and no test is about quota.
    """
    suffix = uuid.uuid4().hex[:8]
    flavor, cluster_queue = f"flavor-{suffix}", f"cq-{suffix}"
    _create(
        api,
        "resourceflavors",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ResourceFlavor",
         "metadata": {"name": flavor}},
    )  # fmt: skip
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": "100"},
                            {"name": "memory", "nominalQuota": "100Gi"},
                        ],
                    }
                ],
            }
        ],
    }
    if admission_checks:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": name} for name in admission_checks]
        }
    _create(
        api,
        "clusterqueues",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue",
         "metadata": {"name": cluster_queue}, "spec": spec},
    )  # fmt: skip
    _create(
        api,
        "localqueues",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
         "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": cluster_queue}},
        namespace,
    )  # fmt: skip
    return cluster_queue


def eventually(probe: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """``probe()``'s first truthy value, polled until ``timeout`` s; else fail naming ``what``.

    Generous by default: the real controllers on a busy 2-core machine react in seconds,
    not milliseconds, and each wait is still bounded.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.2)
