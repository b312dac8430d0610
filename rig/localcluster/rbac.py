"""The identities the local control plane knows, and the RBAC each one is bound to.

The enforcer must see who writes, so tests act as these identities through impersonation.
Controller identities get roughly what their real controllers' ClusterRoles grant.
"""

from __future__ import annotations

from dataclasses import dataclass

KUEUE_IDENTITY = "system:serviceaccount:kueue-system:kueue-controller-manager"
TRAINER_IDENTITY = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"
SUPERVISOR_IDENTITY = "system:serviceaccount:holdwarden-system:dispatch"
ENFORCER_IDENTITY = "system:serviceaccount:holdwarden-system:holdwarden"
# `holdwarden gate`: the readmission gate's own ServiceAccount (manifests/readmission).
GATE_IDENTITY = "system:serviceaccount:holdwarden-system:holdwarden-readmission"
# kube-controller-manager's Job controller: it, not Trainer, creates and deletes the pods of
# the Jobs that JobSet makes for a TrainJob (seen with the real controllers).
JOB_CONTROLLER_IDENTITY = "system:serviceaccount:kube-system:job-controller"
EDITOR_USER = "alice"
UNPRIVILEGED_USER = "mallory"

_TRAINER = "trainer.kubeflow.org"
_KUEUE = "kueue.x-k8s.io"
_READ = ("get", "list", "watch")
_WRITE = ("get", "list", "watch", "create", "update", "patch", "delete")


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]


@dataclass(frozen=True)
class IdentityRBAC:
    user: str
    short_name: str
    rules: tuple[Rule, ...]


IDENTITY_RBAC: tuple[IdentityRBAC, ...] = (
    IdentityRBAC(
        KUEUE_IDENTITY,
        "kueue",
        (
            Rule((_TRAINER,), ("trainjobs",), ("get", "list", "watch", "update", "patch")),
            Rule((_TRAINER,), ("trainjobs/status",), ("get", "update", "patch")),
            Rule((_KUEUE,), ("workloads",), _WRITE),
            Rule((_KUEUE,), ("workloads/status",), ("get", "update", "patch")),
            Rule(
                (_KUEUE,),
                ("admissionchecks", "clusterqueues", "localqueues", "resourceflavors"),
                _READ,
            ),
            Rule(("",), ("pods",), _READ),
            Rule(("", "events.k8s.io"), ("events",), ("create", "patch", "update")),
        ),
    ),
    IdentityRBAC(
        TRAINER_IDENTITY,
        "trainer",
        (
            Rule((_TRAINER,), ("trainjobs",), ("get", "list", "watch", "update", "patch")),
            Rule((_TRAINER,), ("trainjobs/status",), ("get", "update", "patch")),
            Rule(("",), ("pods",), _WRITE),
            Rule(("", "events.k8s.io"), ("events",), ("create", "patch", "update")),
        ),
    ),
    IdentityRBAC(
        JOB_CONTROLLER_IDENTITY,
        "job-controller",
        (
            Rule(("",), ("pods",), _WRITE),
            Rule(("", "events.k8s.io"), ("events",), ("create", "patch", "update")),
        ),
    ),
    IdentityRBAC(
        SUPERVISOR_IDENTITY,
        "supervisor",
        (
            Rule((_TRAINER,), ("trainjobs",), _WRITE),
            # create: preflight's hold round trip is a server-side dry-run create. patch:
            # Hold and Release (a merge patch preconditioned on the resourceVersion).
            Rule((_KUEUE,), ("workloads",), ("get", "list", "watch", "create", "update", "patch")),
            Rule(("",), ("pods",), _READ),
            # Preflight reads: the runtime a probe TrainJob names, and whether the
            # namespace's queues run the readmission gate. get on runtimes: a Kueue-mode
            # Release checks the TrainJob's runtime exists (issue 29).
            Rule((_TRAINER,), ("trainingruntimes", "clustertrainingruntimes"), ("get", "list")),
            Rule((_KUEUE,), ("localqueues", "clusterqueues", "admissionchecks"), ("get", "list")),
            # Preflight's trap probes (issue 29): whether MultiKueue is in use, Trainer's
            # TrainJob CRD (does it honour managedBy?) and Kueue's configuration.
            Rule((_KUEUE,), ("multikueueclusters", "multikueueconfigs"), ("list",)),
            Rule(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("get",)),
            Rule(("",), ("configmaps",), ("get",)),
            # Where Kueue manages jobs without a queue name, Start and preflight read the
            # namespace's labels (kueue.managedJobsNamespaceSelector decides).
            Rule(("",), ("namespaces",), ("get",)),
        ),
    ),
    IdentityRBAC(
        # holdwarden gate: the readmission gate's rights. The enforcer (holdwarden serve)
        # needs none of them: it judges each write from the AdmissionReview alone.
        GATE_IDENTITY,
        "readmission-gate",
        (
            Rule((_TRAINER,), ("trainjobs",), ("get", "list", "watch", "update")),
            Rule((_KUEUE,), ("workloads",), _READ),
            Rule((_KUEUE,), ("workloads/status",), ("get", "update")),
            Rule((_KUEUE,), ("admissionchecks",), _READ),
            Rule((_KUEUE,), ("admissionchecks/status",), ("get", "update")),
            Rule(("",), ("pods",), _READ),
            # The gate's leader election (manifests/readmission: a Role in its namespace).
            Rule(("coordination.k8s.io",), ("leases",), ("get", "create", "update")),
            # MultiKueue's worker clusters and their kubeconfig Secrets (manifests/
            # readmission: the Secrets through a Role in Kueue's namespace only).
            Rule((_KUEUE,), ("multikueueclusters",), ("get", "list")),
            Rule(("",), ("secrets",), ("get",)),
        ),
    ),
    IdentityRBAC(
        EDITOR_USER,
        "editor",
        (
            Rule((_TRAINER,), ("trainjobs", "trainjobs/status"), _WRITE),
            Rule((_KUEUE,), ("workloads", "workloads/status"), _WRITE),
            Rule(("",), ("pods",), _WRITE),
        ),
    ),
)
