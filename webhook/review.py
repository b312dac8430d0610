"""AdmissionReview v1: parse a request body, build the response body.

Invariants:
  - ``parse_review`` either returns a ``Review`` or raises ``BadReview`` (with the HTTP
    status and a message for the caller); it raises nothing else for any input bytes.
  - A response always has ``apiVersion: admission.k8s.io/v1``, ``kind: AdmissionReview``,
    the request's ``uid``, and never a ``patch``.
  - A denial has ``allowed: false``, ``status.code: 403``, ``status.reason: Forbidden``, the
    rule's message, and ``auditAnnotations`` whose keys contain no ``/`` (the apiserver
    prefixes them with the webhook's name).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.rules import Change, Violation

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class BadReview(Exception):
    """The body is not an AdmissionReview v1 request this server can answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Review:
    """One parsed AdmissionReview request."""

    uid: str
    dry_run: bool
    change: Change
    version: str
    user_uid: str


def _str(request: Mapping[str, Any], key: str, where: str = "request") -> str:
    value = request.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadReview(400, f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _obj(request: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadReview(400, f"request.{key} must be an object or null")
    return value


def _map(request: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = request.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadReview(400, f"request.{key} must be an object")
    return value


def parse_review(body: bytes) -> Review:
    """Parse and validate an AdmissionReview v1 request body."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # UnicodeDecodeError and JSONDecodeError are both ValueErrors.
        raise BadReview(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadReview(400, "body must be a JSON object (an AdmissionReview)")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise BadReview(
            400,
            f"expected apiVersion {API_VERSION!r} and kind {KIND!r}, got "
            f"apiVersion {doc.get('apiVersion')!r} and kind {doc.get('kind')!r}; "
            f"register the webhook with admissionReviewVersions: [v1]",
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview(400, "AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview(400, "AdmissionReview request has no uid")
    resource = _map(request, "resource")
    user = _map(request, "userInfo")
    groups = user.get("groups")
    if groups is None:
        groups = []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise BadReview(400, "request.userInfo.groups must be a list of strings")
    dry_run = request.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise BadReview(400, "request.dryRun must be a boolean")
    old = _obj(request, "oldObject")
    new = _obj(request, "object")
    name = _str(request, "name")
    if not name:
        # CREATE with generateName: the apiserver has not named the object yet.
        meta = (new or {}).get("metadata")
        if isinstance(meta, dict):
            candidate = meta.get("name") or meta.get("generateName") or ""
            name = candidate if isinstance(candidate, str) else ""
    change = Change(
        group=_str(resource, "group", "request.resource"),
        resource=_str(resource, "resource", "request.resource"),
        subresource=_str(request, "subResource"),
        operation=_str(request, "operation"),
        namespace=_str(request, "namespace"),
        name=name,
        username=_str(user, "username", "request.userInfo"),
        groups=tuple(groups),
        old=old,
        new=new,
    )
    return Review(
        uid=uid,
        dry_run=dry_run,
        change=change,
        version=_str(resource, "version", "request.resource"),
        user_uid=_str(user, "uid", "request.userInfo"),
    )


def allow(uid: str) -> dict[str, Any]:
    """An AdmissionReview response that allows the request."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": {"uid": uid, "allowed": True},
    }


def deny(uid: str, violation: Violation, *, dry_run: bool) -> dict[str, Any]:
    """An AdmissionReview response that refuses the request for ``violation``."""
    audit: dict[str, str] = {"rule": str(violation.rule)}
    if violation.instance is not None:
        audit["instance"] = violation.instance
    if dry_run:
        audit["dryRun"] = "true"
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {
                "status": "Failure",
                "code": 403,
                "reason": "Forbidden",
                "message": violation.message,
            },
            "auditAnnotations": audit,
        },
    }


def internal_error(uid: str, message: str) -> dict[str, Any]:
    """A refusal for a review this server parsed but failed to judge (fail closed)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {
                "status": "Failure",
                "code": 500,
                "reason": "InternalError",
                "message": f"holdwarden enforcer could not judge this request: {message}",
            },
        },
    }


def bad_request_body(status: int, message: str) -> dict[str, Any]:
    """The JSON body of a 400/413 answer: a Kubernetes ``Status`` the caller can read."""
    reason = "RequestEntityTooLarge" if status == 413 else "BadRequest"
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": status,
        "reason": reason,
        "message": f"holdwarden enforcer: {message}",
    }
