"""Minimal writes: the change from the object as read to the object as decided.

PURE: no I/O. ``write_patch(read, decided)`` computes the change with ``jsonpatch`` (RFC 6902
operations, the design card's library) and returns it as the one body the adapter sends: an
RFC 7386 JSON *merge* patch that carries the read's ``metadata.resourceVersion``.

Why a merge patch and not a JSON Patch whose first operation tests the resourceVersion:
checked against the real kube-apiserver (``tests/controlplane/test_adapter_patches.py``), a
merge patch carrying a stale resourceVersion is answered **409 Conflict**, exactly like a PUT of the
object as read, so the spec's rule is kept word for word: an update preconditioned on the
resourceVersion of the read it was decided on, and a conflict handled as before. A JSON
Patch whose ``test`` of the resourceVersion fails is answered 422 Invalid instead (and one
whose other operations no longer apply, e.g. removing an annotation someone else removed,
is 422 before any version check), indistinguishable from a truly invalid write.

Invariants:
- ``write_patch(read, decided)`` applied to ``read`` (RFC 7386) gives ``decided``, for
  every ``decided`` with no ``null`` value (a merge patch cannot write null: it means
  "remove"; ValueError otherwise) — a property test checks it.
- The patch always carries ``metadata.resourceVersion`` equal to the read's, and nothing
  else that did not change. Lists are written whole (a merge patch replaces lists).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer

Obj = dict[str, Any]
_ABSENT = object()


def operations(read: Mapping[str, Any], decided: Mapping[str, Any]) -> list[Obj]:
    """The RFC 6902 operations from ``read`` to ``decided`` (jsonpatch), for the record.

    Sub-trees that ``decided`` shares with ``read`` (the very same object, as decisions
    share status and managedFields, most of an object) are left out before jsonpatch walks
    the two: the same object has no change in it, and walking it was most of the CPU spent
    between a read's answer and its write (see ``_changed_parts``).
    """
    ops: list[Obj] = jsonpatch.make_patch(*_changed_parts(read, decided)).patch
    return ops


def _changed_parts(read: Any, decided: Any) -> tuple[Any, Any]:
    """``read`` and ``decided`` without the mapping entries they share by identity, at
    every depth where both are mappings.

    Invariant: the changes between the two results are exactly those between the two
    inputs, at the same paths: an entry left out is the same object on both sides (no
    change inside it), and every path to a difference runs through entries that are kept,
    under their own keys. (jsonpatch may then pick the other of two equal values as a
    move's source; the merge patch writes both places alike, so the write is the same.)
    """
    if not (isinstance(read, Mapping) and isinstance(decided, Mapping)) or read is decided:
        return read, decided
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key in [*read, *(k for k in decided if k not in read)]:  # in a stable order
        before, after = read.get(key, _ABSENT), decided.get(key, _ABSENT)
        if before is after:
            continue
        before, after = _changed_parts(before, after)
        if before is not _ABSENT:
            old[key] = before
        if after is not _ABSENT:
            new[key] = after
    return old, new


def write_patch(read: Mapping[str, Any], decided: Mapping[str, Any]) -> Obj:
    """The merge patch turning ``read`` into ``decided``, preconditioned on the read's
    ``metadata.resourceVersion`` (the API server answers 409 if the object moved on)."""
    version = (read.get("metadata") or {}).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise ValueError("a write must carry the read's metadata.resourceVersion")
    if (decided.get("metadata") or {}).get("resourceVersion") != version:
        raise ValueError("the decided object must keep the read's resourceVersion")
    patch: Obj = {}
    for op in operations(read, decided):
        kind = op["op"]
        if kind == "test":
            continue
        if kind == "move":
            _merge_at(patch, read, decided, op["from"])
        _merge_at(patch, read, decided, op["path"])
    patch.setdefault("metadata", {})["resourceVersion"] = version
    return patch


def _merge_at(patch: Obj, read: Mapping[str, Any], decided: Mapping[str, Any], path: str) -> None:
    """Record in ``patch`` the decided value at ``path`` (None where it was removed).

    Walks ``path`` through ``decided``; the first list met on the way is written whole,
    since a merge patch cannot address a list element.
    """
    tokens = jsonpointer.JsonPointer(path).parts
    target: Obj = patch
    here: Any = decided
    before: Any = read
    for depth, token in enumerate(tokens):
        last = depth == len(tokens) - 1
        value = here.get(token, _ABSENT) if isinstance(here, dict) else _ABSENT
        old = before.get(token, _ABSENT) if isinstance(before, dict) else _ABSENT
        if isinstance(value, list) or isinstance(old, list) or last:
            target[token] = None if value is _ABSENT else _checked_copy(value, path)
            return
        if not isinstance(value, dict):  # the parent itself was removed or retyped
            target[token] = None if value is _ABSENT else _checked_copy(value, path)
            return
        nested = target.get(token)
        if not isinstance(nested, dict):
            if nested is not None or token in target:
                return  # an ancestor is already written whole
            nested = target[token] = {}
        target, here, before = nested, value, old


def _checked_copy(value: Any, path: str) -> Any:
    if _has_null(value):
        raise ValueError(f"{path}: a merge patch cannot write null (it means remove)")
    return copy.deepcopy(value)


def _has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return False


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 applied to a copy of ``target`` (what the API server does; for tests)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: Obj = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result
