"""RBAC in the tests' real apiserver: wait until a new Role or binding is in force.

The apiserver's RBAC authorizer learns of Roles and bindings through informers, so one is
not in force the moment its create returns: under load, the first request with the new
identity can still be refused (403). A test that has just made RBAC therefore waits, as
that identity, until a verb it grants is allowed (SelfSubjectAccessReview, the same
authorizer the requests meet) before it sends the requests it tests.

Wait on verbs the new RBAC *allows*, one per binding and per rule the test relies on: a
denial holds before the binding exists too, so waiting for one proves nothing. To check
that something stays denied, first wait for an allowed verb of the same binding, then
assert ``not may(...)``.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client as k8s

RBAC_WAIT_S = 30.0


def may(api: k8s.ApiClient, verb: str, what: str, namespace: str | None = None) -> bool:
    """One SelfSubjectAccessReview as ``api``'s identity: may it ``verb`` ``what``
    (``resource.group``; ``resource`` alone for the core group) in ``namespace``
    (cluster-wide when None)?"""
    resource, _, group = what.partition(".")
    attributes = {"verb": verb, "group": group, "resource": resource}
    if namespace is not None:
        attributes["namespace"] = namespace
    body: Any = {"spec": {"resourceAttributes": attributes}}
    review: Any = k8s.AuthorizationV1Api(api).create_self_subject_access_review(
        body, _request_timeout=10
    )
    return bool(review.status.allowed)


def wait_allowed(
    api: k8s.ApiClient,
    verb: str,
    what: str,
    namespace: str | None = None,
    *,
    within: float = RBAC_WAIT_S,
) -> None:
    """Poll until ``may(api, verb, what, namespace)``; fail the test after ``within`` s."""
    deadline = time.monotonic() + within
    while not may(api, verb, what, namespace):
        where = f"in {namespace}" if namespace is not None else "cluster-wide"
        assert time.monotonic() < deadline, f"{verb} {what} {where} not allowed in {within}s"
        time.sleep(0.1)
