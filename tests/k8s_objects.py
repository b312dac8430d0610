"""Valid bodies for the real CRDs, shared by the tests (not a fake: plain dicts)."""

from __future__ import annotations

from typing import Any

from holdwarden.vocabulary import JOB_UID_LABEL, QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD


def trainjob_body(
    name: str, *, queue: str | None = None, suspend: bool | None = None
) -> dict[str, Any]:
    """A TrainJob that the upstream v1alpha1 schema accepts."""
    metadata: dict[str, Any] = {"name": name}
    if queue is not None:
        metadata["labels"] = {QUEUE_NAME_LABEL: queue}
    spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed"}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": metadata,
        "spec": spec,
    }


def workload_body(
    name: str, *, trainjob: dict[str, Any] | None = None, active: bool | None = None
) -> dict[str, Any]:
    """A Workload that the upstream v1beta2 schema accepts, owned by ``trainjob`` if given.

    Ownership is what Kueue writes: label job-uid and a controller ownerReference.
    """
    metadata: dict[str, Any] = {"name": name}
    if trainjob is not None:
        uid = trainjob["metadata"]["uid"]
        metadata["labels"] = {JOB_UID_LABEL: uid}
        metadata["ownerReferences"] = [
            {
                "apiVersion": TRAINJOB.api_version,
                "kind": TRAINJOB.kind,
                "name": trainjob["metadata"]["name"],
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {
        "queueName": "user-queue",
        "podSets": [
            {
                "name": "node",
                "count": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "trainer", "image": "busybox"}],
                    }
                },
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
