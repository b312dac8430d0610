"""The one set of TrainJob and Workload builders: valid bodies for the real CRDs (plain
dicts, never fakes), shared by the tests, the demo and the benchmarks.

``kueue_workload_body`` is the Workload as Kueue makes it for a TrainJob: the
``kueue.x-k8s.io/job-uid`` label and a controller ownerReference (what the real Kueue
v0.19.2 writes; docs/explanation/proof.md), so every actor of Kueue writes the same object.
"""

from __future__ import annotations

from typing import Any

from holdwarden.objects import kueue_workload_names
from holdwarden.vocabulary import JOB_UID_LABEL, QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD

# The upstream ClusterTrainingRuntime the local control plane installs.
DEFAULT_RUNTIME = "torch-distributed"


def trainjob_body(
    name: str,
    *,
    queue: str | None = None,
    suspend: bool | None = None,
    namespace: str | None = None,
    runtime: str = DEFAULT_RUNTIME,
) -> dict[str, Any]:
    """A TrainJob that the upstream v1alpha1 schema accepts; ``queue`` sets Kueue's label."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if queue is not None:
        metadata["labels"] = {QUEUE_NAME_LABEL: queue}
    spec: dict[str, Any] = {"runtimeRef": {"name": runtime}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": metadata,
        "spec": spec,
    }


def owned_by(trainjob: dict[str, Any]) -> dict[str, Any]:
    """The metadata Kueue gives a TrainJob's Workload: job-uid label, controller owner."""
    uid = trainjob["metadata"]["uid"]
    return {
        "labels": {JOB_UID_LABEL: uid},
        "ownerReferences": [
            {
                "apiVersion": TRAINJOB.api_version,
                "kind": TRAINJOB.kind,
                "name": trainjob["metadata"]["name"],
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def workload_body(
    name: str,
    *,
    trainjob: dict[str, Any] | None = None,
    active: bool | None = None,
    queue: str = "user-queue",
    count: int = 1,
    requests: dict[str, str] | None = None,
    image: str = "busybox",
) -> dict[str, Any]:
    """A Workload that the upstream v1beta2 schema accepts, owned by ``trainjob`` (as
    Kueue owns it) if given. ``requests`` are the pod set's resource requests."""
    metadata: dict[str, Any] = {"name": name}
    if trainjob is not None:
        metadata.update(owned_by(trainjob))
    container: dict[str, Any] = {"name": "trainer", "image": image}
    if requests:
        container["resources"] = {"requests": dict(requests)}
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [
            {
                "name": "node",
                "count": count,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            }
        ],
    }
    if active is not None:
        spec["active"] = active
    return {
        "apiVersion": WORKLOAD.api_version,
        "kind": WORKLOAD.kind,
        "metadata": metadata,
        "spec": spec,
    }


def kueue_workload_body(
    trainjob: dict[str, Any], name: str | None = None, *, queue: str, **pod_set: Any
) -> dict[str, Any]:
    """The Workload Kueue creates for ``trainjob`` (as the API server returned it, with its
    uid) in ``queue``, under the name Kueue gives it unless ``name`` is given (``pod_set``:
    ``count``, ``requests``, ``image`` as ``workload_body`` takes them)."""
    if name is None:
        meta = trainjob["metadata"]
        name = kueue_workload_names(meta["name"], meta["uid"])[0]
    return workload_body(name, trainjob=trainjob, queue=queue, **pod_set)
