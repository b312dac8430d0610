"""AdmissionReview request bodies as a real kube-apiserver sends them (plain dicts).

Test and benchmark fixtures (kept out of the wheel): the enforcer's tests and
bench/webhook_bench.py use them; compare the real captures in
../shared/samples/admissionreview. ``inflate`` grows an object to a realistic size.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from rig.builders import trainjob_body

A = Annotations()


def review(
    *,
    resource: str = "trainjobs",
    operation: str = "UPDATE",
    old: dict[str, Any] | None = None,
    new: dict[str, Any] | None = None,
    user: str = "alice",
    groups: list[str] | None = None,
    subresource: str | None = None,
    dry_run: bool = False,
    namespace: str = "ns",
    name: str = "job",
    uid: str | None = None,
) -> dict[str, Any]:
    """One AdmissionReview v1 request."""
    coords = TRAINJOB if resource == "trainjobs" else WORKLOAD
    group, version, kind = coords.group, coords.version, coords.kind
    if resource not in ("trainjobs", "workloads"):
        group, version, kind = "", "v1", resource.rstrip("s").capitalize()
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {
            "username": user,
            "uid": "0d8b5c2e",
            "groups": groups if groups is not None else ["system:authenticated"],
        },
        "object": new,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"kind": f"{operation.capitalize()}Options", "apiVersion": "meta.k8s.io/v1"},
    }
    if subresource:
        request["subResource"] = subresource
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def trainjob(
    *,
    suspend: bool | None = None,
    instance: str | None = None,
    queue: bool = False,
    name: str = "job",
    namespace: str = "ns",
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if instance is not None:
        annotations.update(
            {
                A.hold_instance: instance,
                A.hold_reason: "node lost",
                A.held_at: "2026-12-02T12:00:00Z",
                A.held_by: "dispatch",
            }
        )
    # The shared builder's body, as stored: with what the apiserver adds.
    body = trainjob_body(
        name, namespace=namespace, queue="user-queue" if queue else None, suspend=suspend
    )
    body["metadata"].update(
        {
            "uid": "6f1d2e0a-6a0e-4d55-9a43-2f3c1e9b7a10",
            "resourceVersion": "4242",
            "generation": 3,
            "creationTimestamp": "2026-12-02T11:00:00Z",
            "annotations": annotations,
        }
    )
    return body


def workload(
    *, active: bool | None = None, instance: str | None = None, name: str = "wl"
) -> dict[str, Any]:
    body = trainjob(instance=instance, name=name)
    body["apiVersion"], body["kind"] = WORKLOAD.api_version, WORKLOAD.kind
    body["spec"] = {
        "queueName": "user-queue",
        "podSets": [
            {
                "name": "node",
                "count": 1,
                "template": {"spec": {"containers": [{"name": "t", "image": "busybox"}]}},
            }
        ],
    }
    if active is not None:
        body["spec"]["active"] = active
    return body


def _managed_fields(count: int) -> list[dict[str, Any]]:
    # What server-side apply and update record: nested FieldsV1 trees per manager.
    entries = []
    for i in range(count):
        fields: dict[str, Any] = {
            "f:metadata": {
                "f:annotations": {".": {}, **{f"f:example.com/key-{j}": {} for j in range(8)}},
                "f:labels": {".": {}, f"f:{QUEUE_NAME_LABEL}": {}},
            },
            "f:spec": {
                "f:runtimeRef": {".": {}, "f:name": {}, "f:apiGroup": {}, "f:kind": {}},
                "f:trainer": {
                    "f:numNodes": {},
                    "f:env": {
                        f'k:{{"name":"ENV_{j}"}}': {".": {}, "f:name": {}, "f:value": {}}
                        for j in range(12)
                    },
                },
            },
        }
        entries.append(
            {
                "manager": f"manager-{i}",
                "operation": "Apply" if i % 2 else "Update",
                "apiVersion": TRAINJOB.api_version,
                "time": "2026-12-02T11:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": fields,
            }
        )
    return entries


def inflate(body: dict[str, Any], target_bytes: int) -> dict[str, Any]:
    """A copy of ``body`` grown to about ``target_bytes`` of JSON with realistic content:
    managedFields, a last-applied-configuration annotation, a trainer env list."""
    import json

    grown = copy.deepcopy(body)
    meta = grown["metadata"]
    meta.setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = (
        json.dumps({"apiVersion": body["apiVersion"], "kind": body["kind"], "spec": body["spec"]})
    )
    managers = 1
    while True:
        meta["managedFields"] = _managed_fields(managers)
        spec = grown["spec"]
        if body["kind"] == TRAINJOB.kind:
            spec["trainer"] = {
                "numNodes": 4,
                "image": "ghcr.io/example/trainer:2.3.0",
                "command": ["torchrun", "train.py"],
                "env": [{"name": f"ENV_{j}", "value": f"value-{j}" * 3} for j in range(12)],
                "resourcesPerNode": {"limits": {"cpu": "8", "memory": "64Gi"}},
            }
        if len(json.dumps(grown)) >= target_bytes or managers > 200:
            return grown
        managers += 1
