"""AdmissionReview v1: parse a request body, build the response body.

Invariants:
  - ``parse_review`` either returns a ``Review`` or raises ``BadReview`` (with the HTTP
    status and a message for the caller); it raises nothing else for any input bytes.
  - It judges a body nested up to ``MAX_REVIEW_DEPTH`` levels (the deepest object the
    kube-apiserver stores, inside the review's envelope) on every supported Python, and
    answers 400 for anything deeper; no depth exhausts the stack (see ``_pruned``).
  - Every value a ``Review`` holds is at most ``MAX_READ_DEPTH`` levels below the body's
    root when it came by the slow path; by the fast path, as deep as msgspec decoded it.
  - A response always has ``apiVersion: admission.k8s.io/v1``, ``kind: AdmissionReview``,
    the request's ``uid``, and never a ``patch``.
  - A denial has ``allowed: false``, ``status.code: 403``, ``status.reason: Forbidden``, the
    rule's message, and ``auditAnnotations`` whose keys contain no ``/`` (the apiserver
    prefixes them with the webhook's name).
"""

from __future__ import annotations

from types import UnionType
from typing import Any, Final, Union, get_args, get_origin

import ijson
import msgspec

from holdwarden.webhook.rules import Change, Violation

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

# The kube-apiserver decodes JSON with Go's encoding/json (and k8s.io/apimachinery's
# util/json), which refuse nesting deeper than 10,000 levels, so no object it stores is
# deeper (the object itself counting as one level). A review carries it two containers
# down (the review, its request): MAX_REVIEW_DEPTH is the deepest body it sends.
APISERVER_MAX_JSON_DEPTH: Final = 10_000
REVIEW_ENVELOPE_DEPTH: Final = 2
MAX_REVIEW_DEPTH: Final = APISERVER_MAX_JSON_DEPTH + REVIEW_ENVELOPE_DEPTH
# How deep (from the body's root) the slow path keeps a value the views read. What the
# apiserver puts there is at most 6 levels deep (annotations and labels are string maps,
# ownerReferences a list of flat objects); far below what msgspec decodes on any
# supported Python, so the pruned document always decodes.
MAX_READ_DEPTH: Final = 100

# msgspec recurses once per level, skipped fields included, and raises RecursionError past
# the interpreter's limit: on 3.11 sys.getrecursionlimit() (1,000 by default: 998 levels
# measured), from 3.12 a C recursion limit fixed when CPython is built, which
# sys.setrecursionlimit does not move (1,498 levels on 3.12.1, 9,999 on 3.13.0). A body
# deeper than that takes the slow path: yajl (ijson's C backend), a parser that keeps its
# stack on the heap, validates the whole body's syntax and depth while the subtrees no
# view reads are dropped; the small document left is decoded by _DECODER, so both paths
# validate the fields the enforcer reads alike. The C backend by name: ijson's
# pure-Python one would be far slower.
_YAJL = ijson.get_backend("yajl2_c")


# What the views read, derived from them so it cannot drift: each JSON field name a view
# decodes, mapped to the schema of its value (a nested Schema for a view, WHOLE for a field
# decoded as a whole). The slow path drops every other field, as the fast path skips it.
class _Whole:
    """The schema of a value decoded as a whole (kept entire by the slow path)."""


WHOLE: Final = _Whole()
Schema = dict[str, "Schema | _Whole"]


def _view_schema(view: type[msgspec.Struct]) -> Schema:
    schema: Schema = {}
    for field in msgspec.structs.fields(view):
        origin = get_origin(field.type)
        kinds = get_args(field.type) if origin in (Union, UnionType) else (field.type,)
        nested = [k for k in kinds if isinstance(k, type) and issubclass(k, msgspec.Struct)]
        schema[field.encode_name] = _view_schema(nested[0]) if nested else WHOLE
    return schema


READ_SCHEMA: Final = _view_schema(_Review)


_OPEN = ("start_map", "start_array")
_CLOSE = ("end_map", "end_array")


def _too_deep(what: str, limit: int) -> BadReview:
    return BadReview(400, f"body is not valid JSON: {what} is nested deeper than {limit:,} levels")


def _pruned(body: bytes) -> bytes:
    """``body`` as JSON with every field no view reads dropped (see READ_SCHEMA).

    Invariants: ``_DECODER.decode`` of the result gives the ``_Review`` that decoding
    ``body`` itself would give where msgspec can go that deep, or the same
    ValidationError. Raises ``BadReview`` (400) when ``body`` is not JSON, is nested deeper
    than ``MAX_REVIEW_DEPTH``, or holds a read value deeper than ``MAX_READ_DEPTH`` (which
    no apiserver sends). Iterative: yajl keeps its stack on the heap, and so does this loop,
    so no input recurses in C or in Python.
    """
    out: list[bytes] = []
    # One entry per open container that is written out: a map's Schema (WHOLE inside a
    # whole value), or an array's elements' (WHOLE, or None: an array where a view was
    # expected, written empty so that _DECODER names the same type error).
    frames: list[Schema | _Whole | None] = []
    is_map: list[bool] = []
    started: list[bool] = []  # a child of the frame has been written
    depth = 0  # open containers, written or not
    skipped = 0  # open containers inside a dropped value
    child: Schema | _Whole | None = READ_SCHEMA  # the next value's schema; None: drop it
    encode = msgspec.json.encode
    try:
        for event, value in _YAJL.basic_parse(body):
            if event in _OPEN:
                depth += 1
                if depth > MAX_REVIEW_DEPTH:
                    raise _too_deep("the body", MAX_REVIEW_DEPTH)
                if skipped or child is None:
                    skipped += 1
                    continue
                if child is WHOLE and depth > MAX_READ_DEPTH:
                    raise _too_deep("a field the enforcer reads", MAX_READ_DEPTH)
                if frames and not is_map[-1]:
                    if started[-1]:
                        out.append(b",")
                    started[-1] = True
                opens_map = event == "start_map"
                out.append(b"{" if opens_map else b"[")
                frames.append(child if opens_map or child is WHOLE else None)
                is_map.append(opens_map)
                started.append(False)
                if not opens_map:
                    child = frames[-1]
                continue
            if event in _CLOSE:
                depth -= 1
                if skipped:
                    skipped -= 1
                    continue
                frames.pop()
                out.append(b"}" if is_map.pop() else b"]")
                started.pop()
                if frames and not is_map[-1]:
                    child = frames[-1]  # the next element's
                continue
            if skipped:
                continue
            if event == "map_key":
                schema = frames[-1]  # a map's: never None
                child = schema.get(value) if isinstance(schema, dict) else WHOLE
                if child is not None:
                    if started[-1]:
                        out.append(b",")
                    started[-1] = True
                    out.append(encode(value) + b":")
                continue
            if child is None:
                continue
            if frames and not is_map[-1]:
                if started[-1]:
                    out.append(b",")
                started[-1] = True
            if event == "string":
                out.append(encode(value))
            elif event == "boolean":
                out.append(b"true" if value else b"false")
            elif event == "null":
                out.append(b"null")
            else:  # a number: an int, or a Decimal for one written with a fraction or exponent
                text = str(value)
                if not isinstance(value, int) and not any(c in text for c in ".eE"):
                    # yajl gives 3.59e+16 as Decimal('35907868606406692'): keep it a float
                    # (a typed field's error names the type, as the fast path's does).
                    text += "E0"
                out.append(text.encode())
    except ijson.JSONError as exc:
        raise BadReview(400, f"body is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer too long for int(), an unpaired surrogate
        raise BadReview(400, f"body is not valid JSON: {exc}") from None
    return b"".join(out)


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


def parse_review(body: bytes, *, iterative: bool = False) -> Review:
    """Parse and validate an AdmissionReview v1 request body.

    msgspec decodes it (the fast path); a body deeper than msgspec goes on this Python
    takes the slow path (``_pruned``), and so does every body with ``iterative`` (tests
    compare the two). Both give the same ``Review`` or the same ``BadReview`` for a body
    within ``MAX_REVIEW_DEPTH`` whose read fields are within ``MAX_READ_DEPTH``; only the
    wording of a JSON syntax error differs between the two parsers.
    """
    try:
        if iterative:
            doc = _DECODER.decode(_pruned(body))
        else:
            try:
                doc = _DECODER.decode(body)
            except RecursionError:
                doc = _DECODER.decode(_pruned(body))
    except msgspec.ValidationError as exc:
        raise BadReview(400, f"body is not a well-formed AdmissionReview: {exc}") from None
    except msgspec.DecodeError as exc:
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
