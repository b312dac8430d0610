"""Preflight: what the adapter can do in a namespace, probed with no I/O of its own.

``Preflight`` runs the probes as operations (``holdwarden.adapter.steps``): each yields its requests
through the core's ``send`` (so every probe gets the same hook, deadline check, timeout,
request log and transport errors as the adapter's calls) and returns a typed result. What
an answer means is decided by the pure functions below the class, each with its table
tests (``tests/unit/test_adapter_preflight_pure.py``); the class only asks and hands the answers
over.

The capabilities (docs/reference/adapter-api.md, "Preflight"):

- ``hold_round_trip``: a server-side dry-run create of a correctly held object keeps its
  hold annotations and hold field (``round_trip_capability``).
- ``update_workloads``, ``update_trainjobs``, ``list_pods``: SelfSubjectAccessReviews
  (``access_capability``).
- ``enforcer_installed``: a dry-run create of the held kind carrying a hold instance
  without its hold field, which the enforcer must refuse by the mode's rule
  (``enforcer_verdict``, ``EnforcerVerdict``).
- ``extra``: ``readmissionGate`` and ``multiKueue`` (Kueue mode, ``GateProbe``),
  ``holdOwnership`` (``ownership_capability``) and ``kueueWithoutQueueName``
  (``queueless_capability``). Reported, not conditions of Hold.
- The traps (issue 29; decided in ``holdwarden.adapter.traps``): ``trainerManagedBy`` (Kueue mode, a
  condition of Hold: MultiKueue in use and a Trainer that ignores ``spec.managedBy``), and
  in ``extra``, reported: ``trainJobRuntimes`` (a TrainJob naming a runtime that is gone),
  ``kueueForceDelete`` (pods Kueue may force-delete) and, in Kueue mode,
  ``kueueRetention`` (Kueue deletes jobs it deactivated).

The core owns the cache (``holdwarden.adapter.operations.context.Context.preflights``, one result
per namespace) and decides when preflight runs (``Adapter.preflight()``, or lazily on a
namespace's first Hold or Release: ``holdwarden.adapter.operations.held``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from holdwarden import objects
from holdwarden.adapter import decisions, traps
from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.steps import (
    FIELD_MANAGER,
    WRITE_VERB,
    ApiStatusError,
    Http,
    Operation,
    Request,
    api_message,
    custom_path,
)
from holdwarden.adapter.types import Capability, PreflightResult
from holdwarden.config import Config
from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    BREAK_GLASS_GROUP,
    CLUSTERQUEUE,
    CLUSTERTRAININGRUNTIME,
    CRD,
    JOBSET_NAME_LABEL,
    KUEUE_CONFIG_KEY,
    KUEUE_CONFIG_MAP,
    LOCALQUEUE,
    MULTIKUEUE_CONTROLLER,
    MULTIKUEUECLUSTER,
    MULTIKUEUECONFIG,
    QUEUE_NAME_LABEL,
    TRAININGRUNTIME,
    TRAINJOB,
    TRAINJOB_CRD_NAME,
    WORKLOAD,
    Annotations,
    Mode,
    Resource,
    RuleId,
)

PROBE_RUNTIME_PLACEHOLDER = "holdwarden-preflight"
# How many objects a trap probe reads per list: a namespace's TrainJobs and their pods,
# the runtimes, the AdmissionChecks. A larger namespace is checked on its first page only,
# and the reason says so.
TRAP_LIST_LIMIT = 500
# The trap capabilities preflight reports in ``extra`` (the CLI prints a warning for each
# that is not supported).
TRAP_CAPABILITIES = ("trainJobRuntimes", "kueueForceDelete", "kueueRetention")
SCAN_HINT = "run `holdwarden preflight` (the lazy preflight of a first Hold lists no namespace)"
NOT_PROBED = "not probed (access reviews only; run `holdwarden preflight`)"


class Sender(Protocol):
    """How a probe sends one request: ``Context.send`` (hook, deadline check, bounded
    timeout, request log; an ``ApiStatusError`` passes through to the probe)."""

    def __call__(self, req: Request, deadline: datetime | None, http: Http) -> Operation[Obj]: ...


# ---- typed step results ----------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeRef:
    """The runtime a probe TrainJob names (``spec.runtimeRef``): one that exists, so that
    Trainer's and Kueue's TrainJob webhooks accept the probe, or the placeholder."""

    name: str
    api_group: str | None = None
    kind: str | None = None

    def as_spec(self) -> dict[str, str]:
        if self.api_group is None or self.kind is None:
            return {"name": self.name}
        return {"name": self.name, "apiGroup": self.api_group, "kind": self.kind}


PLACEHOLDER_RUNTIME = RuntimeRef(PROBE_RUNTIME_PLACEHOLDER)


@dataclass(frozen=True)
class QueueChecks:
    """One LocalQueue of the namespace and what its ClusterQueue's AdmissionChecks are."""

    where: str
    """``LocalQueue ns/name (ClusterQueue cq)``, as reasons name it."""
    gated: bool
    """An AdmissionCheck of the readmission gate's controller is listed."""
    multikueue: bool
    """An AdmissionCheck of MultiKueue's controller is listed."""


@dataclass(frozen=True)
class GateProbe:
    """Kueue mode: the ``readmissionGate`` and ``multiKueue`` capabilities."""

    readmission_gate: Capability
    multikueue: Capability

    @classmethod
    def unknown(cls, why: str) -> GateProbe:
        return cls(Capability(False, why), Capability(False, why))


class EnforcerVerdict(StrEnum):
    """What the enforcer probe's dry-run write met."""

    INSTALLED = "installed"
    """Refused, naming the mode's hold rule."""
    NOT_INSTALLED = "not-installed"
    """Accepted: nothing refuses a hold-breaking write."""
    INCONCLUSIVE = "inconclusive"
    """Refused by something else (another webhook or policy)."""


@dataclass(frozen=True)
class Refusal:
    """An API server's refusal of a probe, as the pure functions read it."""

    status: int
    message: str
    body: str

    @classmethod
    def of(cls, exc: ApiStatusError) -> Refusal:
        return cls(exc.status, api_message(exc), exc.body or "")


# ---- the probes --------------------------------------------------------------------------


class Preflight:
    """The probes of one adapter. ``send`` is the core's; ``clock`` its clock (the probe
    hold's ``P/held-at``)."""

    def __init__(
        self, config: Config, annotations: Annotations, clock: Callable[[], datetime], send: Sender
    ) -> None:
        self.config = config
        self.mode: Mode = config.mode
        self.annotations = annotations
        self._clock = clock
        self._send = send

    @property
    def held_resource(self) -> Resource:
        return WORKLOAD if self.mode == "kueue" else TRAINJOB

    def run(
        self, namespace: str, deadline: datetime | None, *, scan: bool = False
    ) -> Operation[PreflightResult]:
        """Every probe, dry-run creates included (what ``Adapter.preflight()`` reports).

        ``scan``: also list up to 100 Workloads for evidence of a mismatch with Kueue's
        manageJobsWithoutQueueName (``queueless``). Only an explicit preflight scans: the
        lazy one on a namespace's first Hold sends no LIST of Workloads (Hold finds its
        Workload by name, at any namespace size; docs/explanation/holds-and-modes.md,
        "Kueue mode")."""
        runtime = yield from self.runtime_ref(namespace, deadline)
        extra: dict[str, Capability] = {}
        if self.mode == "kueue":
            gate = yield from self.readmission_gate(namespace, deadline)
            extra["readmissionGate"] = gate.readmission_gate
            extra["multiKueue"] = gate.multikueue
        extra["holdOwnership"] = yield from self.ownership(deadline)
        extra["kueueWithoutQueueName"] = yield from self.queueless(namespace, deadline, scan)
        extra["trainJobRuntimes"] = yield from self.trainjob_runtimes(namespace, deadline, scan)
        settings, settings_error = yield from self.kueue_settings(deadline)
        extra["kueueForceDelete"] = yield from self.force_delete(
            namespace, deadline, settings, settings_error, scan
        )
        trainer_managed_by: Capability | None = None
        if self.mode == "kueue":
            extra["kueueRetention"] = traps.retention_capability(settings, settings_error)
            trainer_managed_by = yield from self.managed_by(deadline)
        round_trip = yield from self.round_trip(namespace, deadline, runtime)
        update_workloads = yield from self.access(
            namespace, WRITE_VERB, WORKLOAD.group, WORKLOAD.plural, deadline
        )
        update_trainjobs = yield from self.access(
            namespace, WRITE_VERB, TRAINJOB.group, TRAINJOB.plural, deadline
        )
        list_pods = yield from self.access(namespace, "list", "", "pods", deadline)
        enforcer = yield from self.enforcer(namespace, deadline, runtime)
        return PreflightResult(
            mode=self.mode,
            namespace=namespace,
            hold_round_trip=round_trip,
            update_workloads=update_workloads,
            update_trainjobs=update_trainjobs,
            list_pods=list_pods,
            enforcer_installed=enforcer,
            extra=extra,
            trainer_managed_by=trainer_managed_by,
        )

    def run_access(self, namespace: str, deadline: datetime) -> Operation[PreflightResult]:
        """The light check: SelfSubjectAccessReviews only, no dry-run create (so no create
        right is needed). The round trip is not probed; it stands for the right to update
        the held resource, which is what the Hold's own write needs: one review."""
        resource = self.held_resource
        held = yield from self.access(
            namespace, WRITE_VERB, resource.group, resource.plural, deadline
        )
        return access_only_result(self.mode, namespace, held)

    # ---- one probe each ----------------------------------------------------------------

    def _list(
        self, resource: Resource, namespace: str | None, deadline: datetime | None, limit: int
    ) -> Operation[list[Obj]]:
        """LIST a custom resource (cluster-scoped when ``namespace`` is None)."""
        req = Request("list", resource.plural, namespace or "")
        http = Http("GET", custom_path(resource, namespace), query=(("limit", str(limit)),))
        answer = yield from self._send(req, deadline, http)
        items: list[Obj] = answer.get("items") or []
        return items

    def _get_cluster(
        self, resource: Resource, name: str, deadline: datetime | None
    ) -> Operation[Obj]:
        req = Request("get", resource.plural, "", name)
        http = Http("GET", custom_path(resource, None, name))
        obj: Obj = yield from self._send(req, deadline, http)
        return obj

    def _list_or_error(
        self, resource: Resource, namespace: str | None, deadline: datetime | None
    ) -> Operation[tuple[list[Obj], str | None]]:
        """LIST (first page of ``TRAP_LIST_LIMIT``), or the reason it could not be read."""
        try:
            items = yield from self._list(resource, namespace, deadline, TRAP_LIST_LIMIT)
        except ApiStatusError as exc:
            if exc.status == 404:  # the kind is not served here: there are none
                return [], None
            return [], f"{resource.plural}: {api_message(exc)}"
        return items, None

    def trainjob_runtimes(
        self, namespace: str, deadline: datetime | None, scan: bool
    ) -> Operation[Capability]:
        """``trainJobRuntimes``: does every TrainJob of the namespace name a runtime that
        exists? Trainer v2.3 reads it on every update of the TrainJob and refuses the update
        when it is gone (``traps.runtimes_capability``). Only a scanning (explicit)
        preflight lists the TrainJobs, as ``queueless`` lists Workloads."""
        if not scan:
            return Capability(True, f"TrainJobs in {namespace} not scanned: {SCAN_HINT}")
        jobs, jobs_error = yield from self._list_or_error(TRAINJOB, namespace, deadline)
        if jobs_error is not None:
            return Capability(False, f"could not list TrainJobs in {namespace}: {jobs_error}")
        # Every item of a namespaced LIST is of that namespace (runtime_of reads it there).
        named = [
            (str(objects.name(job)), runtime)
            for job in jobs
            if (runtime := traps.runtime_of(job)) is not None
        ]
        present: set[traps.RuntimeName] = set()
        unseen: list[str] = []
        for resource, scope in ((TRAININGRUNTIME, namespace), (CLUSTERTRAININGRUNTIME, None)):
            if not any(rt.resource is resource for _, rt in named):
                continue
            items, error = yield from self._list_or_error(resource, scope, deadline)
            if error is not None:
                unseen.append(resource.plural)
            present.update(
                traps.RuntimeName(resource.kind, str(objects.name(item)), scope) for item in items
            )
        return traps.runtimes_capability(
            namespace,
            named,
            frozenset(present),
            unseen=unseen,
            truncated=len(jobs) >= TRAP_LIST_LIMIT,
        )

    def kueue_settings(
        self, deadline: datetime | None
    ) -> Operation[tuple[traps.KueueSettings | None, str | None]]:
        """Kueue's configuration file, from its ConfigMap (``kueue-manager-config`` in
        ``readmission.multiKueue.kueueNamespace``), or why it could not be read."""
        kueue_ns = self.config.readmission.multi_kueue.kueue_namespace
        where = f"ConfigMap {kueue_ns}/{KUEUE_CONFIG_MAP}"
        req = Request("get", "configmaps", kueue_ns, KUEUE_CONFIG_MAP)
        path = f"/api/v1/namespaces/{kueue_ns}/configmaps/{KUEUE_CONFIG_MAP}"
        try:
            config_map = yield from self._send(req, deadline, Http("GET", path))
        except ApiStatusError as exc:
            if exc.status == 404:
                return None, f"no {where} (Kueue's configuration, if any, is elsewhere)"
            return None, f"could not read {where}: {api_message(exc)}"
        text = objects.section(config_map, "data").get(KUEUE_CONFIG_KEY)
        if not isinstance(text, str):
            return None, f"{where} has no {KUEUE_CONFIG_KEY}"
        try:
            return traps.kueue_settings(text), None
        except ValueError as exc:
            return None, f"{where}: {exc}"

    def force_delete(
        self,
        namespace: str,
        deadline: datetime | None,
        settings: traps.KueueSettings | None,
        settings_error: str | None,
        scan: bool,
    ) -> Operation[Capability]:
        """``kueueForceDelete``: the pods of the namespace's TrainJobs that opt in to Kueue's
        FailureRecoveryPolicy (only a scanning preflight lists them), and whether Kueue's
        configuration turns it on."""
        if not scan:
            return traps.force_delete_capability(
                namespace, [], f"pods not scanned: {SCAN_HINT}", settings, settings_error
            )
        # Named, so the request log tells it from Release's and Observe's pod LISTs.
        req = Request("list", "pods", namespace, "preflight-force-delete-opt-ins")
        http = Http(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            query=(("labelSelector", JOBSET_NAME_LABEL), ("limit", str(TRAP_LIST_LIMIT))),
        )
        pods: list[Obj] = []
        pods_error: str | None = None
        try:
            answer = yield from self._send(req, deadline, http)
            pods = answer.get("items") or []
        except ApiStatusError as exc:
            pods_error = f"could not list pods in {namespace}: {api_message(exc)}"
        return traps.force_delete_capability(
            namespace, traps.annotated_for_force_delete(pods), pods_error, settings, settings_error
        )

    def managed_by(self, deadline: datetime | None) -> Operation[Capability]:
        """``trainerManagedBy`` (Kueue mode): is MultiKueue in use here (a MultiKueue
        AdmissionCheck, MultiKueueCluster or MultiKueueConfig), and does the installed
        Trainer honour ``spec.managedBy`` (read from its TrainJob CRD)?"""
        evidence: dict[str, list[Obj]] = {}
        unseen: list[str] = []
        for resource in (ADMISSIONCHECK, MULTIKUEUECLUSTER, MULTIKUEUECONFIG):
            items, error = yield from self._list_or_error(resource, None, deadline)
            evidence[resource.plural] = items
            if error is not None:
                unseen.append(error)
        seen = traps.multikueue_evidence(
            evidence[ADMISSIONCHECK.plural],
            evidence[MULTIKUEUECLUSTER.plural],
            evidence[MULTIKUEUECONFIG.plural],
        )
        if not seen:
            return traps.managed_by_capability(seen, unseen, None, "not read")
        try:
            crd = yield from self._get_cluster(CRD, TRAINJOB_CRD_NAME, deadline)
        except ApiStatusError as exc:
            why = f"could not read CustomResourceDefinition {TRAINJOB_CRD_NAME}: {api_message(exc)}"
            return traps.managed_by_capability(seen, unseen, None, why)
        honours = traps.trainer_honours_managed_by(crd)
        why = {
            True: f"its CRD {TRAINJOB_CRD_NAME} has the schema of v2.3 or later",
            False: f"its CRD {TRAINJOB_CRD_NAME} has the schema of v2.2 or earlier",
            None: f"its CRD {TRAINJOB_CRD_NAME} has a schema this build does not know",
        }[honours]
        return traps.managed_by_capability(seen, unseen, honours, why)

    def runtime_ref(self, namespace: str, deadline: datetime | None) -> Operation[RuntimeRef]:
        """A ``spec.runtimeRef`` that Trainer's and Kueue's TrainJob webhooks accept.

        Both resolve the runtime a TrainJob names and refuse a create naming one that does
        not exist ("runtime not found"). Validating webhooks run in parallel and Kubernetes
        does not say whose refusal is reported, so a probe naming a made-up runtime may be
        refused by Trainer before the hold rules are even looked at. The probe therefore
        names a runtime that exists: a TrainingRuntime of the namespace, else a
        ClusterTrainingRuntime. With no Trainer installed (no such resources, or no right
        to list them), a placeholder is named: then nothing resolves it either.
        """
        scopes: tuple[tuple[Resource, str | None], ...] = (
            (TRAININGRUNTIME, namespace),
            (CLUSTERTRAININGRUNTIME, None),
        )
        for resource, scope in scopes:
            try:
                items = yield from self._list(resource, scope, deadline, limit=1)
            except ApiStatusError:
                continue
            if items:
                name = objects.name(items[0])
                if name:
                    return RuntimeRef(name, resource.group, resource.kind)
        return PLACEHOLDER_RUNTIME

    def readmission_gate(self, namespace: str, deadline: datetime | None) -> Operation[GateProbe]:
        """Kueue mode: do the namespace's queues re-admit only through the readmission gate,
        and is every queue that dispatches through MultiKueue gated?

        Without the gate, a Release lets Kueue re-admit while pods of the held execution
        still terminate (two executions at once), and a job runs without any Open. With
        MultiKueue and no gate, a Release lets MultiKueue dispatch the job again, maybe to
        another worker, while the held execution may still run on the first: Kueue does
        not wait for its pods, and only the gate counts them on the workers. Hold still
        works, so both are reported, not made a condition of Hold (the spec fixes those).
        """
        controller = self.config.readmission.controller_name
        try:
            queues = yield from self._list(LOCALQUEUE, namespace, deadline, limit=100)
        except ApiStatusError as exc:
            return GateProbe.unknown(
                f"could not list LocalQueues in {namespace}: {api_message(exc)}"
            )
        check_controllers: dict[str, object] = {}
        found: list[QueueChecks] = []
        for queue in queues:
            lq = (queue.get("metadata") or {}).get("name", "?")
            cq = (queue.get("spec") or {}).get("clusterQueue", "")
            try:
                cluster_queue = yield from self._get_cluster(CLUSTERQUEUE, cq, deadline)
                names = objects.cluster_queue_admission_checks(cluster_queue)
                for check in names:
                    if check not in check_controllers:
                        got = yield from self._get_cluster(ADMISSIONCHECK, check, deadline)
                        check_controllers[check] = (got.get("spec") or {}).get("controllerName")
            except ApiStatusError as exc:
                return GateProbe.unknown(
                    f"could not read ClusterQueue {cq!r} of LocalQueue {namespace}/{lq} or its "
                    f"AdmissionChecks: {api_message(exc)}; grant get on clusterqueues and "
                    "admissionchecks, or check the queue by hand"
                )
            controllers = [check_controllers.get(check) for check in names]
            found.append(
                QueueChecks(
                    where=f"LocalQueue {namespace}/{lq} (ClusterQueue {cq})",
                    gated=controller in controllers,
                    multikueue=MULTIKUEUE_CONTROLLER in controllers,
                )
            )
        return gate_probe(namespace, controller, found)

    def queueless(
        self, namespace: str, deadline: datetime | None, scan: bool
    ) -> Operation[Capability]:
        """Does holdwarden see Kueue's ``manageJobsWithoutQueueName`` as Kueue does here?

        Reads the namespace's labels (when the setting is on) and, with ``scan``, up to 100
        Workloads: one with an empty ``spec.queueName`` whose controller is a TrainJob shows
        that Kueue manages TrainJobs without the queue-name label here (Kueue copies the
        label into ``spec.queueName``); ``queueless_capability`` decides."""
        config = self.config
        labels: dict[str, str] | None = None
        problem = ""
        if config.kueue_manage_jobs_without_queue_name:
            req = Request("get", "namespaces", "", namespace)
            http = Http("GET", f"/api/v1/namespaces/{namespace}")
            try:
                found = yield from self._send(req, deadline, http)
                raw = (found.get("metadata") or {}).get("labels") or {}
                labels = {str(k): str(v) for k, v in raw.items()}
            except ApiStatusError as exc:
                problem = f"could not read Namespace {namespace}: {api_message(exc)}"
        workloads: list[Obj] | None = None
        if scan and not problem:
            try:
                workloads = yield from self._list(WORKLOAD, namespace, deadline, limit=100)
            except ApiStatusError as exc:
                problem = f"could not list Workloads: {api_message(exc)}"
        return queueless_capability(self.mode, config, namespace, labels, workloads, problem)

    def access(
        self, namespace: str, verb: str, group: str, resource: str, deadline: datetime | None
    ) -> Operation[Capability]:
        """A SelfSubjectAccessReview: may we ``verb`` ``resource`` in ``namespace``?"""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                }
            },
        }
        what = access_what(namespace, verb, group, resource)
        req = Request("access-review", "selfsubjectaccessreviews", namespace, what)
        http = Http("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review)
        try:
            answer = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            return Capability(False, f"could not ask whether we may {what}: {api_message(exc)}")
        return access_capability(what, answer.get("status") or {})

    def ownership(self, deadline: datetime | None) -> Operation[Capability]:
        """Is hold-owner-only in force for this configuration, and is this adapter a holder?

        Read from ``webhook.holderIdentities`` (the enforcer reads the same file) and the
        identity the apiserver authenticates us as (SelfSubjectReview). No write can show
        it: a holder's writes pass the rule, which is the point of it (docs/explanation/policy.md).
        """
        holders = self.config.webhook.holder_identities
        if not holders:
            return ownership_capability(holders, None)
        req = Request("self-subject-review", "selfsubjectreviews", "")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        http = Http("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=body)
        try:
            review = yield from self._send(req, deadline, http)
            info = review["status"]["userInfo"]
            user, groups = str(info.get("username") or ""), list(info.get("groups") or [])
        except (ApiStatusError, KeyError, TypeError, AttributeError) as exc:
            return Capability(False, f"hold-owner-only is configured, but who we are is "
                              f"unknown (SelfSubjectReview failed: {exc})")  # fmt: skip
        return ownership_capability(holders, (user, groups))

    def round_trip(
        self, namespace: str, deadline: datetime | None, runtime: RuntimeRef
    ) -> Operation[Capability]:
        """Server-side dry-run create of a correctly held object; the echo must keep it."""
        resource, body = self.held_probe_body(namespace, runtime)
        req = Request("dry-run-create", resource.plural, namespace, body["metadata"]["name"])
        try:
            echo = yield from self._send(req, deadline, dry_run_create(resource, namespace, body))
        except ApiStatusError as exc:
            return Capability(
                False,
                f"dry-run create of a held {resource.kind} failed: {api_message(exc)}"
                + not_ours_hint(Refusal.of(exc)),
            )
        return round_trip_capability(self.mode, resource, body, echo)

    def enforcer(
        self, namespace: str, deadline: datetime | None, runtime: RuntimeRef
    ) -> Operation[Capability]:
        """Dry-run create of the held object carrying a hold instance without its hold
        field: the enforcer must refuse it, by held-workload-inactive in Kueue mode (a
        Workload, active) or held-trainjob-suspended in plain mode (a TrainJob, unsuspended).

        The probe is the mode's own held kind, built to pass every other admission check
        (a valid Workload; a TrainJob naming a runtime that exists), so that a refusal by
        another webhook is unlikely and, when it happens, is reported as such.
        """
        resource, body = self.held_probe_body(namespace, runtime)
        body["metadata"]["annotations"] = {self.annotations.hold_instance: "1"}
        if resource is WORKLOAD:
            body["spec"]["active"] = True
        else:
            body["spec"]["suspend"] = False
        rule = enforcer_rule(self.mode)
        req = Request("dry-run-create", resource.plural, namespace, body["metadata"]["name"])
        refusal: Refusal | None = None
        try:
            yield from self._send(req, deadline, dry_run_create(resource, namespace, body))
        except ApiStatusError as exc:
            refusal = Refusal.of(exc)
        return enforcer_capability(rule, resource, refusal)

    def held_probe_body(self, namespace: str, runtime: RuntimeRef) -> tuple[Resource, Obj]:
        """The mode's held object, correctly held, under a fresh name (never stored: every
        probe create is a dry run)."""
        meta: Obj = {
            "name": f"holdwarden-preflight-{secrets.token_hex(4)}",
            "namespace": namespace,
            "annotations": objects.hold_annotations(
                self.annotations,
                instance=1,
                reason="preflight hold round trip",
                holder=self.config.holder,
                at=self._clock(),
            ),
        }
        if self.mode == "kueue":
            return WORKLOAD, {
                "apiVersion": WORKLOAD.api_version,
                "kind": WORKLOAD.kind,
                "metadata": meta,
                "spec": {
                    "active": False,
                    "podSets": [
                        {
                            "name": "main",
                            "count": 1,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "probe", "image": "busybox"}],
                                }
                            },
                        }
                    ],
                },
            }
        return TRAINJOB, {
            "apiVersion": TRAINJOB.api_version,
            "kind": TRAINJOB.kind,
            "metadata": meta,
            "spec": {"runtimeRef": runtime.as_spec(), "suspend": True},
        }


def dry_run_create(resource: Resource, namespace: str, body: Obj) -> Http:
    return Http(
        "POST",
        custom_path(resource, namespace),
        query=(("dryRun", "All"), ("fieldManager", FIELD_MANAGER)),
        body=body,
    )


# ---- what the answers mean (pure) ------------------------------------------------------


def access_what(namespace: str, verb: str, group: str, resource: str) -> str:
    """``patch workloads.kueue.x-k8s.io in ns``: how reasons name an access review."""
    return f"{verb} {resource}{'.' + group if group else ''} in {namespace}"


def access_capability(what: str, status: Mapping[str, Any]) -> Capability:
    """A SelfSubjectAccessReview's ``status``, as a capability."""
    if status.get("allowed"):
        return Capability(True, f"may {what}")
    why = str(status.get("reason") or status.get("evaluationError") or "")
    return Capability(False, f"may not {what}" + (f": {why}" if why else " (RBAC)"))


def access_only_result(mode: Mode, namespace: str, held: Capability) -> PreflightResult:
    """The light (access-review) preflight's result, from the one review of the right to
    update the held resource; everything else is reported as not probed."""
    other = Capability(False, NOT_PROBED)
    workloads, trainjobs = (held, other) if mode == "kueue" else (other, held)
    return PreflightResult(
        mode=mode,
        namespace=namespace,
        hold_round_trip=Capability(held.supported, f"{NOT_PROBED}; {held.reason}"),
        update_workloads=workloads,
        update_trainjobs=trainjobs,
        list_pods=Capability(False, NOT_PROBED),
        enforcer_installed=Capability(False, NOT_PROBED),
    )


def queueless_capability(
    mode: Mode,
    config: Config,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    workloads: Sequence[Obj] | None,
    problem: str = "",
) -> Capability:
    """Whether holdwarden's ``kueue.manageJobsWithoutQueueName`` agrees with what Kueue
    does in ``namespace``, as far as the objects show it.

    Evidence that Kueue manages TrainJobs without the queue-name label here: a Workload
    with an empty ``spec.queueName`` whose controller is a TrainJob (``workloads`` None:
    not scanned). Unsupported, said with what to do, when that evidence meets the setting
    off, or a namespace the selector does not select; or when plain mode meets a namespace
    where Kueue manages every TrainJob. ``problem``: what could not be read."""
    manage = config.kueue_manage_jobs_without_queue_name
    selector = config.kueue_managed_jobs_namespace_selector
    if problem:
        return Capability(False, f"kueue.manageJobsWithoutQueueName: {problem}")
    unlabelled = sorted(
        {
            owner.name
            for w in workloads or ()
            if (owner := objects.controller_trainjob(w)) is not None
            and not objects.section(w, "spec").get("queueName")
        }
    )
    shown = ", ".join(f"{namespace}/{n}" for n in unlabelled[:3])
    unscanned = (
        "" if workloads is not None else " (Workloads not scanned: run `holdwarden preflight`)"
    )
    if not manage:
        if unlabelled:
            return Capability(
                False,
                f"Kueue manages TrainJobs without the {QUEUE_NAME_LABEL} label here ({shown} "
                "has a Workload with no queue name), but holdwarden's "
                "kueue.manageJobsWithoutQueueName is false, so the enforcer lets anyone change "
                "their spec.suspend. Set kueue.manageJobsWithoutQueueName and "
                "kueue.managedJobsNamespaceSelector as Kueue's configuration has them, and "
                "install the enforcer's second webhook entry (docs/configuration.md)",
            )
        return Capability(
            True,
            "kueue.manageJobsWithoutQueueName is false, and no TrainJob without the "
            f"{QUEUE_NAME_LABEL} label has a Workload here{unscanned}",
        )
    assert namespace_labels is not None  # read whenever the setting is on
    selected = selector.matches(namespace_labels)
    where = (
        f"namespace {namespace} is {'' if selected else 'not '}selected by "
        f"kueue.managedJobsNamespaceSelector ({selector.describe()})"
    )
    if selected and mode == "plain":
        return Capability(
            False,
            f"plain mode, but kueue.manageJobsWithoutQueueName is true and {where}: Kueue "
            "manages every TrainJob here and owns spec.suspend; use mode: kueue here",
        )
    if not selected and unlabelled:
        return Capability(
            False,
            f"{where}, yet a TrainJob without the {QUEUE_NAME_LABEL} label has a Workload "
            f"({shown}): set kueue.managedJobsNamespaceSelector as Kueue's configuration has it",
        )
    return Capability(
        True,
        f"kueue.manageJobsWithoutQueueName is true and {where}: TrainJobs without the "
        f"{QUEUE_NAME_LABEL} label here are {'' if selected else 'not '}Kueue's{unscanned}",
    )


def gate_probe(namespace: str, controller: str, queues: Sequence[QueueChecks]) -> GateProbe:
    """The ``readmissionGate`` and ``multiKueue`` capabilities of the namespace's queues.

    Invariant: the gate is supported only when there is a queue and every queue lists an
    AdmissionCheck of ``controller``."""
    if not queues:
        return GateProbe(
            Capability(
                False,
                f"no LocalQueue in {namespace}: no job here can be admitted by Kueue, and "
                f"none is gated by {controller}",
            ),
            Capability(True, f"no LocalQueue in {namespace} dispatches through MultiKueue"),
        )
    ungated = [queue.where for queue in queues if not queue.gated]
    gate = Capability(True, f"every LocalQueue in {namespace} re-admits only through {controller}")
    if ungated:
        gate = Capability(
            False,
            f"{', '.join(ungated)} lists no AdmissionCheck with controllerName {controller}: "
            "a Release there lets Kueue re-admit while pods of the held execution remain, "
            "and jobs run without Open; add the readmission AdmissionCheck to the "
            "ClusterQueue's spec.admissionChecksStrategy (manifests/readmission)",
        )
    dispatching = [(queue.where, queue.gated) for queue in queues if queue.multikueue]
    return GateProbe(gate, decisions.multikueue_capability(namespace, controller, dispatching))


def ownership_capability(
    holders: Sequence[str], identity: tuple[str, Sequence[str]] | None
) -> Capability:
    """``holdOwnership``: is hold-owner-only configured (``holders``), and is this adapter,
    authenticated as ``identity`` (user, groups), one of the holders?"""
    if not holders:
        return Capability(
            False,
            "hold-owner-only is off (webhook.holderIdentities is empty): anyone who may "
            "update the held object can lift a hold",
        )
    user, groups = identity if identity is not None else ("", ())
    if user in holders or any(g in holders or g == BREAK_GLASS_GROUP for g in groups):
        return Capability(True, f"hold-owner-only is configured for {list(holders)}, and "
                          f"this adapter ({user}) is a holder")  # fmt: skip
    return Capability(
        False,
        f"hold-owner-only is configured for {list(holders)}, but this adapter runs as "
        f"{user}: the enforcer will refuse its Hold and Release",
    )


def round_trip_capability(mode: Mode, resource: Resource, sent: Obj, echo: Obj) -> Capability:
    """The hold round trip: the dry-run create's echo must keep every hold annotation sent
    and the hold field."""
    want = objects.annotations_of(sent)
    got = objects.annotations_of(echo)
    lost = sorted(k for k, v in want.items() if got.get(k) != v)
    if lost:
        return Capability(False, f"the API server dropped or changed annotations {lost}")
    if not objects.hold_field_set(echo, mode):
        field = "spec.active=false" if mode == "kueue" else "spec.suspend=true"
        return Capability(False, f"the API server did not keep {field} on a held {resource.kind}")
    return Capability(True, f"a held {resource.kind} round-trips (server-side dry run)")


def enforcer_rule(mode: Mode) -> str:
    """The rule the enforcer probe must be refused by, in ``mode``."""
    if mode == "kueue":
        return RuleId.HELD_WORKLOAD_INACTIVE.value
    return RuleId.HELD_TRAINJOB_SUSPENDED.value


def enforcer_verdict(rule: str, refusal: Refusal | None) -> EnforcerVerdict:
    """Accepted → not installed; refused naming ``rule`` → installed; else inconclusive."""
    if refusal is None:
        return EnforcerVerdict.NOT_INSTALLED
    if rule in refusal.message or rule in refusal.body:
        return EnforcerVerdict.INSTALLED
    return EnforcerVerdict.INCONCLUSIVE


def enforcer_capability(rule: str, resource: Resource, refusal: Refusal | None) -> Capability:
    """``enforcer_installed`` from what the probe's dry-run write met."""
    verdict = enforcer_verdict(rule, refusal)
    if verdict is EnforcerVerdict.INSTALLED:
        return Capability(True, f"the enforcer refused a hold-breaking write ({rule})")
    if verdict is EnforcerVerdict.INCONCLUSIVE:
        assert refusal is not None
        return Capability(
            False,
            "inconclusive: a hold-breaking dry-run write was refused, but not by the "
            f"enforcer: {refusal.message}" + not_ours_hint(refusal),
        )
    return Capability(
        False,
        f"a {resource.kind} carrying a hold instance without its hold field was accepted: "
        "no enforcer is installed",
    )


def not_ours_hint(refusal: Refusal) -> str:
    """A hint when a probe was refused by some other admission plugin, not a hold rule.

    Validating webhooks run in parallel; when several refuse, which one's message comes back
    is not defined. Naming that case tells the operator the probe says nothing about holds.
    """
    text = f"{refusal.message} {refusal.body}"
    if any(rule.value in text for rule in RuleId) or refusal.status not in (400, 403, 422):
        return ""
    if "denied" in text:
        return (
            " (refused by another admission check, not by a hold rule: the probe could not "
            "reach the hold check; see that check's message above)"
        )
    return ""
