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

from typing import Any

import msgspec

from webhook.rules import Change, Violation

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class BadReview(Exception):
    """The body is not an AdmissionReview v1 request this server can answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Review(msgspec.Struct, frozen=True):
    """One parsed AdmissionReview request (immutable; a Struct for the reason ``Change``
    is one: it is built per review)."""

    uid: str
    dry_run: bool
    change: Change
    version: str
    user_uid: str


# Typed views of exactly the fields the enforcer reads. Decoding into them validates the
# JSON syntax of the whole body but skips (without building Python objects) everything else:
# managedFields, pod templates, status... That is what keeps a 30 KB review's decision in
# tens of microseconds. Fields the rules read defensively are typed ``Any``; the envelope
# fields must have their Kubernetes types, or the body is a 400.


class _Meta(msgspec.Struct):
    name: Any = msgspec.UNSET
    generateName: Any = msgspec.UNSET  # Kubernetes field names
    annotations: Any = msgspec.UNSET
    labels: Any = msgspec.UNSET
    ownerReferences: Any = msgspec.UNSET


class _Spec(msgspec.Struct):
    suspend: Any = msgspec.UNSET
    active: Any = msgspec.UNSET


class _Object(msgspec.Struct):
    metadata: _Meta | None = None
    spec: _Spec | None = None


class _Resource(msgspec.Struct):
    group: str = ""
    version: str = ""
    resource: str = ""


class _User(msgspec.Struct):
    username: str = ""
    uid: str = ""
    groups: list[str] | None = None


class _Request(msgspec.Struct):
    uid: Any = None
    resource: _Resource | None = None
    subResource: str | None = None
    name: str | None = None
    namespace: str | None = None
    operation: str | None = None
    userInfo: _User | None = None
    object: _Object | None = None
    oldObject: _Object | None = None
    dryRun: bool | None = None


class _Review(msgspec.Struct):
    apiVersion: Any = None
    kind: Any = None
    request: _Request | None = None


_DECODER = msgspec.json.Decoder(_Review)
UNSET = msgspec.UNSET


_META_FIELDS = ("name", "generateName", "annotations", "labels", "ownerReferences")
_SPEC_FIELDS = ("suspend", "active")


def _present(view: msgspec.Struct, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``view`` named in ``names`` that the body carried (UNSET left out)."""
    # A loop over getattr, not a comprehension over pairs: this runs four times per review,
    # and it is half the cost.
    found: dict[str, Any] = {}
    for name in names:
        value = getattr(view, name)
        if value is not UNSET:
            found[name] = value
    return found


def _plain(view: _Object | None) -> dict[str, Any] | None:
    """The decoded fields as the plain mapping the rules read (absent keys stay absent)."""
    if view is None:
        return None
    obj: dict[str, Any] = {}
    if view.metadata is not None:
        obj["metadata"] = _present(view.metadata, _META_FIELDS)
    if view.spec is not None:
        obj["spec"] = _present(view.spec, _SPEC_FIELDS)
    return obj


def parse_review(body: bytes) -> Review:
    """Parse and validate an AdmissionReview v1 request body."""
    try:
        doc = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise BadReview(400, f"body is not a well-formed AdmissionReview: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadReview(400, f"body is not valid JSON: {exc}") from None
    if doc.apiVersion != API_VERSION or doc.kind != KIND:
        raise BadReview(
            400,
            f"expected apiVersion {API_VERSION!r} and kind {KIND!r}, got "
            f"apiVersion {doc.apiVersion!r} and kind {doc.kind!r}; "
            f"register the webhook with admissionReviewVersions: [v1]",
        )
    request = doc.request
    if request is None:
        raise BadReview(400, "AdmissionReview has no request object")
    uid = request.uid
    if not isinstance(uid, str) or not uid:
        raise BadReview(400, "AdmissionReview request has no uid")
    resource = request.resource or _Resource()
    user = request.userInfo or _User()
    old = _plain(request.oldObject)
    new = _plain(request.object)
    name = request.name or ""
    if not name and new is not None:
        # CREATE with generateName: the apiserver has not named the object yet.
        meta = new.get("metadata") or {}
        candidate = meta.get("name") or meta.get("generateName") or ""
        name = candidate if isinstance(candidate, str) else ""
    change = Change(
        group=resource.group,
        resource=resource.resource,
        subresource=request.subResource or "",
        operation=request.operation or "",
        namespace=request.namespace or "",
        name=name,
        username=user.username,
        groups=tuple(user.groups or ()),
        old=old,
        new=new,
    )
    return Review(
        uid=uid,
        dry_run=bool(request.dryRun),
        change=change,
        version=resource.version,
        user_uid=user.uid,
    )


def allow(uid: str) -> dict[str, Any]:
    """An AdmissionReview response that allows the request."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": {"uid": uid, "allowed": True},
    }


_ALLOW_HEAD = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'
_ALLOW_TAIL = b',"allowed":true}}'


def allow_bytes(uid: str) -> bytes:
    """``allow(uid)`` already encoded: the hot path, with the uid JSON-escaped by msgspec."""
    return _ALLOW_HEAD + msgspec.json.encode(uid) + _ALLOW_TAIL


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
