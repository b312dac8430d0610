"""A generated corpus of TrainJob and Workload writes, and the verdict the apiserver gives each.

Used by tests/controlplane/test_policy_parity.py to run the same writes once with only the webhook
registered and once with only the ValidatingAdmissionPolicy bound. The corpus is a pure
function of its seed, so both runs (and every run) send exactly the same writes.

What it covers: hold-instance values at the edges ("0", "-1", " 7", "1e3", "01", "",
19-, 20-, 70- and 100,000-digit numbers, 2^63-1 and 2^63, a stored 10,000-character
value), missing and extra annotations (partial
holds, an unrelated annotation, P/opened), spec.suspend / spec.active true, false and
absent, the queue label added and dropped, writers (an editor, Kueue, the supervisor),
update, merge patch, JSON patch and server-side apply, dry runs and real writes, CREATE
and UPDATE.

Invariant: old states are created before anything is registered (so the corpus can start
from objects no enforcer would let anyone create: held and running, garbled), and a write
that really commits goes to its own copy of its base, one copy per run, so every run sees
the same old object for every write.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from rig.builders import trainjob_body, workload_body
from rig.localcluster import KUEUE_IDENTITY, SUPERVISOR_IDENTITY

A = Annotations()
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
EXTRA = "example.com/note"

EDGE_INSTANCES = (
    "1", "2", "3", "4", "10", "9223372036854775806", "9223372036854775807",
    "9223372036854775808", "0", "-1", " 7", "7 ", "1e3", "01", "", "x", "+3",
    "1000000000000000000", "9999999999999999999", "1" * 20, "1" * 70, "1" * 100_000,
    # Line breaks: the policy's message must still be built (it may hold none) and name
    # its rule, as the webhook's does.
    "5\n", "3\r\n",
)  # fmt: skip
OLD_HOLDS: tuple[tuple[str, str | None, bool], ...] = (
    # (name, hold-instance value, the other three hold keys too)
    ("none", None, False),
    ("three", "3", True),
    ("max", "9223372036854775807", True),
    ("garbled", " 7", True),
    ("partial", None, True),  # hold-reason/held-at/held-by without hold-instance
    ("bare", "5", False),  # hold-instance alone
    # Stored garbage longer than any message shows (bigger only slows the corpus down).
    ("huge", "7" * 10_000, True),
)
# name -> (user, extra group). "alice+kueue-group" is the editor with Kueue's identity as a
# group: kueue.identities match usernames or groups, in both twins.
WRITERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "alice": ("alice", ()),
    "alice+kueue-group": ("alice", (KUEUE_IDENTITY,)),
    "kueue": (KUEUE_IDENTITY, ()),
    "supervisor": (SUPERVISOR_IDENTITY, ()),
}
ABSENT = "absent"


def hold_set(instance: str | None, others: bool) -> dict[str, str]:
    notes: dict[str, str] = {}
    if instance is not None:
        notes[A.hold_instance] = instance
    if others:
        notes.update(
            {A.hold_reason: "node lost", A.held_at: "2026-12-02T12:00:00Z", A.held_by: "dispatch"}
        )
    return notes


@dataclass(frozen=True)
class Base:
    """An old object: its kind, annotations, labels and the spec field (suspend/active)."""

    key: str
    kind: str
    annotations: dict[str, str]
    queue: bool
    field_value: bool | None  # None: absent


@dataclass
class Write:
    """One write of the corpus; ``base`` is None for a CREATE."""

    index: int
    kind: str
    operation: str  # CREATE or UPDATE
    method: str  # update, merge patch, json patch, server-side apply, create
    writer: str
    dry_run: bool
    base: Base | None
    annotations: dict[str, str]  # desired annotations
    queue: bool
    field_value: bool | None
    names: dict[str, str] = field(default_factory=dict)  # run -> object name (real writes)

    @property
    def spec_field(self) -> str:
        return "suspend" if self.kind == TRAINJOB.kind else "active"

    def describe(self) -> str:
        return (
            f"#{self.index} {self.operation} {self.kind} by {self.writer} via {self.method}"
            f"{' (dry run)' if self.dry_run else ''}: base {self.base.key if self.base else '-'}"
            f" -> annotations {self.annotations}, queue {self.queue}, "
            f"{self.spec_field} {self.field_value}"
        )


def bases() -> list[Base]:
    found = []
    for hold, instance, others in OLD_HOLDS:
        for extra in (False, True):
            notes = hold_set(instance, others)
            if extra:
                notes[EXTRA] = "keep"
            for value in (None, False, True):
                for queue in (False, True):
                    found.append(
                        Base(f"tj-{hold}-{int(extra)}-{value}-{int(queue)}".lower(),
                             TRAINJOB.kind, notes, queue, value)
                    )  # fmt: skip
                found.append(
                    Base(f"wl-{hold}-{int(extra)}-{value}".lower(), WORKLOAD.kind, notes, True,
                         value)
                )  # fmt: skip
    return found


def _writers(kind: str, operation: str, method: str) -> list[str]:
    """Writers the test RBAC lets make this write (so admission, not RBAC, decides)."""
    if kind == TRAINJOB.kind:
        return ["alice", "supervisor"] if operation == "CREATE" else list(WRITERS)
    if method in ("update", "create"):
        return list(WRITERS)
    return ["alice", "alice+kueue-group", "kueue"]  # the supervisor may not patch Workloads


def _new_annotations(rng: random.Random, old: dict[str, str]) -> dict[str, str]:
    notes = dict(old)
    choice = rng.random()
    if choice < 0.15:
        return notes  # hold annotations unchanged
    if choice < 0.3:  # release: all four hold keys go
        return {k: v for k, v in notes.items() if k not in A.hold_keys}
    if choice < 0.38:  # only hold-instance goes (a partial release)
        notes.pop(A.hold_instance, None)
        return notes
    if choice < 0.45:  # an unrelated annotation comes or goes, P/opened appears
        if EXTRA in notes:
            notes.pop(EXTRA)
        else:
            notes[EXTRA] = "new"
        notes[A.opened] = "2026-12-02T12:00:00Z"
        return notes
    notes[A.hold_instance] = rng.choice(EDGE_INSTANCES)
    if rng.random() < 0.5:
        notes.update(hold_set(None, True))
    return notes


def generate(seed: int = 20261202, updates: int = 1900, creates: int = 350) -> list[Write]:
    """The corpus: ``updates`` UPDATEs over ``bases()`` and ``creates`` CREATEs.

    About 6 % of the writes really commit (the rest are server-side dry runs).
    """
    rng = random.Random(seed)
    olds = bases()
    writes: list[Write] = []
    methods = ("update", "merge patch", "json patch", "server-side apply")
    for _ in range(updates):
        base = rng.choice(olds)
        method = rng.choice(methods)
        writer = rng.choice(_writers(base.kind, "UPDATE", method))
        annotations = _new_annotations(rng, base.annotations)
        if method == "server-side apply":
            # Apply cannot remove what another manager set: it sets values only.
            annotations = {**base.annotations, **annotations}
        value: bool | None = rng.choice((None, False, True, base.field_value, base.field_value))
        if method == "server-side apply" and value is None:
            value = base.field_value if base.field_value is not None else True
        queue = base.queue
        if base.kind == TRAINJOB.kind and method != "server-side apply" and rng.random() < 0.1:
            queue = not queue
        writes.append(
            Write(len(writes), base.kind, "UPDATE", method, writer, rng.random() > 0.06, base,
                  annotations, queue, value)
        )  # fmt: skip
    for _ in range(creates):
        kind = rng.choice((TRAINJOB.kind, WORKLOAD.kind))
        method = rng.choice(("create", "create", "server-side apply"))
        writer = rng.choice(_writers(kind, "CREATE", method))
        _, instance, others = rng.choice(OLD_HOLDS)
        notes = hold_set(instance, others)
        if rng.random() < 0.6:
            notes[A.hold_instance] = rng.choice(EDGE_INSTANCES)
        if rng.random() < 0.2:
            notes[EXTRA] = "x"
        writes.append(
            Write(len(writes), kind, "CREATE", method, writer, rng.random() > 0.06, None,
                  notes, kind == TRAINJOB.kind and rng.random() < 0.5,
                  rng.choice((None, False, True)))
        )  # fmt: skip
    return writes


# --- bodies and requests ---------------------------------------------------------------------


def _coords(kind: str) -> tuple[str, str, str]:
    resource = TRAINJOB if kind == TRAINJOB.kind else WORKLOAD
    return resource.group, resource.version, resource.plural


def body_for(kind: str, name: str, annotations: dict[str, str], queue: bool,
             value: bool | None) -> dict[str, Any]:  # fmt: skip
    if kind == TRAINJOB.kind:
        body = trainjob_body(name, queue="user-queue" if queue else None, suspend=value)
    else:
        body = workload_body(name, active=value)
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    return body


def create_base(admin: k8s.ApiClient, namespace: str, base: Base, name: str) -> dict[str, Any]:
    created: Any = k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
        *_coords(base.kind)[:2], namespace, _coords(base.kind)[2],
        body_for(base.kind, name, base.annotations, base.queue, base.field_value),
    )  # fmt: skip
    return dict(created)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _merge_patch(write: Write, old: dict[str, Any]) -> dict[str, Any]:
    old_notes = old["metadata"].get("annotations") or {}
    notes: dict[str, Any] = {k: None for k in old_notes if k not in write.annotations}
    notes.update({k: v for k, v in write.annotations.items() if old_notes.get(k) != v})
    patch: dict[str, Any] = {"metadata": {"annotations": notes}}
    if write.kind == TRAINJOB.kind:
        patch["metadata"]["labels"] = {QUEUE_NAME_LABEL: "user-queue" if write.queue else None}
    patch["spec"] = {write.spec_field: write.field_value}
    return patch


def _json_patch(write: Write, old: dict[str, Any]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    old_notes = old["metadata"].get("annotations")
    if old_notes is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        old_notes = {}
    for key in old_notes:
        if key not in write.annotations:
            ops.append({"op": "remove", "path": "/metadata/annotations/" + _escape(key)})
    for key, value in write.annotations.items():
        if old_notes.get(key) != value:
            op = "replace" if key in old_notes else "add"
            ops.append({"op": op, "path": "/metadata/annotations/" + _escape(key), "value": value})
    if write.kind == TRAINJOB.kind:
        labels = old["metadata"].get("labels") or {}
        has = QUEUE_NAME_LABEL in labels
        path = "/metadata/labels"
        if write.queue and not has:
            if not labels:
                ops.append({"op": "add", "path": path, "value": {}})
            ops.append({"op": "add", "path": f"{path}/{_escape(QUEUE_NAME_LABEL)}",
                        "value": "user-queue"})  # fmt: skip
        elif has and not write.queue:
            ops.append({"op": "remove", "path": f"{path}/{_escape(QUEUE_NAME_LABEL)}"})
    path = f"/spec/{write.spec_field}"
    if write.field_value is None:
        if write.spec_field in old["spec"]:
            ops.append({"op": "remove", "path": path})
    else:
        ops.append({"op": "add", "path": path, "value": write.field_value})
    return ops


def _apply_body(write: Write, name: str, namespace: str) -> dict[str, Any]:
    group, version, _ = _coords(write.kind)
    if write.operation == "CREATE":
        body = body_for(write.kind, name, write.annotations, write.queue, write.field_value)
        body["metadata"]["namespace"] = namespace
        return body
    body = {
        "apiVersion": f"{group}/{version}",
        "kind": write.kind,
        "metadata": {"name": name, "namespace": namespace, "annotations": write.annotations},
        "spec": {write.spec_field: write.field_value},
    }
    return body


Verdict = str  # "allowed", a rule id, or "error <code> <reason>"
RULE_RE = re.compile(r"holdwarden \[([a-z-]+)\]")


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", ""))
    except ValueError:
        return exc.body or ""


def verdict_of(exc: ApiException) -> Verdict:
    message = _message(exc)
    found = RULE_RE.search(message)
    if found and exc.status == 403:
        return found.group(1)
    return f"error {exc.status} {message[:120]}"


def words_of(exc: ApiException) -> str:
    """holdwarden's sentence in a refusal: from ``holdwarden [rule]`` on (the apiserver's
    prefix, which names the webhook or the policy, left out); "" if there is none."""
    message = _message(exc)
    found = RULE_RE.search(message)
    return message[found.start() :] if found else ""


def send(
    write: Write,
    clients: dict[str, k8s.ApiClient],
    namespace: str,
    name: str,
    old: dict[str, Any] | None,
) -> Verdict:
    """Make ``write`` (on object ``name``, whose current state is ``old``); its verdict."""
    return send_words(write, clients, namespace, name, old)[0]


def send_words(
    write: Write,
    clients: dict[str, k8s.ApiClient],
    namespace: str,
    name: str,
    old: dict[str, Any] | None,
) -> tuple[Verdict, str]:
    """``send``, and holdwarden's sentence when it is refused (``words_of``)."""
    api = k8s.CustomObjectsApi(clients[write.writer])
    group, version, plural = _coords(write.kind)
    extra: dict[str, Any] = {"dry_run": "All"} if write.dry_run else {}
    call: Callable[[], object]
    if write.method == "create":
        body = body_for(write.kind, name, write.annotations, write.queue, write.field_value)

        def call() -> object:
            return api.create_namespaced_custom_object(
                group, version, namespace, plural, body, **extra
            )
    elif write.method == "server-side apply":
        apply = _apply_body(write, name, namespace)

        def call() -> object:
            return api.patch_namespaced_custom_object(
                group, version, namespace, plural, name, apply, _content_type=APPLY,
                field_manager=f"corpus-{write.writer}", force=True, **extra,
            )  # fmt: skip
    elif write.method == "update":
        assert old is not None
        new = json.loads(json.dumps(old))
        new["metadata"]["annotations"] = dict(write.annotations)
        if write.kind == TRAINJOB.kind:
            labels = new["metadata"].setdefault("labels", {})
            if write.queue:
                labels[QUEUE_NAME_LABEL] = "user-queue"
            else:
                labels.pop(QUEUE_NAME_LABEL, None)
        if write.field_value is None:
            new["spec"].pop(write.spec_field, None)
        else:
            new["spec"][write.spec_field] = write.field_value

        def call() -> object:
            return api.replace_namespaced_custom_object(
                group, version, namespace, plural, name, new, **extra
            )
    else:
        assert old is not None
        patch: Any
        if write.method == "merge patch":
            patch, content = _merge_patch(write, old), MERGE
        else:
            patch, content = _json_patch(write, old), JSON_PATCH

        def call() -> object:
            return api.patch_namespaced_custom_object(
                group, version, namespace, plural, name, patch, _content_type=content, **extra
            )

    try:
        call()
    except ApiException as exc:
        return verdict_of(exc), words_of(exc)
    return "allowed", ""
